"""brax environments behind the gymnax ``Environment`` interface (the ``"brax:<name>"`` ids of ``make_env``).

``"brax:<name>"`` is any name of brax's registry (``brax.envs.get_environment``;
brax 0.14: ``ant``, ``halfcheetah``, ``hopper``, ``humanoid``,
``humanoidstandup``, ``inverted_double_pendulum``, ``inverted_pendulum``,
``pusher``, ``reacher``, ``swimmer``, ``walker2d``), built with brax's own
defaults (its default physics backend, ``"generalized"`` for these) and
wrapped in :class:`~jaxweight.rl.fixed_horizon.FixedHorizon`, as the
seals MuJoCo suite:

- every episode lasts exactly ``horizon`` steps (default 1000, the
  ``episode_length`` of brax's training and seals' MuJoCo horizon); when the
  brax environment says ``done`` (the pendulum tips over) the
  episode sits in an absorbing state until the horizon: the terminal
  observation repeats and the reward is 0;
- the environments whose constructor takes ``terminate_when_unhealthy``
  (hopper, walker2d, ant, humanoid) are built with ``False``, as seals'
  ``_no_early_termination``: a fallen body goes on, unpaid for being
  healthy, and never reaches an absorbing state (a fragment after a fall
  still says how the body moves; with ``True``, brax's default, most
  fragments of a falling agent are absorbing and tie). Pass
  ``terminate_when_unhealthy=True`` for brax's episodes;
- observations are brax's, except that the environments whose constructor
  takes ``exclude_current_positions_from_observation`` (halfcheetah, hopper,
  walker2d, ant, humanoid, swimmer...) keep the current x (and y) position in
  the observation (``False``, as seals does), so a reward model sees the
  forward progress the true reward pays for. Pass
  ``exclude_current_positions_from_observation=True`` to get brax's own.
  :attr:`BraxEnv.positions` says how many leading entries those are, so an
  agent can leave them out (``PPOConfig.skip_obs``; the demo does): a policy
  that sees an ever-growing position learns far slower (HalfCheetah on a
  GPU: ``bench/results/gpu-h200-2026-11-27-ppo-brax-halfcheetah-*.json``);
- actions are ``f32[action_size]`` in ``[-1, 1]`` (brax scales them to the
  actuators' ranges); the reward is brax's ``State.reward``;
- a step whose simulation diverges (a non-finite observation or reward, or an
  observation entry of magnitude :data:`DIVERGED` or more: brax's Ant blows up
  under some actions with ``terminate_when_unhealthy=False``) is contained: it
  keeps the last finite state and observation, pays 0 and terminates, so the
  episode absorbs in that finite state; ``info["diverged"]`` marks it, so that a
  rollout can count them. (MuJoCo's C engine resets a simulation whose
  accelerations blow up; brax's JAX pipelines cannot, and their NaNs would reach
  the returns, the reward model and the agent.)

Constructor arguments go through ``make_env("brax:hopper", backend="positional",
reset_noise_scale=0.01)``.

With brax installed (not run by the docstring tests, which run without the extra)::

    import jax, jax.numpy as jnp
    from jaxweight.rl.envs import make_env
    env, params = make_env("brax:inverted_pendulum", horizon=50)
    obs, s = env.reset_env(jax.random.key(0), params)            # obs f32[4]
    obs, s, r, done, info = env.step_env(jax.random.key(1), s, jnp.zeros(1), params)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from jaxweight.rl.fixed_horizon import _keep

__all__ = ["BraxEnv", "BraxParams", "brax_names", "make_brax", "DEFAULT_HORIZON", "DIVERGED"]

#: the horizon of a brax id without ``horizon=`` (brax's training ``episode_length``, seals' MuJoCo horizon)
DEFAULT_HORIZON = 1000

#: an observation entry at or above this magnitude (or a non-finite one, or a non-finite reward) is a diverged
#: simulation: far beyond any physical state of brax's tasks (positions in m, velocities in m/s or rad/s)
DIVERGED = 1e6

#: the constructor argument that drops the current position from the observation (seals keeps it)
_POSITIONS = "exclude_current_positions_from_observation"
#: the constructor argument that ends an episode when the body falls (seals sets it False: no early termination)
_TERMINATE = "terminate_when_unhealthy"


@struct.dataclass
class BraxParams:
    """Env params of :class:`BraxEnv`: only the horizon (brax keeps its settings in the env object)."""

    max_steps_in_episode: int = DEFAULT_HORIZON


@contextlib.contextmanager
def _quiet():
    """Hides the warnings of brax's own code, not of the caller's: the "not actively maintained"
    UserWarning (every model load), jaxopt's DeprecationWarning (on import) and mujoco 4's (MJX)
    "Accessing `x` directly from `Data` is deprecated" that brax 0.14 triggers while a step is traced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Brax System, piplines and environments", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"JAXopt is no longer maintained", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"Accessing `\w+` directly from `\w+` is deprecated",
                                category=DeprecationWarning)
        yield


def _brax_envs() -> Any:
    """``brax.envs`` (imported quietly)."""
    with _quiet():
        from brax import envs
    return envs


def brax_names() -> list[str]:
    """The names of brax's environment registry (sorted)."""
    return sorted(getattr(_brax_envs(), "_envs", {}))


