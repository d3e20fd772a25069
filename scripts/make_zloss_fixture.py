#!/usr/bin/python3
"""The router z-loss's fixture (tests/fixtures/moe/zloss.safetensors) from the Mixtral fixture: its folder loaded by
transformers, its inputs and targets (tests/fixtures/moe/mixtral.safetensors), the loss cross-entropy + AUX x the
balancing loss + ZC x transformers' router_z_loss_func (ST-MoE's, SwitchTransformers') over every layer's router
logits stacked [layers, tokens, experts], and its gradients:
  "z"                        f32 [1]: router_z_loss_func's value
  "loss"                     f32 [1]: the whole loss
  "grad.<hub name>"          each layer's router weight's gradient (model.layers.<l>.block_sparse_moe.gate.weight)
Needs torch and transformers (scripts/make-baselines-venv.sh). usage: make_zloss_fixture.py [FIXTURES]"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import MixtralForCausalLM
from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

AUX, ZC = 0.02, 0.1


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    fx = load_file(os.path.join(root, "moe", "mixtral.safetensors"))
    model = MixtralForCausalLM.from_pretrained(os.path.join(root, "moe", "mixtral"), dtype=torch.float32)
    model.train()
    inputs, targets = fx["inputs"].long(), fx["targets"].long()
    out = model(input_ids=inputs, output_router_logits=True)
    V = model.config.vocab_size
    z = router_z_loss_func(torch.stack([rl.float() for rl in out.router_logits]))
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), targets.reshape(-1))
    loss = ce + AUX * out.aux_loss + ZC * z
    model.zero_grad()
    loss.backward()
    tensors = {"z": z.detach().reshape(1), "loss": loss.detach().reshape(1)}
    for l, layer in enumerate(model.model.layers):
        tensors[f"grad.model.layers.{l}.block_sparse_moe.gate.weight"] = layer.mlp.gate.weight.grad.detach().contiguous()
    path = os.path.join(root, "moe", "zloss.safetensors")
    save_file(tensors, path)
    print(f"zloss: z {z.item():.6f}, loss {loss.item():.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    sys.exit(main())
