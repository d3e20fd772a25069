#!/usr/bin/python3
"""DeepSeek-V3's mixture with Llama's attention (tests/fixtures/moe/deepseek_moe.safetensors): transformers' Mixtral
with each layer's MoE block replaced by transformers' DeepseekV3MoE (DeepseekV3TopkRouter: sigmoid scores, a random
e_score_correction_bias that only chooses, 8 experts in 4 groups of which the best 2, top 3, renormalised and times
2.5; DeepseekV3Experts; 2 shared experts: one ungated DeepseekV3MLP of 2 x 24), no balancing loss. The file holds the
weights under DeepseekV3's per-expert names (mlp.experts.<e>.gate_proj/up_proj/down_proj, mlp.shared_experts.*),
"bias.<l>", inputs, targets, logits, loss, "grad.<name>", adamw_losses (10 AdamW steps), and the Mixtral "config"
with the mixture's settings in "moe". Needs torch and transformers (scripts/make-baselines-venv.sh).
usage: make_deepseek_moe_fixture.py [FIXTURES]"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config, MixtralConfig, MixtralForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_moe_fixtures import adamw_losses, hub_state, lm_loss  # noqa: E402 (the Mixtral fixtures' renaming, steps)

B, T, STEPS = 2, 16, 10
E, TOP, GROUPS, TOPK_GROUP, SCALE, F, SHARED = 8, 3, 4, 2, 2.5, 24, 2


def by_name(named):
    """The model's tensors (weights or gradients) under DeepseekV3's hub names, a fused expert tensor's one an expert."""
    return hub_state(named, F, parts=("gate_proj", "up_proj", "down_proj"), rename=None)


def build():
    """The Mixtral config, the model with DeepseekV3MoE blocks (seeded: the same weights each time), inputs, targets."""
    torch.manual_seed(6)
    cfg = MixtralConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=32, intermediate_size=F, num_local_experts=E, num_experts_per_tok=TOP,
                        rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=False, attn_implementation="eager")
    model = MixtralForCausalLM(cfg).float()
    dcfg = DeepseekV3Config(hidden_size=32, n_routed_experts=E, num_experts_per_tok=TOP, n_group=GROUPS, topk_group=TOPK_GROUP,
                            norm_topk_prob=True, routed_scaling_factor=SCALE, moe_intermediate_size=F, n_shared_experts=SHARED,
                            hidden_act="silu")
    for layer in model.model.layers:
        moe = DeepseekV3MoE(dcfg).float()
        with torch.no_grad():
            for p in moe.parameters():
                p.copy_(0.2 * torch.randn_like(p))
            moe.gate.e_score_correction_bias.copy_(0.05 * torch.randn(E))
        layer.mlp = moe
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    return cfg, model, tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    cfg, model, inputs, targets = build()
    tensors = by_name(dict(model.named_parameters()))
    model.train()
    out = model(input_ids=inputs)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    model.zero_grad()
    loss.backward()
    tensors.update({"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "logits": out.logits.detach(),
                    "loss": loss.detach().reshape(1)})
    for l, layer in enumerate(model.model.layers):
        tensors[f"bias.{l}"] = layer.mlp.gate.e_score_correction_bias.detach().clone()
    tensors.update({"grad." + k: v for k, v in by_name({n: p.grad for n, p in model.named_parameters()}).items()})
    tensors["adamw_losses"] = adamw_losses(model, lambda m: lm_loss(m, inputs, targets, cfg.vocab_size))
    meta = {"config": json.dumps(cfg.to_dict(), sort_keys=True),
            "moe": json.dumps(dict(groups=GROUPS, topk_group=TOPK_GROUP, scale=SCALE, top_k=TOP, shared=SHARED))}
    path = os.path.join(root, "moe", "deepseek_moe.safetensors")
    save_file(tensors, path, metadata=meta)
    print(f"deepseek_moe: loss {loss.item():.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    sys.exit(main())
