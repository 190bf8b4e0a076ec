"""Group-relative advantages and reward moments (GRPO / Dr.GRPO / RLOO).

Moments are taken in units of a power-of-two scale ``s >= max |u|`` of each
row (the batch: of all rows), so squares never overflow: rewards up to the
float32 range (3e38) give finite advantages, and dividing by a power of two is
exact, so nothing changes where the plain formula would not have overflowed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._util import check_value
from ._common import (FMAX, LOW, T_FLOOR, ZERO_STD, Array, check_modes, mask_of, matrix, row_counts, row_maxes,
                      row_sum, row_sums)

__all__ = ["group_advantages", "reward_moments", "zero_truncated"]


class RowStats(NamedTuple):
    """Row statistics every reward quantity starts from.

    Attributes:
      valid: bool[P, G] masked in and finite.
      n: f32[P] valid entries per row.
      n_nonfinite: f32[P] masked-in entries that are NaN / inf.
      umax: f32[P] largest valid value (0 for an empty row).
      s: f32[P] power-of-two scale, ``|u| < 4 s`` for every valid ``u`` of the row.
      mean_x: f32[P] row mean in units of ``s``.
      c_x: f32[P, G] ``u / s - mean_x`` on valid entries, 0 elsewhere.
      ss_x: f32[P] ``sum c_x^2``.
      e, e_sum: f32[P, G] ``exp((u - umax) / T)`` on valid entries and its row
        sum, for the ``q`` of a temperature ``T`` (None when no ``T`` was given).
      n_excluded: f32[P] masked-in entries left out because ``ok`` was False
        (None without ``ok``).
    """

    valid: Array
    n: Array
    n_nonfinite: Array
    umax: Array
    s: Array
    mean_x: Array
    c_x: Array
    ss_x: Array
    e: Array | None = None
    e_sum: Array | None = None
    n_excluded: Array | None = None


def _pow2_scale(a: Array) -> tuple[Array, Array]:
    """``(s, 1/s)``: powers of two with ``a < 4 s`` (a >= 0), both normal floats."""
    _, e = jnp.frexp(a)  # a < 2^e
    # 2^126 keeps 1/s a normal float (CPUs flush subnormals); values are then < 4 s
    e = jnp.clip(e, -120, 126)
    one = jnp.float32(1.0)
    return jnp.ldexp(one, e), jnp.ldexp(one, -e)


def row_stats(u: Array, mask: Array, temperature: Array | None = None, ok: Array | None = None) -> RowStats:
    """:class:`RowStats` of ``u`` over ``mask & ok & isfinite(u)``.

    Passes over the data: counts; row max / min; sum (and, with a
    ``temperature``, the softmax sum of ``q``); squared deviations. ``ok``
    (bool[P, G]) marks entries whose other inputs are usable; masked-in
    entries that are not are counted in ``n_excluded``.
    """
    finite = jnp.isfinite(u)
    if ok is None:
        valid = mask & finite
        n, nf = row_counts(valid, mask & ~finite)
        n_excluded = None
    else:
        valid = mask & ok & finite
        n, nf, n_excluded = row_counts(valid, mask & ok & ~finite, mask & ~ok)
    hi, neg_lo = row_maxes(jnp.where(valid, u, LOW), jnp.where(valid, -u, LOW))
    has = n > 0
    umax = jax.lax.stop_gradient(jnp.where(has, hi, 0.0))
    amax = jax.lax.stop_gradient(jnp.where(has, jnp.maximum(hi, neg_lo), 0.0))  # max |u|
    s, inv = _pow2_scale(amax)
    # scaled first (exact), then shifted by the scaled row max: |x| < 8, and a constant
    # group has deviations that are exactly 0, not rounding noise of its mean
    top = umax * inv
    x = jnp.where(valid, u * inv[:, None] - top[:, None], 0.0)
    e = e_sum = None
    if temperature is None:
        (sum_x,) = row_sums(x)
    else:
        t = jnp.maximum(jnp.asarray(temperature, jnp.float32), T_FLOOR)
        # subtract the row max before dividing by T: (u - max) / T <= 0 never overflows upward
        # (u - max = -inf for -3e38 against 3e38 simply gives exp = 0)
        e = jnp.where(valid, jnp.exp(jnp.where(valid, u - umax[:, None], 0.0) / t), 0.0)
        sum_x, e_sum = row_sums(x, e)
    shifted_mean = sum_x / jnp.maximum(n, 1.0)
    c_x = jnp.where(valid, x - shifted_mean[:, None], 0.0)
    mean_x = top + shifted_mean
    return RowStats(valid=valid, n=n, n_nonfinite=nf, umax=umax, s=s, mean_x=mean_x, c_x=c_x,
                    ss_x=row_sum(c_x * c_x), e=e, e_sum=e_sum, n_excluded=n_excluded)


def _std(ss: Array, n: Array, ddof: int) -> Array:
    dof = n - ddof
    return jnp.where(dof > 0, jnp.sqrt(ss / jnp.maximum(dof, 1.0)), 0.0)


class BatchStats(NamedTuple):
    """Pooled moments of all valid entries, in units of a power of two ``S``."""

    N: Array  # f32[] valid entries
    S: Array  # f32[] scale
    r: Array  # f32[P] row scale / S
    mean: Array  # f32[] batch mean / S
    ss: Array  # f32[] sum of squared deviations / S^2


def batch_stats(rs: RowStats, extra_sums: tuple[Array, ...] = ()) -> tuple[BatchStats, tuple[Array, ...]]:
    """Combine row moments with the parallel-variance formula (no second pass over the data).

    ``extra_sums`` (f32[P] vectors) are summed in the same stacked reduction
    and returned.
    """
    has = rs.n > 0
    big = jnp.max(jnp.where(has, rs.s, 0.0), initial=0.0)
    S = jnp.where(big > 0, big, 1.0)
    r = jnp.where(has, rs.s / S, 0.0)
    mr = rs.mean_x * r
    N, total, *extra = row_sums(rs.n, rs.n * mr, *extra_sums)
    mean = total / jnp.maximum(N, 1.0)
    ss = jnp.sum(rs.ss_x * r * r + rs.n * jnp.square(mr - mean) * has)
    return BatchStats(N=N, S=S, r=r, mean=mean, ss=ss), tuple(extra)


def advantages_from(rs: RowStats, scale: str, eps: Array, ddof: int, baseline: str) -> Array:
    """Advantages from row statistics (the one formula behind every entry point)."""
    c = rs.c_x
    if baseline == "leave_one_out":
        c = c * jnp.where(rs.n > 1, rs.n / jnp.maximum(rs.n - 1.0, 1.0), 0.0)[:, None]
    if scale == "none":
        a = jnp.clip(c * rs.s[:, None], -FMAX, FMAX)
    elif scale == "group":
        # c / (std + eps) in units of s: c_x / (std_x + eps / s)
        den = _std(rs.ss_x, rs.n, ddof) + eps / rs.s
        a = c * jnp.where(den > 0, 1.0 / jnp.where(den > 0, den, 1.0), 0.0)[:, None]
    else:  # batch: centre per group, scale by the std of the whole batch (TRL)
        b, _ = batch_stats(rs)
        den = _std(b.ss, b.N, ddof) + eps / b.S
        inv = jnp.where(den > 0, 1.0 / jnp.where(den > 0, den, 1.0), 0.0)
        a = c * (b.r * inv)[:, None]
    # groups of size 1 (and empty rows) get 0 whatever the scale
    return jnp.where(rs.valid & (rs.n > 1)[:, None], a, 0.0)


def moments_from(b: BatchStats) -> tuple[Array, Array]:
    """``(mean, population std)`` of all valid entries (saturated at the float32 range)."""
    std = jnp.where(b.N > 1, jnp.sqrt(b.ss / jnp.maximum(b.N, 1.0)), 0.0)
    return b.mean * b.S, jnp.minimum(std * b.S, FMAX)


def zero_std_rows(rs: RowStats) -> Array:
    """bool[P]: non-empty rows whose population std is <= 1e-8."""
    pop = rs.s * jnp.sqrt(rs.ss_x / jnp.maximum(rs.n, 1.0))
    return (rs.n > 0) & (pop <= ZERO_STD)


def _inputs(utilities: Any, mask: Any) -> tuple[Array, Array]:
    u = matrix(utilities, "utilities")
    return u, mask_of(mask, u, "utilities")


def group_advantages(
    utilities: Any,
    mask: Any = None,
    *,
    scale: str = "group",
    eps: Any = 1e-4,
    ddof: int = 1,
    baseline: str = "mean",
) -> Array:
    """Group-relative advantages (GRPO / Dr.GRPO / RLOO, TRL / verl / OpenRLHF options).

    With ``b`` the mean of the valid utilities of the row and ``c = u - b``
    (``baseline="leave_one_out"``: ``c = n / (n - 1) * (u - b)``, the RLOO
    baseline):

    - ``scale="group"``: ``A = c / (std of the row + eps)`` (GRPO);
    - ``scale="batch"``: ``A = c / (std of all valid utilities + eps)``
      (TRL ``scale_rewards="batch"``);
    - ``scale="none"``: ``A = c`` (Dr.GRPO; saturated at the float32 range).

    ``std`` uses ``ddof`` (0 when ``n - ddof <= 0``). Groups of size 1 and empty
    rows give 0. Defaults match TRL (``eps=1e-4``, ``ddof=1``); verl uses
    ``eps=1e-6``, OpenRLHF's ``group_norm`` ``eps=1e-9``. Rewards up to the
    float32 range (3e38) give finite advantages.

    Args:
      utilities: f32[P, G] rewards.
      mask: bool[P, G] or None; invalid = masked out or non-finite.
      scale: ``"group"``, ``"batch"`` or ``"none"``.
      eps: f32[] >= 0 added to the std (may be traced).
      ddof: static int, delta degrees of freedom of the std.
      baseline: ``"mean"`` or ``"leave_one_out"``.

    Returns:
      f32[P, G] advantages, 0 on invalid entries.

    Raises:
      ValueError: unknown ``scale`` / ``baseline``, bad ``ddof``, ``eps`` < 0 or
        NaN, or ``utilities`` / ``mask`` of the wrong rank or shape.

    Example::

        import jax.numpy as jnp
        from jaxweight import maxent

        a = maxent.group_advantages(jnp.array([[1., 0., 0., 1.]]))   # [[0.866, -0.866, -0.866, 0.866]]
        assert abs(float(a[0, 0]) - 0.8659) < 1e-3
    """
    ddof = check_modes(scale, baseline, ddof)
    check_value(eps, "eps", ge=0.0)
    u, m = _inputs(utilities, mask)
    return advantages_from(row_stats(u, m), scale, jnp.asarray(eps, jnp.float32), ddof, baseline)


def reward_moments(utilities: Any, mask: Any = None) -> tuple[Array, Array]:
    """Mean and **population** std of all valid utilities.

    Args:
      utilities: f32[P, G].
      mask: bool[P, G] or None.

    Returns:
      ``(mean f32[], std f32[])``; ``n <= 1`` gives std 0, ``n = 0`` gives (0, 0).
    """
    u, m = _inputs(utilities, mask)
    return moments_from(batch_stats(row_stats(u, m))[0])


def zero_truncated(utilities: Any, truncated: Any) -> Array:
    """``where(truncated, 0, utilities)``: rewards of truncated completions set to 0.

    Args:
      utilities: f32[P, G].
      truncated: bool[P, G] (:func:`~jaxweight.maxent.truncation_flags` builds it on the host).
    """
    u = matrix(utilities, "utilities")
    t = mask_of(truncated, u, "utilities", "truncated")
    return jnp.where(t, 0.0, u)
