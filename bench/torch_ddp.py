#!/usr/bin/python3
"""PyTorch DDP baseline for `dtrain bench train --nproc N --baseline torch`:
the GPT-2 of torch_gpt2.py, from the same llm.c weights, wrapped in
DistributedDataParallel over gloo (25 MiB buckets; one with PowerSGD's hook), N local
processes with --threads threads each (or, with --rank R --master ADDR:PORT,
one rank of a job across machines), AdamW, each rank on its own random
batch. Rank 0 prints one JSON line per timed step: {"step", "ms", "loss"}.
Debian's python3-torch or torch from PyPI."""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import forward, load  # noqa: E402


class GPT2(torch.nn.Module):
    def __init__(self, cfg, params):
        super().__init__()
        self.cfg = cfg
        self.shape = [len(t) if isinstance(t, list) else 0 for t in params]
        self.leaves = torch.nn.ParameterList(
            [torch.nn.Parameter(x.detach()) for t in params for x in (t if isinstance(t, list) else [t])])

    def forward(self, idx, tgt):
        p, k = [], 0
        for n in self.shape:
            if n:
                p.append(list(self.leaves[k:k + n]))
                k += n
            else:
                p.append(self.leaves[k])
                k += 1
        return forward(self.cfg, p, idx, tgt)


def worker(rank, a, addr):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=rank, world_size=a.nproc)
    cfg, params = load(a.weights)
    module = GPT2(cfg, params)
    # with the hook, one bucket: the hook chains its allreduces in callbacks that gloo's threads run, so several
    # buckets' chains are issued in an order that differs between ranks (gloo: "Received data size doesn't match
    # expected size", or every rank waiting), which 124M's 20 buckets met in most runs and d6's 3 in some
    mb = sum(x.numel() for x in module.parameters()) * 4 / 2**20 + 1 if a.powersgd else 25
    model = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=mb)
    if a.powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd, start_powerSGD_iter=2)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    g = torch.Generator().manual_seed(1 + rank)
    idx = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0 and step >= a.warmup:
            print(json.dumps({"step": step - a.warmup + 1, "ms": ms, "loss": loss.item()}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--powersgd", type=int, default=0)  # PowerSGD's rank: its hook on DDP (0: none)
    # one rank of a job across machines (bench/cluster_ddp.sh), started on each: this rank and rank 0's address
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--master", default="")
    a = ap.parse_args()
    if a.rank >= 0:
        return worker(a.rank, a, a.master)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, f"127.0.0.1:{port}"), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    sys.exit(main())
