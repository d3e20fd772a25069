#!/usr/bin/env python3
"""Reference fixtures for dtrain's direct preference optimization, computed by TRL's DPOTrainer (the oracle).

Writes tests/fixtures/dpo/:
  tokenizer.json, tokenizer_config.json   the SFT fixtures' (tests/fixtures/sft: ChatML's tokens, eos <|endoftext|>)
  pairs.jsonl            preference pairs ({"prompt", "chosen", "rejected"})
  ref.safetensors        the reference: a tiny random Llama's weights (HF names); metadata "config"
  policy.safetensors     the policy (the reference moved by noise, so that its log-ratios are not zero): its weights,
                         and of one batch holding every pair, TRL's compute_loss (loss_type sigmoid, beta 0.1): "loss",
                         "grad.<name>" every weight's gradient, "ref_logps" and "logps" [2 * pairs] (row 2i chosen,
                         2i + 1 rejected: the sums over the completions' tokens), "ids.<k>" and "mask.<k>" row k's
                         tokens and completion mask as TRL made them
  chat.jsonl             conversational pairs (prompt, chosen, rejected: lists of messages), rendered by the ChatML
                         template of tokenizer_config.json
  chat.safetensors       of the policy on them, as policy.safetensors: "loss", "grad.<name>", "ids.<k>", "mask.<k>"
  implicit.jsonl         pairs without "prompt" (HH-RLHF's form: the prompt at the start of both), texts and turns
  implicit.safetensors   TRL's rows of them (extract_prompt's split), "loss"
  tools_<name>.jsonl     conversational pairs with tools (a call chosen or rejected, a call and its result in the
                         prompt), rendered by Qwen 2.5's (qwen2_5) and Llama 3.1's (llama3_1) templates, the tokenizers
                         and templates of tests/fixtures/sft/<name>_prompts.json; rows of 1024; qwen3_kwargs and
                         llama3_1_kwargs: pairs with each row's chat_template_kwargs
  tools_<name>.safetensors  TRL's rows of them: "ids.<k>", "mask.<k>" (only the rows: `make_dpo_fixtures.py tools`
                         writes these alone)
  losses.safetensors     of the text pairs, TRL's other loss kinds (LOSS_CASES, its metadata "cases": loss_type,
                         loss_weights, label_smoothing, discopop_tau, the f-divergence, ld_alpha, use_weighting): "<k>.loss" and
                         "<k>.grad.<name>" of LOSS_GRADS (`make_dpo_fixtures.py losses` writes it alone, from the
                         reference's and the policy's files)
Run with the baselines' environment (scripts/make-baselines-venv.sh, with trl):
  .venv-baselines/bin/python scripts/make_dpo_fixtures.py
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from datasets import Dataset
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
SFT = os.path.join(HERE, "..", "tests", "fixtures", "sft")
OUT = os.path.join(HERE, "..", "tests", "fixtures", "dpo")
MAX = 65  # dtrain's rows: --seq 64 inputs and targets, 65 tokens
BETA = 0.1
PAIRS = [
    {"prompt": "Question: the capital of France?\nAnswer:", "chosen": " Paris.", "rejected": " Rome, I think."},
    {"prompt": "In the beginning", "chosen": " God created the heaven and the earth.", "rejected": " was the word"},
    {"prompt": "1, 2, 3,", "chosen": " 4, 5, 6", "rejected": " 7"},
    {"prompt": "Say yes.", "chosen": " Yes.", "rejected": " No, never, not today."},
]
CHATS = [
    {"prompt": [{"role": "user", "content": "Hello there"}], "chosen": [{"role": "assistant", "content": "Hi! How can I help?"}],
     "rejected": [{"role": "assistant", "content": "Go away."}]},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}],
     "chosen": [{"role": "assistant", "content": "4."}], "rejected": [{"role": "assistant", "content": "It is five, I believe."}]},
    {"prompt": [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Again."}],
     "chosen": [{"role": "assistant", "content": "Yes, yes."}], "rejected": [{"role": "assistant", "content": "No."}]},
]
IMPLICIT = [
    {"chosen": "\n\nHuman: Is the sky blue?\n\nAssistant: Yes, on a clear day.",
     "rejected": "\n\nHuman: Is the sky blue?\n\nAssistant: No."},
    {"chosen": "Name a fruit: apple", "rejected": "Name a fruit: a stone"},
    {"chosen": "The end", "rejected": "The end is near"},
]


def dpo_batch(policy, ref, tok, rows, tmp, max_length=MAX, **settings):
    """TRL's loss and gradients of one batch of every pair, and its rows (dtrain's order: chosen, rejected); settings: more
    of DPOConfig's (loss_type and the rest)."""
    args = DPOConfig(output_dir=os.path.join(tmp, "run"), beta=BETA, max_length=max_length, per_device_train_batch_size=len(rows),
                     report_to=[], use_cpu=True, dataset_num_proc=None,
                     bf16=False, **settings)  # TRL defaults to bf16 autocast (on the reference at once): f32, as dtrain here
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
    policy.train()
    policy.zero_grad()
    loss = trainer.compute_loss(policy, batch)
    loss.backward()
    tensors = {"grad." + n: p.grad.detach().clone().contiguous() for n, p in policy.named_parameters()}
    tensors["loss"] = loss.detach().reshape(1)
    n = len(rows)
    for k in range(2 * n):
        src = k // 2 + (k % 2) * n
        m = int(batch["attention_mask"][src].sum())
        tensors[f"ids.{k}"] = batch["input_ids"][src, :m].to(torch.int32).contiguous()
        tensors[f"mask.{k}"] = batch["completion_mask"][src, :m].to(torch.int32).contiguous()
    return loss, batch, tensors


