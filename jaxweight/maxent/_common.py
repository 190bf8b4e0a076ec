"""Shared pieces of jaxweight.maxent: argument checks and the floors of the formulas."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._util import check_choice, check_rank, check_same_shape

Array = jax.Array

SCALES = ("group", "batch", "none")
BASELINES = ("mean", "leave_one_out")

Q_FLOOR = 1e-12  # log(max(q, Q_FLOOR)) in the weight scores
W_FLOOR = 1e-12  # log(max(w, W_FLOOR)) in the entropy
T_FLOOR = 1e-8  # smallest tau used as a denominator
ZERO_STD = 1e-8  # population std at or below which a group counts as "zero std"
FMAX = float(np.finfo(np.float32).max)
# the masked-out value of a max or a log-domain entry: finite, so no array ever holds an inf
# placeholder (``jax_debug_infs``); exp(LOW) == 0 like exp(-inf), and a max over a row with a
# valid entry equals the max over its valid entries (every finite float is >= LOW)
LOW = -FMAX


def matrix(x: Any, name: str) -> Array:
    """``x`` as f32[P, G], refusing another rank (ValueError naming ``name``)."""
    check_rank(x, 2, name)
    return jnp.asarray(x, jnp.float32)


def mask_of(mask: Any, ref: Array, ref_name: str, name: str = "mask") -> Array:
    """bool[P, G] mask (all True for None) of the shape of ``ref``."""
    if mask is None:
        return jnp.ones(ref.shape, bool)
    check_rank(mask, 2, name)
    check_same_shape(ref, mask, ref_name, name)
    return jnp.asarray(mask, bool)


def other(x: Any, ref: Array, ref_name: str, name: str) -> Array:
    """A second f32[P, G] input that must match ``ref``'s shape."""
    check_rank(x, 2, name)
    check_same_shape(ref, x, ref_name, name)
    return jnp.asarray(x, jnp.float32)


def check_modes(scale: str, baseline: str, ddof: Any) -> int:
    """Validate the static advantage modes; return ``ddof`` as an int."""
    check_choice(scale, "scale", SCALES)
    check_choice(baseline, "baseline", BASELINES)
    if isinstance(ddof, bool) or not isinstance(ddof, int | np.integer) or ddof < 0:
        raise ValueError(f"ddof must be a static int >= 0, got {ddof!r}")
    return int(ddof)


def row_sum(x: Array) -> Array:
    return jnp.sum(x, axis=-1)


def row_sums(*xs: Array) -> tuple[Array, ...]:
    """Sums over the last axis of several same-shaped arrays, as one stacked reduction.

    On CPU every reduction is its own kernel; a handful of row (or scalar)
    statistics computed one by one would each cost a launch, stacked they
    cost one.
    """
    xs = [jnp.asarray(x, jnp.float32) for x in xs]
    if xs[0].ndim > 1:
        # [P, G] terms: a concatenation of large arrays is slower on CPU than separate reductions
        return tuple(jnp.sum(x, axis=-1) for x in xs)
    return tuple(jnp.sum(jnp.stack(xs), axis=-1))


def row_maxes(*xs: Array) -> tuple[Array, ...]:
    """Maxima over the last axis of several same-shaped arrays, as one stacked reduction.

    Callers mask with :data:`LOW`; an empty axis also gives ``LOW`` (never -inf).
    """
    xs = [jnp.asarray(x, jnp.float32) for x in xs]
    if xs[0].ndim > 1:
        return tuple(jnp.max(x, axis=-1, initial=LOW) for x in xs)
    return tuple(jnp.max(jnp.stack(xs), axis=-1, initial=LOW))


def row_counts(*flags: Array) -> tuple[Array, ...]:
    """Row counts (f32) of up to three bool[P, G] flag arrays in one reduction.

    For ``G <= 255`` the flags are packed in base 256 into one float32 sum:
    every partial sum is an integer below 2^24, so it is exact in any order.
    """
    g = flags[0].shape[-1]
    if g > 255 or len(flags) > 3:
        return tuple(jnp.sum(f, axis=-1, dtype=jnp.float32) for f in flags)
    packed = sum(jnp.where(f, float(256**k), 0.0) for k, f in enumerate(flags))
    tot = jnp.sum(packed, axis=-1)
    out = []
    for k in range(len(flags) - 1, -1, -1):
        c = jnp.floor(tot / float(256**k))
        tot = tot - c * float(256**k)
        out.append(c)
    return tuple(reversed(out))
