#!/usr/bin/env python3
"""V-trace's targets and policy-gradient advantages as RLlib computes them
(ray.rllib.algorithms.impala.torch.vtrace_torch_v2.vtrace_torch, DeepMind's
scalable_agent recursion), for tests/test_rl_ppo.c: random log importance
weights (ratios from about 0.2 to 5, so both truncations bite), rewards,
values, a bootstrap, and discounts that are 0 at some terminations; one case
with rho_bar 1 and one with rho_bar 2.5 (c_bar is 1 in RLlib's, as in
dtrain's defaults).

    .venv-baselines/bin/python scripts/make_vtrace_fixture.py tests/fixtures/rl/vtrace.bin"""
import sys

import torch
from ray.rllib.algorithms.impala.torch.vtrace_torch_v2 import vtrace_torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import fixture_arrays  # noqa: E402

T, B, GAMMA = 20, 6, 0.99


def case(g, name, rho_bar):
    log_rhos = (torch.randn(T, B, generator=g) * 0.8).float()
    rewards = torch.randn(T, B, generator=g).float()
    values = (torch.randn(T + 1, B, generator=g) * 2).float()
    terminal = torch.rand(T, B, generator=g) < 0.08
    discounts = torch.where(terminal, torch.zeros(T, B), torch.full((T, B), GAMMA)).float()
    target = log_rhos.double()
    behaviour = torch.zeros(T, B, dtype=torch.float64)
    vs, adv = vtrace_torch(target_action_log_probs=target, behaviour_action_log_probs=behaviour,
                           discounts=discounts.double(), rewards=rewards.double(), values=values[:T].double(),
                           bootstrap_values=values[T].double(), clip_rho_threshold=rho_bar, clip_pg_rho_threshold=rho_bar)
    print(f"{name}: rho_bar {rho_bar}, {int(terminal.sum())} terminations, "
          f"{int((log_rhos.exp() > rho_bar).sum())} of {T * B} weights truncated")
    return [(name + ".log_rho", log_rhos), (name + ".rewards", rewards), (name + ".values", values),
            (name + ".discount", discounts), (name + ".rho_bar", torch.tensor([rho_bar])), (name + ".vs", vs),
            (name + ".adv", adv)]


def main():
    g = torch.Generator().manual_seed(11)
    records = case(g, "a", 1.0) + case(g, "b", 2.5)
    fixture_arrays.write(sys.argv[1], [(n, t.detach().float()) for n, t in records])


if __name__ == "__main__":
    main()
