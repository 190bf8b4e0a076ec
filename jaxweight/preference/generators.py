"""Trajectory generators for preference comparisons: the protocol and a gymnax + PPO agent.

imitation's ``TrajectoryGenerator`` (``sample(steps)``, ``train(steps)``) as pure
functions over an explicit state, so a whole run jits and vmaps over seeds:
``gen.init(key)``, ``gen.sample(state, key, steps, max_steps=cap)`` (fixed
shapes), ``gen.train(state, key, steps, reward_params)`` and, for agents,
``gen.evaluate(state, key, n)`` (true returns).
:class:`~jaxweight.preference.datasets.DatasetGenerator` (its own module) is a
fixed, shuffled set of trajectories (``TrajectoryDataset``);
:class:`AgentGenerator` a PPO agent (:mod:`jaxweight.preference.ppo`) on a gymnax
environment rewarded by the learned model, with ``AgentTrainer``'s exploration;
samples record the true reward for the teacher. :class:`HostGenerator` is a thin
stateful wrapper with imitation's methods.

References:
  imitation ``algorithms/preference_comparisons.py`` (``TrajectoryDataset``,
  ``AgentTrainer``) and ``policies/exploration_wrapper.py``;
  Schulman et al. 2017 (PPO, arXiv:1707.06347); purejaxrl (Lu et al. 2022).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from gymnax.environments import environment, spaces

from .._util import as_key, check_static_int, check_value
from .data import Trajectories
from .envs import LearnedRewardEnv, LearnedRewardParams, LearnedRewardState, env_step, make_env
from .fixed_horizon import FixedHorizon
from .ppo import (ADVANTAGES, ActorCritic, PPOConfig, PPOHParams, PPOState, Transition, _log_prob_entropy,
                  _sample_action, gae, obs_norm_apply, obs_norm_init, obs_norm_update, ppo_loss, ppo_loss_fresh_gae,
                  split_unrolls)

__all__ = [
    "TrajectoryGenerator",
    "HostGenerator",
    "EpisodeSampler",
    "AgentGenerator",
    "AgentState",
]

Array = jax.Array


# ------------------------------------------------------------------ protocol
class TrajectoryGenerator(Protocol):
    """imitation's protocol: ``sample(key, steps)`` and ``train(key, steps, reward_params)``."""

    def sample(self, key: Any, steps: int) -> Trajectories:  # pragma: no cover - protocol
        ...

    def train(self, key: Any, steps: int, reward_params: Any = None) -> None:  # pragma: no cover
        ...


class HostGenerator:
    """Stateful host-side view of a pure generator (imitation's ``TrajectoryGenerator``).

    Args:
      gen: a pure generator (:class:`~jaxweight.preference.datasets.DatasetGenerator` or :class:`AgentGenerator`).
      key: key or int seed for ``gen.init``.

    Attributes:
      state: the current generator state (replaced by ``train``).

    For instance ``host = HostGenerator(AgentGenerator.from_name("cartpole"), 0)``,
    then ``host.sample(1, 1000)`` (>= 1000 transitions) and ``host.train(2, 10_000, reward_params)``.
    """

    def __init__(self, gen, key: Any):
        self.gen = gen
        self.state = gen.init(as_key(key))
        self._sample = jax.jit(gen.sample, static_argnames=("steps",))
        self._train = jax.jit(gen.train)

    def sample(self, key: Any, steps: int) -> Trajectories:
        """Trajectories with ``sum(lengths) >= steps`` (padding trajectories have length 0)."""
        steps = check_static_int(steps, "steps", minimum=0)
        return self._sample(self.state, as_key(key), steps=steps)

    def train(self, key: Any, steps: int, reward_params: Any = None) -> None:
        """Train the agent for ``steps`` environment steps on ``reward_params`` (no-op for datasets)."""
        steps = check_static_int(steps, "steps", minimum=0)
        self.state = self._train(self.state, as_key(key), jnp.asarray(steps, jnp.int32), reward_params)


