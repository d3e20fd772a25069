#!/usr/bin/python3
"""Reference fixtures for dtrain's GPT-2, computed by PyTorch (the oracle).

Writes, into tests/fixtures/:
  gpt2_tiny.bin      the weights of a small random GPT-2 in llm.c's format
                     (int32 header[256] = {20240326, 3, maxT, V, L, NH, C, Vp},
                     then f32 parameters in llm.c's order)
  gpt2_tiny.safetensors  the same weights with Hugging Face GPT-2 names and
                     layouts (Conv1D weights stored (in, out), wte with V rows,
                     metadata n_head), written here by hand from the format's spec
  gpt2_tiny_bf16.bin the same weights as an llm.c version-5 (bf16) file
  mlp_tiny_ref.bin   the MLP (Linear-ReLU-Linear-ReLU-Linear, cross-entropy):
                     int32 header[8] = {20261123, 4, sizes[4], B}, f32 parameters
                     (per layer weight [out, in] then bias), f32 x[B*sizes[0]],
                     int32 labels[B], f32 logits[B*classes], f32 loss,
                     f32 grads[num_params], f32 losses[10] of 10 AdamW steps
  gpt2_tiny_clip_ref.bin  int32 {steps, 0}, then per step f32 loss and the
                     gradient norm before clipping, of SGD (the hyperparameters
                     below) with torch.nn.utils.clip_grad_norm_ at CLIP
  gpt2_tiny_ref.bin  int32 header[256] = {20261122, 1, B, T, steps, optimizers},
                     int32 inputs[B*T], int32 targets[B*T], f32 logits[B*T*Vp],
                     f32 loss, f32 grads[num_params] (same order as the weights),
                     f32 losses[optimizers][steps]: the loss before each of
                     `steps` updates on the same batch with AdamW, SGD, LAMB, LARS
                     (hyperparameters below; tests/test_gpt2.c uses the same).

Run with Debian's python3-torch (or torch from PyPI):  /usr/bin/python3 scripts/make_fixtures.py
"""
import json
import math
import os
import struct

import numpy as np

import torch
import torch.nn.functional as F

MAXT, V, VP, L, NH, C = 32, 101, 128, 2, 4, 32
B, T = 2, 16
STEPS = 10
OPTIMIZERS = {
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    "sgd": dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "lamb": dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
    "lars": dict(lr=0.1, momentum=0.9, weight_decay=0.01, trust_coef=0.02),
}

CLIP = 0.5  # gradient clipping for gpt2_tiny_clip_ref.bin (the norms here are 0.76-0.88: it clips every step)

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def init_params(gen):
    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std
    proj = 0.02 / math.sqrt(2 * L)
    wte = normal(VP, C)
    wte[V:] = 0
    p = [wte, normal(MAXT, C),
         1 + 0.1 * normal(L, C, std=1), 0.1 * normal(L, C, std=1),   # LayerNorm away from 1/0 to test them
         normal(L, 3 * C, C), 0.1 * normal(L, 3 * C, std=1),
         normal(L, C, C, std=proj), 0.1 * normal(L, C, std=1),
         1 + 0.1 * normal(L, C, std=1), 0.1 * normal(L, C, std=1),
         normal(L, 4 * C, C), 0.1 * normal(L, 4 * C, std=1),
         normal(L, C, 4 * C, std=proj), 0.1 * normal(L, C, std=1),
         1 + 0.1 * normal(C, std=1), 0.1 * normal(C, std=1)]
    return [t.float().requires_grad_(True) for t in p]


def forward(p, idx, tgt):
    wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw, lnfb = p
    hs = C // NH
    x = wte[idx] + wpe[:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = F.layer_norm(x, (C,), ln1w[l], ln1b[l], 1e-5)
        qkv = h @ qkvw[l].T + qkvb[l]
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ apw[l].T + apb[l]
        h = F.layer_norm(x, (C,), ln2w[l], ln2b[l], 1e-5)
        h = F.gelu(h @ fcw[l].T + fcb[l], approximate="tanh")
        x = x + h @ fpw[l].T + fpb[l]
    x = F.layer_norm(x, (C,), lnfw, lnfb, 1e-5)
    logits = x @ wte.T
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), tgt.reshape(-1))
    return logits, loss


