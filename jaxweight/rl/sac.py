"""An off-policy agent: soft actor-critic (SAC) with reward relabelling.

:class:`SACAgent` has :class:`~jaxweight.rl.ppo_agent.PPOAgent`'s
interface (``init``, ``train(state, key, steps, reward_params)``, ``sample_episodes``,
``evaluate``, ``with_reward``, ``fingerprint``); the preference loop's
:class:`~jaxweight.preference.generators.SACGenerator` is this agent with samples as
preference ``Trajectories``, so the loop, the driver and the demos take either. It is what
PEBBLE (Lee et al. 2021) pairs with preference learning: a replay buffer keeps the transitions ``(obs, action,
next_obs)`` and their true reward, never a learned one. Every gradient step
computes the reward of its minibatch with the reward params of the current
``train`` call, so when the reward model changes between rounds every stored
transition is relabelled (PEBBLE's relabelling, done lazily: the same
targets, no pass over the buffer).

The agent (Haarnoja et al. 2018, with automatic entropy tuning): a
tanh-squashed Gaussian actor, two Q-networks and their Polyak-averaged
targets, the temperature ``alpha`` learned towards an entropy of
``-action_dim``; Adam for all three; ``num_envs`` vmapped environments, each
vectorised step stores ``num_envs`` transitions and is followed by
``updates_per_step`` gradient steps on minibatches drawn uniformly from the
buffer. The first ``learning_starts`` transitions come from uniformly random
actions (Stable-Baselines3's ``learning_starts``).

Continuous actions and fixed-horizon environments (every ``make_env`` id):
a ``done`` is always the horizon, which SAC bootstraps through; with
``absorbing_bootstrap``, an environment that enters its absorbing state ends
its episode there with the value of absorbing forever, as PPO's option does.

Example::

    from jaxweight import rl
    env, p = rl.make_env("pendulum")
    agent = rl.SACAgent(env, p, config=rl.SACConfig(num_envs=4, buffer_size=4096, learning_starts=256))
    s = agent.train(agent.init(0), 1, 512)        # the true reward (reward_apply=None)
    returns = agent.evaluate(s, 2, 4)             # f32[4]

References:
  Haarnoja et al. 2018 (SAC, arXiv:1801.01290; automatic temperature,
  arXiv:1812.05905); Lee et al. 2021 (PEBBLE, arXiv:2106.05091);
  Stable-Baselines3 ``SAC`` (defaults: buffer 1e6, batch 256, lr 3e-4, tau
  0.005, gamma 0.99, log-std clipped to [-20, 2]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import struct
from gymnax.environments import environment

from .._util import as_key, check_static_int, check_value
from .fixed_horizon import FixedHorizon
from .normalization import ObsNorm, obs_norm_apply, obs_norm_init, obs_norm_update
from .ppo import adam_with_learning_rate, set_learning_rate
from .rollout import EpisodeSampler

__all__ = ["SACConfig", "SACHParams", "SACReplay", "SACState", "SACActor", "DoubleQ", "SACAgent",
           "squashed_sample"]

Array = jax.Array

#: the actor's log-std is clipped to this range (Stable-Baselines3's ``LOG_STD_MIN``, ``LOG_STD_MAX``)
LOG_STD_RANGE = (-20.0, 2.0)


@struct.dataclass
class SACConfig:
    """Structural SAC settings (static; changing them recompiles).

    Attributes:
      num_envs: parallel environments (E); a vectorised step stores E transitions.
      buffer_size: replay capacity in transitions (a multiple of ``num_envs``;
        the oldest are overwritten). It lives in the agent state, so the
        loop's checkpoints hold it: ``buffer_size * (2 D + A + 2)`` floats per seed.
      batch_size: transitions per gradient step.
      updates_per_step: gradient steps after each vectorised environment step
        (``num_envs`` of them is one gradient step per stored transition, SB3's ratio).
      learning_starts: transitions of uniformly random actions before the
        first gradient step (at least ``batch_size`` are stored first anyway).
      hidden_sizes: MLP widths of the actor and of each Q-network.
      activation: a ``flax.linen`` activation name (``"relu"``, as SB3).
      init_alpha: initial temperature.
      normalize_observations: running mean / variance of the observations in
        the agent state (:class:`~jaxweight.rl.normalization.ObsNorm`, updated with
        every environment step), applied to the stored raw observations at
        every gradient step (brax's SAC).
      reward_scaling: rewards are multiplied by this before the targets.
      absorbing_bootstrap: for a :class:`~jaxweight.rl.fixed_horizon.FixedHorizon`
        environment: a transition into the absorbing state ends its episode
        (the environment is reset) and its target is ``r + gamma * r_abs / (1 -
        gamma)``, ``r_abs`` the reward of an absorbing step (0 for the true
        reward; the learned reward of ``(next_obs, action, next_obs)``).
      skip_obs: the networks see ``obs[..., skip_obs:]`` (the reward model sees all of it).
    """

    num_envs: int = struct.field(pytree_node=False, default=16)
    buffer_size: int = struct.field(pytree_node=False, default=1_000_000)
    batch_size: int = struct.field(pytree_node=False, default=256)
    updates_per_step: int = struct.field(pytree_node=False, default=16)
    learning_starts: int = struct.field(pytree_node=False, default=10_000)
    hidden_sizes: tuple = struct.field(pytree_node=False, default=(256, 256))
    activation: str = struct.field(pytree_node=False, default="relu")
    init_alpha: float = struct.field(pytree_node=False, default=1.0)
    normalize_observations: bool = struct.field(pytree_node=False, default=False)
    reward_scaling: float = struct.field(pytree_node=False, default=1.0)
    absorbing_bootstrap: bool = struct.field(pytree_node=False, default=False)
    skip_obs: int = struct.field(pytree_node=False, default=0)


@struct.dataclass
class SACHParams:
    """Continuous SAC hyperparameters, ``f32[]`` leaves (vmappable, never recompile).

    Attributes:
      learning_rate: Adam step size of actor, critics and temperature (3e-4).
      gamma: discount (0.99).
      tau: Polyak rate of the target Q-networks (0.005).
    """

    learning_rate: Array
    gamma: Array
    tau: Array

    @classmethod
    def create(cls, learning_rate=3e-4, gamma=0.99, tau=0.005):
        """Validated hyperparameters (``learning_rate`` >= 0; ``gamma`` in [0, 1); ``tau`` in [0, 1]).

        Raises:
          ValueError: naming the value and its range.
        """
        check_value(learning_rate, "learning_rate", ge=0.0)
        check_value(gamma, "gamma", ge=0.0, lt=1.0)
        check_value(tau, "tau", ge=0.0, le=1.0)
        f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
        return cls(f(learning_rate), f(gamma), f(tau))


# Our own ring buffer rather than a library one (flashbax, brax's replay): it must be array leaves of
# the agent state, so that a run vmaps over seeds, jits as one program and is saved in the loop's checkpoints.
@struct.dataclass
class SACReplay:
    """A ring buffer of ``C`` transitions (``C = SACConfig.buffer_size``).

    Attributes:
      obs, next_obs: ``f32[C, D]`` raw observations (``next_obs`` the one the
        step reached, before any reset).
      action: ``f32[C, A]`` actions in ``[-1, 1]`` (after the tanh, before the
        scaling to the action space).
      reward: ``f32[C]`` the environment's reward (the learned one is computed
        at every gradient step).
      absorbed: ``bool[C]`` the step entered the absorbing state (with
        ``absorbing_bootstrap``; else all False).
      ptr: ``i32[]`` next row to write; size: ``i32[]`` rows filled.
    """

    obs: Array
    action: Array
    next_obs: Array
    reward: Array
    absorbed: Array
    ptr: Array
    size: Array


@struct.dataclass
class SACState:
    """SAC train state (every leaf an array with an explicit dtype).

    Attributes:
      actor, critic, target: parameters of :class:`SACActor` and of the two
        :class:`DoubleQ` (online and target).
      log_alpha: ``f32[]`` log temperature.
      actor_opt, critic_opt, alpha_opt: Adam states.
      replay: :class:`SACReplay`.
      env_state, obs: the ``E`` training environments and their ``f32[E, D]`` observations.
      steps: ``i32[]`` environment steps so far; episodes: ``i32[]`` finished training episodes.
      obs_norm: :class:`~jaxweight.rl.normalization.ObsNorm` or ``None``.
    """

    actor: Any
    critic: Any
    target: Any
    log_alpha: Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    replay: SACReplay
    env_state: Any
    obs: Array
    steps: Array
    episodes: Array
    obs_norm: ObsNorm | None = None


def _mlp(x, sizes, activation):
    act = getattr(nn, activation)
    for h in sizes:
        x = act(nn.Dense(h)(x))
    return x


class SACActor(nn.Module):
    """``__call__(obs f32[..., D]) -> (mean f32[..., A], log_std f32[..., A])`` of the pre-tanh Gaussian.

    Reads ``obs[..., skip_obs:]``; ``log_std`` is clipped to ``LOG_STD_RANGE``.
    """

    action_dim: int
    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    skip_obs: int = 0

    @nn.compact
    def __call__(self, obs):
        x = _mlp(obs[..., self.skip_obs:], self.hidden_sizes, self.activation)
        mean, log_std = jnp.split(nn.Dense(2 * self.action_dim)(x), 2, axis=-1)
        return mean, jnp.clip(log_std, *LOG_STD_RANGE)


class _Q(nn.Module):
    hidden_sizes: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(_mlp(x, self.hidden_sizes, self.activation))[..., 0]


class DoubleQ(nn.Module):
    """Two Q-networks: ``__call__(obs f32[..., D], action f32[..., A]) -> f32[2, ...]``.

    Both read ``concat(obs[..., skip_obs:], action)``; their params are stacked
    on a leading axis of 2 (``nn.vmap``), each initialised with its own key.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    skip_obs: int = 0

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs[..., self.skip_obs:], action], axis=-1)
        qs = nn.vmap(_Q, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None, out_axes=0,
                     axis_size=2)
        return qs(tuple(self.hidden_sizes), self.activation)(x)


