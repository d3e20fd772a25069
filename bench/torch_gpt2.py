#!/usr/bin/python3
"""PyTorch baseline for `dtrain bench train --baseline torch`: the same GPT-2,
from the same weights (an llm.c model file), on the same synthetic batch,
AdamW, timed per step. Prints one JSON line per timed step:
{"step", "ms", "loss"}. --autocast bf16|fp16 runs forward under
torch.autocast("cpu", dtype) on the f32 weights (mixed precision, the
baseline of `dtrain bench train --precision`). Debian's python3-torch or torch
from PyPI."""
import argparse
import json
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load(path):
    with open(path, "rb") as f:
        h = struct.unpack("256i", f.read(1024))
        assert h[0] == 20240326 and h[1] == 3, f"{path}: not an f32 llm.c model file"
        T, V, L, NH, C, Vp = h[2], h[3], h[4], h[5], h[6], h[7]
        shapes = [(Vp, C), (T, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
                  (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]
        stacked = []
        for s in shapes:
            n = int(np.prod(s))
            stacked.append(torch.from_numpy(np.frombuffer(f.read(4 * n), dtype="<f4").copy().reshape(s)))
    # One leaf tensor per layer, as torch.nn modules hold them: indexing a
    # stacked parameter would make every backward materialise and add a
    # full-size gradient per layer (SelectBackward), a cost no PyTorch user pays.
    params = []
    for i, t in enumerate(stacked):
        per_layer = 2 <= i < 14
        params.append([x.clone().requires_grad_(True) for x in t] if per_layer else t.requires_grad_(True))
    return (T, V, L, NH, C, Vp), params


def forward(cfg, p, idx, tgt):
    _, V, L, NH, C, _ = cfg
    wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw, lnfb = p
    B, T = idx.shape
    hs = C // NH
    x = wte[idx] + wpe[:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = F.layer_norm(x, (C,), ln1w[l], ln1b[l], 1e-5)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in F.linear(h, qkvw[l], qkvb[l]).split(C, dim=2))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + F.linear((att @ v).transpose(1, 2).reshape(B, T, C), apw[l], apb[l])
        h = F.layer_norm(x, (C,), ln2w[l], ln2b[l], 1e-5)
        x = x + F.linear(F.gelu(F.linear(h, fcw[l], fcb[l]), approximate="tanh"), fpw[l], fpb[l])
    logits = F.linear(F.layer_norm(x, (C,), lnfw, lnfb, 1e-5), wte)
    return F.cross_entropy(logits[..., :V].reshape(-1, V), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
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
    cfg, params = load(a.weights)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    leaves = [x for t in params for x in (t if isinstance(t, list) else [t])]
    opt = torch.optim.AdamW(leaves, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = forward(cfg, params, idx, tgt)
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if step >= a.warmup:
            print(json.dumps({"step": step - a.warmup + 1, "ms": ms, "loss": loss.item()}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