def per_layer(ts):
    """Each layer's slice of the per-layer tensors (indices 2..13, stacked
    [L, ...] here) as a tensor of its own, as a model with one parameter per
    layer (Hugging Face's, dtrain's tensor table) has them: the trust ratios
    of LAMB and LARS are per tensor."""
    out = []
    for i, t in enumerate(ts):
        out.extend([t[l] for l in range(L)] if 2 <= i < 14 else [t])
    return out


class Lamb:
    """LAMB (You et al. 2019) with per-tensor trust ratio |w| / |u|."""
    def __init__(self, params, lr, betas, eps, weight_decay):
        self.p, self.lr, self.b1, self.b2, self.eps, self.wd = params, lr, betas[0], betas[1], eps, weight_decay
        self.m = [torch.zeros_like(t) for t in params]
        self.v = [torch.zeros_like(t) for t in params]
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        bc1, bc2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        grads = per_layer([w.grad for w in self.p])
        for w, g, m, v in zip(per_layer(self.p), grads, per_layer(self.m), per_layer(self.v)):
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            u = (m / bc1) / ((v / bc2).sqrt() + self.eps) + self.wd * w
            wn, un = w.norm().item(), u.norm().item()
            trust = wn / un if wn > 0 and un > 0 else 1.0
            w.sub_(self.lr * trust * u)

    def zero_grad(self):
        for w in self.p:
            w.grad = None


class Lars:
    """LARS (You et al. 2017): local lr = eta |w| / (|g| + wd |w|), with momentum."""
    def __init__(self, params, lr, momentum, weight_decay, trust_coef):
        self.p, self.lr, self.mom, self.wd, self.eta = params, lr, momentum, weight_decay, trust_coef
        self.buf = [torch.zeros_like(t) for t in params]

    @torch.no_grad()
    def step(self):
        grads = per_layer([w.grad for w in self.p])
        for w, g, b in zip(per_layer(self.p), grads, per_layer(self.buf)):
            wn, gn = w.norm().item(), g.norm().item()
            local = self.eta * wn / (gn + self.wd * wn) if wn > 0 and gn > 0 else 1.0
            b.mul_(self.mom).add_(self.lr * local * (g + self.wd * w))
            w.sub_(b)

    def zero_grad(self):
        for w in self.p:
            w.grad = None


