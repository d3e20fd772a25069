#!/usr/bin/env python3
"""PyTorch 2.x sharded-training baselines for `dtrain bench train --zero S
--baseline fsdp` (and DeepSpeed's for --baseline deepspeed): the GPT-2 of
torch_gpt2.py as modules (one per block, so that FSDP shards and gathers
block by block), from the same llm.c weights, N local processes over gloo,
--threads threads each, AdamW, each rank on its own random batch.

  --mode zero1            DDP + ZeroRedundancyOptimizer (ZeRO-1)
  --mode fsdp-keep        FSDP2 fully_shard, reshard_after_forward=False
                          (parameters stay gathered from forward to backward: ZeRO-2's traffic)
  --mode fsdp             FSDP2 fully_shard, reshard_after_forward=True (ZeRO-3)
  --mode deepspeed1|2|3   DeepSpeed's ZeRO stage 1, 2 or 3 on its CPU accelerator

Rank 0 prints one JSON line per timed step: {"step", "ms", "loss"}. Needs
the virtual environment of scripts/make-baselines-venv.sh."""
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
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import load  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, C, NH, tensors):
        super().__init__()
        self.C, self.NH = C, NH
        self.w = torch.nn.ParameterList([torch.nn.Parameter(t.detach().clone()) for t in tensors])

    def forward(self, x):
        ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb = self.w
        B, T, C = x.shape
        hs = C // self.NH
        h = F.layer_norm(x, (C,), ln1w, ln1b, 1e-5)
        q, k, v = (t.view(B, T, self.NH, hs).transpose(1, 2) for t in F.linear(h, qkvw, qkvb).split(C, dim=2))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + F.linear((att @ v).transpose(1, 2).reshape(B, T, C), apw, apb)
        h = F.layer_norm(x, (C,), ln2w, ln2b, 1e-5)
        return x + F.linear(F.gelu(F.linear(h, fcw, fcb), approximate="tanh"), fpw, fpb)


class GPT2(torch.nn.Module):
    def __init__(self, cfg, p):
        super().__init__()
        _, self.V, L, NH, C, _ = cfg
        self.C = C
        self.wte = torch.nn.Parameter(p[0].detach().clone())
        self.wpe = torch.nn.Parameter(p[1].detach().clone())
        self.blocks = torch.nn.ModuleList([Block(C, NH, [p[i][l] for i in range(2, 14)]) for l in range(L)])
        self.lnfw = torch.nn.Parameter(p[14].detach().clone())
        self.lnfb = torch.nn.Parameter(p[15].detach().clone())

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.wte[idx] + self.wpe[:T]
        for b in self.blocks:
            x = b(x)
        logits = F.linear(F.layer_norm(x, (self.C,), self.lnfw, self.lnfb, 1e-5), self.wte)
        return F.cross_entropy(logits[..., :self.V].reshape(-1, self.V), tgt.reshape(-1))


def build(a, cfg, params, rank):
    """The wrapped model and a step function for the mode."""
    model = GPT2(cfg, params)
    adam = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    if a.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adam)
    elif a.mode.startswith("fsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (a.nproc,))
        keep = a.mode == "fsdp-keep"
        for b in model.blocks:
            fully_shard(b, mesh=mesh, reshard_after_forward=not keep)
        fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
        opt = torch.optim.AdamW(model.parameters(), **adam)
    else:
        import deepspeed
        stage = int(a.mode[-1])
        ds = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
                                                       "torch_adam": True}},
              "zero_optimization": {"stage": stage, "overlap_comm": True}, "steps_per_print": 1 << 30}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)

        def step(idx, tgt):
            loss = engine(idx, tgt)
            engine.backward(loss)
            engine.step()
            return loss
        return step

    def step(idx, tgt):
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        return loss
    return step


def worker(rank, a, port):
    torch.set_num_threads(a.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(a.nproc), LOCAL_WORLD_SIZE=str(a.nproc))
    if a.mode.startswith("deepspeed"):
        os.environ["DS_ACCELERATOR"] = "cpu"
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    cfg, params = load(a.weights)
    step = build(a, cfg, params, rank)
    g = torch.Generator().manual_seed(1 + rank)
    idx = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, cfg[1], (a.batch, a.seq), generator=g)
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = step(idx, tgt)
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0 and s >= a.warmup:
            print(json.dumps({"step": s - a.warmup + 1, "ms": ms, "loss": float(loss.item())}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--mode", required=True, choices=["zero1", "fsdp-keep", "fsdp", "deepspeed1", "deepspeed2", "deepspeed3"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, port), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    sys.exit(main())
