#!/usr/bin/python3
"""PyTorch's side of bench/compress_resnet.sh: the README's resnet:small recipe on Fashion-MNIST (bench/torch_resnet.py's
model, torchvision's BasicBlock ResNet with a 3x3 stem of 16 and stages of 16, 32 and 64 channels: bench/torch_small_resnet.py,
without torchvision), DistributedDataParallel over gloo on N local ranks of one thread each, SGD with
momentum and weight decay, dtrain's cosine schedule with linear warm-up, each epoch's global order one permutation
shared by the ranks (each takes its slice of a step's global batch); dense, or with torch's powerSGD_hook (rank R,
from step S; error feedback and warm start, its defaults). Pixels scaled to [0, 1] as dtrain reads them. Prints
{"test_accuracy": ...} (rank 0, the 10,000 test images, BatchNorm's running averages). PyTorch's own initialisation:
compare its gap to its own dense run. Needs torch (scripts/make-baselines-venv.sh)."""
import argparse
import gzip
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
from torch_small_resnet import SmallResNet  # noqa: E402


def build():
    return SmallResNet(10)


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def images(a, split):
    x = idx(os.path.join(a.data, f"{split}-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y = idx(os.path.join(a.data, f"{split}-labels-idx1-ubyte.gz")).astype(np.int64)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


def lr_at(a, step, total):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = min(1.0, (step - a.warmup) / max(1, total - a.warmup))
    return 0.5 * (1 + math.cos(math.pi * p)) * a.lr


def worker(rank, a, addr):
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=rank, world_size=a.nproc)
    model = torch.nn.parallel.DistributedDataParallel(build())
    if a.powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd, start_powerSGD_iter=max(2, a.start))
        model.register_comm_hook(state, psgd.powerSGD_hook)
    (x, y), (tx, ty) = images(a, "train"), images(a, "t10k")
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    per_epoch = len(x) // (a.batch * a.nproc)
    total = per_epoch * a.epochs
    step = 0
    for e in range(a.epochs):
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(a.seed + e + 1))
        model.train()
        for i in range(per_epoch):
            at = perm[(i * a.nproc + rank) * a.batch:(i * a.nproc + rank + 1) * a.batch]
            for group in opt.param_groups:
                group["lr"] = lr_at(a, step, total)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x[at]), y[at]).backward()
            opt.step()
            step += 1
    if rank == 0:
        model.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, len(tx), 500):
                right += (model.module(tx[i:i + 500]).argmax(1) == ty[i:i + 500]).sum().item()
        print(json.dumps({"test_accuracy": right / len(tx), "steps": total}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--powersgd", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, f"127.0.0.1:{port}"), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    sys.exit(main())