# ------------------------------------------------------------------ shared by the agents
class EpisodeSampler:
    """What every agent generator shares: whole-episode sampling (with imitation's exploration), evaluation and
    the constructor's common arguments.

    A subclass takes ``(env, env_params, reward_apply, *, config, hparams,
    exploration_frac, switch_prob, random_prob)``, calls ``_init_agent`` and
    ``_init_sampling`` in its constructor and defines ``_policy(state)``
    (what acting needs, a pytree) and ``_act(policy, obs, key, deterministic)``
    (an action before ``_env_action``: a discrete index, or a continuous
    one that is clipped, or tanh-squashed with ``squash``, into the action space).
    """

    def _init_agent(self, reward_apply: Callable | None, config: Any, config_cls: type, hparams: Any,
                    hparams_cls: type) -> None:
        """Check and store ``reward_apply``, ``config`` (default ``config_cls()``) and ``hparams``
        (default ``hparams_cls.create()``, or a dict of its fields)."""
        if reward_apply is not None and not callable(reward_apply):
            raise ValueError(f"reward_apply must be callable or None, got {type(reward_apply).__name__}")
        self.reward_apply = reward_apply
        self.config = config if config is not None else config_cls()
        if not isinstance(self.config, config_cls):
            raise ValueError(f"config must be a {config_cls.__name__}, got {type(self.config).__name__}")
        if hparams is None:
            hparams = hparams_cls.create()
        elif isinstance(hparams, dict):
            hparams = hparams_cls.create(**hparams)
        elif not isinstance(hparams, hparams_cls):
            raise ValueError(f"hparams must be a {hparams_cls.__name__} or a dict of its fields, got "
                             f"{type(hparams).__name__}")
        self.hparams = hparams

    def _check_skip_obs(self, skip: Any, config_name: str) -> int:
        """``config.skip_obs`` as an int in ``[0, D)`` for vector observations ``f32[D]``, or a ``ValueError``."""
        if isinstance(skip, bool) or not isinstance(skip, int | np.integer) or skip < 0 or (
                skip and (len(self.obs_shape) != 1 or skip >= self.obs_shape[0])):
            raise ValueError(f"{config_name}.skip_obs must be an int in [0, D) for vector observations f32[D] "
                             f"(these have shape {self.obs_shape}), got {skip!r}")
        return int(skip)

    def _sampling_fingerprint(self) -> dict[str, Any]:
        """The fingerprint entries of the environment and of the exploration."""
        return {"env": str(getattr(self.base_env, "name", type(self.base_env).__name__)),
                "env_params": repr(self.env_params), "horizon": self.horizon,
                "exploration_frac": self.exploration_frac, "switch_prob": self.switch_prob,
                "random_prob": self.random_prob}

    def replace(self, **changes: Any):
        """A new generator with some constructor arguments changed (``reward_apply``, ``config``,
        ``hparams``, ``exploration_frac``, ``switch_prob``, ``random_prob``); states stay compatible
        as long as ``config`` is unchanged."""
        args = dict(
            env=self.base_env, env_params=self.env_params, reward_apply=self.reward_apply, config=self.config,
            hparams=self.hparams, exploration_frac=self.exploration_frac, switch_prob=self.switch_prob,
            random_prob=self.random_prob,
        )
        unknown = set(changes) - set(args)
        if unknown:
            raise ValueError(f"unknown {type(self).__name__} arguments {sorted(unknown)}; expected some of "
                             f"{sorted(args)}")
        args.update(changes)
        return type(self)(**args)

    def with_reward(self, reward_apply: Callable | None):
        """The same agent settings with another ``reward_apply`` (``None``: the environment's reward)."""
        return self.replace(reward_apply=reward_apply)

    def _init_sampling(self, env: environment.Environment, env_params: Any, exploration_frac: float,
                       switch_prob: float, random_prob: float, squash: bool) -> None:
        for name, v in (("exploration_frac", exploration_frac), ("switch_prob", switch_prob),
                        ("random_prob", random_prob)):
            check_value(v, name, ge=0.0, le=1.0, static=True)  # stored as Python floats
        self.base_env = env
        self.env_params = env_params
        self.exploration_frac = float(exploration_frac)
        self.switch_prob = float(switch_prob)
        self.random_prob = float(random_prob)
        self.horizon = check_static_int(
            int(np.asarray(env_params.max_steps_in_episode)), "env_params.max_steps_in_episode", 1
        )
        self.action_space = env.action_space(env_params)
        self.discrete = isinstance(self.action_space, spaces.Discrete)
        if self.discrete:
            self.action_dim = int(self.action_space.n)
        else:
            self.action_dim = int(np.prod(self.action_space.shape))
            self._low = jnp.asarray(self.action_space.low, jnp.float32)
            self._high = jnp.asarray(self.action_space.high, jnp.float32)
        self._squash = bool(squash) and not self.discrete
        self.obs_shape = tuple(env.observation_space(env_params).shape)
        # Static facts for the loop's variable-horizon check: environments that declare
        # `fixed_horizon` always run `horizon` steps; for others the loop checks the samples.
        self.horizons = (self.horizon,) if getattr(env, "fixed_horizon", False) else None

    def _env_action(self, a):
        if self.discrete:
            return a
        if self._squash:
            return self._low + (jnp.tanh(a) + 1.0) * (0.5 * (self._high - self._low))
        return jnp.clip(a, self._low, self._high)

    def episodes_for(self, steps: int) -> int:
        """Episodes ``sample`` rolls out to cover ``steps`` transitions (a static shape)."""
        steps = check_static_int(steps, "steps", minimum=0)
        h = self.horizon
        agent_eps = -(-steps // h)
        # agent and exploration parts are rounded up separately
        return max(1, agent_eps + (1 if self.exploration_frac > 0 else 0))

    def _random_action(self, key):
        if self.discrete:
            return jax.random.randint(key, (), 0, self.action_dim, jnp.int32)
        return jax.random.uniform(key, (self.action_dim,), jnp.float32, self._low, self._high)

    def _episode(self, policy, key, explore, deterministic=False):
        """One episode of at most ``horizon`` steps without auto-reset: ``(obs, acts, rews, length, terminal)``.

        ``explore`` is ``bool[]`` or the Python ``False`` (no exploration code is traced:
        the same keys, the same episodes, a smaller program).
        """
        h = self.horizon
        k_reset, k_switch0, k_steps = jax.random.split(key, 3)
        obs0, s0 = self.base_env.reset_env(k_reset, self.env_params)
        obs0 = jnp.asarray(obs0, jnp.float32)
        # ExplorationWrapper: the acting policy is drawn at the start and re-drawn with
        # switch_prob at every step (the chain starts in its stationary law either way)
        traced = explore is not False
        use_random0 = (explore & (jax.random.uniform(k_switch0) < self.random_prob)) if traced else jnp.asarray(False)

        def step(carry, k):
            s, obs, use_random, alive = carry
            k_sw, k_pick, k_pol, k_rand, k_env = jax.random.split(k, 5)
            a_pol = self._env_action(self._act(policy, obs, k_pol, deterministic))
            if traced:
                switch = explore & (jax.random.uniform(k_sw) < self.switch_prob)
                use_random = jnp.where(switch, jax.random.uniform(k_pick) < self.random_prob, use_random)
                a = jnp.where(use_random, self._random_action(k_rand), a_pol)
            else:
                a = a_pol
            obs2, s2, r, done, _ = self.base_env.step_env(k_env, s, a, self.env_params)
            obs2 = jnp.asarray(obs2, jnp.float32)
            out = (obs2, a, jnp.where(alive, jnp.asarray(r, jnp.float32), 0.0), alive, alive & done)
            return (s2, obs2, use_random, alive & ~done), out

        _, (obs, acts, rews, alive, ended) = jax.lax.scan(
            step, (s0, obs0, use_random0, jnp.asarray(True)), jax.random.split(k_steps, h)
        )
        obs = jnp.concatenate([obs0[None], obs], axis=0)
        length = jnp.sum(alive, dtype=jnp.int32)
        return obs, acts, rews, length, jnp.any(ended)

    def sample(self, state: AgentState, key: Any, steps: Any, *, max_steps: int | None = None) -> Trajectories:
        """Roll out the current policy (and the exploration policy) for ``>= steps`` transitions.

        As imitation's ``AgentTrainer.sample``: ``e = int(exploration_frac * steps)``
        (at least 1 when ``exploration_frac > 0``) transitions come from
        exploration episodes and ``steps - e`` from the agent; each part is
        whole episodes, agent episodes first. Rewards are the environment's
        true rewards (for the synthetic teacher).

        Args:
          state: generator state.
          key: rollout key.
          steps: requested transitions (static int, or traced ``i32[]`` with ``max_steps``).
          max_steps: static upper bound of ``steps`` fixing the output shape
            (default ``steps``, which must then be a static int).

        Returns:
          ``Trajectories(obs f32[N, H+1, D], acts [N, H, ...], rews f32[N, H],
          lengths i32[N], terminal bool[N])`` with ``N = episodes_for(max_steps)``;
          unused episodes have length 0.
        """
        key = as_key(key)
        if max_steps is None:
            max_steps = check_static_int(steps, "steps", minimum=0)
        n_eps = self.episodes_for(max_steps)
        h = self.horizon
        steps = jnp.asarray(steps, jnp.int32)
        if self.exploration_frac > 0:
            expl = jnp.floor(self.exploration_frac * steps.astype(jnp.float32)).astype(jnp.int32)
            expl = jnp.maximum(expl, 1)
        else:
            expl = jnp.asarray(0, jnp.int32)
        agent_eps = (jnp.maximum(steps - expl, 0) + h - 1) // h
        expl_eps = (expl + h - 1) // h
        idx = jnp.arange(n_eps)
        explore = idx >= agent_eps
        used = idx < agent_eps + expl_eps
        keys = jax.random.split(key, n_eps)
        if self.exploration_frac > 0:
            obs, acts, rews, lengths, terminal = jax.vmap(self._episode, in_axes=(None, 0, 0))(
                self._policy(state), keys, explore
            )
        else:  # no exploration episode is used: leave its code out of the program
            obs, acts, rews, lengths, terminal = jax.vmap(lambda p, k: self._episode(p, k, False), in_axes=(None, 0))(
                self._policy(state), keys
            )
        return Trajectories(
            obs=obs,
            acts=acts,
            rews=jnp.where(used[:, None], rews, 0.0),
            lengths=jnp.where(used, lengths, 0).astype(jnp.int32),
            terminal=terminal & used,
        )

    def evaluate(self, state: AgentState, key: Any, num_episodes: int = 16, *, deterministic: bool = False) -> Array:
        """True (environment) returns ``f32[num_episodes]`` of the current policy.

        Args:
          state: generator state.
          key: rollout key.
          num_episodes: episodes (static).
          deterministic: act with the mode of the policy instead of sampling.
        """
        num_episodes = check_static_int(num_episodes, "num_episodes", minimum=1)
        keys = jax.random.split(as_key(key), num_episodes)
        episode = partial(self._episode, deterministic=bool(deterministic))
        _, _, rews, _, _ = jax.vmap(lambda p, k: episode(p, k, False), in_axes=(None, 0))(self._policy(state), keys)
        return jnp.sum(rews, axis=-1)


# ------------------------------------------------------------------ PPO
@struct.dataclass
class AgentState:
    """State of :class:`AgentGenerator`: the PPO state (the reward params come with every ``train`` call)."""

    ppo: PPOState


class AgentGenerator(EpisodeSampler):
    """A gymnax + PPO agent trained on a learned reward; samples record the true reward.

    Args:
      env: a gymnax environment (e.g. :class:`~jaxweight.preference.envs.FixedHorizonCartPole`).
      env_params: its params (concrete; ``max_steps_in_episode`` is the horizon).
      reward_apply: ``(reward_params, obs, action, next_obs, done) -> f32[]``, the
        reward the agent trains on (a static callable; its params come with
        every ``train`` call inside the env params, see
        :class:`~jaxweight.preference.envs.LearnedRewardEnv`). ``None`` trains
        on the environment's own reward (the true-reward baseline);
        :class:`~jaxweight.preference.driver.PreferenceComparisons` binds its
        learned reward to a generator built with ``None`` (``with_reward``).
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
    ``gen = AgentGenerator(env, p, reward_apply, exploration_frac=0.05)``, ``s = gen.init(0)``,
    ``s = gen.train(s, key, 50_000, reward_params)`` and ``gen.sample(s, key, 2_000)`` (obs
    ``f32[N, 501, 4]`` with the true rewards).
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
        self.tx = optax.chain(*clip, optax.scale_by_adam(eps=1e-5))

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
          name: environment name (see :func:`~jaxweight.preference.envs.make_env`).
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

    def trained_steps(self, state: AgentState) -> Array:
        """``i32[]`` environment steps trained so far."""
        return state.ppo.steps

    # ---------------------------------------------------------------- init
    def init(self, key: Any) -> AgentState:
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
        return AgentState(ppo=ppo)

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
                params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
                return (params, opt_state), None

            if squash:
                mbs = (mbs, jnp.arange(cfg.num_minibatches, dtype=jnp.int32))
            return jax.lax.scan(mb_step, carry, mbs)[0], None

        (params, opt_state), _ = jax.lax.scan(
            epoch, (ppo.params, ppo.opt_state), jax.random.split(k_perm, cfg.update_epochs)
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

    def train(self, state: AgentState, key: Any, steps: Any, reward_params: Any = None, *,
              hparams: PPOHParams | None = None) -> AgentState:
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
          The new :class:`AgentState`.
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
    def _policy(state: AgentState) -> tuple[Any, Any]:
        """What acting needs: ``(network params, ObsNorm or None)``."""
        return state.ppo.params, state.ppo.obs_norm

    def _act(self, policy, obs, key, deterministic=False):
        params, norm = policy
        out, log_std, _ = self.network.apply(params, obs_norm_apply(norm, obs))
        if deterministic:
            return jnp.argmax(out, axis=-1).astype(jnp.int32) if self.discrete else out
        return _sample_action(key, out, log_std, self.discrete)
