#!/usr/bin/env python3
"""Reference fixtures for dtrain's GRPO loss, computed by TRL's GRPOTrainer (the oracle: its _compute_loss and
_get_per_token_logps_and_entropies on a trainer made with a tiny random Llama).

Writes tests/fixtures/grpo/:
  ref.safetensors     the reference: a tiny random Llama's weights (HF names); metadata "config"
  old.safetensors     pi_old: the policy moved further (for the clipped ratios of a second iteration)
  policy.safetensors  the policy (the reference moved by noise, so that the KL is not zero), and:
                        "prompt" [R, P] and "completion" [R, C] the rows' tokens, "mask" [R, C] their completion masks
                        (a completion ends after its end-of-text token), "rewards" [R] and TRL's "advantages" [R]
                        (groups of G, scale_rewards "group"), "ref_logps" [R, C] TRL's reference log-probabilities;
                        for each loss kind K in dapo, grpo, dr_grpo (beta 0.04, one iteration: pi_old = pi detached):
                        "K.loss", "K.grad.<name>" and "K.kl" (TRL's kl metric: the mean over the tokens); "plain.*" the
                        same for loss grpo with use_bias_correction_kl=False (TRL's default, True, takes the KL term
                        times the ratio); and "clip.loss", "clip.grad.<name>", "clip.ratio": loss grpo
                        with pi_old's log-probabilities given ("old_logps" [R, C], TRL's of old.safetensors);
                        "tools.*" loss dapo with "tool_mask" [R, C] (a tool's results inside the longer completions,
                        their tokens 0: TRL's tool_mask, taken out of the loss and of its token count)
  losses.safetensors  TRL's other loss settings (CASES: epsilon_high, delta, sequence-level ratios, bnpo, cispo, sapo,
                      luspo, temperature, top_entropy_quantile, entropy_coef, vespo, off_policy_mask_threshold), each from pi_old's log-probabilities: "<k>.loss", "<k>.grad.<name>" of two tensors,
                      "<k>.ratio"; "adv_batch" and "adv_none" (scale_rewards "batch" and "none"), "adv_gdpo" (normalize_then_sum
                      with a second function, "rewards2", at weights 1 and 0.5); the cases in its
                      metadata (`make_grpo_fixtures.py cases` writes it alone, from the three models' files)
Every prompt has the same length: TRL left-pads prompts and Llama then reads positions shifted by the padding (the
same attention under rotary positions, up to rounding); dtrain's rows start each at position 0.
Run with the baselines' environment (scripts/make-baselines-venv.sh, with trl):
  .venv-baselines/bin/python scripts/make_grpo_fixtures.py
"""
import json
import os
import tempfile

import torch
from datasets import Dataset
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, nanstd

HERE = os.path.dirname(os.path.abspath(__file__))
SFT = os.path.join(HERE, "..", "tests", "fixtures", "sft")
OUT = os.path.join(HERE, "..", "tests", "fixtures", "grpo")
G, PROMPTS, P, C, MAXC = 4, 2, 6, 9, 12  # group, prompts, prompt tokens, completion tokens held, dr_grpo's constant
BETA = 0.04
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.2, 0.9, 0.1]
LENGTHS = [9, 4, 7, 9, 2, 9, 5, 8]
REWARDS2, GDPO_WEIGHTS = [0.0, 3.0, 1.0, 2.0, 2.0, 2.0, 0.5, 4.0], [1.0, 0.5]  # a second reward function (GDPO's case)  # tokens of each completion, its end-of-text token last where shorter than C


