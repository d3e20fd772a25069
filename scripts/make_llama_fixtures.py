#!/usr/bin/env python3
"""Reference fixtures for dtrain's Llama family, computed by Hugging Face transformers (the oracle).

For each tiny random configuration below, writes tests/fixtures/llama/<name>.safetensors holding:
  the model's weights under their Hugging Face names (f32),
  "grad.<name>"   each weight's gradient of the mean cross-entropy on the batch,
  "inputs", "targets"  int32 [B, T],
  "logits"        f32 [B, T, V] (eager attention, f32),
  "loss"          f32 [1],
  "adamw_losses"  f32 [STEPS]: the loss before each of STEPS AdamW updates on the same batch
                  (torch.optim.AdamW over every parameter: lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01),
  "greedy"        int32 [B, PROMPT + NEW]: generate's greedy tokens (do_sample False, its KV cache) from the first
                  PROMPT inputs of each row, before any update,
and in its metadata "config": the config.json that transformers writes for it.
The gqa model is also saved as a Hugging Face folder, tests/fixtures/llama/gqa_folder/, in shards
(save_pretrained with a small max_shard_size: config.json, model-0000N-of-0000M.safetensors and the index).

The configurations: multi-head, grouped-query and multi-query attention; Llama 3.1's rope scaling; tied and
untied embeddings; Qwen 2's biases on q, k and v (Qwen2ForCausalLM); Qwen 3's norm of each head's queries and keys,
its heads wider than hidden / heads (Qwen3ForCausalLM). The vocabulary, 101, divides by no tensor-parallel size,
and the MLP's width is not a multiple of the model's.

Run with the baselines' environment (scripts/make-baselines-venv.sh):
  .venv-baselines/bin/python scripts/make_llama_fixtures.py [NAME...]   (the names given, or all)
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

B, T, STEPS, PROMPT, NEW = 2, 16, 10, 6, 24
BASE = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=32, rms_norm_eps=1e-5, initializer_range=0.2, attn_implementation="eager")
CONFIGS = {
    "mha": dict(seed=2, num_key_value_heads=4, rope_theta=10000.0, tie_word_embeddings=False),
    "gqa": dict(seed=1, num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False),
    "mqa": dict(seed=3, num_key_value_heads=1, rope_theta=10000.0, tie_word_embeddings=True),
    "rope_scaled": dict(seed=5, num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=16)),
    "qwen2": dict(seed=4, num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True, family="qwen2"),
    "qwen3": dict(seed=6, num_key_value_heads=2, head_dim=12, rope_theta=1000000.0, tie_word_embeddings=True, family="qwen3"),
}
FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def spread(model):
    """Norms' weights away from 1 and biases away from 0, so that their gradients matter."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))


def build(name, spec):
    spec = dict(spec)
    config, causal_lm = FAMILIES[spec.pop("family", "llama")]
    torch.manual_seed(spec.pop("seed"))
    cfg = config(**BASE, **spec)
    model = causal_lm(cfg).float()
    spread(model)
    return cfg, model


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "llama")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for name in sys.argv[1:] or CONFIGS:
        cfg, model = build(name, CONFIGS[name])
        g = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
        inputs, targets = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
        weights = {n: p.detach().clone().contiguous() for n, p in model.state_dict().items()}
        if name == "gqa":  # before any update: the same weights as the fixture's
            model.save_pretrained(os.path.join(out_dir, "gqa_folder"), max_shard_size="60KB")
        if cfg.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        greedy = model.generate(inputs[:, :PROMPT], max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                attention_mask=torch.ones(B, PROMPT, dtype=torch.long), pad_token_id=0,
                                eos_token_id=None)
        out = model(input_ids=inputs, labels=targets)
        # transformers shifts labels itself: pass the loss over (inputs -> targets) without its shift
        logits = out.logits.detach()
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        model.zero_grad()
        loss.backward()
        grads = {"grad." + n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            l = torch.nn.functional.cross_entropy(model(input_ids=inputs).logits.reshape(-1, cfg.vocab_size),
                                                  targets.reshape(-1))
            losses.append(l.item())
            l.backward()
            opt.step()
        tensors = dict(weights)
        tensors.update(grads)
        tensors.update({"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "logits": logits,
                        "loss": loss.detach().reshape(1), "adamw_losses": torch.tensor(losses),
                        "greedy": greedy.to(torch.int32).contiguous()})
        meta = {"config": json.dumps(cfg.to_dict(), sort_keys=True)}  # one entry: the header's order is then fixed
        path = os.path.join(out_dir, name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        print(f"{name}: {type(model).__name__}, kv heads {cfg.num_key_value_heads}, tied {cfg.tie_word_embeddings}, "
              f"loss {loss.item():.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
