#!/usr/bin/env python3
"""dtrain's exported mixture-of-experts folders in transformers: each loads (every tensor used, none missing) and its
loss on a token file equals what dtrain's eval printed. Outside the suite (it needs the baselines' environment).

  dtrain train --model mixtral-tiny ... --save CK && dtrain ckpt export CK HF
  dtrain eval --model HF --data TOKENS --val-data TOKENS --seq T --batch B --eval-batches N   (prints the loss)
  .venv-baselines/bin/python scripts/check_moe_hf.py HF TOKENS T B N
"""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def main():
    folder, tokens, T, B, N = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    print(f"{type(model).__name__}: loading info {bad or 'clean'}")
    data = np.fromfile(tokens, dtype=np.uint16)[512:]  # llm.c's token file: a 1024-byte header
    model.eval()
    losses = []
    with torch.no_grad():
        for b in range(N):
            chunk = torch.tensor(data[b * B * T: (b + 1) * B * T + 1].astype(np.int64))
            x, y = chunk[:-1].reshape(B, T), chunk[1:].reshape(B, T)
            out = model(input_ids=x)  # the config's output_router_logits: the balancing loss added as the model's loss adds it
            loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), y.reshape(-1))
            if out.aux_loss is not None:
                loss = loss + model.config.router_aux_loss_coef * out.aux_loss
            losses.append(loss.item())
    print(f"validation loss {sum(losses) / len(losses):.6f} over {N} batches of {B} x {T}")


if __name__ == "__main__":
    main()
