#!/usr/bin/python3
"""PyTorch pipeline-parallel baseline for `dtrain bench train --pp N
--baseline torch`: GPT-2 as nn.Modules from the same llm.c weights, cut into
N stages at the units dtrain's split chooses (--split: each stage's first
unit, unit 0 the embeddings, 1..L the blocks, L+1 the final LayerNorm and
head; the head is a copy of wte, untied, as torch.distributed.pipelining
cannot share one parameter between stages), one stage per process over gloo,
run by torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B or, for
zb1, ScheduleInterleavedZeroBubble with one stage per rank (its zero-bubble
schedule; ZB-H1's shape there), or for interleaved ScheduleInterleaved1F1B
with --virtual V stages per rank (rank r: stages r, r+N, ..; --split then
gives N x V starts), with M micro-batches of --batch each; AdamW. The last stage prints one JSON line per
timed step: {"step", "ms", "loss"}. Needs torch 2.x (the baselines' venv)."""
import argparse
import json
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
from torch_tp import Block  # noqa: E402


class Stage(nn.Module):
    """Units [a, b) of GPT-2."""

    def __init__(self, cfg, p, a, b):
        super().__init__()
        T, V, L, NH, C, Vp = cfg
        wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw, lnfb = p
        self.first, self.last = a == 0, b == L + 2
        self.layers = list(range(max(a - 1, 0), min(b - 1, L)))
        with torch.no_grad():
            if self.first:
                self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(T, C)
                self.wte.weight.copy_(wte)
                self.wpe.weight.copy_(wpe)
            self.h = nn.ModuleList(Block(C, NH) for _ in self.layers)
            for b_, l in zip(self.h, self.layers):
                for m, w, bias in ((b_.ln_1, ln1w, ln1b), (b_.ln_2, ln2w, ln2b), (b_.attn.c_proj, apw, apb), (b_.mlp.c_fc, fcw, fcb),
                                   (b_.mlp.c_proj, fpw, fpb)):
                    m.weight.copy_(w[l])
                    m.bias.copy_(bias[l])
                for i, m in enumerate((b_.attn.q, b_.attn.k, b_.attn.v)):
                    m.weight.copy_(qkvw[l][i * C:(i + 1) * C])
                    m.bias.copy_(qkvb[l][i * C:(i + 1) * C])
            if self.last:
                self.ln_f, self.lm_head = nn.LayerNorm(C), nn.Linear(C, Vp, bias=False)
                self.ln_f.weight.copy_(lnfw)
                self.ln_f.bias.copy_(lnfb)
                self.lm_head.weight.copy_(wte)

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for b in self.h:
            x = b(x)
        if self.last:
            x = self.lm_head(self.ln_f(x))
        return x


def worker(rank, a, addr):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=rank, world_size=a.nproc)
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble)
    cfg, params = load(a.weights)
    first = [int(u) for u in a.split.split(",")] + [cfg[2] + 2]
    v = a.virtual if a.schedule == "interleaved" else 1
    n = a.nproc * v
    mods = [Stage(cfg, params, first[g], first[g + 1]) for g in range(rank, n, a.nproc)]
    stages = [PipelineStage(m, g, n, torch.device("cpu")) for m, g in zip(mods, range(rank, n, a.nproc))]
    stage, module = stages[0], nn.ModuleList(mods)
    V = cfg[1]

    def loss_fn(logits, tgt):
        return F.cross_entropy(logits[..., :V].flatten(0, 1), tgt.flatten())

    if a.schedule == "zb1":
        sched = ScheduleInterleavedZeroBubble([stage], n_microbatches=a.micro, loss_fn=loss_fn)
    elif a.schedule == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=a.micro, loss_fn=loss_fn)
    else:
        sched = (ScheduleGPipe if a.schedule == "gpipe" else Schedule1F1B)(stage, n_microbatches=a.micro, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (a.batch * a.micro, a.seq), generator=g)
    tgt = torch.randint(0, V, (a.batch * a.micro, a.seq), generator=g)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=False)
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        losses = []
        if rank == 0:
            sched.step(idx)
        elif rank == a.nproc - 1:
            sched.step(target=tgt, losses=losses)
        else:
            sched.step()
        opt.step()
        dist.barrier()
        ms = (time.perf_counter() - t0) * 1e3
        if rank == a.nproc - 1 and step >= a.warmup:
            loss = sum(float(x) for x in losses) / len(losses)
            print(json.dumps({"step": step - a.warmup + 1, "ms": round(ms, 3), "loss": round(loss, 6)}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--split", required=True, help="each stage's first unit, comma-separated (0,...)")
    ap.add_argument("--schedule", choices=("gpipe", "1f1b", "zb1", "interleaved"), default="1f1b")
    ap.add_argument("--virtual", type=int, default=2, help="interleaved: stages per rank")
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--batch", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    mp.spawn(worker, args=(a, addr), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    main()
