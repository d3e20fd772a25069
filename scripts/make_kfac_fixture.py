#!/usr/bin/env python3
"""K-FAC's oracle: kfac-pytorch's KFACPreconditioner on tiny Hugging Face models (tests/fixtures/kfac/<name>.safetensors).

Each case trains a tiny random Llama (or Qwen 2, whose q, k and v have biases) for STEPS steps, a new random batch a
step, with kfac-pytorch preconditioning every nn.Linear but the head (skip_layers=["lm_head"]: dtrain's K-FAC leaves
the head, the embedding and the norms as they are) and a torch optimizer updating on the result. Written:
  the model's weights before training under their Hugging Face names (f32),
  "inputs", "targets"    int32 [STEPS, B, T],
  "pgrad0.<name>"        every parameter's gradient after the preconditioner's step 0 (before the optimizer's),
  "pgradN.<name>"        the same at the last step,
  "final.<name>"         every parameter after STEPS updates,
  "losses"               f32 [STEPS],
and in its metadata "config" (the model's config.json) and "kfac" (the settings, as JSON).

The image cases (tests/fixtures/kfac/mlp_eigen, resnet_small_eigen) precondition every Linear and Conv2d of dtrain's
MLP (nn.Sequential(Linear, ReLU, ...)) and of its resnet:small (bench/torch_small_resnet.py: torchvision's layer
names without torchvision, which the baselines' environment lacks), both from the weights dt_mlp_init_random / dt_resnet_init_random give
(scripts/dtrain_random.py), so the files hold no initial weights: "images" f32 [STEPS x B, ...], "labels" int32
[STEPS, B], "pgrad0.<name>", "pgradN.<name>" (the MLP's only: the ResNet's would double the file) and "final.<name>",
their metadata "kfac" (the settings, the model's sizes and seed) and no "config".

kfac-pytorch is not on PyPI in a current form: fetch its repository (github: gpauloski/kfac-pytorch) and
`pip install --no-deps` it into the baselines' environment (scripts/make-baselines-venv.sh), then:
  .venv-baselines/bin/python scripts/make_kfac_fixture.py
"""
import json
import os
import sys

import torch
from kfac.enums import ComputeMethod
from kfac.preconditioner import KFACPreconditioner
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama_fixtures import spread  # noqa: E402
from dtrain_random import mlp_init, resnet_init  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from torch_small_resnet import SmallResNet  # noqa: E402

B, T, STEPS = 2, 16, 8
BASE = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, initializer_range=0.2,
            attn_implementation="eager", tie_word_embeddings=False, rope_theta=10000.0)
# name: (model, optimizer, lr, K-FAC settings)
CASES = {
    "llama_eigen": ("llama", "sgd", 0.05, dict(damping=0.003, factor_decay=0.95, kl_clip=0.001, factor_update_steps=1,
                                               inv_update_steps=1, compute_method="eigen")),
    "qwen2_eigen": ("qwen2", "sgd", 0.05, dict(damping=0.003, factor_decay=0.9, kl_clip=0.01, factor_update_steps=1,
                                               inv_update_steps=1, compute_method="eigen")),
    "llama_inverse": ("llama", "sgd", 0.05, dict(damping=0.01, factor_decay=0.95, kl_clip=0.001, factor_update_steps=1,
                                                 inv_update_steps=1, compute_method="inverse")),
    "llama_intervals_adamw": ("llama", "adamw", 0.002, dict(damping=0.003, factor_decay=0.95, kl_clip=0,
                                                            factor_update_steps=2, inv_update_steps=3,
                                                            compute_method="eigen")),
}


def build(family, seed):
    torch.manual_seed(seed)
    qwen = family == "qwen2"
    cfg = (Qwen2Config if qwen else LlamaConfig)(**BASE)
    model = (Qwen2ForCausalLM if qwen else LlamaForCausalLM)(cfg).float()
    spread(model)
    return cfg, model


