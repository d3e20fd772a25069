#!/usr/bin/env python3
"""RLlib's PPO on CartPole-v1 with CleanRL's ppo.py settings (4 environments x 128 steps a batch, 4 epochs of 4
minibatches of 128, lr 2.5e-4, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01, value 0.5, gradient norm 0.5, two
tanh layers of 64 for each network), Ray on the CPUs given (default 2), for bench/ppo_cleanrl.sh's comparison:
per seed, the wall time from the start of training until RLlib's mean episode return first reached the target, and
the mean return at the end. Ray's start is not counted (it is printed).

    .venv-baselines/bin/python bench/ppo_rllib.py [--steps 500000] [--target 475] [--seeds 1 2 3] [--cpus 2]"""
import argparse
import time


def result_fields(r):
    runners = r.get("env_runners", {})
    ret = runners.get("episode_return_mean", r.get("episode_reward_mean", float("nan")))
    steps = r.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime", 0))
    return ret, steps


def run(seed, steps, target, cpus):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=max(cpus - 1, 0), num_envs_per_env_runner=4 // max(cpus - 1, 1))
              .training(lr=2.5e-4, gamma=0.99, lambda_=0.95, clip_param=0.2, entropy_coeff=0.01, vf_loss_coeff=0.5,
                        num_epochs=4, minibatch_size=128, train_batch_size_per_learner=512, grad_clip=0.5)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                         vf_share_layers=False))
              .debugging(seed=seed))
    algo = config.build_algo()
    t0, reached, ret, done = time.time(), None, float("nan"), 0
    while done < steps:
        ret, done = result_fields(algo.train())
        if reached is None and ret == ret and ret >= target:
            reached = time.time() - t0
    wall = time.time() - t0
    algo.stop()
    return ret, done, reached, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500000)
    ap.add_argument("--target", type=float, default=475)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--cpus", type=int, default=2)
    a = ap.parse_args()
    import ray
    t = time.time()
    ray.init(num_cpus=a.cpus, include_dashboard=False, logging_level="ERROR")
    print(f"rllib: ray started in {time.time() - t:.1f} s on {a.cpus} CPUs (not counted)", flush=True)
    for s in a.seeds:
        ret, done, reached, wall = run(s, a.steps, a.target, a.cpus)
        print(f"rllib seed {s}: mean return {ret:.2f} after {done} env steps in {wall:.1f} s; "
              f"{'reached %g at %.1f s' % (a.target, reached) if reached is not None else 'never reached %g' % a.target}",
              flush=True)


if __name__ == "__main__":
    main()
