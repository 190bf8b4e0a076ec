"""Any gymnax environment as a fixed-horizon one with an absorbing terminal state (seals-style).

Preference learning needs episodes of one length: when episodes end early,
their length leaks the reward and fragments near the end are cut short
(imitation refuses variable horizons). seals fixes this per environment; here
:class:`FixedHorizon` does it for any gymnax ``Environment``, as seals'
``AbsorbAfterDoneWrapper`` (the one seals' MountainCar uses):

- every episode lasts exactly ``horizon`` steps; ``done`` is True at step
  ``horizon`` and never before;
- the step on which the inner environment terminates is returned as it is
  (its observation and reward); from then on the episode sits in an
  absorbing state: the observation repeats that terminal observation, the
  reward is ``0.0`` and the action has no effect. ``info["absorbing"]`` marks
  those steps.

The true reward stays the inner environment's ``step_env`` reward (0 while
absorbing): an agent's samples record it (:class:`~jaxweight.rl.rollout.Episodes` ``rews``;
the preference generators' ``Trajectories.rews``, which is all the synthetic teacher reads). A reward model sees the absorbing steps as
``obs == next_obs == terminal observation``.

Example::

    import gymnax, jax
    from jaxweight.rl.fixed_horizon import FixedHorizon
    env = FixedHorizon(gymnax.make("MountainCar-v0")[0], horizon=50)
    params = env.default_params                  # params.max_steps_in_episode == 50
    obs, state = env.reset(jax.random.key(0), params)
    obs, state, reward, done, info = env.step_env(jax.random.key(1), state, 2, params)
    assert not bool(done) and float(reward) == -1.0

References:
  seals (https://github.com/HumanCompatibleAI/seals), ``util.AbsorbAfterDoneWrapper``
  and ``classic_control.mountain_car``; Gleave et al. 2020 ("The seals benchmark suite").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

__all__ = ["FixedHorizon", "FixedHorizonParams", "FixedHorizonState", "default_horizon"]

Array = jax.Array

#: the inner environment's boolean step marks that ``step_env``'s info passes on (False while absorbing)
_MARKS = ("diverged",)

#: observation bounds at or above this are treated as unbounded by :attr:`FixedHorizon.obs_scale`
_UNBOUNDED = 1e6


@struct.dataclass
class FixedHorizonParams:
    """Env params of :class:`FixedHorizon`: the inner environment's params and the horizon.

    Attributes:
      env_params: params of the wrapped environment (their ``max_steps_in_episode``,
        when they have one, is the horizon too, so the inner environment never
        truncates before it).
      max_steps_in_episode: the horizon (every episode lasts exactly this many steps).
    """

    env_params: Any
    max_steps_in_episode: Any


@struct.dataclass
class FixedHorizonState:
    """State of :class:`FixedHorizon`.

    Attributes:
      env_state: the wrapped environment's state (frozen while absorbing).
      obs: the current observation (the terminal one while absorbing).
      time: ``i32[]`` steps taken in this episode.
      absorbing: ``bool[]`` the inner environment has terminated in this episode.
    """

    env_state: Any
    obs: Array
    time: Array
    absorbing: Array


def default_horizon(env: Any, params: Any = None) -> int | None:
    """The finite ``max_steps_in_episode`` of ``env``'s (default) params as an int, else ``None``.

    ``None`` when the params have no such field, or it is not a finite
    positive whole number (``inf``, ``None``, ``0``, ``2.5``, an array of several).
    """
    if params is None:
        try:
            params = env.default_params
        except Exception:  # noqa: BLE001 - a user env without usable default params has no horizon either
            return None
    value = getattr(params, "max_steps_in_episode", None)
    try:
        v = float(np.asarray(value, dtype=np.float64).reshape(()))
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v) or v < 1 or v != int(v):
        return None
    return int(v)


def _with_max_steps(params: Any, horizon: int) -> Any:
    """``params`` with ``max_steps_in_episode = horizon`` where they have that field (flax struct,
    dataclass or named tuple), else unchanged."""
    if not hasattr(params, "max_steps_in_episode"):
        return params
    if hasattr(params, "replace"):
        return params.replace(max_steps_in_episode=horizon)
    if dataclasses.is_dataclass(params):
        return dataclasses.replace(params, max_steps_in_episode=horizon)
    if hasattr(params, "_replace"):
        return params._replace(max_steps_in_episode=horizon)
    return params


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def _strong(x: Any) -> Array:
    """``x`` as an array of its own dtype, not weakly typed (a fixed scan-carry type)."""
    return x if _is_key(x) else jnp.asarray(x, jnp.asarray(x).dtype)


def _keep(absorbing: Array, new: Any, old: Array) -> Array:
    """``old`` while absorbing, else ``new`` with ``old``'s dtype and shape (fixed state types)."""
    if not _is_key(old):
        new = jnp.reshape(jnp.asarray(new, old.dtype), old.shape)
    return jax.lax.select(absorbing, old, new)


