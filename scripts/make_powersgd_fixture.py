#!/usr/bin/python3
"""PowerSGD's fixtures (tests/fixtures/compress/powersgd_r<R>.safetensors): two ranks of PyTorch DDP over gloo with
torch's powerSGD_hook (error feedback, warm start, start_powerSGD_iter 2, min_compression_rate 2) on a small model of
Linears and a 3-d parameter, four steps; the hook's fourth call (the second compressed, warm-started) recorded:
  "r<k>.grad.<name>"     f32: rank k's gradient as backward left it (before the hook adds the residual)
  "r<k>.res.<name>"      f32: rank k's residual going in (the hook's error_dict, per parameter)
  "r<k>.out.<name>"      f32: the averaged gradient the hook returned on rank k
  "r<k>.newres.<name>"   f32: rank k's residual coming out
  "q.<name>"             f32 [m, r]: the Q going in (last step's average; the hook orthogonalises it), compressed ones
  "newq.<name>"          f32 [m, r]: the Q coming out
metadata: "names" (the parameters, the bucket's order), "ratio" (compression_stats()'s rate), "rank".
Needs torch (scripts/make-baselines-venv.sh). usage: make_powersgd_fixture.py [FIXTURES]"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 32)
        self.l3 = torch.nn.Linear(32, 32)
        self.l4 = torch.nn.Linear(32, 3)
        self.e = torch.nn.Parameter(torch.randn(8, 5, 6) * 0.1)

    def forward(self, x):
        h = torch.tanh(self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x))))))
        return self.l4(h), (self.e * self.e.sum(0, keepdim=True)).sum()


def run(rank, R, path, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = Net()
    names = {id(p): n for n, p in net.named_parameters()}
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=100)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=R, start_powerSGD_iter=2,
                               min_compression_rate=2, use_error_feedback=True, warm_start=True)
    rec, calls = {}, [0]

    def hook(st, bucket):
        k = calls[0]
        calls[0] += 1
        grads, params = bucket.gradients(), bucket.parameters()
        order = [names[id(p)] for p in params]
        if k == 3:
            rec["names"] = order
            err = st.error_dict[bucket.index()]
            at = 0
            for n, g in zip(order, grads):
                rec[f"r{rank}.grad.{n}"] = g.detach().clone()
                rec[f"r{rank}.res.{n}"] = err[at:at + g.numel()].view_as(g).clone()
                at += g.numel()
            rec["q"] = q_slices(st, bucket, grads, order, R)
        fut = psgd.powerSGD_hook(st, bucket)

        def after(f):
            out = f.value()
            if k == 3:
                err, at = st.error_dict[bucket.index()], 0
                for n, g in zip(order, grads):
                    rec[f"r{rank}.out.{n}"] = out[at:at + g.numel()].view_as(g).clone()
                    rec[f"r{rank}.newres.{n}"] = err[at:at + g.numel()].view_as(g).clone()
                    at += g.numel()
                rec["newq"] = q_slices(st, bucket, grads, order, R)
            return out
        return fut.then(after)

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        x, y = torch.randn(6, 16, generator=g), torch.randint(0, 3, (6,), generator=g)
        logits, extra = ddp(x)
        loss = torch.nn.functional.cross_entropy(logits, y) + extra
        opt.zero_grad()
        loss.backward()
        opt.step()
    rec["ratio"] = state.compression_stats()[0]
    torch.save(rec, os.path.join(path, f"rank{rank}.pt"))
    dist.destroy_process_group()


def q_slices(st, bucket, grads, order, R):
    """The hook's Q memory per compressed tensor: tensors grouped by shape, in order of first appearance."""
    groups = {}
    for n, g in zip(order, grads):
        m = g.view(g.shape[0], -1)
        r = min(m.shape[0], m.shape[1], R)
        if psgd._should_compress(m.shape[0], m.shape[1], r, st.min_compression_rate)[0]:
            groups.setdefault(tuple(m.shape), []).append((n, m.shape[1], r))
    mem, at, out = st.q_memory_dict[bucket.index()], 0, {}
    for items in groups.values():
        for n, m, r in items:
            out[n] = mem[at:at + m * r].view(m, r).clone()
            at += m * r
    assert at == mem.numel()
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    os.makedirs(os.path.join(root, "compress"), exist_ok=True)
    for R, port in ((2, 29611), (4, 29612)):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(run, args=(R, tmp, port), nprocs=2, join=True)
            recs = [torch.load(os.path.join(tmp, f"rank{k}.pt")) for k in range(2)]
        out = {}
        for rec in recs:
            out.update({k: v.float().contiguous() for k, v in rec.items() if k.startswith("r") and k != "ratio" and isinstance(v, torch.Tensor)})
        out.update({f"q.{n}": v.contiguous() for n, v in recs[0]["q"].items()})
        out.update({f"newq.{n}": v.contiguous() for n, v in recs[0]["newq"].items()})
        meta = {"names": ",".join(recs[0]["names"]), "ratio": repr(recs[0]["ratio"]), "rank": str(R)}
        save_file(out, os.path.join(root, "compress", f"powersgd_r{R}.safetensors"), metadata=meta)
        print(f"rank {R}: {len(out)} tensors, ratio {recs[0]['ratio']:.6f}, order {meta['names']}")


if __name__ == "__main__":
    main()
