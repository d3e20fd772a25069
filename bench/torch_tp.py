#!/usr/bin/python3
"""PyTorch tensor-parallel baseline for `dtrain bench train --tp N --baseline
torch`: GPT-2 as nn.Modules (q, k, v as three Linears, as torchtitan does, so
that a column split keeps whole heads), from the same llm.c weights,
parallelized with torch.distributed.tensor.parallel over gloo on a "cpu"
device mesh of N local processes: q, k, v and the MLP's first Linear
ColwiseParallel, the two projections RowwiseParallel, the token embedding
RowwiseParallel (by vocabulary) and the LM head ColwiseParallel with its
logits left sharded for loss_parallel (so the head is split as dtrain splits
it; here the head is untied from the embedding, as DTensor cannot share one
parameter between two placements). Every rank gets the same batch; AdamW. Rank 0 prints one JSON line per timed
step: {"step", "ms", "loss"}. Needs torch 2.x (the baselines' venv)."""
import argparse
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import load  # noqa: E402


class Attention(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.q, self.k, self.v, self.c_proj = (nn.Linear(C, C) for _ in range(4))
        self.hs = C // NH

    def forward(self, h):
        B, T = h.shape[0], h.shape[1]
        # after a column split each rank holds n_heads / N whole heads: -1 finds how many
        q, k, v = (m(h).view(B, T, -1, self.hs).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, h):
        return self.c_proj(F.gelu(self.c_fc(h), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn, self.mlp = Attention(C, NH), MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg, p):
        super().__init__()
        T, V, L, NH, C, Vp = cfg
        self.V = V
        self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f, self.lm_head = nn.LayerNorm(C), nn.Linear(C, Vp, bias=False)
        wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw, lnfb = p
        with torch.no_grad():
            self.wte.weight.copy_(wte)
            self.wpe.weight.copy_(wpe)
            self.lm_head.weight.copy_(wte)
            self.ln_f.weight.copy_(lnfw)
            self.ln_f.bias.copy_(lnfb)
            for l, b in enumerate(self.h):
                for m, w, bias in ((b.ln_1, ln1w, ln1b), (b.ln_2, ln2w, ln2b), (b.attn.c_proj, apw, apb), (b.mlp.c_fc, fcw, fcb),
                                   (b.mlp.c_proj, fpw, fpb)):
                    m.weight.copy_(w[l])
                    m.bias.copy_(bias[l])
                for i, m in enumerate((b.attn.q, b.attn.k, b.attn.v)):
                    m.weight.copy_(qkvw[l][i * C:(i + 1) * C])
                    m.bias.copy_(qkvb[l][i * C:(i + 1) * C])

    def forward(self, idx):
        x = self.wte(idx)
        # sequence parallel: this rank's chunk of the positions (the embedding's output is sharded along them)
        start = dist.get_rank() * x.shape[1] if x.shape[1] != idx.shape[1] else 0
        x = x + self.wpe(torch.arange(start, start + x.shape[1]))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def parallelize(model, mesh, sp):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    seq = Shard(1) if sp else Replicate()
    top = {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
           "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)}
    if sp:
        top["ln_f"] = SequenceParallel()
    parallelize_module(model, mesh, top)
    for b in model.h:
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.c_proj": RowwiseParallel(output_layouts=seq), "mlp.c_fc": ColwiseParallel(),
                "mlp.c_proj": RowwiseParallel(output_layouts=seq)}
        if sp:  # Megatron-SP: the LayerNorms on sequence shards, gathered entering each sub-block
            plan.update({"ln_1": SequenceParallel(), "ln_2": SequenceParallel(),
                         "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                         "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))})
        parallelize_module(b, mesh, plan)
    return model


def worker(rank, a, addr):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=rank, world_size=a.nproc)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    mesh = init_device_mesh("cpu", (a.nproc,))
    cfg, params = load(a.weights)
    model = parallelize(GPT2(cfg, params), mesh, a.sp)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=False)
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(idx)
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
            loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0 and step >= a.warmup:
            print(json.dumps({"step": step - a.warmup + 1, "ms": round(ms, 3), "loss": round(float(loss.full_tensor()), 6)}),
                  flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sp", action="store_true", help="sequence parallelism (SequenceParallel on the LayerNorms)")
    a = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    mp.spawn(worker, args=(a, addr), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    main()