class FixedHorizon(environment.Environment):
    """A gymnax environment run for exactly ``horizon`` steps, absorbing after termination.

    Args:
      env: the wrapped gymnax ``Environment`` (uses its ``reset_env``,
        ``step_env``, ``action_space``, ``observation_space``, ``default_params``).
      horizon: episode length, an int >= 1; ``None`` takes the finite
        ``env.default_params.max_steps_in_episode``.
      env_id: an id that determines the environment (``"gymnax:Acrobot-v1"``, made
        without constructor arguments): wrappers with the same id and horizon
        are equal, so jitted programs are shared between them. ``None`` (a
        user's object): equal only when they wrap the same object.

    Steps (see the module docstring): ``step_env(key, state, action, params) ->
    (obs, state, reward f32[], done bool[], info)`` with ``done`` only at
    ``params.max_steps_in_episode`` and ``info = {"discount": f32[], "absorbing":
    bool[], "entered_absorbing": bool[]}`` (``absorbing``: this step was taken in
    the absorbing state; ``entered_absorbing``: the inner environment terminated on
    this step, so the next ones absorb; and the inner environment's own
    ``"diverged"`` mark where it has one: :class:`~jaxweight.rl.brax_envs.BraxEnv`);
    the inner state keeps the dtypes and shapes it had at reset.

    Raises:
      ValueError: ``horizon`` not an int >= 1, or ``None`` for an environment
        without a finite ``max_steps_in_episode``.
    """

    #: every episode lasts exactly ``horizon`` steps (read by the preference loop's horizon check)
    fixed_horizon = True

    def __init__(self, env: environment.Environment, horizon: int | None = None, *, env_id: str | None = None):
        super().__init__()
        for method in ("reset_env", "step_env", "action_space", "observation_space"):
            if not callable(getattr(env, method, None)):
                raise ValueError(f"env must have the gymnax Environment interface; {type(env).__name__} has no "
                                 f"{method}()")
        label = env_id or getattr(env, "name", type(env).__name__)
        if horizon is None:
            horizon = default_horizon(env)
            if horizon is None:
                value = getattr(getattr(env, "default_params", None), "max_steps_in_episode", None)
                raise ValueError(
                    f"horizon=None but {label} has no finite horizon (default_params.max_steps_in_episode = "
                    f"{value!r}); pass horizon=<an int >= 1>"
                )
        if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer) or horizon < 1:
            raise ValueError(f"horizon must be an int >= 1, got {horizon!r}")
        self.horizon = int(horizon)
        self.env_id = env_id
        self._inner = env
        self._label = label
        # the inner env must not truncate before the horizon (gymnax 0.0.x folds its
        # time limit into step_env's done); as seals, which builds envs without TimeLimit
        inner_params = _with_max_steps(env.default_params, self.horizon)
        self._inner_params = inner_params
        self.obs_shape = tuple(env.observation_space(inner_params).shape)

    @property
    def inner(self) -> environment.Environment:
        """The wrapped environment."""
        return self._inner

    def __eq__(self, other):
        return (type(other) is type(self) and other.horizon == self.horizon
                and other._identity() == self._identity())

    def __hash__(self):
        return hash((type(self).__name__, self.horizon, self._identity()))

    def _identity(self):
        return self._inner if self.env_id is None else self.env_id

    @property
    def default_params(self) -> FixedHorizonParams:
        return FixedHorizonParams(self._inner_params, self.horizon)

    def _params(self, params: FixedHorizonParams | None) -> Any:
        return self._inner_params if params is None else params.env_params

    def step_env(self, key, state: FixedHorizonState, action, params: FixedHorizonParams):
        obs, env_state, reward, terminated, inner = self._inner.step_env(key, state.env_state, action,
                                                                         params.env_params)
        absorbing = state.absorbing
        env_state = jax.tree.map(lambda new, old: _keep(absorbing, new, old), env_state, state.env_state)
        obs = _keep(absorbing, obs, state.obs)
        reward = jnp.where(absorbing, 0.0, jnp.reshape(jnp.asarray(reward, jnp.float32), ()))
        time = state.time + 1
        done = time >= params.max_steps_in_episode
        terminated = jnp.reshape(jnp.asarray(terminated), ()).astype(bool)
        marks = {k: jnp.asarray(inner[k], bool) & ~absorbing  # the inner step's marks, while it steps
                 for k in _MARKS if isinstance(inner, dict) and k in inner}
        info = {**marks, "discount": jnp.where(done, 0.0, 1.0).astype(jnp.float32), "absorbing": absorbing,
                "entered_absorbing": ~absorbing & terminated}
        return obs, FixedHorizonState(env_state, obs, time, absorbing | terminated), reward, done, info

    def reset_env(self, key, params: FixedHorizonParams):
        obs, env_state = self._inner.reset_env(key, params.env_params)
        return _strong(obs), FixedHorizonState(jax.tree.map(_strong, env_state), _strong(obs),
                                               jnp.asarray(0, jnp.int32), jnp.asarray(False))

    def get_obs(self, state: FixedHorizonState, params=None, key=None):
        return state.obs

    def is_terminal(self, state: FixedHorizonState, params: FixedHorizonParams):
        return state.time >= params.max_steps_in_episode

    def is_terminated(self, state: FixedHorizonState, params: FixedHorizonParams):  # gymnax >= 1.0 name
        return state.time >= params.max_steps_in_episode

    @property
    def name(self) -> str:
        return f"FixedHorizon({self._label}, {self.horizon})"

    @property
    def num_actions(self) -> int:
        return self._inner.num_actions

    def action_space(self, params: FixedHorizonParams | None = None):
        return self._inner.action_space(self._params(params))

    def observation_space(self, params: FixedHorizonParams | None = None):
        return self._inner.observation_space(self._params(params))

    @property
    def obs_scale(self) -> tuple:
        """Typical magnitude of each observation entry (nested tuples of ``obs_shape``), for
        :func:`~jaxweight.preference.env_rewards.reward_net`'s squashing: ``max(|low|, |high|)`` of
        the observation space where both bounds are finite, nonzero and below 1e6, else 1.

        Raises:
          ValueError: an observation space that is not a ``Box``.
        """
        space = self.observation_space()
        if not isinstance(space, spaces.Box):
            raise ValueError(f"obs_scale needs a Box observation space; {self._label} has "
                             f"{type(space).__name__}")
        shape = self.obs_shape
        low = np.broadcast_to(np.asarray(space.low, np.float64), shape)
        high = np.broadcast_to(np.asarray(space.high, np.float64), shape)
        with np.errstate(invalid="ignore", over="ignore"):
            scale = np.maximum(np.abs(low), np.abs(high))
        ok = np.isfinite(scale) & (scale > 0) & (scale < _UNBOUNDED)
        return _nested(np.where(ok, scale, 1.0))


def _nested(a: np.ndarray) -> Any:
    """``a`` as nested tuples of Python floats (hashable: a static module attribute)."""
    if a.ndim == 0:
        return float(a)
    return tuple(_nested(x) for x in a)
