#!/usr/bin/env python3
"""The loss scaler's oracle: DeepSpeed's own DynamicLossScaler, driven through
scripted sequences of overflowing and clean steps, writes what it does into
tests/fixtures/loss_scale.txt; tests/test_loss_scale.c replays the same
sequences through dtrain's scaler and wants the same scales, hysteresis and
stop.

Needs DeepSpeed (PyPI): run it with the baselines' environment,
  scripts/make-baselines-venv.sh && .venv-baselines/bin/python scripts/make_loss_scale_fixture.py

Format, one record per line:
  config INIT_SCALE WINDOW MIN_SCALE HYSTERESIS CONSECUTIVE   a sequence starts
  step OVERFLOW SCALE HYSTERESIS                              after update_scale(OVERFLOW)
  raise STEP                                                  DeepSpeed refused: at the minimum (1-based step)
"""
import os
import random
import sys

import deepspeed
from deepspeed.runtime.fp16 import loss_scaler

# The rank only picks who logs; a single process has no process group.
loss_scaler.dist.get_rank = lambda: 0

# (initial scale, window, min scale, hysteresis, consecutive hysteresis, steps, P(overflow), seed)
SEQUENCES = [
    (2.0**16, 1000, 1.0, 2, False, 2600, 0.0015, 1),  # DeepSpeed's defaults
    (2.0**16, 4, 1.0, 2, False, 400, 0.15, 2),
    (2.0**10, 3, 1.0, 1, False, 300, 0.3, 3),
    (2.0**8, 5, 2.0, 3, True, 300, 0.25, 4),
    (2.0**20, 7, 1.0, 2, True, 300, 0.4, 5),
    (2.0**4, 10, 2.0**2, 2, False, 200, 0.6, 6),  # runs into the floor
    (2.0**16, 2, 2.0**15, 1, False, 50, 0.9, 7),  # the floor at once
    (1000.0, 5, 3.0, 1, False, 200, 0.5, 8),  # a floor that halving does not land on
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "..", "tests", "fixtures", "loss_scale.txt")
    lines = [f"# DeepSpeed {deepspeed.__version__} DynamicLossScaler, written by scripts/make_loss_scale_fixture.py"]
    for init, window, floor, hyst, consec, steps, p, seed in SEQUENCES:
        rng = random.Random(seed)
        s = loss_scaler.DynamicLossScaler(init_scale=init, scale_window=window, min_scale=floor, delayed_shift=hyst,
                                          consecutive_hysteresis=consec, raise_error_at_min_scale=True)
        lines.append(f"config {init:.17g} {window} {floor:.17g} {hyst} {int(consec)}")
        for i in range(steps):
            overflow = rng.random() < p
            try:
                s.update_scale(overflow)
            except Exception:
                lines.append(f"raise {i + 1}")
                break
            lines.append(f"step {int(overflow)} {s.cur_scale:.17g} {s.cur_hysteresis}")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(SEQUENCES)} sequences", file=sys.stderr)


if __name__ == "__main__":
    main()
