#!/usr/bin/env python3
"""Reference fixtures for dtrain's LoRA adapters, computed by PEFT (the oracle) on transformers models.

For each tiny random model below, LoRA adapters are added by peft.get_peft_model (rank R, alpha ALPHA, dropout P,
the target modules listed), their B matrices drawn at random (PEFT starts them at zero, which would hide every
gradient but B's), and writes tests/fixtures/lora/<name>.safetensors holding:
  the base model's weights under their Hugging Face names (f32),
  the adapters under PEFT's names ("base_model.model.<module>.lora_A.weight", .lora_B.weight),
  "grad.<adapter name>"  each adapter's gradient of the mean cross-entropy on the batch,
  "inputs", "targets"    int32 [B, T],
  "logits"               f32 [B, T, V] (eager attention, f32),
  "loss"                 f32 [1],
  "merged.<name>"        each adapted weight merged as PEFT's merge_and_unload makes it, W + (alpha / rank) B A
                         (under the base's name, before any update),
  "adamw_losses"         f32 [STEPS]: the loss before each of STEPS AdamW updates of the adapters alone (the base
                         frozen, as PEFT leaves it): lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01,
and in its metadata "config" (the model's config.json) and "lora" (rank, alpha, targets, dropout).
With dropout, PEFT's lora_dropout modules draw dtrain's masks (PyTorch's generator cannot be matched: the test is
where dropout acts and how it scales), from the keys "row_keys" int32 [B] as src/kernels/dropout.c draws them, the
same masks at every step; "logits_eval" are the model's in evaluation (no dropout).
Each is also saved as PEFT saves an adapter, tests/fixtures/lora/<name>_adapter/ (adapter_config.json and
adapter_model.safetensors, save_pretrained before any update).

Run with the baselines' environment (scripts/make-baselines-venv.sh):
  .venv-baselines/bin/python scripts/make_lora_fixtures.py
"""
import copy
import json
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

B, T, STEPS = 2, 16, 10
MODELS = {
    # GPT-2: c_attn (fused q/k/v) and both c_proj's (attention's and the MLP's: one name, two modules)
    "gpt2": dict(config=lambda: GPT2Config(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                           resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, initializer_range=0.2),
                 model=GPT2LMHeadModel, rank=4, alpha=8, targets=["c_attn", "c_proj"]),
    # Llama with grouped-query attention: q and v of the fused q/k/v Linear, the MLP's gate and down
    "llama": dict(config=lambda: LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                             rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=False,
                                             attn_implementation="eager"),
                  model=LlamaForCausalLM, rank=6, alpha=16, targets=["q_proj", "v_proj", "gate_proj", "down_proj"]),
}
# the Llama again, with dropout
MODELS["llama_dropout"] = dict(MODELS["llama"], dropout=0.25)
ROW_KEYS = [7, 123456789]
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def dropout_mask(p, adapter, width):
    """dtrain's mask [B, T, width] for adapter number `adapter` (layer x adapters a layer + its index in the layer):
    value f of position t of sequence b kept iff draw f + 1 of the stream from row key (key b, adapter, t)."""
    low = int(float(torch.tensor(p, dtype=torch.float32)) * 2.0 ** 64)
    mask = torch.zeros(B, T, width)
    for b in range(B):
        for t in range(T):
            row = mix64(ROW_KEYS[b] ^ mix64((adapter << 32) | t))
            for f in range(width):
                mask[b, t, f] = mix64((row + (f + 1) * GOLDEN) & M64) >= low
    return mask


class MaskDropout(torch.nn.Module):
    """nn.Dropout's arithmetic with a given mask: the kept values times 1 / (1 - p), in training only."""

    def __init__(self, mask, p):
        super().__init__()
        self.mask, self.scale = mask, torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)

    def forward(self, x):
        return x * self.mask * self.scale if self.training else x


def use_dtrain_masks(model, spec):
    layers = model.base_model.model.model.layers
    order = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
             "mlp.down_proj"]
    for l, layer in enumerate(layers):
        q = 0
        for name in order:
            if name.split(".")[1] not in spec["targets"]:
                continue
            module = layer.get_submodule(name)
            module.lora_dropout["default"] = MaskDropout(
                dropout_mask(spec["dropout"], l * len(spec["targets"]) + q, module.in_features), spec["dropout"])
            q += 1


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "lora")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for i, (name, spec) in enumerate(MODELS.items()):
        torch.manual_seed(i + 1)
        cfg = spec["config"]()
        base = spec["model"](cfg).float()
        base_weights = {n: p.detach().clone().contiguous() for n, p in base.state_dict().items()
                        if not n.endswith(".attn.bias") and not n.endswith(".attn.masked_bias")}
        if cfg.tie_word_embeddings:
            base_weights.pop("lm_head.weight", None)
        lcfg = LoraConfig(r=spec["rank"], lora_alpha=spec["alpha"], lora_dropout=spec.get("dropout", 0.0), target_modules=spec["targets"],
                          bias="none", fan_in_fan_out=name == "gpt2")
        model = get_peft_model(base, lcfg)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.3 * torch.randn_like(p))
        model.save_pretrained(os.path.join(out_dir, name + "_adapter"))
        if spec.get("dropout"):
            use_dtrain_masks(model, spec)
        model.train()
        targeted = {n[len("base_model.model."):-len(".base_layer.weight")] + ".weight"
                    for n, _ in model.named_parameters() if n.endswith(".base_layer.weight")}
        merged = {"merged." + n: p.detach().clone().contiguous()
                  for n, p in copy.deepcopy(model).merge_and_unload().state_dict().items() if n in targeted}
        adapters = {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}
        g = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
        inputs, targets = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
        tensors = dict(base_weights)
        tensors.update({n: p.detach().clone().contiguous() for n, p in adapters.items()})
        tensors.update(merged)
        if spec.get("dropout"):
            model.eval()
            with torch.no_grad():
                tensors["logits_eval"] = model(input_ids=inputs).logits.detach()
            model.train()
            tensors["row_keys"] = torch.tensor(ROW_KEYS, dtype=torch.int32)
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        model.zero_grad()
        loss.backward()
        tensors.update({"grad." + n: p.grad.detach().clone().contiguous() for n, p in adapters.items()})
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            l = torch.nn.functional.cross_entropy(model(input_ids=inputs).logits.reshape(-1, cfg.vocab_size),
                                                  targets.reshape(-1))
            losses.append(l.item())
            l.backward()
            opt.step()
        tensors.update({"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "logits": logits.detach(),
                        "loss": loss.detach().reshape(1), "adamw_losses": torch.tensor(losses)})
        meta = {"config": json.dumps(cfg.to_dict(), sort_keys=True),
                "lora": json.dumps(dict(rank=spec["rank"], alpha=spec["alpha"], targets=",".join(spec["targets"]),
                                       dropout=spec.get("dropout", 0.0)))}
        path = os.path.join(out_dir, name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        print(f"{name}: {len(adapters)} adapter tensors, loss {loss.item():.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
