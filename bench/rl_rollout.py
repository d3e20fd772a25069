#!/usr/bin/env python3
"""Baselines for `dtrain bench rl --baseline`: environment steps per second
under random actions, on this machine, for Gymnasium's SyncVectorEnv and
AsyncVectorEnv (one process an environment), Gymnasium's own vectorised
CartPole (numpy over the batch) and EnvPool (2 threads), at 1, 2, 4 and 8
environments; with --async, EnvPool's send and receive with batches of half
the environments. Actions are drawn before the clock starts, as dtrain's are
drawn inside its loop (a cheaper cost than the steps)."""
import argparse
import time

import gymnasium as gym
import numpy as np


def timed(step, reset, n, steps, discrete, space):
    reset()
    rng = np.random.default_rng(7)
    k = max(1, steps // n)
    if discrete:
        acts = rng.integers(0, space, size=(min(k, 4096), n))
    else:
        acts = rng.uniform(space[0], space[1], size=(min(k, 4096), n, 1)).astype(np.float32)
    t = time.perf_counter()
    for i in range(k):
        step(acts[i % len(acts)])
    return k * n / (time.perf_counter() - t)


def timed_async(env, b, steps, discrete, space):
    """EnvPool's send and receive: each batch received is sent its actions back (drawn before the clock starts)."""
    env.async_reset()
    rng = np.random.default_rng(7)
    if discrete:
        acts = rng.integers(0, space, size=(4096, b))
    else:
        acts = rng.uniform(space[0], space[1], size=(4096, b, 1)).astype(np.float32)
    k = max(1, steps // b)
    t = time.perf_counter()
    for i in range(k):
        info = env.recv()[4]
        env.send(acts[i % len(acts)], info["env_id"])
    return k * b / (time.perf_counter() - t)


def row(name, n, workers, r):
    print(f"{name:34s} {n:8d} {workers:8d} {r:14.0f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=1000000)
    ap.add_argument("--slow-steps", type=int, default=200000)
    ap.add_argument("--async", dest="asynchronous", action="store_true", help="EnvPool's asynchronous mode too")
    a = ap.parse_args()
    probe = gym.make(a.env)
    discrete = isinstance(probe.action_space, gym.spaces.Discrete)
    space = probe.action_space.n if discrete else (float(probe.action_space.low[0]), float(probe.action_space.high[0]))
    for n in (1, 2, 4, 8):
        env = gym.vector.SyncVectorEnv([lambda: gym.make(a.env) for _ in range(n)])
        row("gymnasium SyncVectorEnv", n, 1, timed(env.step, lambda: env.reset(seed=1), n, a.steps, discrete, space))
        env.close()
    for n in (1, 2, 4, 8):
        env = gym.vector.AsyncVectorEnv([lambda: gym.make(a.env) for _ in range(n)])
        row("gymnasium AsyncVectorEnv", n, n, timed(env.step, lambda: env.reset(seed=1), n, a.slow_steps, discrete, space))
        env.close()
    if a.env == "CartPole-v1":
        for n in (1, 2, 4, 8):
            env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
            row("gymnasium CartPoleVectorEnv", n, 1, timed(env.step, lambda: env.reset(seed=1), n, a.steps, discrete, space))
            env.close()
    try:
        import envpool
    except ImportError:
        print("envpool: not installed in the baselines' environment (pip install envpool)")
        return
    for n in (1, 2, 4, 8):
        env = envpool.make_gymnasium(a.env, num_envs=n, num_threads=min(2, n), seed=1)
        row("envpool (2 threads)", n, min(2, n), timed(env.step, env.reset, n, a.steps, discrete, space))
        env.close()
    for n in (2, 4, 8) if a.asynchronous else ():
        b = n // 2
        env = envpool.make_gymnasium(a.env, num_envs=n, batch_size=b, num_threads=2, seed=1)
        row(f"envpool async (batch {b})", n, 2, timed_async(env, b, a.steps, discrete, space))
        env.close()


if __name__ == "__main__":
    main()
