"""The scheduler's configuration: static sizes and modes, sweepable array leaves, checks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import check_choice, check_static_int, check_value, concrete

Array = jax.Array

STRATEGIES = ("uniform", "easy_first", "competence_based", "competence_sqrt", "prioritized")
"""Curriculum strategies (the first three are atropos's)."""

PRIORITIES = ("frontier", "hard", "easy")
"""Scores ranked by ``prioritized``: ``-|ema - competence_threshold|``, ``-ema`` or ``ema``."""

# Capacity must leave room for the sentinel id ``N`` used to park skipped entries.
_MAX_CAPACITY = 2**31 - 2
_MIN_TEMPERATURE = 0.01  # atropos: ``max(0.01, temperature)``


@struct.dataclass
class CurriculumConfig:
    """Settings of a scheduler (build with :func:`config`).

    Static fields (changing them recompiles): ``strategy``, ``n_bins``,
    ``capacity``, ``priority``. Array leaves (new values never recompile and
    can be vmapped over): ``temperature``, ``ema_alpha``,
    ``competence_threshold``, ``competence_c0``, ``staleness_coeff`` (f32[])
    and ``rebin_interval`` (i32[]). The constructor (also through ``replace``)
    runs the checks of :func:`config` on concrete values; traced ones are
    checked under ``jaxweight.checked``.
    """

    temperature: Array
    ema_alpha: Array
    competence_threshold: Array
    competence_c0: Array
    staleness_coeff: Array
    rebin_interval: Array
    strategy: str = struct.field(pytree_node=False, default="uniform")
    n_bins: int = struct.field(pytree_node=False, default=5)
    capacity: int = struct.field(pytree_node=False, default=1)
    priority: str = struct.field(pytree_node=False, default="frontier")

    def __post_init__(self):
        # the checks of :func:`config`, also for a config built directly or by ``replace``;
        # traced leaves and jax's unflattening placeholders are skipped (see ``config``)
        _check_static(self.strategy, self.n_bins, self.capacity, self.priority)
        for name, kw in _LEAF_CHECKS.items():
            v = getattr(self, name)
            if isinstance(v, jax.Array | np.ndarray | np.generic | int | float) and concrete(v) is not None:
                check_value(v, name, **kw)


_LEAF_CHECKS = {
    "temperature": dict(gt=0.0),
    "ema_alpha": dict(ge=0.0, le=1.0),  # 0 (atropos accepts it): every EMA stays at its first score
    "competence_threshold": dict(ge=0.0, le=1.0),  # a success rate, like atropos's
    "rebin_interval": dict(ge=1, le=2**31 - 1, integer=True),
    "competence_c0": dict(gt=0.0, le=1.0),
    "staleness_coeff": dict(ge=0.0, le=1.0),
}


def _check_static(strategy: Any, n_bins: Any, capacity: Any, priority: Any) -> int:
    _check_strategy(strategy)
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer):
        raise ValueError(f"n_bins must be a static Python int, got {type(n_bins).__name__}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    capacity = check_static_int(capacity, "capacity", minimum=1)
    if capacity > _MAX_CAPACITY:
        raise ValueError(f"capacity must be <= {_MAX_CAPACITY}, got {capacity}")
    check_choice(priority, "priority", PRIORITIES)
    return capacity


def _check_strategy(strategy: Any) -> str:
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(
            f"Invalid curriculum strategy '{strategy}'. Must be one of: {list(STRATEGIES)}"
        )
    return strategy


def config(
    strategy: str = "uniform",
    n_bins: int = 5,
    *,
    capacity: int,
    temperature: float = 1.0,
    ema_alpha: float = 0.3,
    competence_threshold: float = 0.5,
    rebin_interval: int = 50,
    competence_c0: float = 0.01,
    staleness_coeff: float = 0.3,
    priority: str = "frontier",
) -> CurriculumConfig:
    """Build and validate a :class:`CurriculumConfig`.

    Args:
      strategy: one of :data:`STRATEGIES`.
      n_bins: number of difficulty bins (>= 1); bin 0 is the easiest.
      capacity: pool size N; item ids are ``0..N-1``.
      temperature: sampling temperature, finite and > 0. As in atropos, it
        is used as ``max(0.01, temperature)`` (stored that way, and clamped
        again at every use, so traced values obey it too).
      ema_alpha: EMA weight of a new score, in [0, 1]. 0 is atropos's meaning
        too: an item's EMA stays at its first score (its count still grows).
      competence_threshold: target EMA (a success rate) of ``priority="frontier"``,
        in [0, 1]; kept and saved for atropos compatibility (atropos never reads it).
      rebin_interval: integer >= 1; boundaries are recomputed when
        ``total_updates`` has grown by at least this much since the last
        rebin (atropos: 50).
      competence_c0: initial competence ``c(0)`` of ``competence_sqrt``, in (0, 1].
      staleness_coeff: weight of the staleness distribution of
        ``prioritized``, in [0, 1].
      priority: the score ``prioritized`` ranks by: one of :data:`PRIORITIES`.

    Returns:
      The config. Continuous values may also be jax arrays (e.g. traced under
      ``jax.vmap`` or ``jax.jit`` for a sweep); traced values are checked
      through ``checkify`` (``jaxweight.checked(jax.jit(...))`` raises the
      same ``ValueError`` as an eager call).

    Raises:
      ValueError: unknown strategy (same message as atropos), ``n_bins < 1``
        (``"n_bins must be >= 1, got 0"``), ``capacity < 1``, a temperature
        that is not finite and > 0, ``ema_alpha`` outside [0, 1],
        ``rebin_interval < 1`` or not an integer, ``competence_c0`` outside
        (0, 1], ``staleness_coeff`` outside [0, 1], ``competence_threshold``
        outside [0, 1] or an unknown ``priority``.

    Example::

        from jaxweight import curriculum as cur

        cfg = cur.config("easy_first", 5, capacity=10_000, temperature=0.5)
        assert cfg.n_bins == 5 and float(cfg.temperature) == 0.5
    """
    capacity = _check_static(strategy, n_bins, capacity, priority)
    values = dict(temperature=temperature, ema_alpha=ema_alpha, competence_threshold=competence_threshold,
                  rebin_interval=rebin_interval, competence_c0=competence_c0, staleness_coeff=staleness_coeff)
    for name, kw in _LEAF_CHECKS.items():  # concrete values here; traced ones through checkify
        check_value(values[name], name, **kw)

    def f32(v):
        return jnp.asarray(v, jnp.float32)

    return CurriculumConfig(
        temperature=jnp.maximum(f32(temperature), jnp.float32(_MIN_TEMPERATURE)),
        ema_alpha=f32(ema_alpha),
        competence_threshold=f32(competence_threshold),
        competence_c0=f32(competence_c0),
        staleness_coeff=f32(staleness_coeff),
        rebin_interval=jnp.asarray(rebin_interval, jnp.int32),
        strategy=strategy,
        n_bins=int(n_bins),
        capacity=capacity,
        priority=priority,
    )


def _temperature(cfg: CurriculumConfig) -> Array:
    """``max(0.01, T)`` at use (atropos's clamp); a NaN (never from :func:`config`) reads as 1."""
    t = jnp.asarray(cfg.temperature, jnp.float32)
    return jnp.where(jnp.isnan(t), jnp.float32(1.0), jnp.maximum(t, _MIN_TEMPERATURE))


def _alpha(cfg: CurriculumConfig) -> Array:
    """``ema_alpha`` clipped to [0, 1] at use; a NaN (never from :func:`config`) reads as 0."""
    a = jnp.asarray(cfg.ema_alpha, jnp.float32)
    return jnp.where(jnp.isnan(a), jnp.float32(0.0), jnp.clip(a, 0.0, 1.0))


def _check_state(state: Any, cfg: CurriculumConfig) -> None:
    """Refuse a state whose pool size or bin count is not the config's (static shapes)."""
    n = np.shape(state.ema)[-1] if np.ndim(state.ema) else None
    if n != cfg.capacity:
        raise ValueError(
            f"state capacity {n} (state.ema has shape {tuple(np.shape(state.ema))}) differs from "
            f"cfg.capacity={cfg.capacity}; build the state with init(cfg) of the same config"
        )
    k = np.shape(state.boundaries)[-1] if np.ndim(state.boundaries) else None
    if k != cfg.n_bins:
        raise ValueError(
            f"state has {k} bin boundaries (state.boundaries has shape "
            f"{tuple(np.shape(state.boundaries))}) but cfg.n_bins={cfg.n_bins}"
        )
