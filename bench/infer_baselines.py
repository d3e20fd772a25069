#!/usr/bin/env python3
"""The serving benchmark's baselines on dtrain's weights (HF-named safetensors):
HF transformers' generate under PyTorch (f32), and llama.cpp's
llama-batched-bench on the same weights written as GGUF (f32, then Q8_0 by
llama-quantize). One JSON line per implementation, precision and thread
count: prefill (a prompt of --prompt tokens in one pass), decode1 and
decodeb (tokens/s decoding --steps tokens after it, batch 1 and --batch).
Run by `dtrain bench infer --baseline ...` with the baselines' venv; llama.cpp
from scripts/build-llama-cpp.sh ($DTRAIN_LLAMA_CPP or .llama.cpp).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def load_state(path):
    from safetensors.numpy import load_file
    return load_file(path)


def shape_of(sd):
    C = sd["wte.weight"].shape[1]
    L = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))
    return C, L, sd["wte.weight"].shape[0], sd["wpe.weight"].shape[0]


def hf_model(args, sd):
    """GPT2LMHeadModel holding dtrain's weights (HF's names), and its vocabulary size."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    C, L, V, T = shape_of(sd)
    m = GPT2LMHeadModel(GPT2Config(n_embd=C, n_layer=L, n_head=args.heads or C // 64, vocab_size=V, n_positions=T))
    m.transformer.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in sd.items()}, strict=False)
    m.tie_weights()
    m.eval()
    return m, V


def hf(args, sd, threads):
    import torch
    torch.set_num_threads(threads)
    m, V = hf_model(args, sd)
    g = torch.Generator().manual_seed(0)

    def run(batch, new):
        ids = torch.randint(0, V, (batch, args.prompt), generator=g)
        t0 = time.perf_counter()
        with torch.no_grad():
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=0)
        return time.perf_counter() - t0

    run(1, 2)  # warm-up
    pre = statistics.median(run(1, 1) for _ in range(args.reps))
    dec1 = statistics.median(run(1, args.steps + 1) for _ in range(args.reps))
    decb = statistics.median(run(args.batch, args.steps + 1) for _ in range(args.reps))
    preb = statistics.median(run(args.batch, 1) for _ in range(args.reps))
    print(json.dumps({"impl": "hf", "prec": "f32", "threads": threads, "prefill": args.prompt / pre,
                      "decode1": args.steps / (dec1 - pre), "decodeb": args.batch * args.steps / (decb - preb)}), flush=True)


