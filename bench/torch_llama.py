#!/usr/bin/python3
"""PyTorch baseline for `dtrain bench train --model llama-tiny|smollm-135m|... --baseline torch`: the same Llama,
from the same weights (a Hugging Face folder dtrain wrote, loaded by transformers' LlamaForCausalLM in eager mode),
on the same synthetic batch, AdamW, timed per step. Prints one JSON line per timed step: {"step", "ms", "loss"}.
--autocast bf16|fp16 runs forward under torch.autocast("cpu", dtype) on the f32 weights. Needs torch and
transformers (the baselines' environment: scripts/make-baselines-venv.sh)."""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--autocast", choices=["bf16", "fp16"])
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.autocast)
    torch.set_num_threads(a.threads)
    m = AutoModelForCausalLM.from_pretrained(a.folder, attn_implementation="eager", dtype=torch.float32)
    m.train()
    V = m.config.vocab_size
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, V, (a.batch, a.seq), generator=g)
    opt = torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = m(input_ids=idx).logits
            loss = F.cross_entropy(logits.reshape(-1, V).float(), tgt.reshape(-1))
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if step >= a.warmup:
            print(json.dumps({"step": step - a.warmup + 1, "ms": ms, "loss": loss.item()}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
