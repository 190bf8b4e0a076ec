"""Query schedules: how many comparisons to ask for in each round (imitation ``QUERY_SCHEDULES``).

Example::

    import numpy as np
    from jaxweight.preference import allocate_comparisons, oric
    assert allocate_comparisons(100, 5, 0.1, "hyperbolic") == [10, 25, 20, 17, 15, 13]
    assert oric(np.array([1.5, 1.5, 2.0])).sum() == 5      # optimal rounding keeps the sum

References:
  imitation ``PreferenceComparisons.train`` and ``util.oric``; optimal rounding
  under integer constraints: Cont & Heidari (2015), arXiv:1501.00014.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._util import check_value

Array = jax.Array

__all__ = ["QUERY_SCHEDULES", "get_schedule", "oric", "allocate_comparisons"]

QUERY_SCHEDULES: dict[str, Callable[[Any], Any]] = {
    "constant": lambda t: 1.0,
    "hyperbolic": lambda t: 1.0 / (1.0 + t),
    "inverse_quadratic": lambda t: 1.0 / (1.0 + t**2),
}
"""Unnormalised share of the comparisons at training progress ``t`` in [0, 1]."""


def get_schedule(schedule: str | Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A schedule name from :data:`QUERY_SCHEDULES` or a callable (returned as is).

    Raises:
      ValueError: "Unknown query schedule: {x}".
    """
    if callable(schedule):
        return schedule
    if isinstance(schedule, str) and schedule in QUERY_SCHEDULES:
        return QUERY_SCHEDULES[schedule]
    raise ValueError(f"Unknown query schedule: {schedule}")


def oric(x: Any) -> Any:
    """Round ``x`` to integers keeping the (integer) sum: floor, then add 1 to the
    ``round(sum(x - floor(x)))`` entries with the largest fractional parts
    (ties: lower index first).

    Works on NumPy input (float64, returns ``int64``) and on JAX input
    (jittable, returns ``i32``).

    Args:
      x: ``f[K]`` real numbers whose sum is (close to) an integer.

    Returns:
      ``int[K]`` with the same sum (up to the rounding of the total).
    """
    if isinstance(x, jax.Array) and not isinstance(x, np.ndarray):
        x = jnp.asarray(x, jnp.float32)
        if x.ndim != 1:
            raise ValueError(f"x must have rank 1, got shape {x.shape}")
        r = jnp.floor(x)
        short = x - r
        k = jnp.round(jnp.sum(short)).astype(jnp.int32)
        order = jnp.argsort(-short, stable=True)
        rank = jnp.zeros(x.shape, jnp.int32).at[order].set(jnp.arange(x.shape[0], dtype=jnp.int32))
        return (r + (rank < k)).astype(jnp.int32)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"x must have rank 1, got shape {x.shape}")
    r = np.floor(x)
    short = x - r
    k = int(np.round(short.sum()))
    order = np.argsort(-short, kind="stable")
    r[order[:k]] += 1
    return r.astype(np.int64)


def allocate_comparisons(
    total: int, num_iterations: int, initial_fraction: float = 0.1, schedule: str | Callable[[Any], Any] = "hyperbolic"
) -> list[int]:
    """Per-round comparison counts of ``PreferenceComparisons.train`` (host helper).

    ``init = int(total * initial_fraction)``; the rest is shared among the
    ``num_iterations`` rounds in proportion to ``schedule(linspace(0, 1, K))``
    and rounded with :func:`oric`.

    Args:
      total: total comparisons (int >= 0).
      num_iterations: ``K >= 1`` rounds after the initial one.
      initial_fraction: share asked for before the agent trains, in [0, 1].
      schedule: a :data:`QUERY_SCHEDULES` name or a callable of progress in [0, 1].

    Returns:
      ``K + 1`` ints: ``[initial, round_1, ..., round_K]`` summing to ``total``.

    Raises:
      ValueError: bad arguments; "Unknown query schedule: {x}".

    Example:
      >>> allocate_comparisons(100, 5, 0.1, "hyperbolic")
      [10, 25, 20, 17, 15, 13]
    """
    fn = get_schedule(schedule)
    if isinstance(total, bool) or not isinstance(total, int | np.integer) or total < 0:
        raise ValueError(f"total must be an int >= 0, got {total!r}")
    if isinstance(num_iterations, bool) or not isinstance(num_iterations, int | np.integer) or num_iterations < 1:
        raise ValueError(f"num_iterations must be an int >= 1, got {num_iterations!r}")
    check_value(initial_fraction, "initial_fraction", ge=0.0, le=1.0, static=True)
    init = int(total * initial_fraction)
    rest = int(total) - init
    unnormalized = np.asarray(np.vectorize(fn, otypes=[np.float64])(np.linspace(0, 1, int(num_iterations))))
    if not np.all(np.isfinite(unnormalized)) or np.any(unnormalized < 0) or unnormalized.sum() <= 0:
        raise ValueError(f"schedule must return finite non-negative values with a positive sum, got {unnormalized}")
    shares = oric(unnormalized / unnormalized.sum() * rest)
    return [init] + [int(s) for s in shares]
