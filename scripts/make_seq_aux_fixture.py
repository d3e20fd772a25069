#!/usr/bin/python3
"""The sequence-wise and global-batch balancing losses' fixture (tests/fixtures/moe/seq_aux.safetensors): DeepSeek-V2's and V3's
complementary loss as Megatron's seq_aux_loss computes it, for each layer the mean over the batch's sequences of
sum_e f_e P_e, f_e = E / (K T) x the sequence's tokens whose K most probable experts hold e (the probabilities' top-k,
without the routing's bias or groups), P_e the mean over its T tokens of e's probability (a sigmoid router's scores
normalised to sum to 1), summed over the layers; and Megatron's global_aux_loss on one micro-batch of one rank
(switch_load_balancing_loss_func per layer: E sum_e f_e P_e over all the batch's tokens, the same top-k and
probabilities), summed over the layers. Two models:
  softmax: the Mixtral fixture's folder and inputs (tests/fixtures/moe/mixtral*), its loss cross-entropy + its
           router_aux_loss_coef x the Switch loss + SC x the sequence-wise loss;
  sigmoid: the DeepSeek-V3 fixture's model (make_deepseek_moe_fixture.build(); its weights checked against
           tests/fixtures/moe/deepseek_moe.safetensors), cross-entropy + SC x the sequence-wise loss.
Held: "seq_<m>" (the loss before SC), "loss_<m>", "grad_<m>.<hub name of each layer's router weight>"; and the same
with GC x the global-batch loss in the sequence-wise one's place, under <m> = glob_softmax and glob_sigmoid.
Needs torch and transformers (scripts/make-baselines-venv.sh). usage: make_seq_aux_fixture.py [FIXTURES]"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import MixtralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_moe_fixture as deepseek  # noqa: E402 (its model, rebuilt from its seeds)

SC, GC = 0.3, 0.2


def probs_and_choices(logits, K, sigmoid):
    """The loss's probabilities (a sigmoid router's scores normalised) and each row's top K of them, as 0/1 [rows, E]."""
    if sigmoid:
        s = torch.sigmoid(logits.float())
        p = s / (s.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        p = torch.softmax(logits.float(), dim=-1)
    return p, torch.zeros_like(p).scatter(1, torch.topk(p, K, dim=-1).indices, 1.0)


def seq_aux(logits, B, T, K, sigmoid):
    """One layer's sequence-wise loss from its router logits [B*T, E] (rows sequence by sequence)."""
    E = logits.shape[-1]
    p, chosen = probs_and_choices(logits, K, sigmoid)
    chosen = chosen.view(B, T, E)
    f = chosen.sum(dim=1) * E / (K * T)  # a constant: counts carry no gradient
    return (f * p.view(B, T, E).mean(dim=1)).sum(dim=-1).mean()


def global_aux(logits, B, T, K, sigmoid):
    """One layer's global-batch loss on one micro-batch: E sum_e f_e P_e over all its B*T tokens."""
    E = logits.shape[-1]
    p, chosen = probs_and_choices(logits, K, sigmoid)
    return E * ((chosen.sum(dim=0) / (B * T * K)) * p.mean(dim=0)).sum()


def record(tensors, case, model, seq, loss, block):
    """The loss's backward; its value, the balancing term and each layer's router gradient (under the hub's block name)
    into tensors."""
    model.zero_grad()
    loss.backward()
    tensors.update({f"seq_{case}": seq.detach().reshape(1), f"loss_{case}": loss.detach().reshape(1)})
    for l, layer in enumerate(model.model.layers):
        tensors[f"grad_{case}.model.layers.{l}.{block}.gate.weight"] = layer.mlp.gate.weight.grad.detach().contiguous()
    return loss.item()


def softmax_case(root, tensors, name, term, coef):
    fx = load_file(os.path.join(root, "moe", "mixtral.safetensors"))
    model = MixtralForCausalLM.from_pretrained(os.path.join(root, "moe", "mixtral"), dtype=torch.float32)
    model.train()
    inputs, targets = fx["inputs"].long(), fx["targets"].long()
    B, T = inputs.shape
    out = model(input_ids=inputs, output_router_logits=True)
    V, K = model.config.vocab_size, model.config.num_experts_per_tok
    seq = sum(term(rl, B, T, K, False) for rl in out.router_logits)
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), targets.reshape(-1))
    loss = ce + model.config.router_aux_loss_coef * out.aux_loss + coef * seq
    return record(tensors, name, model, seq, loss, "block_sparse_moe")


def sigmoid_case(root, tensors, name, term, coef):
    cfg, model, inputs, targets = deepseek.build()
    stored = load_file(os.path.join(root, "moe", "deepseek_moe.safetensors"))
    for hub, w in deepseek.by_name(dict(model.named_parameters())).items():
        if not torch.equal(w, stored[hub]):
            sys.exit(f"the rebuilt DeepSeek model's {hub} is not the fixture's: regenerate deepseek_moe.safetensors first")
    B, T = inputs.shape
    logits = []
    for layer in model.model.layers:  # each router's logits, as its forward makes them
        layer.mlp.gate.register_forward_hook(lambda mod, args, out: logits.append(out[0]))
    model.train()
    out = model(input_ids=inputs)
    seq = sum(term(rl, B, T, deepseek.TOP, True) for rl in logits)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), targets.reshape(-1)) + coef * seq
    return record(tensors, name, model, seq, loss, "mlp")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    tensors = {}
    a, b = softmax_case(root, tensors, "softmax", seq_aux, SC), sigmoid_case(root, tensors, "sigmoid", seq_aux, SC)
    softmax_case(root, tensors, "glob_softmax", global_aux, GC)
    sigmoid_case(root, tensors, "glob_sigmoid", global_aux, GC)
    path = os.path.join(root, "moe", "seq_aux.safetensors")
    save_file(tensors, path)
    print(f"seq_aux: global softmax {tensors['seq_glob_softmax'].item():.6f}, sigmoid {tensors['seq_glob_sigmoid'].item():.6f}")
    print(f"seq_aux: softmax seq {tensors['seq_softmax'].item():.6f} loss {a:.6f}, sigmoid seq {tensors['seq_sigmoid'].item():.6f} "
          f"loss {b:.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    sys.exit(main())
