#!/usr/bin/env python3
"""Hugging Face's learning-rate schedules as the oracle of dtrain's --schedule linear and wsd: transformers'
get_linear_schedule_with_warmup and get_wsd_schedule drive a one-parameter SGD, and the rate each optimizer step
runs at goes into tests/fixtures/schedules.txt; tests/test_schedules.c wants dtrain's dt_lr_at at every step.

Needs torch and transformers (PyPI): run it with the baselines' environment,
  scripts/make-baselines-venv.sh && .venv-baselines/bin/python scripts/make_schedule_fixture.py

Format: a line "case KIND LR LR_MIN WARMUP TOTAL DECAY DECAY_TYPE STEPS" (DECAY 0: dtrain's default, a tenth of
TOTAL, given to transformers as that), then STEPS lines of the rate at steps 0, 1, ... (some past TOTAL).
"""
import os

import torch
import transformers
from transformers import get_linear_schedule_with_warmup, get_wsd_schedule

# (kind, lr, lr_min, warmup, total, decay, decay type)
CASES = [
    ("linear", 1e-3, 0.0, 10, 100, 0, "cosine"),    # TRL's SFTTrainer default kind, with a warm-up
    ("linear", 3e-4, 0.0, 0, 37, 0, "cosine"),      # no warm-up: from lr at once
    ("linear", 2e-3, 0.0, 1, 2, 0, "cosine"),       # shorter than anything
    ("wsd", 1e-3, 0.0, 10, 100, 20, "cosine"),      # transformers' defaults: linear warm-up, cosine decay
    ("wsd", 1e-3, 1e-4, 5, 60, 0, "linear"),        # a floor (min_lr_ratio 0.1), the default tenth
    ("wsd", 6e-4, 0.0, 0, 50, 17, "1-sqrt"),        # Hägele et al.'s 1-sqrt cool-down, no warm-up
    ("wsd", 1e-3, 2e-4, 3, 13, 10, "cosine"),       # no stable phase
]


def rates(kind, lr, lr_min, warmup, total, decay, decay_type, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    if kind == "linear":
        sched = get_linear_schedule_with_warmup(opt, warmup, total)
    else:
        sched = get_wsd_schedule(opt, warmup, decay or total // 10, num_training_steps=total, decay_type=decay_type,
                                 min_lr_ratio=lr_min / lr)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "fixtures", "schedules.txt")
    with open(path, "w") as f:
        f.write(f"# transformers {transformers.__version__}, torch {torch.__version__}: "
                "written by scripts/make_schedule_fixture.py\n")
        for kind, lr, lr_min, warmup, total, decay, dtype in CASES:
            steps = total + 3
            f.write(f"case {kind} {lr!r} {lr_min!r} {warmup} {total} {decay} {dtype} {steps}\n")
            for r in rates(kind, lr, lr_min, warmup, total, decay, dtype, steps):
                f.write(f"{r!r}\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
