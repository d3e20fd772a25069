#!/usr/bin/python3
"""PyTorch's side of bench/compress_accuracy.sh: the demo's GPT-2 from dtrain's initial weights (an llm.c model file),
DistributedDataParallel over gloo on 2 local ranks, AdamW (dtrain's defaults), dtrain's cosine schedule with linear
warm-up, each rank on its own random windows of an llm.c token file; dense, or with torch's powerSGD_hook (rank R,
from step S; error feedback and warm start, its defaults). Prints {"val_loss": ...} (rank 0: the mean over
--eval-batches windows of the validation file, in order). Needs torch (scripts/make-baselines-venv.sh)."""
import argparse
import json
import math
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp import GPT2  # noqa: E402
from torch_gpt2 import load  # noqa: E402


def tokens(path):
    h = np.fromfile(path, dtype="<i4", count=256)
    assert h[0] == 20240520 and h[1] == 1, f"{path}: not a uint16 llm.c token file"
    return torch.from_numpy(np.fromfile(path, dtype="<u2", offset=1024, count=int(h[2])).astype(np.int64))


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = min(1.0, (step - a.warmup) / (a.steps - a.warmup))
    return a.lr_min + 0.5 * (1 + math.cos(math.pi * p)) * (a.lr - a.lr_min)


def worker(rank, a, addr):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=rank, world_size=2)
    cfg, params = load(a.weights)
    model = torch.nn.parallel.DistributedDataParallel(GPT2(cfg, params), bucket_cap_mb=25)
    if a.powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd, start_powerSGD_iter=max(2, a.start))
        model.register_comm_hook(state, psgd.powerSGD_hook)
    train, val = tokens(a.train), tokens(a.val)
    g = torch.Generator().manual_seed(1 + rank)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    T = a.seq
    for step in range(a.steps):
        at = torch.randint(0, len(train) - T - 1, (a.batch,), generator=g)
        x = torch.stack([train[i:i + T] for i in at])
        y = torch.stack([train[i + 1:i + T + 1] for i in at])
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        opt.step()
    if rank == 0:
        with torch.no_grad():
            losses = []
            for b in range(a.eval_batches):
                at = [(b * a.batch + i) * T for i in range(a.batch)]
                x = torch.stack([val[i:i + T] for i in at])
                y = torch.stack([val[i + 1:i + T + 1] for i in at])
                losses.append(model.module(x, y).item())
        print(json.dumps({"val_loss": sum(losses) / len(losses)}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--lr-min", type=float, default=4e-4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--powersgd", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, f"127.0.0.1:{port}"), nprocs=2, join=True)


if __name__ == "__main__":
    sys.exit(main())
