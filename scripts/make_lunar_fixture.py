#!/usr/bin/env python3
"""Episodes of Gymnasium's LunarLander (pybox2d, Box2D 2.3), for
tests/test_rl_lunar.c: the length and return of each episode under a random
policy and under Gymnasium's own heuristic controller, for the discrete and
the continuous lander. dtrain's LunarLander runs on Box2D 2.4, whose solver
differs, so the test compares the distributions (a two-sample
Kolmogorov-Smirnov test), not the trajectories.

    scripts/make_lunar_fixture.py OUT_DIR [RANDOM_EPISODES] [HEURISTIC_EPISODES]   (defaults 1000, 300)

Needs gymnasium and box2d (pip install box2d): scripts/make-baselines-venv.sh's
environment has both. Format: DTFX (scripts/fixture_arrays.py)."""
import os
import sys

import gymnasium as gym
import numpy as np
from gymnasium.envs.box2d.lunar_lander import heuristic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_arrays import write  # noqa: E402


def episodes(gid, n, policy, seed):
    env = gym.make(gid)
    rng = np.random.default_rng(seed)
    lens, rets = [], []
    for k in range(n):
        obs, _ = env.reset(seed=seed + k)
        ret, length, done = 0.0, 0, False
        while not done:
            if policy == "heuristic":
                a = heuristic(env, obs)
            elif env.unwrapped.continuous:
                a = rng.uniform(-1, 1, size=2).astype(np.float32)
            else:
                a = int(rng.integers(4))
            obs, r, term, trunc, _ = env.step(a)
            ret += float(r)
            length += 1
            done = term or trunc
        lens.append(length)
        rets.append(ret)
    return np.array(lens, np.float64), np.array(rets, np.float64)


def main():
    out = sys.argv[1]
    n_random = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    n_heur = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    arrays = []
    for name, gid in (("discrete", "LunarLander-v3"), ("continuous", "LunarLanderContinuous-v3")):
        for policy, n in (("random", n_random), ("heuristic", n_heur)):
            lens, rets = episodes(gid, n, policy, 1000)
            arrays += [(f"{name}_{policy}_len", lens), (f"{name}_{policy}_ret", rets)]
            print(f"{gid} {policy}: {n} episodes, length {lens.mean():.1f} +- {lens.std():.1f}, "
                  f"return {rets.mean():.1f} +- {rets.std():.1f}, landed (return >= 200) {np.mean(rets >= 200):.2f}")
    write(os.path.join(out, "lunar_lander.bin"), arrays)


if __name__ == "__main__":
    main()
