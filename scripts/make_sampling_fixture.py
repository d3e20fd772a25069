#!/usr/bin/env python3
"""Reference fixture for dtrain's sampling filters, computed by Hugging Face's logits processors (the oracle): the
tokens a draw chooses among after RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper and MinPLogitsWarper, in the order generate applies them (transformers' _get_logits_processor).
OpenAI's logit_bias and presence/frequency penalties, which transformers does not have, are computed here in PyTorch
as OpenAI's API reference defines them (mu[j] - c[j] * frequency - (c[j] > 0) * presence, c[j] the times token j was
drawn) and in vLLM's order and roundings (logit_bias added first; after the repetition penalty, the two subtractions).

Writes tests/fixtures/sampling/cases.safetensors: "logits" [ROWS, V] (random, no ties), and for case k of CASES (its
metadata "cases": row, temperature, top_k, top_p, min_p, repetition_penalty with ids, the tokens the sequence holds
(the row's three most likely and its least), and kept: how many) "kept.<k>" the kept tokens' ids (int32, ascending),
and with a penalty or bias "penalized.<k>" the row's logits after them (cases with presence_penalty also hold drawn, the
tokens drawn so far: the row's most likely three times, its second and its least once; logit_bias {"id": bias}).
Run with the baselines' environment (scripts/make-baselines-venv.sh):
  .venv-baselines/bin/python scripts/make_sampling_fixture.py
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "sampling")
ROWS, V = 3, 64
CASES = [
    {"row": 0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.1},
    {"row": 0, "temperature": 0.7, "top_k": 0, "top_p": 1.0, "min_p": 0.05},
    {"row": 1, "temperature": 1.3, "top_k": 20, "top_p": 1.0, "min_p": 0.2},
    {"row": 1, "temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.3},
    {"row": 2, "temperature": 0.5, "top_k": 10, "top_p": 0.8, "min_p": 0.01},
    {"row": 2, "temperature": 1.0, "top_k": 0, "top_p": 0.5, "min_p": 0.0},
    {"row": 2, "temperature": 2.0, "top_k": 30, "top_p": 1.0, "min_p": 0.0},
    {"row": 0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 1.0},
    {"row": 0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.1, "repetition_penalty": 1.3},
    {"row": 1, "temperature": 0.8, "top_k": 10, "top_p": 0.9, "min_p": 0.0, "repetition_penalty": 2.0},
    {"row": 2, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.05, "repetition_penalty": 0.7},
    {"row": 0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.1, "presence_penalty": 0.8, "frequency_penalty": 0.5},
    {"row": 1, "temperature": 0.9, "top_k": 10, "top_p": 0.9, "min_p": 0.0, "presence_penalty": -0.5, "frequency_penalty": 1.5,
     "repetition_penalty": 1.2, "logit_bias": {"5": 3.0, "17": -100.0}},
    {"row": 2, "temperature": 1.0, "top_k": 8, "top_p": 1.0, "min_p": 0.0, "logit_bias": {"0": 4.0, "63": 2.5}},
]


def main():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(ROWS, V, generator=g) * 2.5
    out = {"logits": logits.contiguous()}
    for k, c in enumerate(CASES):
        x = logits[c["row"]].clone().unsqueeze(0)
        ids = torch.zeros(1, 1, dtype=torch.long)
        for t, b in c.get("logit_bias", {}).items():
            x[0, int(t)] += b
        if "repetition_penalty" in c:
            order = torch.argsort(x[0], descending=True)
            c["ids"] = order[:3].tolist() + [order[-1].item()]
            ids = torch.tensor([c["ids"]])
            x = RepetitionPenaltyLogitsProcessor(c["repetition_penalty"])(ids, x)
        if "presence_penalty" in c:
            order = torch.argsort(logits[c["row"]], descending=True)
            c["drawn"] = [order[0].item()] * 3 + [order[1].item(), order[-1].item()]
            counts = torch.bincount(torch.tensor(c["drawn"]), minlength=V).to(x.dtype)
            x[0] -= c["frequency_penalty"] * counts
            x[0] -= c["presence_penalty"] * (counts > 0).to(x.dtype)
        if "repetition_penalty" in c or "presence_penalty" in c or "logit_bias" in c:
            out[f"penalized.{k}"] = x[0].clone().contiguous()
        warpers = [TemperatureLogitsWarper(c["temperature"])]
        if c["top_k"] > 0:
            warpers.append(TopKLogitsWarper(top_k=c["top_k"]))
        if c["top_p"] < 1:
            warpers.append(TopPLogitsWarper(top_p=c["top_p"]))
        if c["min_p"] > 0:
            warpers.append(MinPLogitsWarper(min_p=c["min_p"]))
        for w in warpers:
            x = w(ids, x)
        kept = torch.nonzero(torch.isfinite(x[0])).flatten().to(torch.int32)
        out[f"kept.{k}"] = kept.contiguous()
        c["kept"] = kept.numel()
        print(f"case {k} {c}: {kept.numel()} tokens kept")
    os.makedirs(OUT, exist_ok=True)
    save_file(out, os.path.join(OUT, "cases.safetensors"), metadata={"cases": json.dumps(CASES)})


if __name__ == "__main__":
    main()
