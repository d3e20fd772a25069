#!/usr/bin/env python3
"""Greedy decoding against Hugging Face and llama.cpp on models dtrain did not make: for each configuration below,
a random LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM, or a mixture of experts (MixtralForCausalLM,
Qwen2MoeForCausalLM, Qwen3MoeForCausalLM: llama.cpp's llama, qwen2moe and qwen3moe architectures, the experts
stacked) (transformers, initializer_range 0.1 so that the tokens vary) saved as
an HF folder; then 64 greedy tokens from the bytes of a prompt (as ids) by
  HF generate (f32, eager attention),
  dtrain generate --ids on the folder (its KV cache; f32, and int8 said only),
  llama.cpp's llama-completion (top-k 1, f32: -fa off, f32 cache) on `dtrain ckpt export FOLDER OUT.gguf`,
and prints how many of each agree with HF's; then text in and out through a tokenizer.json (text_case). Exit 1 if
dtrain's f32 or llama.cpp's differ from HF's. The GGUF names
the last id end-of-text (dtrain models carry no tokenizer): llama.cpp stops once it draws that id, and its tokens
agree when they are HF's up to there (--ignore-eos would ban the id instead and turn the tokens).

Run with the baselines' environment; llama.cpp from scripts/build-llama-cpp.sh:
  .venv-baselines/bin/python scripts/check_decode_parity.py [build/dtrain [NAME...]]
"""
import os
import re
import subprocess
import sys
import tempfile

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT, NEW = b"And God said", 64
SMOL = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=True)
CONFIGS = {
    "smollm-135m": (LlamaConfig, LlamaForCausalLM, SMOL),
    "llama3.1-scaled (tiny)": (LlamaConfig, LlamaForCausalLM,
                               dict(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                                    rope_theta=500000.0, tie_word_embeddings=False,
                                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                      high_freq_factor=4.0, original_max_position_embeddings=32))),
    "qwen2 (tiny)": (Qwen2Config, Qwen2ForCausalLM,
                     dict(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                          rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3 (tiny)": (Qwen3Config, Qwen3ForCausalLM,
                     dict(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                          rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
    # mixtures of experts: 8 SwiGLU experts, 2 a token (Qwen 2 MoE's weights not renormalised, a gated shared expert)
    "mixtral (tiny)": (MixtralConfig, MixtralForCausalLM,
                       dict(vocab_size=512, hidden_size=128, intermediate_size=172, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=256,
                            rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen2_moe (tiny)": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                         dict(vocab_size=512, hidden_size=128, intermediate_size=344, moe_intermediate_size=88,
                              shared_expert_intermediate_size=172, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                              qkv_bias=True, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                              max_position_embeddings=256, rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen3_moe (tiny)": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                         dict(vocab_size=512, hidden_size=128, intermediate_size=344, moe_intermediate_size=88, num_experts=8,
                              num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=4, num_attention_heads=8,
                              num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-6,
                              rope_theta=1000000.0, tie_word_embeddings=False, initializer_range=0.2)),
    "qwen3-0.6b": (Qwen3Config, Qwen3ForCausalLM,
                   dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
}


def dtrain_tokens(dtrain, folder, quant):
    ids = ",".join(str(b) for b in PROMPT)
    out = subprocess.run([dtrain, "generate", "--model", folder, "--ids", "--prompt", ids, "--tokens", str(NEW),
                          "--temperature", "0", "--quantize", quant], capture_output=True, text=True, check=True)
    return [int(t) for t in out.stdout.split()[1:]]


SILENT = [0]  # llama.cpp's starts that printed nothing


def llama_completion(exe, gguf, prompt, n):
    """llama-completion's stdout, greedy in f32. On this build (0.3.36, OpenMP) some starts (5-19 in 100 here) print
    nothing and exit 0 right after the threadpool's start, on the very file another start decodes: such a start is run
    again (at most 5 times; counted in SILENT, said at the end), not taken for an answer."""
    for _ in range(5):
        out = subprocess.run([exe, "-m", gguf, "-p", prompt, "-n", str(n), "--top-k", "1", "--temp", "0", "-t", "1", "-no-cnv",
                              "--no-warmup", "-c", "512", "-fa", "off", "-ctk", "f32", "-ctv", "f32"], capture_output=True,
                             check=True).stdout
        if out:
            return out
        SILENT[0] += 1
    return out


def llama_tokens(dtrain, folder, tmp):
    exe = os.path.join(os.environ.get("DTRAIN_LLAMA_CPP") or os.path.join(HERE, "..", ".llama.cpp"), "build", "bin",
                       "llama-completion")
    if not os.access(exe, os.X_OK):
        return None
    gguf = os.path.join(tmp, "model.gguf")
    subprocess.run([dtrain, "ckpt", "export", folder, gguf], capture_output=True, check=True)
    out = llama_completion(exe, gguf, PROMPT.decode(), NEW)
    out = out[len(PROMPT):] if out.startswith(PROMPT) else out
    out = out.split(b" [end of text]")[0]  # what llama-completion prints after the end-of-text token
    ids, i = [], 0
    while i < len(out):
        mo = re.match(rb"<t(\d+)>", out[i:])
        ids.append(int(mo.group(1)) if mo else out[i])
        i += mo.end() if mo else 1
    return ids[:NEW]


def text_case(dtrain):
    """Text in, text out: a tiny random Llama with the Llama 3-style tokenizer of tests/fixtures/tokenizer (its
    folder's tokenizer.json): HF (PreTrainedTokenizerFast + generate, the template's BOS first), dtrain generate on the
    folder, and llama.cpp on `dtrain ckpt export FOLDER OUT.gguf` (the tokenizer's vocabulary, merges and pattern in
    it) print the same continuation."""
    import shutil
    from transformers import PreTrainedTokenizerFast
    tok_json = os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "llama3.json")
    torch.manual_seed(5)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=2004, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                     tie_word_embeddings=False, initializer_range=0.1, bos_token_id=0, eos_token_id=1,
                                     attn_implementation="eager")).float().eval()
    prompt = "The License applies to"
    tok = PreTrainedTokenizerFast(tokenizer_file=tok_json)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    ref = tok.decode(out[0, ids.shape[1]:])
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "hf")
        m.save_pretrained(folder)
        shutil.copy(tok_json, os.path.join(folder, "tokenizer.json"))
        mine = subprocess.run([dtrain, "generate", "--model", folder, "--prompt", prompt, "--tokens", "24", "--temperature", "0"],
                              capture_output=True, check=True).stdout.decode("utf-8", "replace").rstrip("\n")[len(prompt):]
        gguf = os.path.join(tmp, "model.gguf")
        subprocess.run([dtrain, "ckpt", "export", folder, gguf], capture_output=True, check=True)
        exe = os.path.join(os.environ.get("DTRAIN_LLAMA_CPP") or os.path.join(HERE, "..", ".llama.cpp"), "build", "bin",
                           "llama-completion")
        lc = None
        if os.access(exe, os.X_OK):
            lc = llama_completion(exe, gguf, prompt, 24).decode("utf-8", "replace")
            lc = lc.split(" [end of text]")[0].rstrip("\n")[len(prompt):]
    ok = mine == ref and (lc is None or lc == ref)
    print("%-24s text through tokenizer.json, 24 tokens: dtrain %s HF's, llama.cpp on dtrain's GGUF %s HF's%s (%r)" %
          ("llama3 tokenizer (tiny)", "=" if mine == ref else "!=", "(not built)" if lc is None else "=" if lc == ref else "!=",
           "" if ok else "   FAIL", ref[:40]) + ("" if lc is None or lc == ref else " llama.cpp's: %r" % lc[:40]), flush=True)
    return ok


