"""brax's own PPO (brax.training.agents.ppo) on a brax task with its published settings: the reference curve
that bench_preference_brax.py's PPO is compared with, measured on the same machine.

Run ``python bench/bench_preference_brax_ref.py --env inverted_pendulum --out FILE.json`` (needs the brax extra).
Each curve point records the evaluation's return and, after the first, brax's ``training/policy_dist_mean_std``
(the policy's pre-tanh std, mean over the last minibatch of the last update).
brax's training config for inverted_pendulum: num_timesteps 2e6, num_evals 20, reward_scaling 10,
episode_length 1000, normalize_observations, action_repeat 1, unroll_length 5, num_minibatches 32,
num_updates_per_batch 4, discounting 0.97, learning_rate 3e-4, entropy_cost 1e-2, num_envs 2048,
batch_size 1024.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

CONFIGS = {
    "inverted_pendulum": dict(num_timesteps=2_000_000, num_evals=20, reward_scaling=10, episode_length=1000,
                              normalize_observations=True, action_repeat=1, unroll_length=5, num_minibatches=32,
                              num_updates_per_batch=4, discounting=0.97, learning_rate=3e-4, entropy_cost=1e-2,
                              num_envs=2048, batch_size=1024),
    "inverted_double_pendulum": dict(num_timesteps=20_000_000, num_evals=20, reward_scaling=10,
                                     episode_length=1000, normalize_observations=True, action_repeat=1,
                                     unroll_length=5, num_minibatches=32, num_updates_per_batch=4, discounting=0.97,
                                     learning_rate=3e-4, entropy_cost=1e-2, num_envs=2048, batch_size=1024),
    "halfcheetah": dict(num_timesteps=50_000_000, num_evals=20, reward_scaling=1, episode_length=1000,
                        normalize_observations=True, action_repeat=1, unroll_length=20, num_minibatches=32,
                        num_updates_per_batch=8, discounting=0.95, learning_rate=3e-4, entropy_cost=1e-3,
                        num_envs=2048, batch_size=512),
}


def _removed(jax) -> bool:
    try:
        jax.device_put_replicated  # noqa: B018
        return False
    except AttributeError:
        return True


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="inverted_pendulum", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=None, help="num_timesteps (default: brax's)")
    ap.add_argument("--evals", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deterministic-eval", action="store_true",
                    help="evaluate the policy's mode (brax's default evaluates the stochastic policy)")
    ap.add_argument("--num-envs", type=int, default=None, help="num_envs (default: brax's)")
    ap.add_argument("--batch-size", type=int, default=None, help="batch_size (default: brax's)")
    ap.add_argument("--num-minibatches", type=int, default=None, help="num_minibatches (default: brax's)")
    ap.add_argument("--episode-length", type=int, default=None, help="episode_length (default: brax's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import jax
    import jax.numpy as jnp

    if not hasattr(jax, "device_put_replicated") or _removed(jax):  # brax 0.14 on jax >= 0.8: a shim
        def device_put_replicated(x, devices):
            return jax.tree.map(lambda a: jax.device_put(jnp.stack([jnp.asarray(a)] * len(devices))), x)

        jax.device_put_replicated = device_put_replicated
    from brax import envs
    from brax.training.agents.ppo import train as ppo

    cfg = dict(CONFIGS[a.env])
    if a.steps:
        cfg["num_timesteps"] = a.steps
    if a.evals:
        cfg["num_evals"] = a.evals
    for name in ("num_envs", "batch_size", "num_minibatches", "episode_length"):  # small runs (the device suite's check)
        if getattr(a, name) is not None:
            cfg[name] = getattr(a, name)
    env = envs.get_environment(a.env)
    curve = []
    t0 = time.perf_counter()

    def progress(step, metrics):
        curve.append({"steps": int(step), "return": float(metrics["eval/episode_reward"]),
                      "elapsed_s": time.perf_counter() - t0})
        for k in ("training/sps", "training/walltime"):  # brax's own rate (its training time only) and clock
            if k in metrics:
                curve[-1][k.split("/")[1]] = float(metrics[k])
        if "training/policy_dist_mean_std" in metrics:  # the (pre-tanh) std of the last minibatch, mean over it
            curve[-1]["std"] = float(metrics["training/policy_dist_mean_std"])
        print(json.dumps(curve[-1]), flush=True)

    ppo.train(environment=env, progress_fn=progress, seed=a.seed, deterministic_eval=a.deterministic_eval, **cfg)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import provenance  # noqa: PLC0415  (command, commit, machine, date, jax version, device)

    res = {"env": a.env, "config": cfg, "curve": curve, "wall_s": time.perf_counter() - t0, **provenance()}
    if a.out:
        tmp = f"{a.out}.tmp"  # atomic: brax's reference may run where jaxweight is not installed
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1)
        os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
