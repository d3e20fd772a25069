#!/usr/bin/env python3
"""Gymnasium's NormalizeObservation and NormalizeReward, each followed by a
clip to [-10, 10] (CleanRL's ppo_continuous_action.py wraps every
environment so), on a scripted environment's stream of observations,
rewards and ends, for tests/test_rl_envs.c. Gymnasium 0.29, the version
CleanRL pins (its running statistics are float64; 1.x keeps the
observation's in the space's dtype).

    PYTHONPATH=<gymnasium 0.29> scripts/make_rl_norm_fixture.py tests/fixtures/rl/norm.bin"""
import sys

import gymnasium as gym
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import fixture_arrays  # noqa: E402

STEPS, DIM, GAMMA = 3000, 3, 0.99


class Scripted(gym.Env):
    """Plays back obs[k], rew[k], term[k], trunc[k]: a reset takes the next observation, a step the next of each."""

    def __init__(self, obs, rew, term, trunc):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (DIM,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.obs, self.rew, self.term, self.trunc, self.k = obs, rew, term, trunc, 0

    def reset(self, seed=None, options=None):
        self.k += 1
        return self.obs[self.k - 1].astype(np.float64), {}

    def step(self, action):
        self.k += 1
        k = self.k - 1
        return self.obs[k].astype(np.float64), float(self.rew[k]), bool(self.term[k]), bool(self.trunc[k]), {}


def main():
    assert gym.__version__.startswith("0.29"), f"gymnasium {gym.__version__}: this fixture is 0.29's wrappers"
    rng = np.random.default_rng(3)
    n = STEPS + 1
    obs = (rng.normal(size=(n, DIM)) * [1.0, 30.0, 0.01] + [5.0, -40.0, 0.0]).astype(np.float32)
    rew = (rng.normal(size=n) * 4 - 6).astype(np.float32)
    ends = rng.random(n)
    term = (ends < 0.01).astype(np.float32)
    trunc = ((ends >= 0.01) & (ends < 0.02)).astype(np.float32)
    env = Scripted(obs, rew, term, trunc)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(env, lambda o: np.clip(o, -10, 10))
    env = gym.wrappers.NormalizeReward(env, gamma=GAMMA)
    env = gym.wrappers.TransformReward(env, lambda r: np.clip(r, -10, 10))
    # row k: what the stream gave at call k (a reset or a step), and what the wrappers made of it
    was_reset = np.zeros(n, np.float32)
    out_obs = np.zeros((n, DIM), np.float32)
    out_rew = np.zeros(n, np.float32)
    o, _ = env.reset()
    was_reset[0], out_obs[0] = 1, o
    k = 1
    while k < n:
        o, r, te, tr, _ = env.step(0)
        out_obs[k], out_rew[k] = o, r
        k += 1
        if (te or tr) and k < n:
            o, _ = env.reset()
            was_reset[k], out_obs[k] = 1, o
            k += 1
    print(f"{n} calls, {int(was_reset.sum())} resets, {int(term.sum())} terminations scripted; "
          f"obs_rms mean {env.env.env.env.obs_rms.mean}, return var {float(env.env.return_rms.var):.4f}")
    fixture_arrays.write(sys.argv[1], [("obs", obs), ("rew", rew), ("term", term), ("reset", was_reset),
                                       ("out_obs", out_obs), ("out_rew", out_rew)])


if __name__ == "__main__":
    main()
