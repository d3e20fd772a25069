#!/usr/bin/env python3
"""Trajectories of Gymnasium's classic-control environments, for
tests/test_rl_envs.c: each episode's first state (env.unwrapped.state) and
observation, then per step the random action taken, the observation, the
reward and both flags. dtrain's environments, started from the same states
and given the same actions, must give the same.

    scripts/make_rl_env_fixture.py OUT_DIR [STEPS]   (default 10000 a kind)

Format (DTRL): "DTRL", then per array a u32 name length, the name, a u8 type
(0 f32, 1 f64, 2 u8), a u32 count and the values, little-endian."""
import struct
import sys

import gymnasium as gym
import numpy as np

KINDS = [("cartpole", "CartPole-v1"), ("acrobot", "Acrobot-v1"), ("mountaincar", "MountainCar-v0"),
         ("pendulum", "Pendulum-v1")]


def write(path, arrays):
    with open(path, "wb") as f:
        f.write(b"DTRL")
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            t = {np.float32: 0, np.float64: 1, np.uint8: 2}[a.dtype.type]
            f.write(struct.pack("<I", len(name)) + name.encode() + struct.pack("<BI", t, a.size))
            f.write(a.astype(a.dtype.newbyteorder("<")).tobytes())


def record(gid, steps, seed):
    env = gym.make(gid)
    rng = np.random.default_rng(seed)
    states, first_obs, starts = [], [], []
    acts, obs, rew, term, trunc = [], [], [], [], []
    episode = 0
    done = True
    while len(obs) < steps:
        if done:
            o, _ = env.reset(seed=seed * 1000 + episode)
            episode += 1
            starts.append(len(obs))
            states.append(np.asarray(env.unwrapped.state, dtype=np.float64))
            first_obs.append(o)
        if isinstance(env.action_space, gym.spaces.Discrete):
            a = int(rng.integers(env.action_space.n))
            acts.append(np.float32(a))
        else:
            a = rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
            acts.append(a[0])
        o, r, te, tr, _ = env.step(a)
        obs.append(o)
        rew.append(float(r))
        term.append(te)
        trunc.append(tr)
        done = te or tr
    return {
        "start": np.array(starts, dtype=np.float64),
        "state": np.concatenate(states),
        "first_obs": np.concatenate(first_obs).astype(np.float32),
        "action": np.array(acts, dtype=np.float32),
        "obs": np.concatenate(obs).astype(np.float32),
        "reward": np.array(rew, dtype=np.float64),
        "terminated": np.array(term, dtype=np.uint8),
        "truncated": np.array(trunc, dtype=np.uint8),
    }


def main():
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    for i, (name, gid) in enumerate(KINDS):
        arrays = record(gid, steps, seed=17 + i)
        write(f"{out}/{name}.dtrl", arrays)
        ends = int(arrays["terminated"].sum()), int(arrays["truncated"].sum())
        print(f"{gid}: {steps} steps, {len(arrays['start'])} episodes, {ends[0]} terminated, {ends[1]} truncated")


if __name__ == "__main__":
    main()