# TRL's loss kinds beside sigmoid (policy.safetensors' own), each on the text pairs from the same policy and reference:
# DPOConfig's settings as dtrain's flags take them
LOSS_CASES = [
    {"loss_type": ["hinge"]}, {"loss_type": ["ipo"]}, {"loss_type": ["exo_pair"], "label_smoothing": 1e-3},
    {"loss_type": ["nca_pair"]}, {"loss_type": ["robust"], "label_smoothing": 0.1}, {"loss_type": ["bco_pair"]},
    {"loss_type": ["sppo_hard"]}, {"loss_type": ["apo_zero"]}, {"loss_type": ["apo_down"]},
    {"loss_type": ["discopop"], "discopop_tau": 0.05}, {"loss_type": ["sft"]}, {"loss_type": ["sigmoid_norm"]},
    {"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]},  # MPO's mix, TRL's own example
    {"loss_type": ["sigmoid"], "f_divergence_type": "forward_kl"}, {"loss_type": ["sigmoid"], "f_divergence_type": "js_divergence"},
    {"loss_type": ["ipo"], "f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.3},
    {"loss_type": ["robust", "hinge"], "loss_weights": [0.5, 2.0], "label_smoothing": 0.2},
    {"loss_type": ["aot"], "label_smoothing": 0.1}, {"loss_type": ["aot_unpaired"]},  # the log-ratios sorted across the batch
    # LD-DPO's tails beyond the shorter completion, WPO's weights, both with sft (its tokens unweighted by ld_alpha)
    {"loss_type": ["sigmoid"], "ld_alpha": 0.5}, {"loss_type": ["ipo"], "ld_alpha": 0.0},
    {"loss_type": ["sigmoid"], "use_weighting": True}, {"loss_type": ["bco_pair", "sigmoid_norm"], "use_weighting": True},
    {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5], "ld_alpha": 0.3}, {"loss_type": ["sigmoid"], "ld_alpha": 0.3, "use_weighting": True},
]  # (TRL 1.16 cannot take use_weighting with hinge or sft: it scales their losses in place, which backward then refuses)
# the gradients kept of each (the last norm's and a down projection's: every row's weight reaches them)
LOSS_GRADS = ["model.norm.weight", "model.layers.1.mlp.down_proj.weight"]


def loss_cases():
    """losses.safetensors: of the text pairs, each LOSS_CASES' loss ("<k>.loss") and gradients ("<k>.grad.<name>"); the
    cases in its metadata ("cases")."""
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(OUT, "tokenizer.json"), eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    models = []
    for name in ("ref", "policy"):
        path = os.path.join(OUT, name + ".safetensors")
        with safe_open(path, "pt") as f:
            cfg = LlamaConfig(**json.loads(f.metadata()["config"]))
            m = LlamaForCausalLM(cfg).float()
            m.load_state_dict({k: f.get_tensor(k) for k in m.state_dict()})
        models.append(m)
    ref, policy = models
    tensors = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, case in enumerate(LOSS_CASES):
            loss, _, t = dpo_batch(policy, ref, tok, PAIRS, tmp, **case)
            tensors[f"{k}.loss"] = t["loss"]
            for n in LOSS_GRADS:
                tensors[f"{k}.grad.{n}"] = t["grad." + n]
            print(f"losses: {k} {case}: {loss.item():.6f}")
    save_file(tensors, os.path.join(OUT, "losses.safetensors"), metadata={"cases": json.dumps(LOSS_CASES)})


def tool_cases():
    """Pairs with tools by Qwen 2.5's and Llama 3.1's templates: TRL's rows (the tools' turns in the prompt)."""
    sys.path.insert(0, HERE)
    from make_sft_fixtures import TOOLS, ADD, QWEN3_KWARGS, LLAMA31_KWARGS, fixture_tokenizer
    user = [{"role": "user", "content": "2 + 3?"}]
    call = [{"role": "assistant", "content": None, "tool_calls": [ADD]}]
    pairs = {
        # Qwen 2.5's: a call chosen over a refusal; a result in the prompt, the tools as their JSON text
        "qwen2_5": [{"prompt": user, "chosen": call, "rejected": [{"role": "assistant", "content": "I cannot add."}], "tools": TOOLS},
                    {"prompt": [{"role": "system", "content": "Be brief."}] + user + [dict(call[0], content="Adding.")] +
                     [{"role": "tool", "content": "5"}], "chosen": [{"role": "assistant", "content": "5."}],
                     "rejected": [{"role": "assistant", "content": "6."}], "tools": json.dumps(TOOLS)}],
        # Llama 3.1's (its template reads a message's tool_calls by the key alone: every message of a column has one,
        # so the calls are a column's own): the call chosen, or rejected
        "llama3_1": [{"prompt": [{"role": "system", "content": " Be brief. "}] + user, "chosen": call,
                      "rejected": [{"role": "assistant", "content": " I cannot add. "}], "tools": TOOLS},
                     {"prompt": [{"role": "user", "content": "Weather in Paris?"}], "chosen": call,
                      "rejected": [{"role": "assistant", "content": "Sunny."}], "tools": json.dumps(TOOLS)}],
        # each row's chat_template_kwargs (TRL's DPOTrainer passes a row's to apply_chat_template): Qwen 3's generation
        # prompt with thinking off, so its empty think block is the prompt's; Llama 3.1's date, its tools in the system turn
        "qwen3_kwargs": [{"prompt": user, "chosen": [{"role": "assistant", "content": "5."}], "rejected": [{"role": "assistant", "content": "6."}],
                          "tools": None, "chat_template_kwargs": QWEN3_KWARGS},
                         {"prompt": [{"role": "system", "content": "Be brief."}] + user + [{"role": "assistant", "content": "5."}] +
                          [{"role": "user", "content": "And 3 + 4?"}], "chosen": [{"role": "assistant", "content": "7."}],
                          "rejected": [{"role": "assistant", "content": "Seven, I think."}], "tools": None, "chat_template_kwargs": QWEN3_KWARGS}],
    }
    pairs["llama3_1_kwargs"] = [dict(r, chat_template_kwargs=LLAMA31_KWARGS) for r in pairs["llama3_1"]]
    torch.manual_seed(7)
    for name, rows in pairs.items():
        case = json.load(open(os.path.join(SFT, name.replace("_kwargs", "") + "_prompts.json")))
        tok = fixture_tokenizer(case["tokenizer"], case["chat_template"])
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, max_position_embeddings=1024)
        ref = LlamaForCausalLM(cfg).float()
        # the data set as TRL reads it: the tools as their JSON text (a column mixes no lists and texts)
        data = [dict(p, tools=p["tools"] if isinstance(p["tools"], str) else json.dumps(p["tools"]) if p["tools"] else None) for p in rows]
        with tempfile.TemporaryDirectory() as tmp:
            _, batch, tensors = dpo_batch(LlamaForCausalLM(cfg).float(), ref, tok, data, tmp, max_length=1024)
        with open(os.path.join(OUT, f"tools_{name}.jsonl"), "w") as f:
            for p in rows:
                f.write(json.dumps(p) + "\n")
        save_file({k: v for k, v in tensors.items() if k.startswith(("ids.", "mask."))}, os.path.join(OUT, f"tools_{name}.safetensors"))
        lengths = [int(x) for x in batch["attention_mask"].sum(1)]
        print(f"tools_{name}: {len(rows)} pairs with tools, rows of {lengths} tokens, {int(batch['completion_mask'].sum())} completion tokens")


