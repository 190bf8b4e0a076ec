"""Exact quantile boundaries: MSD radix selection over float bit patterns, and binning.

atropos sorts the tracked EMAs to read ``n_bins`` order statistics. Here all of
them come out of the same few histogram passes over the pool (O(N) each, ties
and -0.0/+0.0 handled), tens of times faster than a full sort on a CPU; the
equal-spacing boundaries keep atropos's float32 rounding (no fused multiply-add).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array

_F32_MAX = float(np.finfo(np.float32).max)


def _desc_keys(x: Array) -> Array:
    """u32 keys whose ascending order is the descending order of the floats ``x``.

    -0.0 is folded onto +0.0 first, so equal floats get equal keys.
    """
    x = jnp.where(x == 0, jnp.float32(0.0), x)
    b = lax.bitcast_convert_type(x, jnp.uint32)
    asc = jnp.where((b >> 31) == 1, ~b, b | jnp.uint32(0x80000000))
    return ~asc


def _from_desc_keys(kd: Array) -> Array:
    asc = ~kd
    b = jnp.where((asc >> 31) == 1, asc & jnp.uint32(0x7FFFFFFF), ~asc)
    return lax.bitcast_convert_type(b, jnp.float32)


def _searchsorted(a: Array, v: Array, side: str) -> Array:
    # Few boundaries: comparing against all of them vectorises best; many: binary search.
    method = "compare_all" if a.shape[0] <= 16 else "scan"
    return jnp.searchsorted(a, v, side=side, method=method)


def _rank_in_histogram(hist: Array, rows: Array, rem: Array) -> tuple[Array, Array]:
    """For each target t: the bucket d of ``hist[rows[t]]`` holding rank ``rem[t]``
    (``cs[d-1] <= rem < cs[d]``) and the count below that bucket.

    Two levels (sqrt-sized blocks) instead of a prefix sum over all buckets,
    which XLA's CPU backend computes slowly for 65536 buckets.
    """
    nb = hist.shape[1]
    sub = 1 << ((nb.bit_length() - 1 + 1) // 2)
    h3 = hist.reshape(hist.shape[0], nb // sub, sub)
    blocks = jnp.sum(h3, axis=2)[rows]  # [K, nb/sub]
    bcs = jnp.cumsum(blocks, axis=1)
    bi = jnp.minimum(jnp.sum(bcs <= rem[:, None], axis=1), nb // sub - 1).astype(jnp.int32)
    below_b = jnp.take_along_axis(bcs - blocks, bi[:, None], axis=1)[:, 0]
    inner = h3[rows, bi]  # [K, sub]
    ics = jnp.cumsum(inner, axis=1)
    r2 = rem - below_b
    j = jnp.minimum(jnp.sum(ics <= r2[:, None], axis=1), sub - 1).astype(jnp.int32)
    below = below_b + jnp.take_along_axis(ics - inner, j[:, None], axis=1)[:, 0]
    return bi * sub + j, below


def _radix_widths(n: int, k: int) -> tuple[int, ...]:
    """Digit widths of the selection passes: two passes, unless there are many
    targets (one histogram row of 2^width buckets per target)."""
    return (16, 16) if k <= 32 else (11, 11, 10)


def _select_desc(keys: Array, valid: Array, ranks: Array, widths: tuple[int, ...] | None = None) -> Array:
    """Exact order statistics of ``keys`` (u32[N]) among ``valid`` ones.

    Returns the key of rank ``ranks[t]`` (0-based, ascending) for each target;
    ``ranks`` (i32[K]) must be non-decreasing. An MSD radix selection: each pass
    histograms one digit of the elements whose higher digits match a target's
    known prefix (one histogram row per distinct prefix), so every target is
    resolved in the same few passes over the data, O(N) each.
    """
    k = ranks.shape[0]
    widths = widths or _radix_widths(keys.shape[0], k)
    prefix = jnp.zeros((k,), jnp.uint32)
    rem = ranks.astype(jnp.int32)
    consumed = 0
    for w in widths:
        nb = 1 << w
        shift = 32 - consumed - w
        digit = ((keys >> shift) & jnp.uint32(nb - 1)).astype(jnp.int32)
        if consumed == 0:
            rows, idx = 1, jnp.where(valid, digit, nb)
            row_of_target = jnp.zeros((k,), jnp.int32)
        else:
            hi = keys >> (32 - consumed)
            # prefixes are sorted because the ranks are: the first target with an
            # equal prefix owns the histogram row of that prefix.
            slot = _searchsorted(prefix, hi, "left").astype(jnp.int32)
            match = valid & (prefix[jnp.minimum(slot, k - 1)] == hi)
            rows = k
            idx = jnp.where(match, slot * nb + digit, k * nb)
            row_of_target = _searchsorted(prefix, prefix, "left").astype(jnp.int32)
        hist = jnp.zeros((rows * nb,), jnp.int32).at[idx].add(1, mode="drop").reshape(rows, nb)
        d, below = _rank_in_histogram(hist, row_of_target, rem)
        rem = rem - below
        prefix = (prefix << w) | d.astype(jnp.uint32)
        consumed += w
    return prefix


def _add_rounded(prod: Array, addend: Array) -> Array:
    """``prod + addend`` with ``prod`` rounded to float32 first (no fused multiply-add).

    XLA contracts a multiply feeding an add into an FMA on CPU and GPU (even
    across ``optimization_barrier``); going through a scatter stores the
    product first, which keeps atropos's float32 rounding.
    """
    idx = jnp.arange(prod.shape[0])
    return jnp.zeros_like(prod).at[idx].set(prod).at[idx].add(addend)


def _compute_boundaries(ema: Array, count: Array, n_bins: int) -> tuple[Array, Array]:
    """atropos ``_recompute_bins`` over the tracked items: (f32[n_bins], bool[])."""
    tracked = count > 0
    n = jnp.sum(tracked, dtype=jnp.int32)
    # max / min over the (finite) tracked EMAs with float32's extremes as neutral
    # elements, and 0 with nothing tracked: no inf ever appears (jax_debug_infs)
    big = jnp.float32(_F32_MAX)
    mx = jnp.where(n > 0, jnp.max(jnp.where(tracked, ema, -big)), jnp.float32(0.0))
    mn = jnp.where(n > 0, jnp.min(jnp.where(tracked, ema, big)), jnp.float32(0.0))
    i = jnp.arange(n_bins, dtype=jnp.int32)
    # XLA turns a division by a constant into a multiplication by its
    # reciprocal (not exact); dividing by a value it cannot fold keeps the
    # IEEE quotient atropos computes.
    nbf = jnp.where(n >= 0, jnp.float32(n_bins), jnp.float32(1.0))
    # EMAs near the float32 limits (|x| ~ 3e38): max - min would overflow (exactly when
    # the halved difference, computed without rounding loss there, exceeds max/2); the
    # same spacing is then computed at half scale, and the direct one from zeros.
    over = 0.5 * mx - 0.5 * mn > jnp.float32(_F32_MAX / 2)
    mxd, mnd = jnp.where(over, 0.0, mx), jnp.where(over, 0.0, mn)
    step_ = (mxd - mnd) / nbf
    spaced = jnp.where(mxd == mnd, mnd, _add_rounded(-(i.astype(jnp.float32) * step_), mxd))
    half = 0.5 * mx - i.astype(jnp.float32) * (0.5 * mx / nbf - 0.5 * mn / nbf)
    spaced = jnp.where(over, jnp.clip(half, -1.7e38, 1.7e38) * 2.0, spaced)
    # floor(i * n / n_bins) without overflowing int32 for large pools
    q, r = n // n_bins, n % n_bins
    ranks = jnp.minimum(i * q + (i * r) // n_bins, jnp.maximum(n - 1, 0))
    sel = _select_desc(_desc_keys(ema), tracked, ranks)
    # with nothing tracked the selection is meaningless (possibly a NaN bit pattern): read 0.0
    quant = _from_desc_keys(jnp.where(n > 0, sel, _desc_keys(jnp.zeros((), jnp.float32))))
    b = jnp.where(n < n_bins, spaced, quant)
    b = jnp.where(n > 0, b, jnp.float32(0.0))
    return b.astype(jnp.float32), n > 0


def _bins_of(ema: Array, tracked: Array, b: Array, n_bins: int) -> Array:
    """First i with ``ema >= b_i`` (else the last bin); untracked -> middle bin."""
    # b is non-increasing, so #{i : b_i > ema} is the first i with ema >= b_i.
    gt = n_bins - _searchsorted(b[::-1], ema, "right").astype(jnp.int32)
    return jnp.where(tracked, jnp.minimum(gt, n_bins - 1), n_bins // 2).astype(jnp.int32)