def run(name, family, opt_name, lr, ks):
    cfg, model = build(family, sorted(CASES).index(name) + 1)
    weights = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, cfg.vocab_size, (STEPS, B, T + 1), generator=g)
    inputs, targets = tokens[:, :, :T].contiguous(), tokens[:, :, 1:].contiguous()
    kl = ks["kl_clip"] if ks["kl_clip"] > 0 else 1e30  # off: its constructor takes no None; nothing reaches this
    pre = KFACPreconditioner(model, factor_update_steps=ks["factor_update_steps"], inv_update_steps=ks["inv_update_steps"],
                             damping=ks["damping"], factor_decay=ks["factor_decay"], kl_clip=kl, lr=lr,
                             compute_method=ComputeMethod.EIGEN if ks["compute_method"] == "eigen" else ComputeMethod.INVERSE,
                             skip_layers=["lm_head"])
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    out, losses = {}, []
    for s in range(STEPS):
        opt.zero_grad()
        logits = model(input_ids=inputs[s]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets[s].reshape(-1))
        losses.append(loss.item())
        loss.backward()
        pre.step()
        if s in (0, STEPS - 1):
            tag = "pgrad0." if s == 0 else "pgradN."
            out.update({tag + n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()})
        opt.step()
    out.update(weights)
    out.update({"final." + n: p.detach().clone().contiguous() for n, p in model.named_parameters()})
    out.update({"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "losses": torch.tensor(losses)})
    settings = dict(ks, optimizer=opt_name, lr=lr, momentum=0.9 if opt_name == "sgd" else 0, steps=STEPS)
    meta = {"config": json.dumps(cfg.to_dict(), sort_keys=True), "kfac": json.dumps(settings, sort_keys=True)}
    return out, meta, losses


# name: (model, its sizes, images' shape, batch, steps, lr, K-FAC settings); SGD with momentum 0.9 underneath, seed 7
IMAGE_CASES = {
    "mlp_eigen": ("mlp", [20, 16, 12, 5], [20], 8, 8, 0.05, dict(damping=0.003, factor_decay=0.95, kl_clip=0.001,
                                                                 factor_update_steps=1, inv_update_steps=1, compute_method="eigen")),
    "resnet_small_eigen": ("resnet:small", [10], [1, 16, 16], 4, 3, 0.05,
                           dict(damping=0.003, factor_decay=0.95, kl_clip=0.001, factor_update_steps=1, inv_update_steps=1,
                                compute_method="eigen")),
}


def run_image(name, kind, sizes, shape, batch, steps, lr, ks):
    seed = 7
    if kind == "mlp":
        layers = []
        for i in range(len(sizes) - 1):
            layers += [torch.nn.Linear(sizes[i], sizes[i + 1])] + ([torch.nn.ReLU()] if i + 2 < len(sizes) else [])
        model = torch.nn.Sequential(*layers)
        mlp_init([m for m in layers if isinstance(m, torch.nn.Linear)], seed)
        classes = sizes[-1]
    else:
        model = SmallResNet(sizes[0])
        resnet_init(model, seed)
        classes = sizes[0]
    model.train()
    g = torch.Generator().manual_seed(13)
    images = torch.randn((steps, batch, *shape), generator=g)
    labels = torch.randint(0, classes, (steps, batch), generator=g)
    pre = KFACPreconditioner(model, factor_update_steps=ks["factor_update_steps"], inv_update_steps=ks["inv_update_steps"],
                             damping=ks["damping"], factor_decay=ks["factor_decay"], kl_clip=ks["kl_clip"], lr=lr,
                             compute_method=ComputeMethod.EIGEN if ks["compute_method"] == "eigen" else ComputeMethod.INVERSE)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out, losses = {}, []
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images[s]), labels[s])
        losses.append(loss.item())
        loss.backward()
        pre.step()
        if s == 0 or (s == steps - 1 and kind == "mlp"):
            tag = "pgrad0." if s == 0 else "pgradN."
            out.update({tag + n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()})
        opt.step()
    out.update({"final." + n: p.detach().clone().contiguous() for n, p in model.named_parameters()})
    out.update({"images": images.reshape(steps * batch, *shape).contiguous(), "labels": labels.to(torch.int32), "losses": torch.tensor(losses)})
    settings = dict(ks, optimizer="sgd", lr=lr, momentum=0.9, steps=steps, model=kind, sizes=sizes, shape=shape, batch=batch,
                    seed=seed)
    return out, {"kfac": json.dumps(settings, sort_keys=True)}, losses


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "kfac")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for name, (family, opt_name, lr, ks) in CASES.items():
        tensors, meta, losses = run(name, family, opt_name, lr, ks)
        path = os.path.join(out_dir, name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        print(f"{name}: losses {losses[0]:.4f} -> {losses[-1]:.4f}, {os.path.getsize(path)} bytes")
    for name, case in IMAGE_CASES.items():
        tensors, meta, losses = run_image(name, *case)
        path = os.path.join(out_dir, name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        print(f"{name}: losses {losses[0]:.4f} -> {losses[-1]:.4f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
