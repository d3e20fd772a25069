#!/usr/bin/env python3
"""PEFT + PyTorch baseline for bench/lora_cost.sh: a Hugging Face GPT-2 or Llama (random weights of a preset's
shape), LoRA adapters from peft.get_peft_model (rank, alpha, target modules; the base frozen, as PEFT leaves it), or
with --full every weight trained; AdamW over what trains, eager attention, f32, one synthetic batch, timed per step.
Prints one JSON line per step: {"step", "ms", "loss"}, then {"peak_rss_mib"}.
Run with the baselines' environment (scripts/make-baselines-venv.sh)."""
import argparse
import json
import resource
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

SHAPES = {
    "124M": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                                               resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)),
    "smollm-135m": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                                        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                                        max_position_embeddings=2048, tie_word_embeddings=True)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="124M", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=8)
    ap.add_argument("--targets", default="c_attn")
    ap.add_argument("--full", action="store_true", help="train every weight (no adapters)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = SHAPES[a.model]().float()
    model.config._attn_implementation = "eager"
    if not a.full:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=a.targets.split(","),
                                                 fan_in_fan_out=a.model == "124M"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(1)
    V = model.config.vocab_size
    x = torch.randint(0, V, (a.batch, a.seq), generator=g)
    y = torch.randint(0, V, (a.batch, a.seq), generator=g)
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
        print(json.dumps({"step": step, "ms": (time.perf_counter() - t0) * 1e3, "loss": loss.item()}), flush=True)
    print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
