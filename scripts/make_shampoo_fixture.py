#!/usr/bin/env python3
"""Shampoo's oracle: Meta's distributed_shampoo (tests/fixtures/shampoo/shampoo.safetensors).

distributed_shampoo is not on PyPI: clone https://github.com/facebookresearch/optimizers (read at commit f606606)
and point SHAMPOO_SRC at the clone. Run with the baselines' environment:
  SHAMPOO_SRC=/path/to/optimizers .venv-baselines/bin/python scripts/make_shampoo_fixture.py

One DistributedShampoo group on one process, its default root-inverse preconditioner (a symmetric eigen-decomposition,
the factors perturbed by epsilon before it), Adam grafting at the same beta2, decoupled weight decay, a largest block
of 8 so that every path of the blocking runs: "a" [20, 12] cut into six 2-D blocks (8 x 8 down to 4 x 4), "b" [1, 3]
squeezed to a vector, "c" [10] cut into two vector blocks, "d" [2, 2] merged into one vector of 4. Fixed gradients
(not the parameters' own, as for SOAP: scripts/make_soap_fixture.py), enough steps of them before preconditioning
starts that every factor is well conditioned: an inverse fourth root magnifies the eigen-decomposition's float32
error by the condition number, and two LAPACKs (torch's, Debian's) differ there. "c" takes a one-hot a step plus
noise, so that its 8-long block sees every direction. Written:
  "syn.<name>"          each parameter before the steps,
  "syn.grads.<name>"    its gradients [STEPS, ...],
  "syn.final.<name>"    it after the steps,
and in its metadata "shampoo" (the settings, as JSON).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

STEPS = 16
SETTINGS = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-12, graft_eps=1e-8, weight_decay=0.01, block=8,
                precondition_every=3, start=10, steps=STEPS)


def main():
    src = os.environ.get("SHAMPOO_SRC")
    if not src:
        sys.exit("make_shampoo_fixture.py: set SHAMPOO_SRC to a clone of github.com/facebookresearch/optimizers")
    sys.path.insert(0, src)
    from distributed_shampoo import AdamPreconditionerConfig, DistributedShampoo
    from distributed_shampoo.shampoo_types import WeightDecayType

    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "shampoo")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(23)
    syn = {"a": torch.randn(20, 12, generator=gen), "b": torch.randn(1, 3, generator=gen),
           "c": torch.randn(10, generator=gen), "d": torch.randn(2, 2, generator=gen)}
    grads = {n: torch.randn(STEPS, *p.shape, generator=gen) for n, p in syn.items()}
    grads["c"] = 0.1 * grads["c"] + 2.0 * torch.eye(10)[torch.arange(STEPS) % 10]
    params = {n: torch.nn.Parameter(p.clone()) for n, p in syn.items()}
    s = SETTINGS
    opt = DistributedShampoo(list(params.values()), lr=s["lr"], betas=(s["beta1"], s["beta2"]), epsilon=s["eps"],
                             weight_decay=s["weight_decay"], weight_decay_type=WeightDecayType.DECOUPLED,
                             max_preconditioner_dim=s["block"], precondition_frequency=s["precondition_every"],
                             start_preconditioning_step=s["start"], use_bias_correction=True,
                             grafting_config=AdamPreconditionerConfig(beta2=s["beta2"], epsilon=s["graft_eps"]))
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[n][k].clone()
        opt.step()
    out = {"syn." + n: p.contiguous() for n, p in syn.items()}
    out.update({"syn.grads." + n: g.contiguous() for n, g in grads.items()})
    out.update({"syn.final." + n: p.detach().clone().contiguous() for n, p in params.items()})
    path = os.path.join(out_dir, "shampoo.safetensors")
    save_file(out, path, metadata={"shampoo": json.dumps(SETTINGS, sort_keys=True)})
    print(f"shampoo: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