class BraxEnv(environment.Environment):
    """A brax ``Env`` as a gymnax ``Environment`` (no auto-reset, no horizon: wrap it in ``FixedHorizon``).

    ``reset_env(key, params) -> (obs f32[O], brax State)``;
    ``step_env(key, state, action f32[A], params) -> (obs f32[O], State, reward f32[], terminated bool[], {})``
    (brax steps are deterministic: the key is unused). ``action_space`` is
    ``Box(-1, 1, (A,))``, ``observation_space`` an unbounded ``Box((O,))``.

    Args:
      env: a brax ``Env`` (``brax.envs.get_environment(name)``).
      name: its registry name (for messages).
      positions: how many leading observation entries are the current position
        that brax drops by default and this observation keeps (seals-style; 1
        for halfcheetah, hopper, walker2d: x; 2 for ant: x, y), else 0. An agent
        can leave them out (:attr:`PPOConfig.skip_obs
        <jaxweight.rl.ppo.PPOConfig.skip_obs>`) while a reward model sees them.
    """

    def __init__(self, env: Any, name: str, positions: int = 0):
        super().__init__()
        self.brax_env = env
        self.brax_name = name
        self.positions = int(positions)
        self.obs_size = _obs_size(env)
        with _quiet():
            self.action_size = int(env.action_size)

    @property
    def default_params(self) -> BraxParams:
        return BraxParams()

    def reset_env(self, key, params):
        with _quiet():
            state = self.brax_env.reset(key)
        return jnp.asarray(state.obs, jnp.float32), state

    def step_env(self, key, state, action, params):
        del key
        a = jnp.reshape(jnp.asarray(action, jnp.float32), (self.action_size,))
        # brax's envs update state.metrics in place (hopper's and walker2d's with a Python float when they end
        # episodes on a fall): step a copy, so that the caller's state stays as it was
        with _quiet():
            new = self.brax_env.step(state.replace(metrics=dict(state.metrics), info=dict(state.info)), a)
        obs = jnp.asarray(new.obs, jnp.float32)
        reward = jnp.reshape(jnp.asarray(new.reward, jnp.float32), ())
        # a diverged simulation (brax's Ant can blow up under some actions) is contained: the step keeps the
        # last finite state, pays 0 and terminates, so the wrapping FixedHorizon absorbs in a finite state
        ok = jnp.all(jnp.isfinite(obs)) & jnp.isfinite(reward) & (jnp.max(jnp.abs(obs)) < DIVERGED)
        new = jax.tree.map(lambda n, o: _keep(~ok, n, jnp.asarray(o)), new, state)
        terminated = (jnp.reshape(new.done, ()) > 0.5) | ~ok
        return jnp.asarray(new.obs, jnp.float32), new, jnp.where(ok, reward, 0.0), terminated, {"diverged": ~ok}

    def get_obs(self, state, params=None, key=None):
        return jnp.asarray(state.obs, jnp.float32)

    def is_terminal(self, state, params):
        return jnp.reshape(state.done, ()) > 0.5

    @property
    def name(self) -> str:
        return f"brax:{self.brax_name}"

    @property
    def num_actions(self) -> int:
        return self.action_size

    def action_space(self, params=None) -> spaces.Box:
        return spaces.Box(-1.0, 1.0, (self.action_size,), jnp.float32)

    def observation_space(self, params=None) -> spaces.Box:
        big = float(jnp.finfo(jnp.float32).max)
        return spaces.Box(-big, big, (self.obs_size,), jnp.float32)


def make_brax(name: str, kwargs: dict) -> BraxEnv:
    """The :class:`BraxEnv` of brax's ``name`` (seals-style observations; see the module docstring).

    Made once per name and arguments in a process (building a brax system takes seconds; the
    environment holds no state of its own, so callers share it).

    Raises:
      ValueError: constructor arguments the brax environment does not take.
    """
    try:
        key = (name, tuple(sorted(kwargs.items())))
        hash(key)
    except TypeError:  # an unhashable argument: made anew
        return _make_brax(name, kwargs)
    return _make_brax_once(key)


@functools.lru_cache(maxsize=32)
def _make_brax_once(key: tuple) -> BraxEnv:
    name, kwargs = key
    return _make_brax(name, dict(kwargs))


def _make_brax(name: str, kwargs: dict) -> BraxEnv:
    envs = _brax_envs()
    cls = envs._envs[name]
    kwargs = dict(kwargs)
    try:
        takes = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):  # no signature: leave brax's defaults
        takes = {}
    takes_positions = _POSITIONS in takes
    if takes_positions:
        kwargs.setdefault(_POSITIONS, False)
    if _TERMINATE in takes:
        kwargs.setdefault(_TERMINATE, False)
    try:
        with _quiet():
            env = envs.get_environment(name, **kwargs)
    except TypeError as e:
        raise ValueError(f"brax:{name} does not take the arguments {sorted(kwargs)}: {e}") from None
    positions = 0
    if takes_positions and not kwargs[_POSITIONS]:  # how many entries brax's own observation drops
        with _quiet():
            own = envs.get_environment(name, **{**kwargs, _POSITIONS: True})
        positions = _obs_size(env) - _obs_size(own)
    return BraxEnv(env, name, positions)


def _obs_size(env: Any) -> int:
    """The length of ``env``'s observation from the shapes of a traced reset. (brax's ``observation_size``
    runs a reset op by op: seconds per call on a CPU, three calls per environment made.)"""
    with _quiet():
        return int(jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs.shape[-1])
