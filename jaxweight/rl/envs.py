"""Fixed-horizon environments, the one factory :func:`make_env` and the learned-reward wrapper.

Preference learning needs episodes of one fixed length (with early termination
all CartPole fragments tie and the length leaks the reward), as in seals:
:class:`FixedHorizonCartPole` (500 steps, reward 1 while upright and in bounds)
and :class:`FixedHorizonPendulum` (200 steps) are the gymnax counterparts.
:func:`make_env` is the one factory: a built-in id, ``"gymnax:<id>"`` (any
gymnax environment, absorbing after termination:
:mod:`~jaxweight.rl.fixed_horizon`), ``"brax:<name>"`` (any brax environment, same wrapping:
:mod:`~jaxweight.rl.brax_envs`) or
a user's gymnax ``Environment`` object (the protocol is in its docstring).
:class:`LearnedRewardEnv` replaces the reward with a reward function (e.g. a learned
model) whose params ride in the env params (:class:`LearnedRewardParams`), so a new reward model
never recompiles the agent; the true reward stays in ``info["true_reward"]``.

Example::

    import jax, jax.numpy as jnp
    from jaxweight.rl import LearnedRewardEnv, LearnedRewardParams, make_env
    env, env_params = make_env("cartpole")
    wrapped = LearnedRewardEnv(env, lambda p, o, a, o2, d: p["w"] @ o)
    params = LearnedRewardParams(env_params, {"w": jnp.ones(4)})
    key = jax.random.key(0)
    obs, state = wrapped.reset(key, params)
    obs, state, r_learned, *_, info = wrapped.step(key, state, 0, params)
    assert info["true_reward"] == 1.0      # the environment's own reward; the agent sees r_learned
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces
from gymnax.environments.classic_control import cartpole as _cartpole
from gymnax.environments.classic_control import pendulum as _pendulum

from .._util import concrete
from . import env_ids

__all__ = [
    "FixedHorizonCartPole",
    "FixedHorizonPendulum",
    "LearnedRewardEnv",
    "LearnedRewardParams",
    "LearnedRewardState",
    "RewardFn",
    "make_env",
    "oracle_reward",
    "ENVS",
    "env_step",
]

Array = jax.Array

#: ``reward_apply(reward_params, obs f32[D], action, next_obs f32[D], done bool[]) -> f32[]``
RewardFn = Callable[[Any, Array, Array, Array, Array], Array]

_F32_MAX = float(jnp.finfo(jnp.float32).max)


def _action_ok(space: Any, action: Any, xp: Any) -> Any:
    """bool[]: ``action`` belongs to ``space`` (Discrete: an integer in ``[0, n)``; Box: finite)."""
    a = xp.asarray(action)
    floating = xp.issubdtype(a.dtype, xp.floating)
    if isinstance(space, spaces.Discrete):
        ok = (a >= 0) & (a < int(space.n))
        if floating:
            ok = ok & (xp.floor(a) == a)
        return xp.all(ok)
    return xp.all(xp.isfinite(a)) if floating else xp.asarray(True)


def env_step(env: environment.Environment, key: Any, state: Any, action: Any, params: Any = None):
    """``env.step`` (auto-reset) as ``(obs, state, reward, done, info)`` for every supported gymnax.

    The one place that knows both gymnax step signatures: gymnax 0.0.x returns
    ``(obs, state, reward, done, info)``; gymnax 1.x returns
    ``(obs, state, reward, terminated, truncated, info)``, here folded to
    ``done = terminated | truncated`` (both kept in ``info``). Works on the
    batched call too (``jax.vmap(partial(env_step, env), ...)``).

    An action outside the action space (``7`` for ``Discrete(2)``, a NaN for a
    ``Box``) is refused when concrete; a traced one (under ``jit`` / ``vmap``)
    leaves the environment where it was: the state and observation are the old
    ones, the reward 0, ``done`` False and ``info["invalid_action"]`` True (False
    for every valid action, so a rollout can count them).

    Args:
      env: a gymnax environment.
      key, state, action, params: as ``env.step``.

    Returns:
      ``(obs, state, reward, done bool[], info dict)``.

    Raises:
      ValueError: a concrete action outside ``env.action_space(params)``.
    """
    space = env.action_space(params) if hasattr(env, "action_space") else None
    if not isinstance(space, spaces.Discrete | spaces.Box):  # no space to check against
        return _step(env, key, state, action, params, jnp.asarray(True))
    c = concrete(action)
    if c is not None:
        if not bool(_action_ok(space, c, np)):
            want = (f"an integer in [0, {int(space.n) - 1}]" if isinstance(space, spaces.Discrete)
                    else "finite")
            raise ValueError(f"action must be {want} for the action space {type(space).__name__} of "
                             f"{getattr(env, 'name', type(env).__name__)}, got {c.tolist()!r}")
        return _step(env, key, state, action, params, jnp.asarray(True))
    ok = _action_ok(space, action, jnp)
    a = jnp.asarray(action)
    safe = jnp.where(ok, a, jnp.zeros((), a.dtype))  # never step the env with a bad value
    obs, new_state, reward, done, info = _step(env, key, state, safe, params, ok)
    keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
    return (keep(obs, jnp.asarray(env.get_obs(state), jnp.asarray(obs).dtype)), jax.tree.map(keep, new_state, state),
            jnp.where(ok, reward, jnp.zeros((), jnp.asarray(reward).dtype)), ok & done, info)


def _step(env: environment.Environment, key: Any, state: Any, action: Any, params: Any, ok: Array):
    out = env.step(key, state, action, params)
    if len(out) == 6:  # gymnax >= 1.0
        obs, state, reward, terminated, truncated, info = out
        done = jnp.logical_or(terminated, truncated)
        info = {**info, "terminated": terminated & ok, "truncated": truncated & ok}
    elif len(out) == 5:  # gymnax 0.0.x
        obs, state, reward, done, info = out
    else:
        raise ValueError(f"{type(env).__name__}.step returned {len(out)} values; expected 5 (gymnax 0.0.x) or 6 (1.x)")
    return obs, state, reward, done, {**info, "invalid_action": ~ok}


class _FixedHorizonEnv(environment.Environment):
    """A gymnax environment run for exactly ``horizon`` steps, with an ``i32`` step counter.

    Subclasses set ``_inner`` (the gymnax environment), ``obs_shape``,
    ``obs_scale``, ``_title`` and implement :meth:`_step_reward` and the spaces;
    episodes end at ``params.max_steps_in_episode`` and never earlier.
    """

    #: every episode lasts exactly ``horizon`` steps (read by the preference loop's horizon check)
    fixed_horizon = True
    _title = "FixedHorizon"

    def __init__(self, inner: environment.Environment, obs_shape: tuple[int, ...], horizon: int):
        super().__init__()
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be an int >= 1, got {horizon!r}")
        self.horizon = horizon
        self.obs_shape = obs_shape
        self._inner = inner

    def __eq__(self, other):
        return type(other) is type(self) and other.horizon == self.horizon

    def __hash__(self):
        return hash((type(self).__name__, self.horizon))

    def _step_reward(self, key, state, action, params):
        """``(obs, new_state, reward f32[])`` of one step of the inner environment."""
        raise NotImplementedError

    def step_env(self, key, state, action, params):
        obs, new_state, reward = self._step_reward(key, state, action, params)
        new_state = new_state.replace(time=jnp.asarray(new_state.time, jnp.int32))
        done = new_state.time >= params.max_steps_in_episode
        info = {"discount": jnp.where(done, 0.0, 1.0).astype(jnp.float32)}
        return obs, new_state, jnp.asarray(reward, jnp.float32), done, info

    def reset_env(self, key, params):
        obs, state = self._inner.reset_env(key, params)
        return obs, state.replace(time=jnp.asarray(0, jnp.int32))

    def get_obs(self, state, params=None, key=None):
        return self._inner.get_obs(state)

    def is_terminal(self, state, params):
        return state.time >= params.max_steps_in_episode

    def is_terminated(self, state, params):  # gymnax >= 1.0 name of is_terminal
        return state.time >= params.max_steps_in_episode

    @property
    def name(self) -> str:
        return f"{self._title}-{self.horizon}"


class FixedHorizonCartPole(_FixedHorizonEnv):
    """CartPole-v1 (gymnax physics) with a fixed horizon and a 0/1 upright reward (seals-style).

    Observations ``f32[4]`` = (x, x_dot, theta, theta_dot), actions ``{0, 1}``
    (push left / right). Reward after a step: ``1.0`` if ``|x| <= x_threshold``
    and ``|theta| <= theta_threshold_radians`` in the new state, else ``0.0``.
    ``done`` is True exactly at step ``horizon`` (``params.max_steps_in_episode``),
    never earlier; after a fall the pole keeps swinging and the cart keeps moving.

    Args:
      horizon: episode length (default 500, as seals' CartPole-v0).

    For instance ``obs, state = FixedHorizonCartPole().reset(jax.random.key(0), env.default_params)``.
    """

    #: typical magnitude of each observation (x and theta: the failure thresholds)
    obs_scale = (2.4, 2.0, 12 * 2 * np.pi / 360, 2.0)
    _title = "FixedHorizonCartPole"

    def __init__(self, horizon: int = 500):
        super().__init__(_cartpole.CartPole(), (4,), horizon)

    @property
    def default_params(self) -> _cartpole.EnvParams:
        return _cartpole.EnvParams(max_steps_in_episode=self.horizon)

    def upright(self, state: _cartpole.EnvState, params: _cartpole.EnvParams) -> Array:
        """``bool[]``: pole within ``theta_threshold_radians`` and cart within ``x_threshold``."""
        return (jnp.abs(state.x) <= params.x_threshold) & (
            jnp.abs(state.theta) <= params.theta_threshold_radians
        )

    def transition_reward(self, params, obs, action, next_obs, done=None) -> Array:
        """The true reward of one transition from observations alone (``f32[]``).

        Lets the true reward go through :class:`LearnedRewardEnv` as if it were a
        perfectly learned model (an oracle for tests and baselines).
        """
        del obs, action, done
        up = (jnp.abs(next_obs[..., 0]) <= params.x_threshold) & (
            jnp.abs(next_obs[..., 2]) <= params.theta_threshold_radians
        )
        return up.astype(jnp.float32)

    def _step_reward(self, key, state, action, params):
        obs, new_state, _, _, _ = self._inner.step_env(key, state, action, params)
        return obs, new_state, self.upright(new_state, params).astype(jnp.float32)

    @property
    def num_actions(self) -> int:
        return 2

    def action_space(self, params=None) -> spaces.Discrete:
        return spaces.Discrete(2)

    def observation_space(self, params) -> spaces.Box:
        # Unbounded: nothing stops the cart or the pole after a fall.
        return spaces.Box(-_F32_MAX, _F32_MAX, (4,), jnp.float32)


class FixedHorizonPendulum(_FixedHorizonEnv):
    """Pendulum-v1 (gymnax) with a fixed horizon (200) and an ``i32`` step counter.

    Observations ``f32[3]`` = (cos theta, sin theta, theta_dot), actions
    ``f32[1]`` torque in [-2, 2], reward ``-(angle^2 + 0.1 thdot^2 + 0.001 u^2)``
    (gymnax / gym). Pendulum never terminates early, so only the horizon is set.

    Args:
      horizon: episode length (default 200, as Pendulum-v1).
    """

    obs_scale = (1.0, 1.0, 8.0)
    _title = "FixedHorizonPendulum"

    def __init__(self, horizon: int = 200):
        super().__init__(_pendulum.Pendulum(), (3,), horizon)

    @property
    def default_params(self) -> _pendulum.EnvParams:
        return _pendulum.EnvParams(max_steps_in_episode=self.horizon)

    def transition_reward(self, params, obs, action, next_obs=None, done=None) -> Array:
        """The true reward of one transition from ``obs`` and ``action`` (``f32[]``); see the CartPole one."""
        del next_obs, done
        theta = jnp.arctan2(obs[..., 1], obs[..., 0])
        u = jnp.clip(jnp.reshape(jnp.asarray(action, jnp.float32), (-1,))[0], -params.max_torque, params.max_torque)
        return -(theta**2 + 0.1 * obs[..., 2] ** 2 + 0.001 * u**2)

    def _step_reward(self, key, state, action, params):
        action = jnp.reshape(jnp.asarray(action, jnp.float32), (-1,))[0]
        obs, new_state, reward, _, _ = self._inner.step_env(key, state, action, params)
        return obs, new_state, reward

    @property
    def num_actions(self) -> int:
        return 1

    def action_space(self, params=None) -> spaces.Box:
        max_torque = 2.0 if params is None else params.max_torque
        return spaces.Box(-max_torque, max_torque, (1,), jnp.float32)

    def observation_space(self, params) -> spaces.Box:
        high = jnp.array([1.0, 1.0, params.max_speed], jnp.float32)
        return spaces.Box(-high, high, (3,), jnp.float32)


#: name -> constructor of the built-in fixed-horizon environments.
ENVS: dict[str, Callable[[], environment.Environment]] = {
    "cartpole": FixedHorizonCartPole,
    "pendulum": FixedHorizonPendulum,
}


def oracle_reward(env: environment.Environment, env_params: Any) -> RewardFn:
    """A ``reward_apply`` that ignores its params and returns ``env``'s true reward.

    Feeding it through :class:`LearnedRewardEnv` trains the agent exactly as a
    perfectly learned reward model would (the quality ceiling of the loop).
    """
    if not hasattr(env, "transition_reward"):
        raise ValueError(
            f"{type(env).__name__} has no transition_reward: its true reward comes from step_env only (the "
            "sampled trajectories record it); train on it with reward_apply=None, or use a built-in environment")

    def reward_apply(reward_params, obs, action, next_obs, done):
        del reward_params
        return env.transition_reward(env_params, obs, action, next_obs, done)

    return reward_apply


def make_env(env: str | environment.Environment, *, horizon: int | None = None,
             **kwargs) -> tuple[environment.Environment, Any]:
    """``(env, env_params)`` of a fixed-horizon environment named by id, or of a user's environment.

    Every environment it returns runs exactly ``params.max_steps_in_episode``
    steps per episode (``env.fixed_horizon`` is True), as preference learning
    needs (seals): early termination would leak the reward through the length.

    Args:
      env: an id or an environment object:

        - ``"cartpole"`` / ``"pendulum"``: :class:`FixedHorizonCartPole`
          (horizon 500) / :class:`FixedHorizonPendulum` (horizon 200);
        - ``"gymnax:<id>"``: any id of ``gymnax.registered_envs``
          (``"gymnax:Acrobot-v1"``, ``"gymnax:MountainCar-v0"``,
          ``"gymnax:MountainCarContinuous-v0"``...), wrapped in
          :class:`~jaxweight.rl.fixed_horizon.FixedHorizon`: after a
          termination the episode absorbs (terminal observation repeated,
          reward 0) until the horizon, as seals' ``AbsorbAfterDoneWrapper``;
        - ``"brax:<name>"``: any name of brax's registry (``"brax:inverted_pendulum"``,
          ``"brax:reacher"``, ``"brax:halfcheetah"``; needs ``pip install 'jaxweight[brax]'``),
          wrapped in ``FixedHorizon`` the same way (default horizon 1000; actions in
          ``[-1, 1]``; the current position kept in the observation where brax can drop
          it, as seals): :mod:`~jaxweight.rl.brax_envs`;
        - a user's environment: an object with the gymnax ``Environment``
          interface, wrapped in ``FixedHorizon`` the same way. It needs
          ``default_params`` (their ``max_steps_in_episode``, when finite, is
          the default horizon), ``reset_env(key, params) -> (obs, state)``,
          ``step_env(key, state, action, params) -> (obs, state, reward,
          terminated, info)`` without auto-reset, ``get_obs``,
          ``action_space(params)`` (``Discrete`` or ``Box``) and
          ``observation_space(params)`` (a ``Box``). The true reward is the
          ``reward`` of ``step_env``: the generator records it in the sampled
          trajectories, which is what the synthetic teacher compares. Give it
          ``transition_reward(params, obs, action, next_obs, done) -> f32[]``
          only to use :func:`oracle_reward`. An object that is already
          fixed-horizon (``fixed_horizon = True``) is returned as it is.
      horizon: episode length, an int >= 1; ``None``: the environment's own
        (500 / 200 for the built-ins; the finite
        ``default_params.max_steps_in_episode`` otherwise).
      **kwargs: constructor arguments of the environment an id names.

    Returns:
      ``(env, env.default_params)``.

    Raises:
      ValueError: an unknown id (with the close ones and the accepted forms),
        ``horizon`` not an int >= 1, ``horizon=None`` for an environment
        without a finite ``max_steps_in_episode``, ``kwargs`` with an object.
      ImportError: an id whose family's package is not installed (names the
        extra, e.g. ``pip install 'jaxweight[brax]'``).

    Example::

        import jax, jax.numpy as jnp
        from flax import struct
        from gymnax.environments import environment, spaces
        from jaxweight.rl.envs import make_env

        @struct.dataclass
        class State:
            x: jax.Array
            time: jax.Array

        @struct.dataclass
        class Params:
            max_steps_in_episode: int = 30

        class Walk(environment.Environment):  # +-0.25 on a line, reward -|x - 1|, the goal x >= 1 ends it
            @property
            def default_params(self):
                return Params()

            def reset_env(self, key, params):
                s = State(jnp.zeros(()), jnp.asarray(0, jnp.int32))
                return self.get_obs(s), s

            def step_env(self, key, s, action, params):
                s = State(s.x + jnp.where(action == 1, 0.25, -0.25), s.time + 1)
                return self.get_obs(s), s, -jnp.abs(s.x - 1.0), s.x >= 1.0, {}

            def get_obs(self, s, params=None, key=None):
                return s.x[None]

            def action_space(self, params=None):
                return spaces.Discrete(2)

            def observation_space(self, params):
                return spaces.Box(-10.0, 10.0, (1,), jnp.float32)

        env, params = make_env(Walk())                # horizon 30, from Params
        obs, s = env.reset(jax.random.key(0), params)
        for _ in range(6):                            # at the goal after 4 steps, then absorbing
            obs, s, r, done, info = env.step_env(jax.random.key(1), s, 1, params)
        assert float(obs[0]) == 1.0 and float(r) == 0.0 and bool(info["absorbing"]) and not bool(done)
        acrobot, p = make_env("gymnax:Acrobot-v1", horizon=100)
        assert acrobot.fixed_horizon and p.max_steps_in_episode == 100
    """
    if isinstance(env, str) and env in ENVS:
        built = ENVS[env](**kwargs) if horizon is None else ENVS[env](horizon=horizon, **kwargs)
        return built, built.default_params
    return env_ids.make(env, horizon=horizon, builtins=tuple(ENVS), **kwargs)


@struct.dataclass
class LearnedRewardParams:
    """Env params of :class:`LearnedRewardEnv`: the wrapped env's params plus the reward's.

    Attributes:
      env_params: params of the wrapped environment.
      reward_params: any pytree passed as the first argument of ``reward_apply``
        (e.g. ensemble params and an exploration bonus ``alpha``). They are
        traced values, so new reward params never recompile a jitted agent.
    """

    env_params: Any
    reward_params: Any

    @property
    def max_steps_in_episode(self):
        return self.env_params.max_steps_in_episode


@struct.dataclass
class LearnedRewardState:
    """State of :class:`LearnedRewardEnv`: the wrapped state and the current observation.

    The observation is kept because the reward takes ``(obs, action, next_obs, done)``
    and not every environment can rebuild ``obs`` from its state.
    """

    env_state: Any
    obs: Array
    time: Array


class LearnedRewardEnv(environment.Environment):
    """A gymnax environment whose reward is ``reward_apply(reward_params, obs, action, next_obs, done)``.

    ``step`` returns the learned reward; the wrapped environment's reward is in
    ``info["true_reward"]`` (use it for evaluation only; the agent never sees it).
    ``done`` and the auto-reset are the wrapped environment's.

    Args:
      env: the wrapped gymnax environment (its ``step_env``/``reset_env`` are used).
      reward_apply: a static callable
        ``(reward_params, obs f32[D], action, next_obs f32[D], done bool[]) -> f32[]``
        for a single transition; for an ensemble, typically
        ``mean + alpha * std`` of the members (see ``add_std``).

    New reward params (``params.replace(reward_params=new)``) reuse the same compiled agent.
    """

    def __init__(self, env: environment.Environment, reward_apply: RewardFn):
        super().__init__()
        if not callable(reward_apply):
            raise ValueError(f"reward_apply must be callable, got {type(reward_apply).__name__}")
        self.env = env
        self.reward_apply = reward_apply
        self.obs_shape = getattr(env, "obs_shape", None)
        self.fixed_horizon = bool(getattr(env, "fixed_horizon", False))

    def __eq__(self, other):
        return (
            type(other) is type(self)
            and other.env == self.env
            and other.reward_apply == self.reward_apply
        )

    def __hash__(self):
        return hash((type(self).__name__, self.env, self.reward_apply))

    def params(self, env_params: Any, reward_params: Any) -> LearnedRewardParams:
        """``LearnedRewardParams(env_params, reward_params)``."""
        return LearnedRewardParams(env_params, reward_params)

    @property
    def default_params(self):
        raise ValueError(
            "LearnedRewardEnv has no default params: build them with "
            "LearnedRewardParams(env_params, reward_params)"
        )

    def step_env(self, key, state: LearnedRewardState, action, params: LearnedRewardParams):
        next_obs, env_state, true_reward, done, info = self.env.step_env(
            key, state.env_state, action, params.env_params
        )
        reward = self.reward_apply(params.reward_params, state.obs, action, next_obs, done)
        reward = jnp.reshape(jnp.asarray(reward, jnp.float32), ())
        info = {**info, "true_reward": jnp.asarray(true_reward, jnp.float32)}
        new_state = LearnedRewardState(env_state, next_obs, state.time + 1)
        return next_obs, new_state, reward, done, info

    def reset_env(self, key, params: LearnedRewardParams):
        obs, env_state = self.env.reset_env(key, params.env_params)
        return obs, LearnedRewardState(env_state, obs, jnp.asarray(0, jnp.int32))

    def get_obs(self, state, params=None, key=None):
        return state.obs

    def is_terminal(self, state, params):
        return self.env.is_terminal(state.env_state, params.env_params)

    def is_terminated(self, state, params):  # gymnax >= 1.0 name of is_terminal
        return self.env.is_terminal(state.env_state, params.env_params)

    @property
    def name(self) -> str:
        return f"LearnedReward({self.env.name})"

    @property
    def num_actions(self) -> int:
        return self.env.num_actions

    def action_space(self, params=None):
        return self.env.action_space(None if params is None else params.env_params)

    def observation_space(self, params):
        return self.env.observation_space(params.env_params)