def squashed_sample(key: Array, mean: Array, log_std: Array) -> tuple[Array, Array]:
    """A reparameterised tanh-Gaussian sample and its log-density.

    Args:
      key: PRNG key.
      mean, log_std: ``f32[..., A]`` of the pre-tanh Gaussian.

    Returns:
      ``(a f32[..., A] in (-1, 1), log_prob f32[...])``, the density of ``a``
      (the Gaussian's of ``u`` minus ``sum log(1 - tanh(u)^2)``, in the stable
      form ``2 (log 2 - u - softplus(-2 u))``).
    """
    eps = jax.random.normal(key, mean.shape, mean.dtype)
    u = mean + jnp.exp(log_std) * eps
    logp = -0.5 * jnp.sum(eps ** 2 + 2.0 * log_std + jnp.log(2.0 * jnp.pi), axis=-1)
    logp = logp - jnp.sum(2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u)), axis=-1)
    return jnp.tanh(u), logp


class SACAgent(EpisodeSampler):
    """A SAC agent on a fixed-horizon gymnax environment with continuous actions, trained on a learned reward.

    Args:
      env: a fixed-horizon gymnax environment (``make_env``'s ids), continuous actions.
      env_params: its params (``max_steps_in_episode`` is the horizon).
      reward_apply: ``(reward_params, obs, action, next_obs, done) -> f32[]`` (the
        action as the environment gets it), or ``None``: the environment's reward
        (the true-reward baseline); the preference driver binds its learned
        reward (``with_reward``).
      config: :class:`SACConfig`.
      hparams: :class:`SACHParams` or a dict of its fields (the loop's config copies them).
      exploration_frac, switch_prob, random_prob: imitation's exploration of
        the samples (as :class:`~jaxweight.rl.ppo_agent.PPOAgent`).

    ``sample_episodes`` and ``evaluate`` run whole episodes of the current
    policy (sampled, or its mean with ``deterministic=True``); samples record
    the true reward for the teacher.

    Raises:
      ValueError: discrete actions; an environment without a fixed horizon;
        a setting out of range (named).
    """

    def __init__(
        self,
        env: environment.Environment,
        env_params: Any,
        reward_apply: Callable | None = None,
        *,
        config: SACConfig | None = None,
        hparams: SACHParams | dict | None = None,
        exploration_frac: float = 0.0,
        switch_prob: float = 0.5,
        random_prob: float = 0.5,
    ):
        self._init_agent(reward_apply, config, SACConfig, hparams, SACHParams)
        self._init_sampling(env, env_params, exploration_frac, switch_prob, random_prob, squash=True)
        if self.discrete:
            raise ValueError(f"{type(self).__name__} needs continuous actions; "
                             f"{getattr(env, 'name', type(env).__name__)} has "
                             f"{type(self.action_space).__name__}({self.action_dim}) (use PPO)")
        if not getattr(env, "fixed_horizon", False):
            raise ValueError(f"{type(self).__name__} needs a fixed-horizon environment (every done a time limit, "
                             f"which it bootstraps through): a make_env id or a FixedHorizon wrapper, got "
                             f"{type(env).__name__}")
        cfg = self.config
        for name in ("num_envs", "buffer_size", "batch_size", "updates_per_step"):
            check_static_int(getattr(cfg, name), f"config.{name}", 1)
        check_static_int(cfg.learning_starts, "config.learning_starts", 0)
        if cfg.buffer_size % cfg.num_envs:
            raise ValueError(f"config.buffer_size ({cfg.buffer_size}) must be a multiple of config.num_envs "
                             f"({cfg.num_envs}): each environment step writes num_envs rows")
        if cfg.batch_size > cfg.buffer_size:
            raise ValueError(f"config.batch_size ({cfg.batch_size}) must be <= config.buffer_size "
                             f"({cfg.buffer_size})")
        if not all(isinstance(h, int | np.integer) and not isinstance(h, bool) and h >= 1
                   for h in cfg.hidden_sizes):
            raise ValueError(f"config.hidden_sizes must be ints >= 1, got {cfg.hidden_sizes!r}")
        check_value(cfg.init_alpha, "config.init_alpha", gt=0.0, static=True)
        check_value(cfg.reward_scaling, "config.reward_scaling", gt=0.0, static=True)
        for name in ("normalize_observations", "absorbing_bootstrap"):
            if not isinstance(getattr(cfg, name), bool):
                raise ValueError(f"config.{name} must be a bool, got {getattr(cfg, name)!r}")
        if cfg.absorbing_bootstrap and not isinstance(env, FixedHorizon):
            raise ValueError(f"config.absorbing_bootstrap needs a FixedHorizon environment, got "
                             f"{type(env).__name__}")
        skip = self._check_skip_obs(cfg.skip_obs, "SACConfig")
        hidden = tuple(int(h) for h in cfg.hidden_sizes)
        self.actor = SACActor(self.action_dim, hidden, cfg.activation, skip)
        self.critic = DoubleQ(hidden, cfg.activation, skip)
        self.tx = adam_with_learning_rate(self.hparams.learning_rate)
        self.target_entropy = -float(self.action_dim)

    # ---------------------------------------------------------------- construction
    def fingerprint(self) -> dict[str, Any]:
        """Every setting of this agent that changes results (JSON-ready; stored in the loop's checkpoints)."""
        fp = self._sampling_fingerprint()
        for f in ("num_envs", "buffer_size", "batch_size", "updates_per_step", "learning_starts", "hidden_sizes",
                  "activation", "init_alpha", "normalize_observations", "reward_scaling", "absorbing_bootstrap",
                  "skip_obs"):
            fp[f"sac/{f}"] = getattr(self.config, f)
        for f in ("learning_rate", "gamma", "tau"):
            fp[f"sac/{f}"] = np.asarray(jax.device_get(getattr(self.hparams, f))).tolist()
        return fp

    def trained_steps(self, state: SACState) -> Array:
        """``i32[]`` environment steps trained so far."""
        return state.steps

    def iterations_for(self, steps: Any) -> Array:
        """Vectorised environment steps ``ceil(steps / num_envs)`` that ``train`` runs for ``steps``."""
        e = self.config.num_envs
        return (jnp.asarray(steps, jnp.int32) + e - 1) // e

    # ---------------------------------------------------------------- init
    def init(self, key: Any) -> SACState:
        """A fresh agent: networks (the targets a copy of the critics), Adam states, an empty buffer, reset envs."""
        cfg = self.config
        k_actor, k_critic, k_env = jax.random.split(as_key(key), 3)
        obs0 = jnp.zeros(self.obs_shape, jnp.float32)
        a0 = jnp.zeros((self.action_dim,), jnp.float32)
        actor = self.actor.init(k_actor, obs0)
        critic = self.critic.init(k_critic, obs0, a0)
        log_alpha = jnp.asarray(np.log(cfg.init_alpha), jnp.float32)
        obs, env_state = jax.vmap(self.base_env.reset_env, in_axes=(0, None))(
            jax.random.split(k_env, cfg.num_envs), self.env_params)
        c = cfg.buffer_size
        replay = SACReplay(
            obs=jnp.zeros((c,) + self.obs_shape, jnp.float32), action=jnp.zeros((c, self.action_dim), jnp.float32),
            next_obs=jnp.zeros((c,) + self.obs_shape, jnp.float32), reward=jnp.zeros((c,), jnp.float32),
            absorbed=jnp.zeros((c,), bool), ptr=jnp.asarray(0, jnp.int32), size=jnp.asarray(0, jnp.int32))
        return SACState(
            actor=actor, critic=critic, target=critic, log_alpha=log_alpha, actor_opt=self.tx.init(actor),
            critic_opt=self.tx.init(critic), alpha_opt=self.tx.init(log_alpha), replay=replay, env_state=env_state,
            obs=jnp.asarray(obs, jnp.float32), steps=jnp.asarray(0, jnp.int32),
            episodes=jnp.asarray(0, jnp.int32),
            obs_norm=obs_norm_init(self.obs_shape) if cfg.normalize_observations else None)

    # ---------------------------------------------------------------- acting
    @staticmethod
    def _policy(state: SACState) -> tuple[Any, Any]:
        """What acting needs: ``(actor params, ObsNorm or None)``."""
        return state.actor, state.obs_norm

    def _act(self, policy, obs, key, deterministic=False):
        """The pre-tanh action ``u`` (``_env_action`` squashes and scales it)."""
        params, norm = policy
        mean, log_std = self.actor.apply(params, obs_norm_apply(norm, obs))
        if deterministic:
            return mean
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)

    def _scale(self, a: Array) -> Array:
        """Actions in ``[-1, 1]`` to the action space."""
        return self._low + (a + 1.0) * (0.5 * (self._high - self._low))

    # ---------------------------------------------------------------- training
    def _collect(self, st: SACState, key: Array) -> SACState:
        """One vectorised environment step; its ``E`` transitions go into the buffer."""
        cfg = self.config
        e = cfg.num_envs
        k_act, k_rand, k_env, k_reset = jax.random.split(key, 4)
        mean, log_std = self.actor.apply(st.actor, obs_norm_apply(st.obs_norm, st.obs))
        a, _ = squashed_sample(k_act, mean, log_std)
        warm = st.steps < cfg.learning_starts
        a = jnp.where(warm, jax.random.uniform(k_rand, a.shape, jnp.float32, -1.0, 1.0), a)
        obs2, env_state, r, done, info = jax.vmap(self.base_env.step_env, in_axes=(0, 0, 0, None))(
            jax.random.split(k_env, e), st.env_state, self._scale(a), self.env_params)
        obs2 = jnp.asarray(obs2, jnp.float32)
        done = jnp.asarray(done, bool)
        absorbed = (info["entered_absorbing"] & ~done) if cfg.absorbing_bootstrap else jnp.zeros((e,), bool)
        rb = st.replay
        put = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x.astype(buf.dtype), rb.ptr, 0)  # noqa: E731
        rb = SACReplay(obs=put(rb.obs, st.obs), action=put(rb.action, a), next_obs=put(rb.next_obs, obs2),
                       reward=put(rb.reward, jnp.asarray(r, jnp.float32)), absorbed=put(rb.absorbed, absorbed),
                       ptr=(rb.ptr + e) % cfg.buffer_size, size=jnp.minimum(rb.size + e, cfg.buffer_size))
        end = done | absorbed
        obs_re, state_re = jax.vmap(self.base_env.reset_env, in_axes=(0, None))(
            jax.random.split(k_reset, e), self.env_params)

        def pick(new, old):
            return jnp.where(jnp.reshape(end, end.shape + (1,) * (old.ndim - 1)), new, old)

        norm = st.obs_norm if st.obs_norm is None else obs_norm_update(st.obs_norm, obs2)
        return st.replace(replay=rb, env_state=jax.tree.map(pick, state_re, env_state),
                          obs=pick(jnp.asarray(obs_re, jnp.float32), obs2), steps=st.steps + e,
                          episodes=st.episodes + jnp.sum(end, dtype=jnp.int32), obs_norm=norm)

    def _rewards(self, reward_params: Any, batch: SACReplay) -> tuple[Array, Array]:
        """``(r f32[B], r_abs f32[B])``: the reward of each transition and of an absorbing step after it."""
        if self.reward_apply is None:
            return batch.reward, jnp.zeros_like(batch.reward)
        env_a = self._scale(batch.action)
        no = jnp.zeros(batch.reward.shape, bool)
        f = jax.vmap(self.reward_apply, in_axes=(None, 0, 0, 0, 0))
        r = jnp.asarray(f(reward_params, batch.obs, env_a, batch.next_obs, no), jnp.float32)
        if not self.config.absorbing_bootstrap:
            return r, jnp.zeros_like(r)
        r_abs = jnp.asarray(f(reward_params, batch.next_obs, env_a, batch.next_obs, no), jnp.float32)
        return r, r_abs

    def targets(self, st: SACState, key: Array, batch: SACReplay, reward_params: Any, hp: SACHParams) -> Array:
        """``f32[B]`` soft Q targets of a minibatch (rows of :class:`SACReplay`).

        ``c r + gamma (min_i Q'_i(s', a') - alpha log pi(a'|s'))`` with ``a' ~ pi(s')``,
        ``c`` the reward scaling and ``r`` relabelled with ``reward_params``; for a row
        that entered the absorbing state, ``c r + gamma c r_abs / (1 - gamma)``.
        """
        nxt = obs_norm_apply(st.obs_norm, batch.next_obs)
        r, r_abs = self._rewards(reward_params, batch)
        scale = jnp.float32(self.config.reward_scaling)
        mean2, log_std2 = self.actor.apply(st.actor, nxt)
        a2, logp2 = squashed_sample(key, mean2, log_std2)
        v_next = jnp.min(self.critic.apply(st.target, nxt, a2), axis=0) - jnp.exp(st.log_alpha) * logp2
        v_next = jnp.where(batch.absorbed, scale * r_abs / jnp.maximum(1.0 - hp.gamma, 1e-3), v_next)
        return jax.lax.stop_gradient(scale * r + hp.gamma * v_next)

    def _losses(self, st: SACState, key: Array, batch: SACReplay, reward_params: Any, hp: SACHParams):
        obs = obs_norm_apply(st.obs_norm, batch.obs)
        k_next, k_pi = jax.random.split(key)
        alpha = jnp.exp(st.log_alpha)
        y = self.targets(st, k_next, batch, reward_params, hp)

        def critic_loss(p):
            q = self.critic.apply(p, obs, batch.action)
            return 0.5 * jnp.sum(jnp.mean(jnp.square(q - y), axis=-1))

        def actor_loss(p, critic):
            mean, log_std = self.actor.apply(p, obs)
            a, logp = squashed_sample(k_pi, mean, log_std)
            q = jnp.min(self.critic.apply(critic, obs, a), axis=0)
            return jnp.mean(alpha * logp - q), logp

        return critic_loss, actor_loss

    def _gradient_step(self, st: SACState, key: Array, reward_params: Any, hp: SACHParams) -> SACState:
        """One gradient step of the critics, then the actor, the temperature and the targets."""
        k_idx, k_loss = jax.random.split(key)
        rb = st.replay
        idx = jax.random.randint(k_idx, (self.config.batch_size,), 0, jnp.maximum(rb.size, 1))
        batch = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), rb.replace(ptr=None, size=None))
        critic_loss, actor_loss = self._losses(st, k_loss, batch, reward_params, hp)
        lr = hp.learning_rate

        def adam(params, grads, opt):
            upd, opt = self.tx.update(grads, set_learning_rate(opt, lr), params)
            return optax.apply_updates(params, upd), opt

        critic, critic_opt = adam(st.critic, jax.grad(critic_loss)(st.critic), st.critic_opt)
        g_actor, logp = jax.grad(actor_loss, has_aux=True)(st.actor, critic)
        actor, actor_opt = adam(st.actor, g_actor, st.actor_opt)
        ent_gap = jax.lax.stop_gradient(jnp.mean(logp) + self.target_entropy)
        log_alpha, alpha_opt = adam(st.log_alpha, -ent_gap, st.alpha_opt)  # d/d log_alpha of -log_alpha * gap
        target = optax.incremental_update(critic, st.target, hp.tau)  # Polyak: tau * critic + (1 - tau) * target
        return st.replace(actor=actor, critic=critic, target=target, log_alpha=log_alpha, actor_opt=actor_opt,
                          critic_opt=critic_opt, alpha_opt=alpha_opt)

    def _iteration(self, st: SACState, key: Array, reward_params: Any, hp: SACHParams) -> SACState:
        cfg = self.config
        k_env, k_upd = jax.random.split(key)
        st = self._collect(st, k_env)
        ready = (st.replay.size >= cfg.batch_size) & (st.steps >= cfg.learning_starts)

        def updates(s):
            return jax.lax.fori_loop(0, cfg.updates_per_step,
                                     lambda i, s: self._gradient_step(s, jax.random.fold_in(k_upd, i),
                                                                      reward_params, hp), s)

        return jax.lax.cond(ready, updates, lambda s: s, st)

    def train(self, state: SACState, key: Any, steps: Any, reward_params: Any = None, *,
              hparams: SACHParams | None = None) -> SACState:
        """``ceil(steps / num_envs)`` environment steps, each followed by ``updates_per_step`` gradient steps.

        Args:
          state: from :meth:`init` or a previous ``train``.
          key: randomness (iteration ``i`` uses ``fold_in(key, i)``).
          steps: environment steps (int or traced ``i32[]``; never recompiles).
          reward_params: params of ``reward_apply``: every gradient step
            relabels its minibatch with them.
          hparams: :class:`SACHParams` (default the constructor's).

        Returns:
          The new :class:`SACState`.
        """
        key = as_key(key)
        hp = self.hparams if hparams is None else hparams
        if not isinstance(hp, SACHParams):
            raise ValueError(f"hparams must be a SACHParams, got {type(hp).__name__}")
        return jax.lax.fori_loop(
            0, self.iterations_for(steps),
            lambda i, s: self._iteration(s, jax.random.fold_in(key, i), reward_params, hp), state)

