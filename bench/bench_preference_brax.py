"""PPO or SAC on the TRUE reward of a brax task at a fixed horizon (seals-style, absorbing), the check of the loop's agents.

Runs :class:`~jaxweight.preference.generators.AgentGenerator` with ``reward_apply=None`` (the environment's own
reward) for ``--steps`` environment steps on ``--seeds`` seeds in one vmapped program, evaluating the stochastic
and the greedy policy every ``--evals`` chunk, and a uniformly random policy once. Defaults follow brax's
published PPO settings for inverted_pendulum (brax/training/agents/ppo; its training config: 2e6 steps,
reward_scaling 10, normalize_observations, discounting 0.97, learning_rate 3e-4, entropy_cost 1e-2, 2048 envs,
unroll 5 x 16 per env and 32 minibatches per update, 4 epochs).

``--agent sac`` runs :class:`~jaxweight.preference.generators.SACGenerator` instead (the ``--sac-*`` flags; defaults
Stable-Baselines3's SAC settings with 16 environments and one gradient step per transition, learning rate 3e-4,
discount 0.99, no observation statistics, reward scaling 1; of the other flags it takes ``--env``, ``--horizon``,
``--steps``, ``--evals``, ``--seeds``, ``--brax-obs``, ``--absorbing-bootstrap`` and ``--episodic``; the curve
records the temperature instead of the std).

Run ``python bench/bench_preference_brax.py --env brax:inverted_pendulum --steps 2000000 --out FILE.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def _episodic_class():
    from flax import struct

    from jaxweight.rl.brax_envs import BraxEnv

    @struct.dataclass
    class EpisodicState:
        brax: object
        time: jax.Array

    class Episodic(BraxEnv):
        """brax's episodes: done on brax's termination or at the horizon (gymnax then resets, as brax's
        training wrapper does; brax bootstraps the value at the time limit, this treats it as an end)."""

        def __init__(self, inner):
            super().__init__(inner.brax_env, inner.brax_name)

        def reset_env(self, key, params):
            obs, st = super().reset_env(key, params)
            return obs, EpisodicState(st, jnp.asarray(0, jnp.int32))

        def step_env(self, key, state, action, params):
            obs, st, r, term, info = super().step_env(key, state.brax, action, params)
            t = state.time + 1
            return obs, EpisodicState(st, t), r, term | (t >= params.max_steps_in_episode), info

        def get_obs(self, state, params=None, key=None):
            return super().get_obs(state.brax)

        def is_terminal(self, state, params):
            return super().is_terminal(state.brax, params) | (state.time >= params.max_steps_in_episode)

    return Episodic


def _Episodic(inner):
    return _episodic_class()(inner)


def _mean_std(gen, state):
    """The policy's (pre-squash) std per action: the parameter, or with a state-dependent std its mean over the
    training environments' current observations; SAC: its temperature alpha."""
    from jaxweight.rl.normalization import obs_norm_apply

    if hasattr(state, "log_alpha"):
        return jnp.exp(state.log_alpha)[None]
    _, log_std, _ = gen.network.apply(state.ppo.params, obs_norm_apply(state.ppo.obs_norm, state.ppo.obs))
    return jnp.exp(log_std).reshape(-1, log_std.shape[-1]).mean(0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="brax:inverted_pendulum")
    ap.add_argument("--horizon", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=2_000_000)
    ap.add_argument("--evals", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--num-envs", type=int, default=2048)
    ap.add_argument("--num-steps", type=int, default=80)
    ap.add_argument("--minibatches", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--gamma", type=float, default=0.97)
    ap.add_argument("--ent", type=float, default=1e-2)
    ap.add_argument("--reward-scaling", type=float, default=10.0)
    ap.add_argument("--no-obs-norm", action="store_true")
    ap.add_argument("--init-log-std", type=float, default=0.0)
    ap.add_argument("--absorbing-bootstrap", action="store_true")
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    ap.add_argument("--max-grad-norm", type=lambda v: None if v.lower() == "none" else float(v), default=0.5,
                    help="global-norm gradient clipping of actor+critic together, or 'none' (brax's PPO: none)")
    ap.add_argument("--tanh-squash", action="store_true", help="PPOConfig.tanh_squash (brax's NormalTanhDistribution)")
    ap.add_argument("--value-hidden", type=int, nargs="+", default=None, help="critic widths (brax: 256 x 5)")
    ap.add_argument("--activation", default="tanh", help="flax.linen activation (brax: swish)")
    ap.add_argument("--policy-head-scale", type=float, default=0.01, help="init scale of the policy's output layer")
    ap.add_argument("--state-std", action="store_true",
                    help="PPOConfig.state_dependent_std (brax's policy: softplus(raw) + 0.001 from the output layer)")
    ap.add_argument("--clip-eps", type=float, default=0.2, help="PPO ratio clipping (brax's PPO: 0.3)")
    ap.add_argument("--eval-episodes", type=int, default=16)
    ap.add_argument("--episodic", action="store_true",
                    help="brax's own episodes (reset on termination, as brax's PPO trains) instead of the "
                         "loop's fixed horizon with an absorbing end: checks PPO itself against brax's numbers")
    ap.add_argument("--brax-obs", action="store_true",
                    help="brax's own observations (exclude_current_positions_from_observation=True: no x position, "
                         "as brax's PPO trains) instead of the seals-style ones that keep it")
    ap.add_argument("--gae-per-minibatch", action="store_true",
                    help="PPOConfig.gae_per_minibatch (brax's PPO: whole unrolls per minibatch, advantages recomputed "
                         "with the current critic before every gradient step)")
    ap.add_argument("--unroll-length", type=int, default=None,
                    help="PPOConfig.unroll_length (with --gae-per-minibatch: cut each environment's --num-steps into "
                         "unrolls of this many steps; brax's PPO: 20)")
    ap.add_argument("--advantage", choices=("gae", "lambda_return"), default="gae",
                    help="PPOConfig.advantage (brax's PPO: lambda_return)")
    ap.add_argument("--seed", type=int, default=0, help="the seeds' keys are split from jax.random.key(SEED)")
    ap.add_argument("--agent", choices=("ppo", "sac"), default="ppo")
    ap.add_argument("--sac-envs", type=int, default=16)
    ap.add_argument("--sac-updates-per-step", type=int, default=16)
    ap.add_argument("--sac-batch", type=int, default=256)
    ap.add_argument("--sac-buffer", type=int, default=1_000_000)
    ap.add_argument("--sac-learning-starts", type=int, default=10_000)
    ap.add_argument("--sac-hidden", type=int, nargs="+", default=[256, 256])
    ap.add_argument("--sac-lr", type=float, default=3e-4)
    ap.add_argument("--sac-gamma", type=float, default=0.99)
    ap.add_argument("--sac-reward-scaling", type=float, default=1.0)
    ap.add_argument("--sac-obs-norm", action="store_true", help="SACConfig.normalize_observations")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from jaxweight.rl.envs import make_env
    from jaxweight.preference.generators import AgentGenerator
    from jaxweight.rl.ppo import PPOConfig, PPOHParams

    kw = {"exclude_current_positions_from_observation": True} if a.brax_obs else {}
    if a.episodic:
        from jaxweight.rl.brax_envs import BraxParams, make_brax

        family, _, name = a.env.partition(":")
        assert family == "brax", "--episodic is for brax ids"
        env, p = _Episodic(make_brax(name, kw)), BraxParams(a.horizon)
    else:
        env, p = make_env(a.env, horizon=a.horizon, **kw)
    cfg = PPOConfig(num_envs=a.num_envs, num_steps=a.num_steps, num_minibatches=a.minibatches,
                    update_epochs=a.epochs, hidden_sizes=tuple(a.hidden), normalize_observations=not a.no_obs_norm,
                    reward_scaling=a.reward_scaling, init_log_std=a.init_log_std,
                    absorbing_bootstrap=a.absorbing_bootstrap, max_grad_norm=a.max_grad_norm, tanh_squash=a.tanh_squash,
                    value_hidden_sizes=None if a.value_hidden is None else tuple(a.value_hidden),
                    activation=a.activation, policy_head_scale=a.policy_head_scale,
                    state_dependent_std=a.state_std, gae_per_minibatch=a.gae_per_minibatch,
                    unroll_length=a.unroll_length, advantage=a.advantage)
    hp = PPOHParams.create(learning_rate=a.lr, gamma=a.gamma, ent_coef=a.ent, clip_eps=a.clip_eps, anneal_steps=0.0)
    gen = AgentGenerator(env, p, config=cfg, hparams=hp)
    if a.agent == "sac":
        from jaxweight.rl.sac import SACConfig, SACHParams
        from jaxweight.preference.generators import SACGenerator

        gen = SACGenerator(env, p, config=SACConfig(
            num_envs=a.sac_envs, buffer_size=a.sac_buffer, batch_size=a.sac_batch,
            updates_per_step=a.sac_updates_per_step, learning_starts=a.sac_learning_starts,
            hidden_sizes=tuple(a.sac_hidden), normalize_observations=a.sac_obs_norm,
            reward_scaling=a.sac_reward_scaling, absorbing_bootstrap=a.absorbing_bootstrap),
            hparams=SACHParams.create(learning_rate=a.sac_lr, gamma=a.sac_gamma))
    chunk = -(-a.steps // a.evals)

    def train_chunk(state, key):
        k1, k2, k3 = jax.random.split(key, 3)
        state = gen.train(state, k1, chunk)
        r = gen.evaluate(state, k2, a.eval_episodes)
        g = gen.evaluate(state, k3, a.eval_episodes, deterministic=True)
        std = _mean_std(gen, state)  # the policy's (pre-squash) std per action
        return state, (jnp.mean(r), jnp.mean(g), gen.trained_steps(state), std)

    init = jax.jit(jax.vmap(gen.init))
    step = jax.jit(jax.vmap(train_chunk))
    keys = jax.random.split(jax.random.key(a.seed), a.seeds)
    t0 = time.perf_counter()
    state = init(keys)
    step_c = step.lower(state, keys).compile()
    t_compile = time.perf_counter() - t0
    curve = []
    t1 = time.perf_counter()
    for i in range(a.evals):
        state, (r, g, n, sd) = step_c(state, jax.vmap(lambda k: jax.random.fold_in(k, i))(keys))
        r, g, n, sd = (np.asarray(x) for x in jax.device_get((r, g, n, sd)))
        curve.append({"steps": int(n[0]), "return": r.tolist(), "return_deterministic": g.tolist(), "std": sd.tolist(),
                      "elapsed_s": time.perf_counter() - t1})
        print(json.dumps(curve[-1]), flush=True)
    t_run = time.perf_counter() - t1

    # a uniformly random policy (the normalised score's zero)
    space = env.action_space(p)

    def random_return(key):
        k0, ks = jax.random.split(key)
        obs, s = env.reset_env(k0, p)

        def f(carry, k):  # rewards until the episode ends (the absorbing ones are 0 anyway)
            s, alive = carry
            ka, ke = jax.random.split(k)
            act = jax.random.uniform(ka, space.shape, minval=space.low, maxval=space.high)
            _, s, r, done, _ = env.step_env(ke, s, act, p)
            return (s, alive & ~done), jnp.where(alive, r, 0.0)

        return jnp.sum(jax.lax.scan(f, (s, jnp.asarray(True)), jax.random.split(ks, a.horizon))[1])

    rnd = np.asarray(jax.jit(jax.vmap(random_return))(jax.random.split(jax.random.key(9), 32)))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import provenance  # noqa: PLC0415  (command, commit, machine, date, jax version, device)

    res = {"env": a.env, "horizon": a.horizon, "episodic": a.episodic, "settings": vars(a), "curve": curve,
           "final_return": curve[-1]["return"], "final_return_deterministic": curve[-1]["return_deterministic"],
           "random_return": float(rnd.mean()), "compile_s": t_compile, "run_s": t_run,
           "steps_per_s": a.seeds * curve[-1]["steps"] / t_run, **provenance()}
    print(json.dumps({k: v for k, v in res.items() if k != "curve"}))
    if a.out:
        from jaxweight.checkpoint import save_json  # noqa: PLC0415

        save_json(a.out, res)


if __name__ == "__main__":
    main()
