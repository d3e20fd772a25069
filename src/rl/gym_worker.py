"""A bridge worker: K Gymnasium environments that dtrain steps (src/rl/gym_bridge.c).

dtrain starts it as `python3 gym_worker.py ID K` with two descriptors: 3
(a socket to dtrain: commands in, replies out) and 4 (the shared memory).
It makes the K environments, answers one line with their spaces ("ok ..."
then the action bounds, or "error ..."), and after the memory is sized
("m") serves rounds: a byte in, every environment's command done (step with
its action, reset with or without a seed, or nothing), a byte out ("d", or
"e" and a line saying what failed). The socket's end ends it.
Observations, actions and rewards travel through the memory, never the
pipes, so a round costs two bytes of messages whatever the sizes.
"""
import math
import mmap
import os
import socket
import sys
import time

STEP, RESET_SEEDED, RESET, IDLE = 0, 1, 2, 3
sock = socket.socket(fileno=3)


def say(line):
    os.write(3, (line.replace("\n", " ") + "\n").encode())


def read_byte(spin=0.0002):
    """The next byte from dtrain: asked for without waiting for a moment first (waking an idle core costs more
    than a small environment's step), then waited for."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < spin:
        try:
            b = sock.recv(1, socket.MSG_DONTWAIT)
            break
        except BlockingIOError:
            os.sched_yield()  # a core shared with dtrain (more processes than cores) goes to it
    else:
        b = sock.recv(1)
    if not b:
        sys.exit(0)  # dtrain closed its end: the run is over
    return b


def spaces(env, gym):
    o, a = env.observation_space, env.action_space
    if isinstance(o, gym.spaces.Box):
        obs_dim, onehot = int(math.prod(o.shape)) if o.shape else 1, 0
    elif isinstance(o, gym.spaces.Discrete):
        obs_dim, onehot = int(o.n), int(o.n)
    else:
        raise TypeError(f"its observation space {o} is neither a Box nor a Discrete one")
    if isinstance(a, gym.spaces.Discrete):
        if int(a.start) != 0:
            raise TypeError(f"its action space {a} does not start at 0")
        actions, act_dim, low, high = int(a.n), 1, [0.0], [float(a.n - 1)]
    elif isinstance(a, gym.spaces.Box):
        actions, act_dim = 0, int(math.prod(a.shape)) if a.shape else 1
        low, high = [float(x) for x in a.low.reshape(-1)], [float(x) for x in a.high.reshape(-1)]
    else:
        raise TypeError(f"its action space {a} is neither a Discrete nor a Box one")
    spec = getattr(env, "spec", None)
    max_steps = int(spec.max_episode_steps or 0) if spec is not None else 0
    return obs_dim, onehot, actions, act_dim, low, high, max_steps


def main():
    env_id, k = sys.argv[1], int(sys.argv[2])
    try:
        import numpy as np
        import gymnasium as gym
    except Exception as e:  # noqa: BLE001 -- every failure is said to dtrain, which names it
        say(f"error cannot import gymnasium with {sys.executable}: {type(e).__name__}: {e}")
        return 1
    try:
        envs = [gym.make(env_id) for _ in range(k)]
        obs_dim, onehot, actions, act_dim, low, high, max_steps = spaces(envs[0], gym)
    except Exception as e:  # noqa: BLE001
        say(f"error Gymnasium cannot make {env_id}: {type(e).__name__}: {e}")
        return 1
    say(f"ok {obs_dim} {actions} {act_dim} {max_steps} {gym.__version__}")
    say(" ".join(repr(x) for x in low))
    say(" ".join(repr(x) for x in high))
    if read_byte() != b"m":
        return 1
    mem = mmap.mmap(4, os.fstat(4).st_size)
    # the layout gym_bridge.c writes: commands, seeds, actions, observations, rewards, terminated, truncated
    at = 0

    def view(dtype, n):
        nonlocal at
        at = (at + 7) // 8 * 8
        v = np.frombuffer(mem, dtype=dtype, count=n, offset=at)
        at += v.nbytes
        return v

    cmd, seed = view(np.int8, k), view(np.int64, k)
    act = view(np.float32, k * act_dim).reshape(k, act_dim)
    obs = view(np.float32, k * obs_dim).reshape(k, obs_dim)
    rew, term, trunc = view(np.float64, k), view(np.uint8, k), view(np.uint8, k)

    def put(i, o):
        if onehot:
            obs[i] = 0
            obs[i, int(o)] = 1
        else:
            obs[i] = np.asarray(o, dtype=np.float32).reshape(-1)

    while True:
        read_byte()
        i = -1
        try:
            for i in range(k):
                c = int(cmd[i])
                if c == STEP:
                    a = int(act[i, 0]) if actions else act[i].reshape(envs[i].action_space.shape)
                    o, r, te, tr, _ = envs[i].step(a)
                    put(i, o)
                    rew[i], term[i], trunc[i] = float(r), bool(te), bool(tr)
                elif c in (RESET_SEEDED, RESET):
                    o, _ = envs[i].reset(seed=int(seed[i]) if c == RESET_SEEDED else None)
                    put(i, o)
                    rew[i], term[i], trunc[i] = 0.0, 0, 0
            os.write(3, b"d")
        except Exception as e:  # noqa: BLE001
            os.write(3, b"e")
            say(f"environment {i} of this worker: {type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main())