def agree(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main():
    """Every configuration, or those whose names start with the words after DTRAIN (mixtral, qwen3_moe, ...)."""
    dtrain = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "build", "dtrain")
    only = sys.argv[2:]
    bad = 0
    for name, (Config, Model, kw) in CONFIGS.items():
        if only and not any(name.startswith(o) for o in only):
            continue
        torch.manual_seed(3)
        m = Model(Config(**{"initializer_range": 0.1, "attn_implementation": "eager", **kw})).float().eval()
        ids = torch.tensor([list(PROMPT)])
        with torch.no_grad():
            ref = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=False, pad_token_id=0)[0, len(PROMPT):].tolist()
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "hf")
            m.save_pretrained(folder)
            f32, q8 = dtrain_tokens(dtrain, folder, "none"), dtrain_tokens(dtrain, folder, "int8")
            lc = llama_tokens(dtrain, folder, tmp)
        eos = kw["vocab_size"] - 1
        ok = f32 == ref and (lc is None or lc == ref or (lc == ref[:len(lc)] and lc[-1] == eos))
        bad += not ok
        print("%-24s %d distinct tokens; of %d, agree with HF generate's: dtrain f32 %d, llama.cpp on dtrain's GGUF %s, "
              "dtrain int8 %d%s" % (name, len(set(ref)), NEW, agree(f32, ref), "(not built)" if lc is None else agree(lc, ref),
                                    agree(q8, ref), "" if ok else "   FAIL") +
              (" (llama.cpp stopped at the end-of-text id, HF's token there too)" if lc and len(lc) < NEW and ok else ""),
              flush=True)
    if not only:
        bad += not text_case(dtrain)
    if SILENT[0]:
        print("(llama.cpp printed nothing and exited 0 on %d start(s), each run again)" % SILENT[0])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
