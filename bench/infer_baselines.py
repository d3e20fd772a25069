#!/usr/bin/env python3
"""The serving benchmark's baselines on dtrain's weights (an HF folder and a
GGUF, as dtrain ckpt export writes them): HF transformers' generate under
PyTorch (f32), and llama.cpp's llama-batched-bench (the GGUF in f32, then
Q8_0 by llama-quantize); first each one's greedy tokens against dtrain's. One JSON line per implementation, precision and thread
count: prefill (a prompt of --prompt tokens in one pass), decode1 and
decodeb (tokens/s decoding --steps tokens after it, batch 1 and --batch).
Run by `dtrain bench infer --baseline ...` with the baselines' venv; llama.cpp
from scripts/build-llama-cpp.sh ($DTRAIN_LLAMA_CPP or .llama.cpp).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def hf_model(args):
    """The HF folder dtrain wrote (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM), and its vocabulary size."""
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(args.weights, torch_dtype="float32", attn_implementation="eager")
    m.eval()
    return m, m.config.vocab_size


def hf(args, threads):
    import torch
    torch.set_num_threads(threads)
    m, V = hf_model(args)
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


PROMPT = "And God said"  # byte values are token ids on every side (dtrain's GGUF lists the 256 bytes first)


def dtrain_greedy(args):
    ids = ",".join(str(b) for b in PROMPT.encode())
    out = subprocess.run([args.dtrain, "generate", "--model", args.weights, "--ids", "--prompt", ids, "--tokens", str(args.check),
                          "--temperature", "0"], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return [int(t) for t in out.stdout.split()[1:]]


def compare(name, theirs, mine):
    agree = next((i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b), min(len(theirs), len(mine)))
    print(json.dumps({"check": "greedy tokens, " + name, "same": theirs == mine, "tokens": len(theirs), "agree": agree,
                      "distinct": len(set(theirs)), name: theirs[:12], "dtrain": mine[:12]}), flush=True)


def same_tokens(args):
    """HF's greedy generate against dtrain generate's (the cache's) on the same weights: the prompt's bytes as ids,
    --check tokens; prints how many agree and the first difference."""
    import torch
    torch.set_num_threads(1)
    m, V = hf_model(args)
    ids = torch.tensor([list(PROMPT.encode())])
    with torch.no_grad():
        hf_out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.check, min_new_tokens=args.check,
                            do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
    compare("hf", hf_out, dtrain_greedy(args))


def llama_root():
    return os.environ.get("DTRAIN_LLAMA_CPP") or os.path.join(HERE, "..", ".llama.cpp")


SILENT = [0]  # llama.cpp's starts that printed nothing


def llama_run(cmd, answered, **kw):
    """One run of a llama.cpp tool. This build (0.3.36, OpenMP) prints nothing and exits 0 on some starts (10 of 40
    llama-batched-bench starts here, 19 of 100 llama-completion ones, on one file): such a start is run again (at most 5
    times; counted in SILENT, said at the end), not taken for a failure or an answer."""
    for _ in range(5):
        out = subprocess.run(cmd, capture_output=True, **kw)
        if out.returncode or answered(out):
            return out
        SILENT[0] += 1
    return out


def llama_tokens(args):
    """llama.cpp's greedy tokens (llama-completion, top-k 1, no BOS, in f32: its flash attention, on by default, rounds
    to f16 and turned a near tie of SmolLM's shape at token 48) from dtrain's GGUF: its text read back as ids (a byte
    below 256, "<tN>" above). It stops at the GGUF's end-of-text id (the last): compared up to there."""
    exe = os.path.join(llama_root(), "build", "bin", "llama-completion")
    if not os.access(exe, os.X_OK):
        print("llama-completion is not built: run scripts/build-llama-cpp.sh", file=sys.stderr)
        return
    out = llama_run([exe, "-m", args.gguf, "-p", PROMPT, "-n", str(args.check), "--top-k", "1", "--temp", "0", "-t", "1",
                     "-no-cnv", "--no-warmup", "-c", "512", "-fa", "off", "-ctk", "f32", "-ctv", "f32"], lambda o: o.stdout)
    text = out.stdout
    if text.startswith(PROMPT.encode()):
        text = text[len(PROMPT):]
    text = text.split(b" [end of text]")[0]  # what llama-completion prints after the end-of-text token
    ids, i = [], 0
    while i < len(text):
        mo = re.match(rb"<t(\d+)>", text[i:])
        if mo:
            ids.append(int(mo.group(1)))
            i += mo.end()
        else:
            ids.append(text[i])
            i += 1
    mine = dtrain_greedy(args)
    compare("llama.cpp", ids[:args.check], mine[:len(ids)] if len(ids) < args.check else mine)


def llama(args, threads_list):
    root = llama_root()
    bb, qz = (os.path.join(root, "build", "bin", x) for x in ("llama-batched-bench", "llama-quantize"))
    if not os.access(bb, os.X_OK):
        print("llama.cpp is not built at %s: run scripts/build-llama-cpp.sh (or point DTRAIN_LLAMA_CPP at one)" % root,
              file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as d:
        f32, q8 = args.gguf, os.path.join(d, "m-q8_0.gguf")
        subprocess.run([qz, f32, q8, "Q8_0"], check=True, capture_output=True)
        for prec, path in (("f32", f32), ("q8_0", q8)):
            for t in threads_list:
                runs = []
                for _ in range(args.reps):
                    out = llama_run([bb, "-m", path, "-c", str(args.batch * (args.prompt + args.steps) + 16), "-b", "2048", "-ub",
                                     "512", "-npp", str(args.prompt), "-ntg", str(args.steps), "-npl", "1,%d" % args.batch, "-t",
                                     str(t), "-tb", str(t), "--output-format", "jsonl"], lambda o: '{"n_kv_max"' in o.stdout + o.stderr,
                                    text=True)
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
    p.add_argument("--weights", required=True, help="an HF folder")
    p.add_argument("--gguf", required=True, help="the same weights as GGUF (dtrain ckpt export DIR OUT.gguf)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--which", default="all")
    p.add_argument("--check", type=int, default=0, help="compare this many greedy tokens with dtrain generate's")
    p.add_argument("--dtrain", default=os.path.join(HERE, "..", "build", "dtrain"))
    a = p.parse_args()
    threads = [int(t) for t in a.threads.split(",") if t]
    if a.check and a.which in ("hf", "all"):
        same_tokens(a)
    if a.check and a.which in ("llama", "all"):
        llama_tokens(a)
    if a.which in ("hf", "all"):
        for t in threads:
            hf(a, t)
    if a.which in ("llama", "all"):
        llama(a, threads)
    if SILENT[0]:
        print("(llama.cpp printed nothing and exited 0 on %d start(s), each run again)" % SILENT[0], file=sys.stderr)


if __name__ == "__main__":
    main()
