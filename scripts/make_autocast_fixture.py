#!/usr/bin/python3
"""Reference loss curves for dtrain's mixed precision, computed by PyTorch
(the oracle): GPT-2 trained with torch.autocast("cpu", dtype=torch.bfloat16)
on f32 master weights, and the same in plain f32, from the weights dtrain's
initialisation gives (its splitmix64 + Box-Muller, reproduced here) on the
same batches (llm.c's loader order over a byte-level token file).

Writes tests/fixtures/autocast_ref.txt, one block per model:
  case NAME layers L channels C heads NH vocab V maxseq T0 batch B seq T steps S lr LR wd WD seed SEED
  fp32 loss_1 ... loss_S
  bf16 loss_1 ... loss_S
tests/mixed_precision.sh trains dtrain with the same settings (--precision
bf16 and fp32) and compares step by step.

What differs by design (autocast is run as a GPT-2 written in PyTorch would
run it): attention is scaled_dot_product_attention, which autocast runs in
bf16 (its CPU kernel sums in f32, as dtrain's); the loss is computed in f32
from the bf16 logits (logits.float(), as llm.c and dtrain do); the
embeddings, LayerNorms and the residual stream stay f32 as autocast leaves
them.

The data: the first 200000 bytes of /usr/share/common-licenses/GPL-3 as
byte tokens (dtrain tokenize --bytes).

Run with torch 2.x (scaled_dot_product_attention), e.g. the baselines' venv:
  .venv-baselines/bin/python scripts/make_autocast_fixture.py
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dtrain_random import normals  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "autocast_ref.txt")
TEXT = "/usr/share/common-licenses/GPL-3"

CASES = [
    # name, layers, channels, heads, vocab, max_seq, batch, seq, steps
    ("tiny", 2, 64, 4, 256, 64, 4, 64, 50),
    ("d6", 6, 384, 6, 50257, 256, 4, 64, 50),
]
LR, WD, SEED = 1e-3, 0.01, 1337

def init_params(L, C, V, Vp, T0, seed):
    """dt_gpt2_init_random: llm.c's tensors in order, each layer in turn;
    weights N(0, 0.02) (projections 0.02/sqrt(2L)), LayerNorm weights 1 and
    biases 0 (which draw nothing), padded vocabulary rows 0."""
    proj = np.float32(0.02) / np.sqrt(np.float32(2 * L), dtype=np.float32)
    shapes = [(Vp, C), (T0, C), (C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C), (4 * C,),
              (C, 4 * C), (C,), (C,), (C,)]
    ln_w, bias = {2, 8, 14}, {5, 7, 3, 9, 11, 13, 15}
    calls, out = 0, []
    for i, shape in enumerate(shapes):
        layers = L if 2 <= i < 14 else 1
        n = int(np.prod(shape))
        ts = []
        for _ in range(layers):
            if i in ln_w:
                v = np.ones(n, np.float32)
            elif i in bias:
                v = np.zeros(n, np.float32)
            else:
                std = proj if i in (6, 12) else np.float32(0.02)
                v = (std * normals(SEED if seed is None else seed, calls, n)).astype(np.float32)
                calls += 2 * n
            ts.append(torch.from_numpy(v.reshape(shape).copy()))
        out.append(torch.stack(ts) if layers > 1 else ts[0])
    out[0][V:] = 0
    return [t.float().requires_grad_(True) for t in out]


def forward(p, idx, tgt, L, C, NH, V, autocast):
    wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw, lnfb = p
    B, T = idx.shape
    hs = C // NH
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        x = wte[idx] + wpe[:T]
        for l in range(L):
            h = F.layer_norm(x, (C,), ln1w[l], ln1b[l], 1e-5)
            qkv = F.linear(h, qkvw[l], qkvb[l])
            q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), apw[l], apb[l])
            h = F.layer_norm(x, (C,), ln2w[l], ln2b[l], 1e-5)
            h = F.gelu(F.linear(h, fcw[l], fcb[l]), approximate="tanh")
            x = x + F.linear(h, fpw[l], fpb[l])
        x = F.layer_norm(x, (C,), lnfw, lnfb, 1e-5)
        logits = F.linear(x, wte)
    return F.cross_entropy(logits.float()[..., :V].reshape(-1, V), tgt.reshape(-1))


def train(case, tokens, autocast):
    name, L, C, NH, V, T0, B, T, steps = case
    Vp = (V + 63) // 64 * 64  # dtrain pads the vocabulary to 64
    p = init_params(L, C, V, Vp, T0, SEED)
    opt = torch.optim.AdamW(p, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    nb = (len(tokens) - 1) // (B * T)
    losses = []
    for s in range(steps):
        b = s % nb
        chunk = torch.from_numpy(tokens[b * B * T: b * B * T + B * T + 1].astype(np.int64))
        loss = forward(p, chunk[:-1].view(B, T), chunk[1:].view(B, T), L, C, NH, V, autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"{name} {'bf16' if autocast else 'fp32'} step {s + 1}: {losses[-1]:.6f}", file=sys.stderr)
    return losses


def main():
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tokens = np.frombuffer(open(TEXT, "rb").read()[:200000], dtype=np.uint8).astype(np.int64)
    lines = []
    for case in CASES:
        name, L, C, NH, V, T0, B, T, steps = case
        lines.append(f"case {name} layers {L} channels {C} heads {NH} vocab {V} maxseq {T0} batch {B} seq {T} "
                     f"steps {steps} lr {LR:g} wd {WD:g} seed {SEED}")
        for autocast in (False, True):
            ls = train(case, tokens, autocast)
            lines.append(("bf16 " if autocast else "fp32 ") + " ".join(f"{x:.7f}" for x in ls))
    with open(OUT, "w") as f:
        f.write(f"# torch {torch.__version__}, scripts/make_autocast_fixture.py\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
