"""Environment ids of the families behind :func:`~jaxweight.rl.envs.make_env`.

An id is ``"<family>:<name>"``: ``"gymnax:<id>"`` is any id of
``gymnax.registered_envs`` (``"gymnax:Acrobot-v1"``, ``"gymnax:MountainCar-v0"``,
``"gymnax:Pendulum-v1"``), made with ``gymnax.make`` and wrapped in
:class:`~jaxweight.rl.fixed_horizon.FixedHorizon`; ``"brax:<name>"`` is
any name of brax's registry (``"brax:inverted_pendulum"``, ``"brax:halfcheetah"``;
:mod:`~jaxweight.rl.brax_envs`: horizon 1000 by default, seals-style
observations with the current position), wrapped the same way. A user's own environment is an object with
the gymnax ``Environment`` interface (see ``make_env``), wrapped the same way.
The built-in ids (``"cartpole"``, ``"pendulum"``) are resolved by ``make_env``
itself. Each family names the package it needs and the extra that installs
it, so a missing one is one ``ImportError`` (``pip install 'jaxweight[brax]'``);
a new family is one entry of :data:`FAMILIES`.

Example::

    from jaxweight.rl.env_ids import make
    env, params = make("gymnax:Acrobot-v1", horizon=100)
    assert env.horizon == 100 and params.max_steps_in_episode == 100
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from .._install import install_hint
from .fixed_horizon import FixedHorizon

__all__ = ["Family", "FAMILIES", "make", "known_ids"]


@dataclasses.dataclass(frozen=True)
class Family:
    """One family of environment ids (``"<prefix>:<name>"``).

    Attributes:
      module: the package the family needs (checked before anything is imported).
      extra: the jaxweight extra that installs it (``pip install 'jaxweight[<extra>]'``).
      names: ``() -> list[str]`` the family's known names (for "did you mean").
      build: ``(name, horizon, kwargs) -> (env, env_params)`` a fixed-horizon
        environment; ``name`` is one of ``names()``, ``horizon`` an int >= 1 or
        ``None`` (the environment's own), ``kwargs`` the constructor arguments.
    """

    module: str
    extra: str
    names: Callable[[], list[str]]
    build: Callable[[str, int | None, dict], tuple[Any, Any]]


def _gymnax_names() -> list[str]:
    import gymnax

    return list(gymnax.registered_envs)


def _gymnax_build(name: str, horizon: int | None, kwargs: dict) -> tuple[Any, Any]:
    import gymnax

    try:
        inner, _ = gymnax.make(name, **kwargs)
    except TypeError as e:  # an argument the constructor does not take
        raise ValueError(f"gymnax:{name} does not take the arguments {sorted(kwargs)}: {e}") from None
    env = FixedHorizon(inner, horizon, env_id=None if kwargs else f"gymnax:{name}")
    return env, env.default_params


def _brax_names() -> list[str]:
    from .brax_envs import brax_names

    return brax_names()


def _brax_build(name: str, horizon: int | None, kwargs: dict) -> tuple[Any, Any]:
    from .brax_envs import make_brax

    env = FixedHorizon(make_brax(name, kwargs), horizon, env_id=None if kwargs else f"brax:{name}")
    return env, env.default_params


#: prefix -> :class:`Family` of the ids ``"<prefix>:<name>"``
FAMILIES: dict[str, Family] = {
    "gymnax": Family("gymnax", "rl", _gymnax_names, _gymnax_build),
    "brax": Family("brax", "brax", _brax_names, _brax_build),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def known_ids(builtins: Sequence[str] = ()) -> list[str]:
    """Every id ``make`` accepts now: ``builtins`` and the names of each installed family."""
    out = list(builtins)
    for prefix, fam in FAMILIES.items():
        if _installed(fam.module):
            out += [f"{prefix}:{n}" for n in fam.names()]
    return out


def _close(word: str, candidates: Sequence[str]) -> list[str]:
    """Up to 3 ``candidates`` close to ``word``, case-insensitively, with or without their prefix
    (``"acrobot"`` finds ``"gymnax:Acrobot-v1"``)."""
    w = word.lower()

    def score(c: str) -> float:
        return max(difflib.SequenceMatcher(None, w, form).ratio() for form in {c.lower(), c.lower().split(":")[-1]})

    scored = sorted(((score(c), i) for i, c in enumerate(candidates)), key=lambda t: (-t[0], t[1]))
    return [candidates[i] for s, i in scored[:3] if s >= 0.6]


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    close = _close(word, candidates)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def make(env: Any, *, horizon: int | None = None, builtins: Sequence[str] = (), **kwargs: Any) -> tuple[Any, Any]:
    """``(env, env_params)`` of a family id or a user's environment object, fixed-horizon.

    Args:
      env: ``"<family>:<name>"`` (a key of :data:`FAMILIES`) or an object with
        the gymnax ``Environment`` interface.
      horizon: episode length (int >= 1); ``None``: the environment's finite
        ``default_params.max_steps_in_episode``.
      builtins: the ids ``make_env`` resolves itself (listed in the unknown-id error).
      **kwargs: constructor arguments of the environment an id names.

    Returns:
      ``(env, env.default_params)``; ``env.fixed_horizon`` is True.

    Raises:
      ValueError: an unknown id (the message lists the close ones and the
        accepted forms); ``horizon`` not an int >= 1, or ``None`` for an
        environment without a finite horizon; ``kwargs`` with an object; an
        object without the gymnax interface; ``horizon`` different from the
        one of an object that is already fixed-horizon.
      ImportError: the family's package is missing (names the extra to install).
    """
    if isinstance(env, str):
        return _make_id(env, horizon, builtins, kwargs)
    if kwargs:
        raise ValueError(f"keyword arguments {sorted(kwargs)} go to the constructor of an environment id; "
                         f"got them with a {type(env).__name__} object")
    if not (callable(getattr(env, "step_env", None)) and callable(getattr(env, "reset_env", None))):
        raise ValueError(f"env must be an environment id ({', '.join(repr(b) for b in builtins)}, "
                         f"'gymnax:<id>', 'brax:<name>') or an object with the gymnax Environment interface, "
                         f"got {type(env).__name__}")
    if getattr(env, "fixed_horizon", False):  # already fixed-horizon (e.g. a built-in instance)
        own = getattr(env, "horizon", None)
        if horizon is not None and horizon != own:
            raise ValueError(f"horizon={horizon!r} but {type(env).__name__} already has the fixed horizon "
                             f"{own!r}; build it with the horizon you want")
        return env, env.default_params
    wrapped = FixedHorizon(env, horizon)
    return wrapped, wrapped.default_params


def _make_id(env_id: str, horizon: int | None, builtins: Sequence[str], kwargs: dict) -> tuple[Any, Any]:
    prefix, sep, name = env_id.partition(":")
    fam = FAMILIES.get(prefix) if sep else None
    if fam is None:
        forms = [repr(b) for b in builtins] + [f"'{p}:<name>'" for p in FAMILIES]
        raise ValueError(f"unknown environment {env_id!r}{_did_you_mean(env_id, known_ids(builtins))} "
                         f"(accepted: {', '.join(forms)}, or a gymnax Environment object)")
    if not _installed(fam.module):
        raise ImportError(f"{env_id!r} needs {fam.module}: {install_hint(fam.extra)}")
    names = fam.names()
    if names and name not in names:
        raise ValueError(f"unknown {prefix} environment {name!r} in {env_id!r}{_did_you_mean(name, names)} "
                         f"(known: {names})")
    return fam.build(name, horizon, kwargs)
