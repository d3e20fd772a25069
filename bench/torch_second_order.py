#!/usr/bin/python3
"""PyTorch baselines for bench/second_order_overhead.sh: a GPT of dtrain's d6 shape (its Linears as nn.Linear, so
kfac-pytorch registers them; the head tied to the embedding as a plain matmul, which neither K-FAC preconditions) on
random tokens, one thread a rank, timed per step; over 1 rank or N ranks of torch.distributed (gloo, DDP). Optimizers:
adamw; kfac (kfac-pytorch's KFACPreconditioner at its defaults: factors and decompositions every step, damping 0.001,
COMM-OPT, SGD with momentum under it, as dtrain's --optimizer kfac --momentum 0.9); shampoo (Meta's distributed_shampoo
from $SHAMPOO_SRC: blocks of 1024, roots every 10 steps from step 10, Adam grafting, its DDP distribution over the
ranks, as dtrain's --optimizer shampoo). Prints one line: the mean ms a step over steps 2 to N.
usage: torch_second_order.py --optimizer adamw|kfac|shampoo [--ranks N] [--layers 6 --channels 384 --heads 6
       --vocab 256 --seq 64 --batch 4 --steps 11]"""
import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch_gpt_model import GPT


def make_optimizer(a, model, ranks):
    if a.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3), None
    if a.optimizer == "kfac":
        from kfac.preconditioner import KFACPreconditioner
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), KFACPreconditioner(model, lr=1e-3)
    src = os.environ.get("SHAMPOO_SRC")
    if not src:
        sys.exit("torch_second_order.py: set SHAMPOO_SRC to a clone of github.com/facebookresearch/optimizers")
    sys.path.insert(0, src)
    from distributed_shampoo import AdamPreconditionerConfig, DDPDistributedConfig, DistributedShampoo
    from distributed_shampoo.shampoo_types import DefaultSingleDeviceDistributedConfig
    cfg = DDPDistributedConfig(num_trainers_per_group=ranks) if ranks > 1 else DefaultSingleDeviceDistributedConfig
    opt = DistributedShampoo(model.parameters(), lr=1e-3, betas=(0.9, 0.999), epsilon=1e-12, max_preconditioner_dim=1024,
                             precondition_frequency=10, start_preconditioning_step=10,
                             grafting_config=AdamPreconditionerConfig(beta2=0.999, epsilon=1e-8), distributed_config=cfg)
    return opt, None


def worker(rank, a, ranks, out):
    torch.set_num_threads(1)
    if ranks > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=rank, world_size=ranks)
    torch.manual_seed(1)
    model = GPT(a.layers, a.heads, a.channels, a.vocab, a.seq)
    net = torch.nn.parallel.DistributedDataParallel(model) if ranks > 1 else model
    opt, pre = make_optimizer(a, model, ranks)
    g = torch.Generator().manual_seed(100 + rank)
    times = []
    for s in range(a.steps):
        tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(net(tok[:, :-1]).reshape(-1, a.vocab), tok[:, 1:].reshape(-1))
        loss.backward()
        if pre:
            pre.step()
        opt.step()
        times.append(time.perf_counter() - t0)
        if not math.isfinite(loss.item()):
            sys.exit(f"torch_second_order.py: {a.optimizer}: loss not finite at step {s + 1}")
    if rank == 0:
        out.put(1e3 * sum(times[1:]) / len(times[1:]))
    if ranks > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", required=True, choices=["adamw", "kfac", "shampoo"])
    p.add_argument("--ranks", type=int, default=1)
    for k, v in dict(layers=6, channels=384, heads=6, vocab=256, seq=64, batch=4, steps=11).items():
        p.add_argument("--" + k, type=int, default=v)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, a.ranks, out)) for r in range(a.ranks)]
    for x in procs:
        x.start()
    ms = out.get()
    for x in procs:
        x.join()
    print("%.0f" % ms)


if __name__ == "__main__":
    main()
