"""The PPO agent: a gymnax environment, optionally rewarded by a reward function, and PPO's updates.

:class:`PPOAgent` trains (``init``, ``train(state, key, steps, reward_params)``), samples whole
episodes (:meth:`~jaxweight.rl.rollout.EpisodeSampler.sample_episodes`) and evaluates true
returns (:meth:`~jaxweight.rl.rollout.EpisodeSampler.evaluate`), all pure functions over an
explicit state, so a whole run jits and vmaps over seeds. With a ``reward_apply`` the agent learns
from ``reward_apply(reward_params, obs, action, next_obs, done)``
(:class:`~jaxweight.rl.envs.LearnedRewardEnv`) while the samples record the environment's own
reward. The preference loop's :class:`~jaxweight.preference.generators.AgentGenerator` is this
agent with samples as preference ``Trajectories``.

Example::

    from jaxweight import rl
    env, p = rl.make_env("cartpole", horizon=20)
    agent = rl.PPOAgent(env, p, config=rl.PPOConfig(num_envs=2, num_steps=8, num_minibatches=2,
                                                    update_epochs=1, hidden_sizes=(8,)))
    s = agent.train(agent.init(0), 1, 32)          # 2 updates on the true reward
    assert int(agent.trained_steps(s)) == 32
    assert agent.evaluate(s, 2, 3).shape == (3,)   # true returns of 3 episodes

References:
  Schulman et al. 2017 (PPO, arXiv:1707.06347); purejaxrl (Lu et al. 2022); imitation's
  ``AgentTrainer`` (the exploration of the samples).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from gymnax.environments import environment

from .._util import as_key, check_static_int, check_value
from .envs import LearnedRewardEnv, LearnedRewardParams, LearnedRewardState, env_step, make_env
from .fixed_horizon import FixedHorizon
from .normalization import obs_norm_apply, obs_norm_init, obs_norm_update
from .ppo import (ADVANTAGES, ActorCritic, PPOConfig, PPOHParams, PPOState, Transition, _log_prob_entropy,
                  _sample_action, adam_with_learning_rate, gae, ppo_loss, ppo_loss_fresh_gae, set_learning_rate,
                  split_unrolls)
from .rollout import EpisodeSampler

__all__ = ["PPOAgent", "PPOAgentState"]

Array = jax.Array


@struct.dataclass
class PPOAgentState:
    """State of :class:`PPOAgent`: the PPO state (the reward params come with every ``train`` call)."""

    ppo: PPOState


class PPOAgent(EpisodeSampler):
    """A gymnax + PPO agent trained on a reward function (or the environment's reward); samples record the true reward.

    Args:
      env: a gymnax environment (e.g. :class:`~jaxweight.rl.envs.FixedHorizonCartPole`).
      env_params: its params (concrete; ``max_steps_in_episode`` is the horizon).
      reward_apply: ``(reward_params, obs, action, next_obs, done) -> f32[]``, the
        reward the agent trains on (a static callable; its params come with
        every ``train`` call inside the env params, see
        :class:`~jaxweight.rl.envs.LearnedRewardEnv`). ``None`` trains
        on the environment's own reward (the true-reward baseline);
        the preference driver binds its learned reward to an agent built
        with ``None`` (``with_reward``).
      config: :class:`PPOConfig` (structural PPO settings).
      hparams: :class:`PPOHParams` or a dict of its fields (continuous PPO settings): the
        default of ``train``'s ``hparams``; the preference loop's config copies them
        (``LoopConfig.agent_hparams``), the agent state holds none.
      exploration_frac: fraction of sampled transitions from the exploration
        policy (imitation ``AgentTrainer``; default 0).
      switch_prob: per-step probability of re-drawing the acting policy during
        exploration episodes (default 0.5).
      random_prob: probability that a re-draw picks uniformly random actions
        instead of the agent (default 0.5).

    Sampling rolls out the *current* policy from fresh resets (imitation reuses
    the agent's latest training rollouts; same policy, no buffering). Each
    exploration episode keeps its own switch state (the original switches one
    policy for all parallel environments). Training rounds the requested
    steps up to whole PPO updates of ``num_envs * num_steps`` transitions, as
    Stable-Baselines3's ``learn`` does with whole rollouts.

    For instance, with ``env, p = make_env("cartpole")``:
    ``agent = PPOAgent(env, p, reward_apply, exploration_frac=0.05)``, ``s = agent.init(0)``,
    ``s = agent.train(s, key, 50_000, reward_params)`` and ``agent.sample_episodes(s, key, 2_000)``
    (obs ``f32[N, 501, 4]`` with the true rewards).
    """

    def __init__(
        self,
        env: environment.Environment,
        env_params: Any,
        reward_apply: Callable | None = None,
        *,
        config: PPOConfig | None = None,
        hparams: PPOHParams | dict | None = None,
        exploration_frac: float = 0.0,
        switch_prob: float = 0.5,
        random_prob: float = 0.5,
    ):
        self._init_agent(reward_apply, config, PPOConfig, hparams, PPOHParams)
        self.env = LearnedRewardEnv(env, reward_apply) if reward_apply is not None else None
        self._init_sampling(env, env_params, exploration_frac, switch_prob, random_prob,
                            squash=self.config.tanh_squash)
        cfg = self.config
        for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs"):
            check_static_int(getattr(cfg, name), f"config.{name}", 1)
        if cfg.max_grad_norm is not None:
            check_value(cfg.max_grad_norm, "config.max_grad_norm", gt=0.0, static=True)
        check_value(cfg.reward_scaling, "config.reward_scaling", gt=0.0, static=True)
        check_value(cfg.init_log_std, "config.init_log_std", static=True)
        if cfg.absorbing_bootstrap and not isinstance(env, FixedHorizon):
            raise ValueError(f"config.absorbing_bootstrap needs a FixedHorizon environment (a 'gymnax:' or 'brax:' "
                             f"id of make_env, or a wrapped object), got {type(env).__name__}")
        if not isinstance(cfg.normalize_observations, bool):
            raise ValueError(f"config.normalize_observations must be a bool, got {cfg.normalize_observations!r}")
        if not all(isinstance(h, int | np.integer) and h >= 1 for h in cfg.hidden_sizes):
            raise ValueError(f"config.hidden_sizes must be ints >= 1, got {cfg.hidden_sizes!r}")
        if cfg.advantage not in ADVANTAGES:
            raise ValueError(f"config.advantage must be one of {ADVANTAGES}, got {cfg.advantage!r}")
        if cfg.unroll_length is not None:
            check_static_int(cfg.unroll_length, "config.unroll_length", 1)
            if not cfg.gae_per_minibatch:
                raise ValueError("config.unroll_length cuts the rollout into unrolls for config.gae_per_minibatch; "
                                 "set gae_per_minibatch=True or leave unroll_length None")
            if cfg.num_steps % cfg.unroll_length:
                raise ValueError(f"config.num_steps ({cfg.num_steps}) must be a multiple of config.unroll_length "
                                 f"({cfg.unroll_length})")
        if cfg.gae_per_minibatch and self._unrolls() % cfg.num_minibatches:
            raise ValueError(f"config.gae_per_minibatch takes whole unrolls per minibatch: num_envs * num_steps / "
                             f"unroll_length ({cfg.num_envs} * {cfg.num_steps} / "
                             f"{cfg.unroll_length or cfg.num_steps} = {self._unrolls()}) must be a multiple of "
                             f"config.num_minibatches ({cfg.num_minibatches})")
        if cfg.batch_size % cfg.num_minibatches:
            raise ValueError(
                f"num_envs * num_steps ({cfg.batch_size}) must be a multiple of config.num_minibatches "
                f"({cfg.num_minibatches})"
            )
        vh = None if cfg.value_hidden_sizes is None else tuple(int(h) for h in cfg.value_hidden_sizes)
        skip = self._check_skip_obs(cfg.skip_obs, "PPOConfig")
        self.network = ActorCritic(self.action_dim, self.discrete, tuple(cfg.hidden_sizes), cfg.activation,
                                   float(cfg.init_log_std), vh, float(cfg.policy_head_scale),
                                   bool(cfg.state_dependent_std), skip)
        clip = () if cfg.max_grad_norm is None else (optax.clip_by_global_norm(cfg.max_grad_norm),)
        self.tx = adam_with_learning_rate(self.hparams.learning_rate, *clip, eps=1e-5)

    def _unrolls(self) -> int:
        """Whole unrolls per update with ``config.gae_per_minibatch``: ``num_envs * num_steps / unroll_length``."""
        cfg = self.config
        return cfg.num_envs * (cfg.num_steps // (cfg.unroll_length or cfg.num_steps))

    def fingerprint(self) -> dict[str, Any]:
        """Every setting of this agent that changes results (JSON-ready; the loop stores it in checkpoints)."""
        fp = self._sampling_fingerprint()
        for f in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "hidden_sizes", "activation",
                  "max_grad_norm"):
            fp[f"ppo/{f}"] = getattr(self.config, f)
        # settings added later: recorded only when set, so earlier runs' fingerprints stay what they were
        if self.config.normalize_observations:
            fp["ppo/normalize_observations"] = True
        if self.config.reward_scaling != 1.0:
            fp["ppo/reward_scaling"] = float(self.config.reward_scaling)
        if self.config.init_log_std != 0.0:
            fp["ppo/init_log_std"] = float(self.config.init_log_std)
        if self.config.absorbing_bootstrap:
            fp["ppo/absorbing_bootstrap"] = True
        if self.config.tanh_squash:
            fp["ppo/tanh_squash"] = True
        if self.config.state_dependent_std and not self.discrete:
            fp["ppo/state_dependent_std"] = True
        if self.config.skip_obs:
            fp["ppo/skip_obs"] = int(self.config.skip_obs)
        if self.config.gae_per_minibatch:
            fp["ppo/gae_per_minibatch"] = True
        if self.config.unroll_length is not None:
            fp["ppo/unroll_length"] = int(self.config.unroll_length)
        if self.config.advantage != "gae":
            fp["ppo/advantage"] = self.config.advantage
        if self.config.policy_head_scale != 0.01:
            fp["ppo/policy_head_scale"] = float(self.config.policy_head_scale)
        if self.config.value_hidden_sizes is not None:
            fp["ppo/value_hidden_sizes"] = tuple(int(h) for h in self.config.value_hidden_sizes)
        for f in ("learning_rate", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "vf_clip",
                  "anneal_steps"):
            fp[f"ppo/{f}"] = np.asarray(jax.device_get(getattr(self.hparams, f))).tolist()
        return fp

    @classmethod
    def from_name(cls, name: str, reward_apply: Callable | None = None, *, horizon: int | None = None, **kwargs):
        """An agent on a built-in fixed-horizon environment (``"cartpole"`` or ``"pendulum"``).

        Args:
          name: environment name (see :func:`~jaxweight.rl.envs.make_env`).
          reward_apply: as in the constructor.
          horizon: episode length (default: the environment's, 500 / 200).
          **kwargs: further constructor arguments (``config``, ``hparams``, exploration).
        """
        env, params = make_env(name, **({} if horizon is None else {"horizon": horizon}))
        return cls(env, params, reward_apply, **kwargs)

    # ---------------------------------------------------------------- helpers
    def _train_env_params(self, reward_params):
        if self.env is None:
            return self.env_params
        return LearnedRewardParams(self.env_params, reward_params)

    def updates_for(self, steps: Any) -> Array:
        """PPO updates ``ceil(steps / (num_envs * num_steps))`` that ``train`` runs for ``steps``."""
        b = self.config.batch_size
        return (jnp.asarray(steps, jnp.int32) + b - 1) // b

    def trained_steps(self, state: PPOAgentState) -> Array:
        """``i32[]`` environment steps trained so far."""
        return state.ppo.steps

    # ---------------------------------------------------------------- init
    def init(self, key: Any) -> PPOAgentState:
        """A fresh agent: network params, optimizer state, ``num_envs`` reset training envs."""
        key = as_key(key)
        k_net, k_env = jax.random.split(key)
        obs0 = jnp.zeros(self.obs_shape, jnp.float32)
        params = self.network.init(k_net, obs0)
        obs, env_state = jax.vmap(self.base_env.reset, in_axes=(0, None))(
            jax.random.split(k_env, self.config.num_envs), self.env_params
        )
        obs = jnp.asarray(obs, jnp.float32)
        if self.env is not None:
            env_state = LearnedRewardState(env_state, obs, jnp.zeros((self.config.num_envs,), jnp.int32))
        ppo = PPOState(
            params=params,
            opt_state=self.tx.init(params),
            env_state=env_state,
            obs=obs,
            steps=jnp.asarray(0, jnp.int32),
            episodes=jnp.asarray(0, jnp.int32),
            obs_norm=obs_norm_init(self.obs_shape) if self.config.normalize_observations else None,
        )
        return PPOAgentState(ppo=ppo)

    # ---------------------------------------------------------------- training
    def rollout(self, ppo: PPOState, key: Any, reward_params: Any = None,
                hparams: PPOHParams | None = None) -> tuple[Any, Array, Transition, Array]:
        """One training rollout of ``num_steps`` steps in the ``num_envs`` training environments.

        Args:
          ppo: the PPO state (its ``env_state`` / ``obs`` are continued).
          key: rollout key.
          reward_params: params of ``reward_apply`` (ignored without one).
          hparams: PPO hyperparameters (only ``gamma`` is used, by
            ``config.absorbing_bootstrap``; default the constructor's).

        Returns:
          ``(env_state, obs f32[E, D], traj, true_reward f32[S, E])``: ``traj.reward``
          is what the agent learns from (the learned reward when ``reward_apply``
          is set, times ``config.reward_scaling``), ``traj.obs`` the raw
          observations, ``true_reward`` the environment's own reward of the same steps
          (for diagnostics; never used for learning).
        """
        cfg = self.config
        hp = self.hparams if hparams is None else hparams
        env = self.env if self.env is not None else self.base_env
        env_params = self._train_env_params(reward_params)

        def step(carry, k):
            env_state, obs = carry
            k_act, k_env = jax.random.split(k)
            out, log_std, value = self.network.apply(ppo.params, obs_norm_apply(ppo.obs_norm, obs))
            a = _sample_action(k_act, out, log_std, self.discrete)
            logp, _ = _log_prob_entropy(out, log_std, a, self.discrete)
            obs2, env_state, r, done, info = jax.vmap(partial(env_step, env), in_axes=(0, 0, 0, None))(
                jax.random.split(k_env, cfg.num_envs), env_state, self._env_action(a), env_params
            )
            true_r = info["true_reward"] if self.env is not None else r
            r = jnp.asarray(r, jnp.float32)
            done = jnp.asarray(done, bool)
            if cfg.absorbing_bootstrap:
                env_state, obs2, r, done = self._absorb(env, env_params, reward_params, hp, k_env, env_state,
                                                        jnp.asarray(obs2, jnp.float32), self._env_action(a), r,
                                                        done, info["entered_absorbing"])
            if cfg.reward_scaling != 1.0:  # a Python branch: at 1.0 the program is the one of before
                r = r * jnp.float32(cfg.reward_scaling)
            tr = Transition(obs, a, logp, value, r, done)
            return (env_state, jnp.asarray(obs2, jnp.float32)), (tr, jnp.asarray(true_r, jnp.float32))

        (env_state, obs), (traj, true_r) = jax.lax.scan(
            step, (ppo.env_state, ppo.obs), jax.random.split(as_key(key), cfg.num_steps)
        )
        return env_state, obs, traj, true_r

    def _absorb(self, env, env_params, reward_params, hp, k_env, env_state, obs2, action, r, done, entered):
        """``config.absorbing_bootstrap`` for one step of the ``E`` training envs: those that ``entered`` the
        absorbing state (and are not at the horizon anyway) end their episode with the discounted value of
        absorbing forever added to their reward, and are reset. Returns ``(env_state, obs2, r, done)``."""
        entered = jnp.asarray(entered, bool) & ~done
        if self.env is not None:  # the learned reward of an absorbing step: (terminal obs, action, terminal obs)
            r_abs = jax.vmap(self.reward_apply, in_axes=(None, 0, 0, 0, 0))(
                reward_params, obs2, action, obs2, jnp.zeros_like(done))
            r_abs = jnp.asarray(r_abs, jnp.float32)
        else:  # FixedHorizon pays 0 while absorbing
            r_abs = jnp.zeros_like(r)
        gamma = hp.gamma
        bonus = gamma * r_abs / jnp.maximum(1.0 - gamma, 1e-3)  # reward_scaling applies to it with r, after
        r = r + jnp.where(entered, bonus, 0.0)
        obs_re, state_re = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(jax.random.fold_in(k_env, 1), self.config.num_envs), env_params)

        def pick(new, old):
            m = jnp.reshape(entered, entered.shape + (1,) * (old.ndim - 1))
            return jnp.where(m, new, old)

        env_state = jax.tree.map(pick, state_re, env_state)
        obs2 = pick(jnp.asarray(obs_re, jnp.float32), obs2)
        return env_state, obs2, r, done | entered

    def _update(self, ppo: PPOState, key, reward_params, hp: PPOHParams) -> PPOState:
        cfg = self.config
        k_roll, k_perm = jax.random.split(key)
        lr = hp.current_learning_rate(ppo.steps)
        env_state, obs, traj, _ = self.rollout(ppo, k_roll, reward_params, hp)
        norm = ppo.obs_norm
        if norm is not None:  # brax's order: the rollout's observations join the statistics before the update
            norm = obs_norm_update(norm, traj.obs)
        n = cfg.batch_size
        fresh = cfg.gae_per_minibatch  # Python branch: off, the program is the one of before
        if fresh:  # whole unrolls [K * E, L] and the observations after them [K * E]
            flat = split_unrolls(traj, obs, cfg.unroll_length or cfg.num_steps)
            rows = self._unrolls()
        else:
            _, _, last_value = self.network.apply(ppo.params, obs_norm_apply(norm, obs))
            adv, targets = gae(traj, last_value, hp, cfg.advantage)
            flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), (traj, adv, targets))
            rows = n

        def epoch(carry, k):
            perm = jax.random.permutation(k, rows)
            mbs = jax.tree.map(
                lambda x: jnp.take(x, perm, axis=0).reshape((cfg.num_minibatches, -1) + x.shape[1:]), flat
            )

            squash = cfg.tanh_squash and not self.discrete  # Python branch: off, the program is the one of before

            def mb_step(carry, mb):
                params, opt_state = carry
                tk = None
                if squash:  # a key per minibatch for the entropy's reparameterised sample
                    mb, i = mb
                    tk = jax.random.fold_in(k, i)
                if fresh:
                    unrolls, last_obs = mb
                    batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), unrolls)  # back to [T, e]
                    grads = jax.grad(ppo_loss_fresh_gae, argnums=2)(self.network, self.discrete, params, batch,
                                                                    last_obs, hp, norm, tk, cfg.advantage)
                else:
                    batch, a, t = mb
                    grads = jax.grad(ppo_loss, argnums=2)(self.network, self.discrete, params, batch, a, t, hp,
                                                          norm, tk)
                updates, opt_state = self.tx.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
                return (params, opt_state), None

            if squash:
                mbs = (mbs, jnp.arange(cfg.num_minibatches, dtype=jnp.int32))
            return jax.lax.scan(mb_step, carry, mbs)[0], None

        (params, opt_state), _ = jax.lax.scan(
            epoch, (ppo.params, set_learning_rate(ppo.opt_state, lr)), jax.random.split(k_perm, cfg.update_epochs)
        )
        return ppo.replace(
            params=params,
            opt_state=opt_state,
            env_state=env_state,
            obs=obs,
            steps=ppo.steps + jnp.asarray(n, jnp.int32),
            episodes=ppo.episodes + jnp.sum(traj.done, dtype=jnp.int32),
            obs_norm=norm,
        )

    def train(self, state: PPOAgentState, key: Any, steps: Any, reward_params: Any = None, *,
              hparams: PPOHParams | None = None) -> PPOAgentState:
        """Train PPO for ``ceil(steps / (num_envs * num_steps))`` updates on ``reward_apply``.

        Args:
          state: from :meth:`init` or a previous ``train``.
          key: randomness of rollouts and minibatches (update ``i`` uses
            ``fold_in(key, i)``).
          steps: environment steps (int or traced ``i32[]``; a traced count
            never recompiles), rounded up to whole updates.
          reward_params: params of ``reward_apply``; they ride in the env params,
            so new values never recompile.
          hparams: :class:`PPOHParams` (array leaves: new values never recompile;
            default the constructor's). The preference loop passes its config's
            ``agent_hparams``.

        Returns:
          The new :class:`PPOAgentState`.
        """
        key = as_key(key)
        hp = self.hparams if hparams is None else hparams
        if not isinstance(hp, PPOHParams):
            raise ValueError(f"hparams must be a PPOHParams, got {type(hp).__name__}")
        ppo = jax.lax.fori_loop(
            0, self.updates_for(steps), lambda i, p: self._update(p, jax.random.fold_in(key, i), reward_params, hp),
            state.ppo,
        )
        return state.replace(ppo=ppo)

    # ---------------------------------------------------------------- sampling
    @staticmethod
    def _policy(state: PPOAgentState) -> tuple[Any, Any]:
        """What acting needs: ``(network params, ObsNorm or None)``."""
        return state.ppo.params, state.ppo.obs_norm

    def _act(self, policy, obs, key, deterministic=False):
        params, norm = policy
        out, log_std, _ = self.network.apply(params, obs_norm_apply(norm, obs))
        if deterministic:
            return jnp.argmax(out, axis=-1).astype(jnp.int32) if self.discrete else out
        return _sample_action(key, out, log_std, self.discrete)
