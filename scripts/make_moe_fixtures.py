#!/usr/bin/env python3
"""Reference fixtures for dtrain's mixture of experts, computed by transformers' MixtralForCausalLM,
Qwen2MoeForCausalLM and Qwen3MoeForCausalLM (the oracles).

A tiny random model of each (E experts, top K, router_aux_loss_coef AUX with output_router_logits, so that the loss
is Hugging Face's cross-entropy plus AUX times load_balancing_loss_func; Qwen 2 MoE's with its shared expert and
weights not renormalised; Qwen 3 MoE's with its head norms and a dense layer) is saved as a Hugging Face folder, tests/fixtures/moe/<name>/ (config.json,
model.safetensors: save_pretrained's names, one tensor an expert), and tests/fixtures/moe/<name>.safetensors holds:
  "inputs", "targets"      int32 [B, T],
  "logits"                 f32 [B, T, V] (eager attention, f32),
  "loss", "aux"            f32 [1]: the training loss (cross-entropy + AUX * aux), and load_balancing_loss_func's value,
  "router_logits.<l>"      f32 [B*T, E]: layer l's router logits,
  "router_top.<l>"         int32 [B*T, K]: the experts layer l chose for each token (torch.topk of the probabilities),
  "moe_out.<l>"            f32 [B*T, C]: layer l's sparse MoE block output,
  "grad.<name>"            each weight's gradient of the loss, under the folder's names (an expert's gate and up from
                           the model's fused gate_up_proj, down from its down_proj),
  "adamw_losses"           f32 [STEPS]: the loss before each of STEPS AdamW steps (lr 1e-3, betas 0.9/0.999, eps 1e-8,
                           weight decay 0.01).

Run with the baselines' environment (scripts/make-baselines-venv.sh):
  .venv-baselines/bin/python scripts/make_moe_fixtures.py
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

B, T, STEPS = 2, 16, 10
E, K, AUX = 4, 2, 0.02


COMMON = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=32, num_experts_per_tok=K, output_router_logits=True, router_aux_loss_coef=AUX,
              rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=False, attn_implementation="eager")
MODELS = {
    # the folder keeps Mixtral's old names: block_sparse_moe, an expert's w1 (gate), w3 (up), w2 (down)
    "mixtral": dict(config=lambda: MixtralConfig(intermediate_size=24, num_local_experts=E, **COMMON), model=MixtralForCausalLM,
                    rename=(".mlp.", ".block_sparse_moe."), parts=("w1", "w3", "w2"), ffn="intermediate_size", seed=3),
    "qwen2_moe": dict(config=lambda: Qwen2MoeConfig(intermediate_size=40, moe_intermediate_size=20, shared_expert_intermediate_size=28,
                                                    num_experts=E, norm_topk_prob=False, qkv_bias=True, decoder_sparse_step=1,
                                                    **COMMON),
                      model=Qwen2MoeForCausalLM, rename=None, parts=("gate_proj", "up_proj", "down_proj"), ffn="moe_intermediate_size",
                      seed=4),
    # dense layers among the mixtures: layer 0 in mlp_only_layers, layer 2 not a multiple of decoder_sparse_step (from 1);
    # layers 1 and 3 sparse
    "qwen2_moe_dense": dict(config=lambda: Qwen2MoeConfig(intermediate_size=40, moe_intermediate_size=20, shared_expert_intermediate_size=28,
                                                          num_experts=E, norm_topk_prob=False, qkv_bias=True, decoder_sparse_step=2,
                                                          mlp_only_layers=[0], **dict(COMMON, num_hidden_layers=4)),
                            model=Qwen2MoeForCausalLM, rename=None, parts=("gate_proj", "up_proj", "down_proj"),
                            ffn="moe_intermediate_size", seed=5),
    # Qwen 3's mixture: each head's queries and keys RMS-normed, heads of 16 wider than hidden / heads (8), weights
    # renormalised over the K; layer 0 dense (mlp_only_layers), layers 1 and 2 sparse
    "qwen3_moe": dict(config=lambda: Qwen3MoeConfig(intermediate_size=40, moe_intermediate_size=20, num_experts=E, norm_topk_prob=True,
                                                    decoder_sparse_step=1, mlp_only_layers=[0], head_dim=16, rope_theta=1e6,
                                                    **dict(COMMON, num_hidden_layers=3)),
                      model=Qwen3MoeForCausalLM, rename=None, parts=("gate_proj", "up_proj", "down_proj"), ffn="moe_intermediate_size",
                      seed=6),
}


def sparse_layers(cfg):
    """The layers whose MLP is a mixture (Qwen 2 MoE's rule; every layer for Mixtral)."""
    step, dense = getattr(cfg, "decoder_sparse_step", 1), getattr(cfg, "mlp_only_layers", [])
    return [l for l in range(cfg.num_hidden_layers) if l not in dense and (l + 1) % step == 0]


def grads_by_hub_name(model, spec, F):
    """Each parameter's gradient under the folder's name, a fused expert tensor's one an expert."""
    def hub(n):
        return n.replace(*spec["rename"]) if spec["rename"] else n
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.detach()
        if n.endswith("experts.gate_up_proj"):
            for e in range(E):
                out["grad." + hub(n).replace("experts.gate_up_proj", f"experts.{e}.{spec['parts'][0]}.weight")] = g[e, :F].contiguous()
                out["grad." + hub(n).replace("experts.gate_up_proj", f"experts.{e}.{spec['parts'][1]}.weight")] = g[e, F:].contiguous()
        elif n.endswith("experts.down_proj"):
            for e in range(E):
                out["grad." + hub(n).replace("experts.down_proj", f"experts.{e}.{spec['parts'][2]}.weight")] = g[e].contiguous()
        else:
            out["grad." + hub(n)] = g.contiguous()
    return out


def make(out_dir, name, spec):
    torch.manual_seed(spec["seed"])
    cfg = spec["config"]()
    model = spec["model"](cfg).float()
    if name.startswith("qwen"):  # q/k/v biases start at zero, head norms at one: drawn, so that reading them shows
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("_proj.bias"):
                    p.copy_(0.2 * torch.randn_like(p))
                elif n.endswith("_norm.weight") and ".self_attn." in n:
                    p.copy_(1 + 0.2 * torch.randn_like(p))
    model.save_pretrained(os.path.join(out_dir, name))
    for extra in ("generation_config.json",):
        path = os.path.join(out_dir, name, extra)
        if os.path.exists(path):
            os.remove(path)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    inputs, targets = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
    moe_out = {}
    hooks = [layer.mlp.register_forward_hook(lambda m, i, o, l=l: moe_out.__setitem__(l, o.detach().reshape(B * T, -1)))
             for l, layer in enumerate(model.model.layers)]
    model.train()
    out = model(input_ids=inputs, output_router_logits=True)
    for h in hooks:
        h.remove()
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    loss = ce + AUX * out.aux_loss
    model.zero_grad()
    loss.backward()
    tensors = {"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "logits": out.logits.detach(),
               "loss": loss.detach().reshape(1), "aux": out.aux_loss.detach().reshape(1).float()}
    sparse = sparse_layers(cfg)
    assert len(out.router_logits) == len(sparse), (len(out.router_logits), sparse)
    for l, rl in zip(sparse, out.router_logits):
        tensors[f"router_logits.{l}"] = rl.detach().reshape(B * T, E).contiguous()
        probs = torch.softmax(rl.detach().float(), dim=-1)
        tensors[f"router_top.{l}"] = torch.topk(probs, K, dim=-1).indices.to(torch.int32).contiguous()
        tensors[f"moe_out.{l}"] = moe_out[l].contiguous()
    tensors.update(grads_by_hub_name(model, spec, getattr(cfg, spec["ffn"])))
    def loss_of(m):
        o = m(input_ids=inputs, output_router_logits=True)
        return torch.nn.functional.cross_entropy(o.logits.reshape(-1, cfg.vocab_size), targets.reshape(-1)) + AUX * o.aux_loss
    tensors["adamw_losses"] = adamw_losses(model, loss_of)
    path = os.path.join(out_dir, name + ".safetensors")
    save_file(tensors, path)
    print(f"{name}: loss {loss.item():.6f} (aux {out.aux_loss.item():.6f}), {os.path.getsize(path)} bytes")


def lm_loss(model, inputs, targets, vocab):
    """The mean cross-entropy of the model's logits on inputs against targets."""
    return torch.nn.functional.cross_entropy(model(input_ids=inputs).logits.reshape(-1, vocab), targets.reshape(-1))


def adamw_losses(model, loss_of, steps=STEPS):
    """The losses of `steps` AdamW steps (lr 1e-3, weight decay 0.01) of loss_of(model), each before its update."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        l = loss_of(model)
        losses.append(l.item())
        l.backward()
        opt.step()
    return torch.tensor(losses)


def hub_state(named, F, parts=("w1", "w3", "w2"), rename=(".mlp.", ".block_sparse_moe.")):
    """Tensors by the model's parameter names (its weights, or their gradients) under the folder's names (Mixtral's by
    default: parts the gate's, up's and down's names, rename the MoE block's), a fused expert tensor's one an expert."""
    out = {}
    for n, p in named.items():
        n, p = n.replace(*rename) if rename else n, p.detach().clone()
        if n.endswith("experts.gate_up_proj"):
            for e in range(p.shape[0]):
                out[n.replace("gate_up_proj", f"{e}.{parts[0]}.weight")] = p[e, :F].contiguous()
                out[n.replace("gate_up_proj", f"{e}.{parts[1]}.weight")] = p[e, F:].contiguous()
        elif n.endswith("experts.down_proj"):
            for e in range(p.shape[0]):
                out[n.replace("down_proj", f"{e}.{parts[2]}.weight")] = p[e].contiguous()
        else:
            out[n] = p.contiguous()
    return out


def make_sigmoid_router(out_dir):
    """Mixtral's model with DeepSeek-V3's router in every layer (transformers' DeepseekV3TopkRouter: sigmoid scores, a
    random e_score_correction_bias that only chooses, 8 experts in GROUPS groups of which the best TOPK_GROUP, top
    3, renormalised and times SCALE), no balancing loss: tests/fixtures/moe/sigmoid_router.safetensors holds the weights
    under the folder's names, "bias.<l>", "router_top.<l>" (the choices as a set: topk's order is not kept),
    "router_weights.<l>" (in the order of router_top), inputs, targets, logits, loss, "grad.<name>" and adamw_losses,
    and its "config" and "router" metadata."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    experts, top, groups, topk_group, scale = 8, 3, 4, 2, 2.5
    torch.manual_seed(5)
    common = dict(COMMON, num_experts_per_tok=top, output_router_logits=False)
    cfg = MixtralConfig(intermediate_size=24, num_local_experts=experts, **common)
    model = MixtralForCausalLM(cfg).float()
    dcfg = DeepseekV3Config(hidden_size=cfg.hidden_size, n_routed_experts=experts, num_experts_per_tok=top, n_group=groups,
                            topk_group=topk_group, norm_topk_prob=True, routed_scaling_factor=scale)
    seen = {}
    for l, layer in enumerate(model.model.layers):
        router = DeepseekV3TopkRouter(dcfg)
        with torch.no_grad():
            router.weight.copy_(layer.mlp.gate.weight)
            router.e_score_correction_bias.copy_(0.05 * torch.randn(experts))
        router.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(l, o))
        layer.mlp.gate = router
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    inputs, targets = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
    tensors = hub_state(dict(model.named_parameters()), cfg.intermediate_size)
    model.train()
    out = model(input_ids=inputs)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    model.zero_grad()
    loss.backward()
    tensors.update({"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "logits": out.logits.detach(),
                    "loss": loss.detach().reshape(1)})
    for l, layer in enumerate(model.model.layers):
        _, w, idx = seen[l]
        order = torch.sort(idx, dim=-1)  # a set: sorted by expert
        tensors[f"router_top.{l}"] = order.values.to(torch.int32).contiguous()
        tensors[f"router_weights.{l}"] = torch.gather(w.detach(), 1, order.indices).contiguous()
        tensors[f"bias.{l}"] = layer.mlp.gate.e_score_correction_bias.detach().clone()
    grads = hub_state({n: p.grad for n, p in model.named_parameters()}, cfg.intermediate_size)
    tensors.update({"grad." + k: v for k, v in grads.items()})
    tensors["adamw_losses"] = adamw_losses(model, lambda m: lm_loss(m, inputs, targets, cfg.vocab_size))
    meta = {"config": json.dumps(cfg.to_dict(), sort_keys=True),
            "router": json.dumps(dict(groups=groups, topk_group=topk_group, scale=scale, top_k=top))}
    path = os.path.join(out_dir, "sigmoid_router.safetensors")
    save_file(tensors, path, metadata=meta)
    print(f"sigmoid_router: loss {loss.item():.6f}, {os.path.getsize(path)} bytes")


def main():
    """Every fixture, or those named on the command line (mixtral, qwen2_moe, qwen2_moe_dense, qwen3_moe, sigmoid_router)."""
    import sys
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "moe")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    only = set(sys.argv[1:])
    for name, spec in MODELS.items():
        if not only or name in only:
            make(out_dir, name, spec)
    if not only or "sigmoid_router" in only:
        make_sigmoid_router(out_dir)


if __name__ == "__main__":
    main()
