#!/usr/bin/env python3
"""LoRA's round trips with PEFT on models dtrain did not make: for a tiny random GPT-2 and a tiny Llama (transformers,
saved as HF folders),
  1. dtrain trains LoRA adapters on the folder (dtrain train --model FOLDER --lora-rank ... --save CK),
  2. PEFT loads CK as an adapter folder (PeftModel.from_pretrained) and computes the loss and logits of a batch,
  3. dtrain evaluates the same batch with the adapters (dtrain eval --model FOLDER --lora CK): the same loss,
  4. dtrain merges them (dtrain ckpt merge FOLDER CK MERGED) and transformers loads MERGED (from_pretrained):
     the same logits as PEFT's adapted model,
  5. PEFT's own adapter folder (save_pretrained of freshly drawn adapters) merged by dtrain: transformers' logits on
     the merged folder equal PEFT's adapted model's.
Prints each figure; exit 1 if any is off (1e-5 relative).

Run with the baselines' environment:
  .venv-baselines/bin/python scripts/check_lora_peft.py [build/dtrain]
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
B, T = 2, 32
MODELS = {
    "gpt2": (lambda: GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                                  initializer_range=0.1)), "c_attn,c_proj", True),
    "llama": (lambda: LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                                   initializer_range=0.1, tie_word_embeddings=False)),
              "q_proj,v_proj,down_proj", False),
}
failed = 0


def report(name, what, err, tol=1e-5):
    global failed
    ok = err <= tol
    failed += not ok
    print(f"{name:6s} {what:58s} {err:.2e}{'' if ok else '   FAIL'}")


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def tokens_file(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(toks), *toks))


def run(*args):
    out = subprocess.run(list(args), capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"failed: {' '.join(args)}\n{out.stdout}{out.stderr}")
    return out.stdout + out.stderr


def main():
    dtrain = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "build", "dtrain")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        g = torch.Generator().manual_seed(3)
        toks = torch.randint(0, 256, (20000,), generator=g).tolist()
        data = os.path.join(tmp, "tok.bin")
        tokens_file(data, toks)
        batch = torch.tensor(toks[:B * T + 1])
        x, y = batch[:-1].view(B, T), batch[1:].view(B, T)
        for name, (make, targets, fan) in MODELS.items():
            folder, ck, merged = (os.path.join(tmp, name + s) for s in ("_base", "_ck", "_merged"))
            make().float().save_pretrained(folder)
            run(dtrain, "train", "--model", folder, "--data", data, "--seq", str(T), "--batch", str(B), "--steps", "8",
                "--lr", "1e-2", "--lora-rank", "4", "--lora-alpha", "16", "--lora-targets", targets, "--save", ck, "--quiet")
            base = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float()
            peft = PeftModel.from_pretrained(base, ck).eval()
            with torch.no_grad():
                logits = peft(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).item()
            out = run(dtrain, "eval", "--model", folder, "--lora", ck, "--data", data, "--val-data", data, "--seq", str(T),
                      "--batch", str(B), "--eval-batches", "1")
            m = re.search(r"validation loss ([0-9.]+)", out)
            report(name, f"dtrain's adapters in PEFT: loss {loss:.6f}, dtrain eval's {m.group(1) if m else '?'}",
                   abs(float(m.group(1)) - loss) / loss if m else 1)
            run(dtrain, "ckpt", "merge", folder, ck, merged)
            with torch.no_grad():
                ml = AutoModelForCausalLM.from_pretrained(merged, attn_implementation="eager").float()(input_ids=x).logits
            report(name, "dtrain's merge in transformers: logits = PEFT's adapted model's", rel(ml, logits))
            # PEFT's own folder, merged by dtrain
            fresh = get_peft_model(AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float(),
                                   LoraConfig(r=8, lora_alpha=32, target_modules=targets.split(","), fan_in_fan_out=fan))
            with torch.no_grad():
                for n, p in fresh.named_parameters():
                    if "lora_B" in n:
                        p.copy_(0.2 * torch.randn_like(p))
                want = fresh(input_ids=x).logits
            pf, pm = os.path.join(tmp, name + "_peft"), os.path.join(tmp, name + "_peft_merged")
            fresh.save_pretrained(pf)
            run(dtrain, "ckpt", "merge", folder, pf, pm)
            with torch.no_grad():
                got = AutoModelForCausalLM.from_pretrained(pm, attn_implementation="eager").float()(input_ids=x).logits
            report(name, "PEFT's folder merged by dtrain: logits = PEFT's adapted model's", rel(got, want))
    print("lora with peft:", "FAILED" if failed else "all agree")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