def main():
    if sys.argv[1:] == ["tools"]:
        tool_cases()
        return
    if sys.argv[1:] == ["losses"]:
        loss_cases()
        return
    os.makedirs(OUT, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(SFT, f), os.path.join(OUT, f))
    with open(os.path.join(OUT, "pairs.jsonl"), "w") as f:
        for p in PAIRS:
            f.write(json.dumps(p) + "\n")
    torch.use_deterministic_algorithms(True)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(OUT, "tokenizer.json"), eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, tie_word_embeddings=False,
                      attn_implementation="eager")
    ref = LlamaForCausalLM(cfg).float()
    policy = LlamaForCausalLM(cfg).float()
    policy.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with tempfile.TemporaryDirectory() as tmp:
        loss, batch, tensors = dpo_batch(policy, ref, tok, PAIRS, tmp)
        with torch.no_grad():  # the rows' log-probabilities, as the loss summed them, for the record
            labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)

            def logps(model):
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
                lab = labels[:, 1:]
                lp = torch.log_softmax(logits.float(), -1).gather(-1, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                return (lp * (lab != -100)).sum(1)

            def rows(v):  # TRL's batch is [all chosen, all rejected]: dtrain's rows interleave them
                n = len(PAIRS)
                return torch.stack([v[:n], v[n:]], 1).reshape(-1).contiguous()

            ref_lp, pol_lp = rows(logps(ref)), rows(logps(policy))
        tok.chat_template = json.load(open(os.path.join(OUT, "tokenizer_config.json")))["chat_template"]
        chat_loss, _, chat = dpo_batch(policy, ref, tok, CHATS, tmp)
        implicit_loss, _, implicit = dpo_batch(policy, ref, tok, IMPLICIT, tmp)
    save_file({n: p.detach().clone().contiguous() for n, p in ref.state_dict().items()}, os.path.join(OUT, "ref.safetensors"),
              metadata={"config": json.dumps(cfg.to_dict(), sort_keys=True)})
    tensors.update({n: p.detach().clone().contiguous() for n, p in policy.state_dict().items()})
    tensors["ref_logps"], tensors["logps"] = ref_lp, pol_lp
    n = len(PAIRS)
    with open(os.path.join(OUT, "chat.jsonl"), "w") as f:
        for p in CHATS:
            f.write(json.dumps(p) + "\n")
    save_file(chat, os.path.join(OUT, "chat.safetensors"))
    with open(os.path.join(OUT, "implicit.jsonl"), "w") as f:
        for p in IMPLICIT:
            f.write(json.dumps(p) + "\n")
    save_file(implicit, os.path.join(OUT, "implicit.safetensors"))
    print(f"implicit: {len(IMPLICIT)} pairs without a prompt, loss {implicit_loss.item():.6f}")
    print(f"chat: {len(CHATS)} conversational pairs, loss {chat_loss.item():.6f}")
    save_file(tensors, os.path.join(OUT, "policy.safetensors"), metadata={"config": json.dumps(cfg.to_dict(), sort_keys=True)})
    print(f"dpo: {n} pairs, loss {loss.item():.6f}, log-ratio margins "
          f"{[round(float(BETA * ((pol_lp[2*i] - ref_lp[2*i]) - (pol_lp[2*i+1] - ref_lp[2*i+1]))), 5) for i in range(n)]}")
    tool_cases()
    loss_cases()


if __name__ == "__main__":
    main()
