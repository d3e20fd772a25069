#!/usr/bin/env python3
"""RLlib's PPO against dtrain's, Ray on the CPUs given (default 2), for bench/ppo_cleanrl.sh's comparison.
  cartpole: CartPole-v1 with CleanRL's ppo.py settings (4 environments x 128 steps a batch, 4 epochs of 4 minibatches
            of 128, lr 2.5e-4, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01, value 0.5, gradient norm 0.5, two
            tanh layers of 64 for each network), 500k env steps, the target a mean return of 475;
  lunarlander: LunarLander-v3 with RL Zoo's settings (16 environments x 1024 steps, minibatches of 64, 4 epochs,
            gamma 0.999, lambda 0.98, lr 3e-4, entropy 0.01, the value loss not clipped), 1.5M steps, the target 200.
Per seed: the wall time from the start of training until the mean return of the last 100 finished episodes first
reached the target (dtrain's and CleanRL's rule: each environment writes its episodes' returns to a file, read after
every training iteration), RLlib's own episode_return_mean at the same moment (a window of its own: it reached 475 on
CartPole after ~20k steps, fewer than 100 such episodes hold), and the mean return at the end. Ray's start is not
counted (it is printed). --max-seconds ends a seed's run early; a target not reached by then is said so.

    .venv-baselines/bin/python bench/ppo_rllib.py [--env cartpole] [--steps N] [--target R] [--seeds 1 2 3]
        [--cpus 2] [--max-seconds S]"""
import argparse
import os
import tempfile
import time

SETTINGS = {
    "cartpole": dict(id="CartPole-v1", steps=500000, target=475, envs=4,
                     training=dict(lr=2.5e-4, gamma=0.99, lambda_=0.95, clip_param=0.2, entropy_coeff=0.01,
                                   vf_loss_coeff=0.5, num_epochs=4, minibatch_size=128,
                                   train_batch_size_per_learner=512, grad_clip=0.5)),
    "lunarlander": dict(id="LunarLander-v3", steps=1500000, target=200, envs=16,
                        training=dict(lr=3e-4, gamma=0.999, lambda_=0.98, clip_param=0.2, entropy_coeff=0.01,
                                      vf_loss_coeff=0.5, vf_clip_param=float("inf"), num_epochs=4, minibatch_size=64,
                                      train_batch_size_per_learner=16384, grad_clip=0.5)),
}


def logged_env(env_id, path):
    """The environment, with every finished episode's return appended to path (one line each: short appends to a
    file opened O_APPEND are not interleaved, so the environment runners may share it)."""
    import gymnasium as gym

    class EpisodeLog(gym.Wrapper):
        def reset(self, **kw):
            self.ret = 0.0
            return self.env.reset(**kw)

        def step(self, action):
            obs, r, term, trunc, info = self.env.step(action)
            self.ret += float(r)
            if term or trunc:
                with open(path, "a") as f:
                    f.write(f"{self.ret}\n")
            return obs, r, term, trunc, info

    return EpisodeLog(gym.make(env_id))


def last100(path):
    try:
        with open(path) as f:
            rets = [float(x) for x in f.read().split()]
    except FileNotFoundError:
        return float("nan"), 0
    last = rets[-100:]
    return (sum(last) / len(last) if last else float("nan")), len(rets)


def result_fields(r):
    runners = r.get("env_runners", {})
    ret = runners.get("episode_return_mean", r.get("episode_reward_mean", float("nan")))
    steps = r.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime", 0))
    return ret, steps


def run(s, seed, steps, target, cpus, max_seconds):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env
    path = os.path.join(tempfile.mkdtemp(), "episodes.txt")
    register_env("logged", lambda cfg: logged_env(s["id"], path))
    runners = max(cpus - 1, 0)
    config = (PPOConfig().environment("logged")
              .env_runners(num_env_runners=runners, num_envs_per_env_runner=s["envs"] // max(runners, 1))
              .training(**s["training"])
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                         vf_share_layers=False))
              .debugging(seed=seed))
    algo = config.build_algo()
    t0, reached, ours, done = time.time(), None, float("nan"), 0
    while done < steps and time.time() - t0 < max_seconds:
        theirs, done = result_fields(algo.train())
        ours, episodes = last100(path)
        if reached is None and ours == ours and ours >= target:
            reached = (time.time() - t0, done, episodes, theirs)
    wall = time.time() - t0
    algo.stop()
    return ours, done, reached, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", choices=sorted(SETTINGS), default="cartpole")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--target", type=float)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=float("inf"))
    a = ap.parse_args()
    s = SETTINGS[a.env]
    steps = a.steps or s["steps"]
    target = s["target"] if a.target is None else a.target
    import ray
    t = time.time()
    ray.init(num_cpus=a.cpus, include_dashboard=False, logging_level="ERROR")
    print(f"rllib {ray.__version__}: ray started in {time.time() - t:.1f} s on {a.cpus} CPUs (not counted)",
          flush=True)
    for seed in a.seeds:
        ret, done, reached, wall = run(s, seed, steps, target, a.cpus, a.max_seconds)
        if reached:
            when = ("reached %g at %.1f s (%d env steps, %d episodes; RLlib's episode_return_mean then %.1f)"
                    % ((target,) + reached))
        else:
            when = "never reached %g" % target
        print(f"rllib seed {seed} {s['id']}: mean return of the last 100 episodes {ret:.2f} after {done} env steps "
              f"in {wall:.1f} s; {when}", flush=True)


if __name__ == "__main__":
    main()