def to_bf16(a):
    """f32 -> bf16 bits, round to nearest even (as dtrain and torch do)."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


HF = ["wte.weight", "wpe.weight", "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
      "mlp.c_proj.weight", "mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"]
TRANSPOSED = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def write_safetensors(path, params):
    tensors = {}
    for i, (name, t) in enumerate(zip(HF, params)):
        a = t.detach().numpy()
        if i == 0:
            a = a[:V]                                   # HF keeps V rows, no padding
        if 2 <= i < 14:
            for l in range(L):
                x = a[l].T if name in TRANSPOSED else a[l]
                tensors[f"h.{l}.{name}"] = np.ascontiguousarray(x, dtype="<f4")
        else:
            tensors[name] = np.ascontiguousarray(a, dtype="<f4")
    tensors["lm_head.weight"] = tensors["wte.weight"]  # tied; readers ignore it
    header, blobs, pos = {"__metadata__": {"format": "pt", "n_head": str(NH)}}, [], 0
    for name, a in tensors.items():
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(20261122)
    params = init_params(gen)
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    os.makedirs(out, exist_ok=True)

    with open(os.path.join(out, "gpt2_tiny.bin"), "wb") as f:
        f.write(struct.pack("256i", *([20240326, 3, MAXT, V, L, NH, C, VP] + [0] * 248)))
        for t in params:
            f.write(t.detach().contiguous().numpy().astype("<f4").tobytes())

    write_safetensors(os.path.join(out, "gpt2_tiny.safetensors"), params)
    with open(os.path.join(out, "gpt2_tiny_bf16.bin"), "wb") as f:
        f.write(struct.pack("256i", *([20240326, 5, MAXT, V, L, NH, C, VP] + [0] * 248)))
        for t in params:
            f.write(to_bf16(t.detach().numpy()).tobytes())

    logits, loss = forward(params, idx, tgt)
    loss.backward()
    grads = [t.grad.detach().clone() for t in params]

    losses = []
    for name, hp in OPTIMIZERS.items():
        p = [t.detach().clone().requires_grad_(True) for t in params]
        if name == "adamw":
            opt = torch.optim.AdamW(p, **hp)
        elif name == "sgd":
            opt = torch.optim.SGD(p, **hp)
        elif name == "lamb":
            opt = Lamb(p, **hp)
        else:
            opt = Lars(p, **hp)
        curve = []
        for _ in range(STEPS):
            opt.zero_grad()
            _, l = forward(p, idx, tgt)
            curve.append(l.item())
            l.backward()
            opt.step()
        losses.append(curve)
        print(f"{name}: {curve[0]:.6f} -> {curve[-1]:.6f}")

    with open(os.path.join(out, "gpt2_tiny_ref.bin"), "wb") as f:
        f.write(struct.pack("256i", *([20261122, 1, B, T, STEPS, len(OPTIMIZERS)] + [0] * 250)))
        f.write(idx.numpy().astype("<i4").tobytes())
        f.write(tgt.numpy().astype("<i4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(struct.pack("<f", loss.item()))
        for g in grads:
            f.write(g.numpy().astype("<f4").tobytes())
        for curve in losses:
            f.write(struct.pack(f"<{STEPS}f", *curve))
    print(f"loss {loss.item():.6f}; wrote {out}/gpt2_tiny.bin and gpt2_tiny_ref.bin")
    write_clipped(out, params, idx, tgt)
    write_mlp(out)


def write_clipped(out, params, idx, tgt):
    """SGD (momentum, Nesterov; a scale-sensitive optimizer, unlike Adam, so a
    wrong clip factor shows) with torch.nn.utils.clip_grad_norm_ at CLIP: per
    step the loss and the norm before clipping (it clips at every step)."""
    p = [t.detach().clone().requires_grad_(True) for t in params]
    opt = torch.optim.SGD(p, **OPTIMIZERS["sgd"])
    rows = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, l = forward(p, idx, tgt)
        l.backward()
        norm = torch.nn.utils.clip_grad_norm_(p, CLIP)
        rows += [l.item(), norm.item()]
        opt.step()
    with open(os.path.join(out, "gpt2_tiny_clip_ref.bin"), "wb") as f:
        f.write(struct.pack(f"<2i{2 * STEPS}f", STEPS, 0, *rows))
    print(f"sgd clipped at {CLIP}: loss {rows[0]:.6f} -> {rows[-2]:.6f}, norm {rows[1]:.4f} -> {rows[-1]:.4f}")


MLP_SIZES, MLP_B = [20, 16, 12, 5], 8


def write_mlp(out):
    gen = torch.Generator().manual_seed(20261123)
    layers = []
    for i, o in zip(MLP_SIZES[:-1], MLP_SIZES[1:]):
        bound = 1 / math.sqrt(i)
        w = ((torch.rand(o, i, generator=gen) * 2 - 1) * bound).requires_grad_(True)
        b = ((torch.rand(o, generator=gen) * 2 - 1) * bound).requires_grad_(True)
        layers += [w, b]
    x = torch.randn(MLP_B, MLP_SIZES[0], generator=gen)
    y = torch.randint(0, MLP_SIZES[-1], (MLP_B,), generator=gen)

    def fwd(p):
        h = x
        for k in range(0, len(p), 2):
            h = F.linear(h, p[k], p[k + 1])
            if k + 2 < len(p):
                h = F.relu(h)
        return h, F.cross_entropy(h, y)

    logits, loss = fwd(layers)
    loss.backward()
    p = [t.detach().clone().requires_grad_(True) for t in layers]
    opt = torch.optim.AdamW(p, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    curve = []
    for _ in range(10):
        opt.zero_grad()
        _, l = fwd(p)
        curve.append(l.item())
        l.backward()
        opt.step()
    with open(os.path.join(out, "mlp_tiny_ref.bin"), "wb") as f:
        f.write(struct.pack("8i", 20261123, len(MLP_SIZES), *MLP_SIZES, MLP_B, 0))
        for t in layers:
            f.write(t.detach().numpy().astype("<f4").tobytes())
        f.write(x.numpy().astype("<f4").tobytes())
        f.write(y.numpy().astype("<i4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(struct.pack("<f", loss.item()))
        for t in layers:
            f.write(t.grad.numpy().astype("<f4").tobytes())
        f.write(struct.pack("<10f", *curve))
    print(f"mlp: loss {loss.item():.6f}, AdamW {curve[0]:.6f} -> {curve[-1]:.6f}; wrote {out}/mlp_tiny_ref.bin")


if __name__ == "__main__":
    main()
