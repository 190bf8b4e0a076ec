"""Episode sampling and evaluation shared by the agents (:class:`~jaxweight.rl.ppo_agent.PPOAgent`,
:class:`~jaxweight.rl.sac.SACAgent`).

:class:`EpisodeSampler` is the base of both: the constructor's common arguments (the environment,
a reward function, config and hyperparameters, imitation's exploration), whole-episode rollouts of
the current policy from fresh resets (:meth:`~EpisodeSampler.sample_episodes`, fixed shapes, the
environment's own reward recorded) and :meth:`~EpisodeSampler.evaluate` (true returns).
:class:`Episodes` is what a rollout returns; it knows no reward-learning type (the preference
generators turn it into their ``Trajectories``).

References:
  imitation ``algorithms/preference_comparisons.py`` (``AgentTrainer``) and
  ``policies/exploration_wrapper.py`` (the exploration of the samples).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from .._util import as_key, check_static_int, check_value

__all__ = ["Episodes", "EpisodeSampler"]

Array = jax.Array


@struct.dataclass
class Episodes:
    """Whole episodes of at most ``H`` steps, padded to ``H``.

    Attributes:
      obs: ``f32[N, H+1, *obs_shape]`` observations (the reset one first).
      acts: ``[N, H, *act_shape]`` actions as the environment got them.
      rews: ``f32[N, H]`` the environment's own rewards (0 after the end and in unused episodes).
      lengths: ``i32[N]`` transitions of each episode (0: an unused episode).
      terminal: ``bool[N]`` the episode ended with ``done`` before or at ``H``.
    """

    obs: Array
    acts: Array
    rews: Array
    lengths: Array
    terminal: Array


class EpisodeSampler:
    """What every agent shares: whole-episode sampling (with imitation's exploration), evaluation and
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
        """A new agent with some constructor arguments changed (``reward_apply``, ``config``,
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
        """Episodes ``sample_episodes`` rolls out to cover ``steps`` transitions (a static shape)."""
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

    def sample_episodes(self, state: Any, key: Any, steps: Any, *, max_steps: int | None = None) -> Episodes:
        """Roll out the current policy (and the exploration policy) for ``>= steps`` transitions.

        As imitation's ``AgentTrainer.sample``: ``e = int(exploration_frac * steps)``
        (at least 1 when ``exploration_frac > 0``) transitions come from
        exploration episodes and ``steps - e`` from the agent; each part is
        whole episodes, agent episodes first. Rewards are the environment's
        true rewards (for the synthetic teacher).

        Args:
          state: the agent state.
          key: rollout key.
          steps: requested transitions (static int, or traced ``i32[]`` with ``max_steps``).
          max_steps: static upper bound of ``steps`` fixing the output shape
            (default ``steps``, which must then be a static int).

        Returns:
          :class:`Episodes` ``(obs f32[N, H+1, D], acts [N, H, ...], rews f32[N, H],
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
        return Episodes(
            obs=obs,
            acts=acts,
            rews=jnp.where(used[:, None], rews, 0.0),
            lengths=jnp.where(used, lengths, 0).astype(jnp.int32),
            terminal=terminal & used,
        )

    def evaluate(self, state: Any, key: Any, num_episodes: int = 16, *, deterministic: bool = False) -> Array:
        """True (environment) returns ``f32[num_episodes]`` of the current policy.

        Args:
          state: the agent state.
          key: rollout key.
          num_episodes: episodes (static).
          deterministic: act with the mode of the policy instead of sampling.
        """
        num_episodes = check_static_int(num_episodes, "num_episodes", minimum=1)
        keys = jax.random.split(as_key(key), num_episodes)
        episode = partial(self._episode, deterministic=bool(deterministic))
        _, _, rews, _, _ = jax.vmap(lambda p, k: episode(p, k, False), in_axes=(None, 0))(self._policy(state), keys)
        return jnp.sum(rews, axis=-1)