def same_tokens(args, sd):
    """HF's greedy generate against dtrain generate's (the cache's) on the same weights: a byte prompt's ids, --check
    tokens; prints how many agree and the first difference."""
    import torch
    torch.set_num_threads(1)
    m, V = hf_model(args, sd)
    prompt = "And God said"
    ids = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        hf_out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.check, min_new_tokens=args.check,
                            do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
    out = subprocess.run([args.dtrain, "generate", "--model", args.weights, "--prompt", prompt, "--tokens", str(args.check),
                          "--temperature", "0"],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    text = out.stdout[len(prompt):].strip()
    if V == 256:
        mine = list(text.encode())
    else:
        mine = [int(t) for t in text.replace(">", "").split("<") if t]
    agree = next((i for i, (a, b) in enumerate(zip(hf_out, mine)) if a != b), min(len(hf_out), len(mine)))
    print(json.dumps({"check": "greedy tokens", "same": hf_out == mine, "tokens": len(hf_out), "agree": agree,
                      "distinct": len(set(hf_out)), "hf": hf_out[:12], "dtrain": mine[:12]}), flush=True)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_gguf(sd, heads, path, gguf):
    """GPT-2 in llama.cpp's names (its gpt2 architecture); HF's Conv1D weights [in, out] turned to [out, in]. The
    vocabulary is the 256 bytes and placeholders: the benchmark feeds token ids, never text."""
    import numpy as np
    C, L, V, T = shape_of(sd)
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_context_length(T)
    w.add_embedding_length(C)
    w.add_feed_forward_length(4 * C)
    w.add_block_count(L)
    w.add_head_count(heads or C // 64)
    w.add_layer_norm_eps(1e-5)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    toks = bytes_to_unicode() + ["\u0120t"] + ["<t%d>" % i for i in range(257, V)]
    w.add_token_list(toks)
    w.add_token_types([1] * V)
    w.add_token_merges(["\u0120 t"])  # llama.cpp wants merges; one that makes token 256
    w.add_bos_token_id(V - 1)
    w.add_eos_token_id(V - 1)
    f = lambda a: np.ascontiguousarray(a, dtype=np.float32)
    w.add_tensor("token_embd.weight", f(sd["wte.weight"]))
    w.add_tensor("position_embd.weight", f(sd["wpe.weight"]))
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for l in range(L):
        for hfn, gn in names.items():
            wt, b = sd["h.%d.%s.weight" % (l, hfn)], sd["h.%d.%s.bias" % (l, hfn)]
            w.add_tensor("blk.%d.%s.weight" % (l, gn), f(wt if hfn.startswith("ln") else wt.T))
            w.add_tensor("blk.%d.%s.bias" % (l, gn), f(b))
    w.add_tensor("output_norm.weight", f(sd["ln_f.weight"]))
    w.add_tensor("output_norm.bias", f(sd["ln_f.bias"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama(args, sd, threads_list):
    root = os.environ.get("DTRAIN_LLAMA_CPP") or os.path.join(HERE, "..", ".llama.cpp")
    bb, qz = (os.path.join(root, "build", "bin", x) for x in ("llama-batched-bench", "llama-quantize"))
    if not os.access(bb, os.X_OK):
        print("llama.cpp is not built at %s: run scripts/build-llama-cpp.sh (or point DTRAIN_LLAMA_CPP at one)" % root,
              file=sys.stderr)
        return
    sys.path.insert(0, os.path.join(root, "src", "gguf-py"))
    import gguf
    with tempfile.TemporaryDirectory() as d:
        f32, q8 = os.path.join(d, "m-f32.gguf"), os.path.join(d, "m-q8_0.gguf")
        write_gguf(sd, args.heads, f32, gguf)
        subprocess.run([qz, f32, q8, "Q8_0"], check=True, capture_output=True)
        for prec, path in (("f32", f32), ("q8_0", q8)):
            for t in threads_list:
                runs = []
                for _ in range(args.reps):
                    out = subprocess.run([bb, "-m", path, "-c", str(args.batch * (args.prompt + args.steps) + 16), "-b", "2048",
                                          "-ub", "512", "-npp", str(args.prompt), "-ntg", str(args.steps), "-npl",
                                          "1,%d" % args.batch, "-t", str(t), "-tb", str(t), "--output-format", "jsonl"],
                                         capture_output=True, text=True)
                    rows = [json.loads(x) for x in (out.stdout + out.stderr).splitlines() if x.startswith("{\"n_kv_max\"")]
                    if out.returncode or len(rows) != 2:
                        print("llama-batched-bench failed: %s" % (out.stderr[-800:]), file=sys.stderr)
                        return
                    runs.append(rows)
                med = lambda i, k: statistics.median(r[i][k] for r in runs)
                print(json.dumps({"impl": "llama.cpp", "prec": prec, "threads": t, "prefill": med(0, "speed_pp"),
                                  "decode1": med(0, "speed_tg"), "decodeb": med(1, "speed_tg")}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weights", required=True)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--heads", type=int, default=0)
    p.add_argument("--which", default="all")
    p.add_argument("--check", type=int, default=0, help="compare this many greedy tokens with dtrain generate's")
    p.add_argument("--dtrain", default=os.path.join(HERE, "..", "build", "dtrain"))
    a = p.parse_args()
    sd = load_state(a.weights)
    threads = [int(t) for t in a.threads.split(",") if t]
    if a.check:
        same_tokens(a, sd)
    if a.which in ("hf", "all"):
        for t in threads:
            hf(a, sd, t)
    if a.which in ("llama", "all") and a.which != "none":
        llama(a, sd, threads)


if __name__ == "__main__":
    main()
