#!/usr/bin/python3
"""PyTorch baseline for expert parallelism (bench/moe_ep.sh): a Mixtral from a Hugging Face folder (transformers'
MixtralForCausalLM, eager) whose sparse MoE blocks are replaced by an expert-parallel block over gloo: rank r keeps
experts [r E/P, (r+1) E/P), routes its tokens over all E (softmax top-k, renormalised, as Mixtral), sends each
(token, choice) row to the rank holding its expert with torch.distributed.nn's all_to_all_single (autograd through
it; the counts exchanged first), runs its experts on what arrives, and sends the outputs back. The other weights are
averaged over the ranks after backward, the experts' not (each rank holds its own: 1/P of the data-parallel
average's sum). AdamW; each rank reads its rows of the same token file dtrain reads, in order. Prints one JSON line a
timed step (rank 0): {"step", "ms", "loss", "a2a_bytes"} (a2a_bytes: what this rank's exchanges sent to the other
ranks). Needs torch and transformers (scripts/make-baselines-venv.sh)."""
import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.multiprocessing as mp
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

# the autograd-aware all_to_all_single (its backward exchanges the gradients) is deprecated in PyTorch 2.15 in favour of
# a private module; it still does what this baseline needs, so its warning is not printed every step
warnings.filterwarnings("ignore", message=".*all_to_all_single is deprecated.*", category=FutureWarning)


class EPMoE(torch.nn.Module):
    def __init__(self, block, rank, world, counter):
        super().__init__()
        E = block.experts.gate_up_proj.shape[0]
        self.E, self.K, self.rank, self.world, self.El = E, block.top_k, rank, world, E // world
        lo, hi = rank * self.El, (rank + 1) * self.El
        self.gate = block.gate.weight  # [E, C], replicated
        self.gate_up = torch.nn.Parameter(block.experts.gate_up_proj.data[lo:hi].clone())  # [El, 2F, C]
        self.down = torch.nn.Parameter(block.experts.down_proj.data[lo:hi].clone())  # [El, C, F]
        self.counter = counter

    def forward(self, h):
        B, T, C = h.shape
        x = h.reshape(-1, C)
        probs = F.softmax(x @ self.gate.t(), dim=-1)
        w, idx = probs.topk(self.K, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        rows = x[order // self.K]  # the pairs sorted by expert
        counts = torch.bincount(flat, minlength=self.E)
        send = counts.reshape(self.world, self.El)  # to rank j: its experts' counts
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # every rank's counts for this rank's experts
        in_split = send.sum(1).tolist()
        out_split = recv.sum(1).tolist()
        self.counter[0] += (sum(in_split) - in_split[self.rank]) * C * 4
        got = dnn.all_to_all_single(torch.empty(sum(out_split), C), rows, out_split, in_split)
        # rows arrive rank by rank, each rank's by expert: run each local expert on its rows
        ys = torch.empty_like(got)
        parts, at = [], 0
        for s in range(self.world):
            for e in range(self.El):
                n = int(recv[s, e])
                parts.append((e, at, n))
                at += n
        outs = [None] * len(parts)
        for e in range(self.El):
            mine = [(k, a, n) for k, (ee, a, n) in enumerate(parts) if ee == e and n]
            if not mine:
                continue
            xe = torch.cat([got[a:a + n] for _, a, n in mine])
            g, u = (xe @ self.gate_up[e].t()).chunk(2, dim=-1)
            ye = (F.silu(g) * u) @ self.down[e].t()
            at = 0
            for k, _, n in mine:
                outs[k] = ye[at:at + n]
                at += n
        ys = torch.cat([o if o is not None else got[a:a] for o, (_, a, _) in zip(outs, parts)])
        self.counter[0] += (sum(out_split) - out_split[self.rank]) * C * 4
        back = dnn.all_to_all_single(torch.empty(sum(in_split), C), ys, in_split, out_split)
        y = torch.zeros_like(x)
        y.index_add_(0, order // self.K, back * w.reshape(-1)[order].unsqueeze(1))
        return y.reshape(B, T, C)


def tokens(path):
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(1024), dtype=np.int32)
        return np.frombuffer(f.read(), dtype=np.uint16)[: int(head[2])].astype(np.int64)


def worker(rank, a):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ep)
    torch.set_num_threads(a.threads)
    m = AutoModelForCausalLM.from_pretrained(a.folder, attn_implementation="eager", dtype=torch.float32)
    counter = [0]
    for layer in m.model.layers:
        layer.mlp = EPMoE(layer.mlp, rank, a.ep, counter)
    m.train()
    experts = {id(p) for layer in m.model.layers for p in (layer.mlp.gate_up, layer.mlp.down)}
    shared = [p for p in m.parameters() if id(p) not in experts]
    opt = torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    toks = tokens(a.data)
    V = m.config.vocab_size
    per = a.batch * a.seq
    for step in range(a.warmup + a.steps):
        at = (step * a.ep + rank) * per
        chunk = torch.from_numpy(toks[at: at + per + 1].copy())
        idx, tgt = chunk[:-1].reshape(a.batch, a.seq), chunk[1:].reshape(a.batch, a.seq)
        dist.barrier()
        t0 = time.perf_counter()
        counter[0] = 0
        opt.zero_grad(set_to_none=True)
        logits = m(input_ids=idx).logits
        loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
        loss.backward()
        for p in shared:  # the replicated weights' average; an expert's gradient already holds every rank's tokens
            if p.grad is None:  # (an expert no token of this rank chose this step)
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= a.ep
        for layer in m.model.layers:
            for p in (layer.mlp.gate_up, layer.mlp.down):
                if p.grad is not None:
                    p.grad /= a.ep
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0 and step >= a.warmup:
            print(json.dumps({"step": step - a.warmup + 1, "ms": ms, "loss": loss.item(), "a2a_bytes": counter[0]}, separators=(",", ":")), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--port", type=int, default=29533)
    a = ap.parse_args()
    mp.spawn(worker, args=(a,), nprocs=a.ep, join=True)


if __name__ == "__main__":
    sys.exit(main())
