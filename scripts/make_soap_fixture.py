#!/usr/bin/env python3
"""SOAP's oracle: pytorch_optimizer's SOAP (tests/fixtures/soap/soap.safetensors).

Three parameters (a 6 x 5 matrix, a 40 x 3 one whose long side stays unrotated, a vector), given fixed random
gradients (not the parameters' own) for STEPS steps, one SOAP group (betas 0.9/0.95, unequal so that one cannot
stand for the other; weight decay 0.01, the bases refreshed every 3 steps, sides longer than 32 left unrotated). Why not a model's own gradients: SOAP is sensitive on
them. An eigenvector of two close eigenvalues is ill-determined in f32 and Adam's division by the rotated second
moment magnifies it: on a tiny Llama the oracle's own float32 and float64 runs part by 9e-4 after one update and by
0.34 after ten, and two f32 builds of dtrain (native, and the sanitizers' portable one) by as much; a comparison there
holds on one CPU path only. Fixed, well-conditioned gradients take that noise away. Written:
  "syn.<name>"          each parameter before the steps,
  "syn.grads.<name>"    its gradients [STEPS, ...],
  "syn.final.<name>"    it after the steps,
and in its metadata "soap" (the settings, as JSON).
Run with the baselines' environment plus pytorch_optimizer (pip install pytorch_optimizer):
  .venv-baselines/bin/python scripts/make_soap_fixture.py
"""
import json
import os

import torch
from pytorch_optimizer import SOAP
from safetensors.torch import save_file

STEPS = 10
SETTINGS = dict(lr=3e-3, beta1=0.9, beta2=0.95, weight_decay=0.01, precondition_frequency=3, max_precondition_dim=32,
                eps=1e-8, steps=STEPS)


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "soap")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    out = {}
    gen = torch.Generator().manual_seed(17)
    syn = {"a": torch.randn(6, 5, generator=gen), "b": torch.randn(40, 3, generator=gen), "c": torch.randn(7, generator=gen)}
    grads = {n: torch.randn(STEPS, *p.shape, generator=gen) for n, p in syn.items()}
    params = {n: torch.nn.Parameter(p.clone()) for n, p in syn.items()}
    s = SETTINGS
    opt = SOAP(list(params.values()), lr=s["lr"], betas=(s["beta1"], s["beta2"]), weight_decay=s["weight_decay"],
               precondition_frequency=s["precondition_frequency"], max_precondition_dim=s["max_precondition_dim"],
               eps=s["eps"])
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[n][k].clone()
        opt.step()
    out.update({"syn." + n: p.contiguous() for n, p in syn.items()})
    out.update({"syn.grads." + n: g.contiguous() for n, g in grads.items()})
    out.update({"syn.final." + n: p.detach().clone().contiguous() for n, p in params.items()})
    meta = {"soap": json.dumps(SETTINGS, sort_keys=True)}
    path = os.path.join(out_dir, "soap.safetensors")
    save_file(out, path, metadata=meta)
    print(f"soap: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
