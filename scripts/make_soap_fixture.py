#!/usr/bin/env python3
"""SOAP's oracle: pytorch_optimizer's SOAP on a tiny Hugging Face Llama (tests/fixtures/soap/llama.safetensors).

STEPS steps, a new random batch a step, every parameter in one SOAP group (betas 0.95/0.95, weight decay 0.01,
the bases refreshed every 3 steps, sides longer than 32 left unrotated). The sides it rotates are all full rank in
this model (multi-head attention: q, k, v, o are 32 x 32; the MLP's 48 x 32 and 32 x 48 and the 101 x 32 tables
rotate their 32 side only): a rank-deficient statistic's null space has no one basis, and the first basis comes
from an eigen-decomposition, which two LAPACKs may choose differently there. Written:
  the model's weights before training under their Hugging Face names (f32),
  "inputs", "targets"   int32 [STEPS, B, T],
  "final.<name>"        every parameter after STEPS steps,
  "final64.<name>"      the same from the same run in float64 (model and optimizer), cast to f32,
  "losses"              f32 [STEPS],
SOAP is sensitive: a basis vector of two close eigenvalues is ill-determined in f32, and Adam's division by the
rotated second moment magnifies it (here float32 and float64 runs of the oracle part by 9e-4 after the first update
and by about 0.3 after 10 steps). The test therefore holds dtrain's f32 SOAP as close to the float64 run as the
oracle's own f32 run is (at most twice its distance), not to the f32 run's digits.
  "syn.<name>", "syn.grads.<name>" [STEPS, ...], "syn.final.<name>": a well-conditioned case where that noise is
      absent: three parameters (a 6 x 5 matrix, a 40 x 3 one whose long side stays unrotated, a vector) given
      fixed random gradients (not the parameters' own), every update of which the test matches to 1e-5,
and in its metadata "config" (config.json) and "soap" (the settings, as JSON).
Run with the baselines' environment plus pytorch_optimizer (pip install pytorch_optimizer):
  .venv-baselines/bin/python scripts/make_soap_fixture.py
"""
import json
import os

import torch
from pytorch_optimizer import SOAP
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

B, T, STEPS = 2, 32, 10
SETTINGS = dict(lr=3e-3, beta1=0.95, beta2=0.95, weight_decay=0.01, precondition_frequency=3, max_precondition_dim=32,
                eps=1e-8, steps=STEPS)


def run(dtype, cfg, inputs, targets):
    torch.manual_seed(5)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    weights = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    model = model.to(dtype)
    s = SETTINGS
    opt = SOAP(model.parameters(), lr=s["lr"], betas=(s["beta1"], s["beta2"]), weight_decay=s["weight_decay"],
               precondition_frequency=s["precondition_frequency"], max_precondition_dim=s["max_precondition_dim"],
               eps=s["eps"])
    losses = []
    for k in range(STEPS):
        opt.zero_grad()
        logits = model(input_ids=inputs[k]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets[k].reshape(-1))
        losses.append(loss.item())
        loss.backward()
        opt.step()
    final = {n: p.detach().float().clone().contiguous() for n, p in model.named_parameters()}
    return weights, final, losses


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "soap")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=32, rms_norm_eps=1e-5, initializer_range=0.2,
                      attn_implementation="eager", tie_word_embeddings=False, rope_theta=10000.0)
    g = torch.Generator().manual_seed(13)
    tokens = torch.randint(0, cfg.vocab_size, (STEPS, B, T + 1), generator=g)
    inputs, targets = tokens[:, :, :T].contiguous(), tokens[:, :, 1:].contiguous()
    weights, final, losses = run(torch.float32, cfg, inputs, targets)
    _, final64, _ = run(torch.float64, cfg, inputs, targets)
    out = dict(weights)
    out.update({"final." + n: p for n, p in final.items()})
    out.update({"final64." + n: p for n, p in final64.items()})
    out.update({"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "losses": torch.tensor(losses)})
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
    meta = {"config": json.dumps(cfg.to_dict(), sort_keys=True), "soap": json.dumps(SETTINGS, sort_keys=True)}
    path = os.path.join(out_dir, "llama.safetensors")
    save_file(out, path, metadata=meta)
    print(f"soap: losses {losses[0]:.4f} -> {losses[-1]:.4f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