def trainer_for(policy, ref, tok, loss_type, tmp, **extra):
    # made with beta 0 (else TRL loads the reference again from the model's hub name, which a random model has not)
    # and given BETA after: _compute_loss reads self.beta, and the reference's log-probabilities come in the inputs
    args = GRPOConfig(output_dir=os.path.join(tmp, loss_type), beta=0.0, loss_type=loss_type, num_generations=G,
                      per_device_train_batch_size=G * PROMPTS, max_completion_length=MAXC, report_to=[], use_cpu=True,
                      bf16=False, **{"temperature": 1.0, **extra})
    data = Dataset.from_list([{"prompt": "x"}] * (G * PROMPTS))
    tr = GRPOTrainer(model=policy, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                     train_dataset=data, processing_class=tok)
    tr.beta = BETA
    tr.current_gradient_accumulation_steps = 1  # set by the training loop, which this does not run
    return tr


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(SFT, "tokenizer.json"), eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    eos = tok.eos_token_id
    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, tie_word_embeddings=False,
                      attn_implementation="eager")
    ref = LlamaForCausalLM(cfg).float()
    policy, old = LlamaForCausalLM(cfg).float(), LlamaForCausalLM(cfg).float()
    policy.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    old.load_state_dict(policy.state_dict())
    with torch.no_grad():
        for p in old.parameters():
            p.add_(0.1 * torch.randn_like(p))
    for m in (ref, old):  # the trainer's own log-probabilities (its fused head, at temperature 1) for the others too
        add_fused_lm_head(m, temperature=1.0)
    R = G * PROMPTS
    prompts = torch.randint(eos + 1, len(tok), (PROMPTS, P)).repeat_interleave(G, 0)
    completion = torch.randint(eos + 1, len(tok), (R, C))
    mask = torch.zeros(R, C, dtype=torch.int64)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
        if n < C:
            completion[i, n - 1] = eos
            completion[i, n:] = eos  # padding, as TRL pads with the pad token (masked)
    rewards = torch.tensor(REWARDS)
    mean = rewards.view(-1, G).mean(1).repeat_interleave(G)
    std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    advantages = (rewards - mean) / (std + 1e-4)  # TRL's scale_rewards "group"
    inputs = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": completion,
              "completion_mask": mask, "advantages": advantages, "num_items_in_batch": mask.sum()}
    out = {"prompt": prompts.to(torch.int32).contiguous(), "completion": completion.to(torch.int32).contiguous(),
           "mask": mask.to(torch.int32).contiguous(), "rewards": rewards, "advantages": advantages.float().contiguous()}
    ids = torch.cat([prompts, completion], 1)
    att = torch.cat([torch.ones_like(prompts), mask], 1)
    # a tool's results inside the longer completions (TRL's tool_mask: 0 for their tokens), for the "tools" case
    tool_mask = torch.ones(R, C, dtype=torch.int64)
    for i, n in enumerate(LENGTHS):
        if n >= 6:
            tool_mask[i, 2:4] = 0
    out["tool_mask"] = tool_mask.to(torch.int32).contiguous()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("dapo", "grpo", "dr_grpo", "plain", "tools"):
            tr = (trainer_for(policy, ref, tok, "grpo", tmp + "/plain", use_bias_correction_kl=False) if kind == "plain"
                  else trainer_for(policy, ref, tok, "dapo", tmp + "/tools") if kind == "tools"
                  else trainer_for(policy, ref, tok, kind, tmp))
            if kind == "tools":
                inputs = dict(inputs, tool_mask=tool_mask, num_items_in_batch=(mask * tool_mask).sum())
            with torch.no_grad():
                ref_lp, _, _ = tr._get_per_token_logps_and_entropies(ref, ids, att, C)
                old_lp, _, _ = tr._get_per_token_logps_and_entropies(old, ids, att, C)
            inputs["ref_per_token_logps"] = ref_lp
            policy.train()
            policy.zero_grad()
            loss = tr._compute_loss(policy, dict(inputs))
            loss.backward()
            out[kind + ".loss"] = loss.detach().reshape(1)
            out[kind + ".kl"] = torch.tensor([tr._metrics["train"]["kl"][-1]])
            out.update({kind + ".grad." + n: p.grad.detach().clone().contiguous() for n, p in policy.named_parameters()})
            print(f"{kind}: loss {loss.item():.7f}, kl {tr._metrics['train']['kl'][-1]:.6f}")
            if kind == "grpo":
                policy.zero_grad()
                loss = tr._compute_loss(policy, dict(inputs, old_per_token_logps=old_lp))
                loss.backward()
                out["clip.loss"] = loss.detach().reshape(1)
                out.update({"clip.grad." + n: p.grad.detach().clone().contiguous() for n, p in policy.named_parameters()})
                out["clip.ratio"] = torch.tensor([tr._metrics["train"]["clip_ratio/region_mean"][-1]])
                out["old_logps"] = old_lp.contiguous()
                print(f"clip: loss {loss.item():.7f}, clip ratio {out['clip.ratio'].item():.4f}")
        out["ref_logps"] = ref_lp.contiguous()
    meta = {"config": json.dumps(cfg.to_dict(), sort_keys=True)}
    for name, m in (("ref", ref), ("old", old)):
        save_file({n: p.detach().clone().contiguous() for n, p in m.state_dict().items()}, os.path.join(OUT, name + ".safetensors"), metadata=meta)
    out.update({n: p.detach().clone().contiguous() for n, p in policy.state_dict().items()})
    save_file(out, os.path.join(OUT, "policy.safetensors"), metadata=meta)
    print(f"advantages {[round(float(a), 5) for a in advantages]}")


