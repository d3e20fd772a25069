#!/usr/bin/python3
"""PyTorch baseline for `dtrain bench train --model resnet50 --synthetic`:
Horovod's pytorch_synthetic_benchmark.py with DDP over gloo instead of
Horovod. torchvision's model, one random batch (torch.randn images, random
labels), SGD lr 0.01, N local processes with --threads threads each. Rank 0
prints one JSON line per timed iteration: {"iter", "ms", "img_per_s_worker"}.
Debian's python3-torch with python3-torchvision, or torch and torchvision
from PyPI (scripts/make-baselines-venv.sh)."""
import argparse
import json
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision


def shape(model):
    """dtrain's synthetic images: ImageNet's for torchvision's ResNets,
    Fashion-MNIST's for its small one."""
    return (1, 28, 28, 10) if model == "resnet:small" else (3, 224, 224, 1000)


def build(model):
    if model != "resnet:small":
        return getattr(torchvision.models, model)(num_classes=1000)
    from torchvision.models.resnet import BasicBlock
    m = torchvision.models.ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10)
    m.conv1 = torch.nn.Conv2d(1, 16, 3, 1, 1, bias=False)
    m.bn1 = torch.nn.BatchNorm2d(16)
    m.maxpool = torch.nn.Identity()
    m.inplanes = 16
    m.layer1 = m._make_layer(BasicBlock, 16, 2)
    m.layer2 = m._make_layer(BasicBlock, 32, 2, stride=2)
    m.layer3 = m._make_layer(BasicBlock, 64, 2, stride=2)
    m.layer4 = torch.nn.Identity()
    m.fc = torch.nn.Linear(64, 10)
    return m


def worker(rank, a, port):
    torch.set_num_threads(a.threads)
    if a.nproc > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.nproc)
    torch.manual_seed(1 + rank)
    model = build(a.model)
    if a.nproc > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    c, h, w, k = shape(a.model)
    data = torch.randn(a.batch, c, h, w)
    target = torch.randint(0, k, (a.batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for it in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0 and it >= a.warmup:
            print(json.dumps({"iter": it - a.warmup, "ms": ms, "img_per_s_worker": a.batch / (ms / 1e3)}), flush=True)
    if a.nproc > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    if a.nproc == 1:
        worker(0, a, 0)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, port), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    main()