# TRL's other loss settings, each with pi_old's log-probabilities given (old.safetensors: ratios away from 1) and the
# reference's KL (BETA): GRPOConfig's fields as dtrain's flags take them; "tools": with the tools' tool_mask
CASES = [
    {"loss_type": "dapo", "epsilon_high": 0.28},  # DAPO's clip-higher
    {"loss_type": "grpo", "delta": 1.5},  # INTELLECT-2's two-sided clipping
    {"loss_type": "dapo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},  # GSPO's
    {"loss_type": "dapo", "importance_sampling_level": "sequence", "tools": True},
    {"loss_type": "grpo", "importance_sampling_level": "sequence", "use_bias_correction_kl": False},
    {"loss_type": "bnpo"}, {"loss_type": "cispo", "epsilon_high": 1.2}, {"loss_type": "sapo"},
    {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    # the log-probabilities at the sampling temperature (the reference's and pi_old's too); the policy term of the
    # tokens in the top quantile by entropy (at that temperature)
    {"loss_type": "dapo", "temperature": 0.7}, {"loss_type": "dapo", "top_entropy_quantile": 0.5},
    {"loss_type": "grpo", "temperature": 1.3, "top_entropy_quantile": 0.2, "epsilon_high": 0.28},
    {"loss_type": "dapo", "importance_sampling_level": "sequence", "top_entropy_quantile": 0.0},
    # the entropy bonus (its gradient through the whole distribution), alone and over the quantile's tokens
    {"loss_type": "dapo", "entropy_coef": 0.1},
    {"loss_type": "grpo", "entropy_coef": 0.05, "top_entropy_quantile": 0.5, "temperature": 0.8},
    # vespo's gamma weights (TRL's shape, another); DeepSeek-V3.2's off-policy mask (pi_old's mean KL over the rows of
    # negative advantage here: 0.67, -0.22, -0.10, 0.08: 0.05 drops two, 0.5 one)
    {"loss_type": "vespo"},
    {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_pos": 2.0, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.0},
    {"loss_type": "dapo", "off_policy_mask_threshold": 0.05},
    {"loss_type": "grpo", "off_policy_mask_threshold": 0.5, "importance_sampling_level": "sequence"},
]
CASE_GRADS = ["model.norm.weight", "model.layers.1.mlp.down_proj.weight"]
# the adaptive entropy coefficient (the entropies here 6.2-6.9 nats): a target above them (the bonus from the second
# step, its coefficient rising to the cap) and one below (never applied, the coefficient falling)
ADAPTIVE = [
    {"entropy_coef": 0.1, "use_adaptive_entropy": True, "entropy_target": 7.0, "entropy_coef_delta": 0.05, "entropy_coef_max": 0.18},
    {"entropy_coef": 0.1, "use_adaptive_entropy": True, "entropy_target": 6.0, "entropy_coef_delta": 0.04, "entropy_coef_min": 0.05,
     "top_entropy_quantile": 0.5},
]


def loss_cases():
    """losses.safetensors: each CASES' loss ("<k>.loss"), gradients ("<k>.grad.<name>" of CASE_GRADS) and clip ratio
    ("<k>.ratio": TRL's clip_ratio/region_mean, or cispo_clip_ratio), from policy.safetensors' rows and old.safetensors'
    pi_old; and the advantages by scale_rewards "batch" and "none" ("adv_batch", "adv_none", as TRL's
    _generate_and_score_completions makes them). The cases in its metadata ("cases")."""
    from safetensors import safe_open
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(SFT, "tokenizer.json"), eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    models, f = {}, safe_open(os.path.join(OUT, "policy.safetensors"), "pt")
    for name in ("ref", "old", "policy"):
        with safe_open(os.path.join(OUT, name + ".safetensors"), "pt") as g:
            m = LlamaForCausalLM(LlamaConfig(**json.loads(g.metadata()["config"]))).float()
            m.load_state_dict({k: g.get_tensor(k) for k in m.state_dict()})
        if name != "policy":
            add_fused_lm_head(m, temperature=1.0)
        models[name] = m
    prompts, completion, mask = (f.get_tensor(k).to(torch.int64) for k in ("prompt", "completion", "mask"))
    tool_mask = f.get_tensor("tool_mask").to(torch.int64)
    rewards, advantages = f.get_tensor("rewards"), f.get_tensor("advantages")
    ids, att = torch.cat([prompts, completion], 1), torch.cat([torch.ones_like(prompts), mask], 1)
    out = {}
    mean = rewards.view(-1, G).mean(1).repeat_interleave(G)
    out["adv_batch"] = ((rewards - mean) / (nanstd(rewards) + 1e-4)).float().contiguous()
    out["adv_none"] = (rewards - mean).float().contiguous()
    # GDPO's normalize_then_sum with a second function (REWARDS2) at weights GDPO_WEIGHTS, as
    # _generate_and_score_completions' branch makes it
    per_func = torch.stack([rewards, torch.tensor(REWARDS2)], dim=1).view(-1, G, 2)
    mean_k, std_k = torch.nanmean(per_func, dim=1, keepdim=True), nanstd(per_func, dim=1, keepdim=True)
    summed = (((per_func - mean_k) / (std_k + 1e-4)).view(-1, 2) * torch.tensor(GDPO_WEIGHTS).unsqueeze(0)).nansum(dim=1)
    out["rewards2"] = torch.tensor(REWARDS2).float().contiguous()
    out["adv_gdpo"] = ((summed - torch.nanmean(summed)) / (nanstd(summed) + 1e-4)).float().contiguous()
    policy = models["policy"]
    with tempfile.TemporaryDirectory() as tmp:
        for k, case in enumerate(CASES):
            extra = {key: v for key, v in case.items() if key not in ("loss_type", "tools")}
            tr = trainer_for(policy, models["ref"], tok, case["loss_type"], os.path.join(tmp, str(k)), **extra)
            for name in ("ref", "old"):  # their log-probabilities at the case's temperature, as the trainer's
                add_fused_lm_head(models[name], temperature=tr.temperature)
            inputs = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": completion,
                      "completion_mask": mask, "advantages": advantages, "num_items_in_batch": mask.sum()}
            if case.get("tools"):
                inputs.update(tool_mask=tool_mask, num_items_in_batch=(mask * tool_mask).sum())
            with torch.no_grad():
                inputs["ref_per_token_logps"], _, _ = tr._get_per_token_logps_and_entropies(models["ref"], ids, att, C)
                inputs["old_per_token_logps"], _, _ = tr._get_per_token_logps_and_entropies(models["old"], ids, att, C)
            policy.train()
            policy.zero_grad()
            loss = tr._compute_loss(policy, inputs)
            loss.backward()
            named = dict(policy.named_parameters())
            out[f"{k}.loss"] = loss.detach().reshape(1)
            out.update({f"{k}.grad.{n}": named[n].grad.detach().clone().contiguous() for n in CASE_GRADS})
            metric = "cispo_clip_ratio" if case["loss_type"] == "cispo" else "clip_ratio/region_mean"
            if metric in tr._metrics["train"]:
                out[f"{k}.ratio"] = torch.tensor([tr._metrics["train"][metric][-1]])
            print(f"case {k} {case}: loss {loss.item():.7f}" + (f", {metric} {out[f'{k}.ratio'].item():.4f}" if f"{k}.ratio" in out else ""))
        # the adaptive entropy coefficient over three steps of the same rows (each call its own optimizer step, no update
        # between): ADAPTIVE's settings, each step's loss and the coefficient after it
        for k, case in enumerate(ADAPTIVE):
            tr = trainer_for(policy, models["ref"], tok, "dapo", os.path.join(tmp, f"a{k}"), **case)
            for name in ("ref", "old"):
                add_fused_lm_head(models[name], temperature=tr.temperature)
            inputs = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": completion,
                      "completion_mask": mask, "advantages": advantages, "num_items_in_batch": mask.sum()}
            with torch.no_grad():
                inputs["ref_per_token_logps"], _, _ = tr._get_per_token_logps_and_entropies(models["ref"], ids, att, C)
                inputs["old_per_token_logps"], _, _ = tr._get_per_token_logps_and_entropies(models["old"], ids, att, C)
            losses, coefs = [], []
            for _ in range(3):
                policy.train()
                losses.append(tr._compute_loss(policy, inputs).item())
                coefs.append(tr.entropy_coef)
            out[f"adaptive{k}.loss"], out[f"adaptive{k}.coef"] = torch.tensor(losses), torch.tensor(coefs)
            print(f"adaptive {k} {case}: losses {losses}, coefficients {coefs}")
    save_file(out, os.path.join(OUT, "losses.safetensors"), metadata={"cases": json.dumps(CASES), "adaptive": json.dumps(ADAPTIVE)})


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["cases"]:
        loss_cases()
    else:
        main()
        loss_cases()
