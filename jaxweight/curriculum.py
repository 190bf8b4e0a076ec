"""On-device curriculum scheduler: the atropos ``CurriculumScheduler`` over a fixed pool.

Every item of a pool of ``N = cfg.capacity`` items (ids ``0..N-1``) keeps an
exponential moving average (EMA) of its rewards. Items are binned by quantile
of their EMA (bin 0 = easiest = highest reward) and a strategy picks which
bins to sample from as training progresses. This module keeps the atropos
semantics exactly for single updates and makes them fast and composable:

* ``update`` applies a whole batch of ``(id, score)`` pairs in array order in
  O(B) work, independent of the pool size (sort the batch by (id, position),
  fold runs of equal ids with a parallel scan of the affine EMA maps, one
  scatter). Pass the state with buffer donation (:data:`update_jit`,
  :data:`step_jit`) so the pool is updated in place.
* ``recompute_bins`` finds the exact quantile boundaries with a two-pass
  radix selection over the float bit patterns (all ``n_bins`` order
  statistics in the same passes; ties and -0.0/+0.0 handled), tens of times
  faster than a full sort of the pool on a CPU.
* ``sample_items`` draws ``num`` actual items: a bin by the strategy (only
  bins holding eligible items), then an item uniformly inside it, through a
  128-ary tree of per-block bin counts (one binning pass per call).
* Two curricula from the literature on the same state: ``competence_sqrt``
  (Platanios et al. 2019) and ``prioritized`` (Prioritized Level Replay,
  Jiang et al. 2021).
* ``state_dict`` / ``load_state_dict`` read and write the atropos JSON layout.

Example::

    from jaxweight import curriculum as cur

    cfg = cur.config("competence_sqrt", n_bins=5, capacity=100_000)
    state = cur.init(cfg)
    state = cur.update_jit(state, ids, rewards, cfg)          # i32[B], f32[B]; donates state
    batch = cur.sample_items(key, state, cfg, step, total_steps, num=256)

Out-of-range ids: entries with ``id < 0`` or ``id >= capacity`` (not masked
out) raise ``ValueError`` when the ids are concrete (eager calls with NumPy /
Python / concrete jax arrays, and a concrete mask if any), and are ignored
(skipped, never written anywhere) when the ids are traced (inside ``jit``,
``vmap``, ``scan``, and so in :data:`update_jit` / :data:`step_jit`).

Buffer donation: :data:`update_jit`, :data:`update_groups_jit` and
:data:`step_jit` are ``jax.jit`` of the functions with ``donate_argnums=0``:
the pool is updated in place (O(B) per update), and the state passed in must
not be used again. Inside your own jitted training step, donate the state the
same way (``jax.jit(train_step, donate_argnums=...)``). Calling
:func:`update` eagerly compiles and caches the same program but copies the
pool (no donation).

Sharded pools: the ``[N]`` leaves of the state may be sharded over a 1-D
device mesh (``shard_state(state, cfg, mesh)`` puts them there with a
``NamedSharding(mesh, P(axis))``; the scalars and boundaries stay
replicated; :func:`state_sharding` gives the shardings for ``in_shardings`` /
``out_shardings``). Every function here accepts such a state (eagerly or
under ``jax.jit``) and gives the same results as on one device; XLA's SPMD
partitioner inserts the collectives, and the pool stays sharded.

Many schedulers: every function is pure and vmappable, e.g. one pool per
environment (``jax.vmap(update, in_axes=(0, 0, 0, None))``) or a sweep over
the array leaves of the config. Under ``vmap`` the rebin ``cond`` becomes a
``select``, so the (cheap) selection then runs on every batch.

References:
  atropos ``atroposlib/envs/curriculum.py`` (NousResearch, PR #428 / #430).
  E. A. Platanios et al., "Competence-based Curriculum Learning for Neural
  Machine Translation", NAACL 2019, arXiv:1903.09848.
  M. Jiang, E. Grefenstette, T. Rocktaschel, "Prioritized Level Replay",
  ICML 2021, arXiv:2010.03934 (and jaxued's ``LevelSampler``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from ._util import as_key, atomic_write_json, check_rank, check_same_shape, check_static_int

Array = jax.Array

__all__ = [
    "STRATEGIES",
    "PRIORITIES",
    "CurriculumConfig",
    "CurriculumState",
    "config",
    "init",
    "update",
    "update_groups",
    "update_jit",
    "update_groups_jit",
    "step",
    "step_jit",
    "difficulty",
    "item_bin",
    "recompute_bins",
    "bin_boundaries",
    "bin_probabilities",
    "sample_bin",
    "sample_items",
    "metrics",
    "metrics_dict",
    "KeyIndex",
    "state_dict",
    "load_state_dict",
    "save_json",
    "load_json",
    "state_sharding",
    "shard_state",
]

STRATEGIES = ("uniform", "easy_first", "competence_based", "competence_sqrt", "prioritized")
"""Curriculum strategies (the first three are atropos's)."""

PRIORITIES = ("frontier", "hard", "easy")
"""Scores ranked by ``prioritized``: ``-|ema - competence_threshold|``, ``-ema`` or ``ema``."""

# Capacity must leave room for the sentinel id ``N`` used to park skipped entries.
_MAX_CAPACITY = 2**31 - 2
# Branching factor of the sampling tree: a draw touches 128 entries per level.
_BLOCK = 128


# ====================================================================== config
@struct.dataclass
class CurriculumConfig:
    """Settings of a scheduler (build with :func:`config`).

    Static fields (changing them recompiles): ``strategy``, ``n_bins``,
    ``capacity``, ``priority``. Array leaves (new values never recompile and
    can be vmapped over): ``temperature``, ``ema_alpha``,
    ``competence_threshold``, ``competence_c0``, ``staleness_coeff`` (f32[])
    and ``rebin_interval`` (i32[]).
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


def _concrete(x: Any) -> np.ndarray | None:
    """``x`` as a NumPy array when its value is known at trace time, else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x)
    except Exception:  # noqa: BLE001 - anything not convertible is treated as traced
        return None


def _check_strategy(strategy: Any) -> str:
    if strategy not in STRATEGIES:
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
      temperature: sampling temperature, stored as ``max(0.01, temperature)``
        (and clamped again at every use, so traced values obey it too).
      ema_alpha: EMA weight of a new score, clipped to [0, 1] (here and at use).
      competence_threshold: target EMA of ``priority="frontier"``; kept and
        saved for atropos compatibility (atropos never reads it).
      rebin_interval: boundaries are recomputed when ``total_updates`` has
        grown by at least this much since the last rebin (atropos: 50).
      competence_c0: initial competence ``c(0)`` of ``competence_sqrt``, in (0, 1].
      staleness_coeff: weight of the staleness distribution of
        ``prioritized``, in [0, 1].
      priority: the score ``prioritized`` ranks by: one of :data:`PRIORITIES`.

    Returns:
      The config. Continuous values may also be jax arrays (e.g. traced under
      ``jax.vmap`` for a sweep); value checks then apply only to concrete ones.

    Raises:
      ValueError: unknown strategy (same message as atropos), ``n_bins < 1``
        (``"n_bins must be >= 1, got 0"``), ``capacity < 1``,
        ``rebin_interval < 1``, ``competence_c0`` outside (0, 1],
        ``staleness_coeff`` outside [0, 1] or unknown ``priority``.

    Example::

        cfg = config("easy_first", 5, capacity=10_000, temperature=0.5)
    """
    _check_strategy(strategy)
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer):
        raise ValueError(f"n_bins must be a static Python int, got {type(n_bins).__name__}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    capacity = check_static_int(capacity, "capacity", minimum=1)
    if capacity > _MAX_CAPACITY:
        raise ValueError(f"capacity must be <= {_MAX_CAPACITY}, got {capacity}")
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {list(PRIORITIES)}, got {priority!r}")
    ri = _concrete(rebin_interval)
    if ri is not None:
        if ri.shape != () or not np.issubdtype(ri.dtype, np.integer):
            raise ValueError(f"rebin_interval must be an integer scalar, got {rebin_interval!r}")
        if int(ri) < 1:
            raise ValueError(f"rebin_interval must be >= 1, got {int(ri)}")
    c0 = _concrete(competence_c0)
    if c0 is not None and not np.all((c0 > 0) & (c0 <= 1)):
        raise ValueError(f"competence_c0 must be in (0, 1], got {competence_c0!r}")
    sc = _concrete(staleness_coeff)
    if sc is not None and not np.all((sc >= 0) & (sc <= 1)):
        raise ValueError(f"staleness_coeff must be in [0, 1], got {staleness_coeff!r}")
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    return CurriculumConfig(
        temperature=jnp.maximum(f32(temperature), jnp.float32(0.01)),
        ema_alpha=jnp.clip(f32(ema_alpha), 0.0, 1.0),
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
    return jnp.maximum(jnp.asarray(cfg.temperature, jnp.float32), 0.01)


def _alpha(cfg: CurriculumConfig) -> Array:
    return jnp.clip(jnp.asarray(cfg.ema_alpha, jnp.float32), 0.0, 1.0)


# ======================================================================= state
@struct.dataclass
class CurriculumState:
    """Per-item EMAs and bins of a pool of N items.

    Attributes:
      ema: f32[N] EMA of each item's scores (0 where untracked).
      count: i32[N] number of updates of each item; tracked iff ``count > 0``.
      last_update: i32[N] ``total_updates`` right after the item's last update.
      boundaries: f32[n_bins] stored bin boundaries (non-increasing).
      has_boundaries: bool[] whether ``boundaries`` holds a computed set.
      last_rebin_count: i32[] ``total_updates`` at the last rebin.
      total_updates: i32[] always ``sum(count)`` (kept as an O(1) counter).
    """

    ema: Array
    count: Array
    last_update: Array
    boundaries: Array
    has_boundaries: Array
    last_rebin_count: Array
    total_updates: Array


def init(cfg: CurriculumConfig) -> CurriculumState:
    """An empty scheduler state: nothing tracked, no boundaries.

    Args:
      cfg: the config (its ``capacity`` and ``n_bins`` set the shapes).

    Returns:
      ``CurriculumState`` with ``ema f32[N]``, ``count i32[N]``,
      ``last_update i32[N]``, ``boundaries f32[n_bins]`` and scalar leaves,
      all zero / False.

    Example::

        state = init(config(capacity=1000))
    """
    n, k = cfg.capacity, cfg.n_bins
    return CurriculumState(
        ema=jnp.zeros((n,), jnp.float32),
        count=jnp.zeros((n,), jnp.int32),
        last_update=jnp.zeros((n,), jnp.int32),
        boundaries=jnp.zeros((k,), jnp.float32),
        has_boundaries=jnp.asarray(False),
        last_rebin_count=jnp.asarray(0, jnp.int32),
        total_updates=jnp.asarray(0, jnp.int32),
    )


# ============================================================ exact selection
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
    mx = jnp.max(jnp.where(tracked, ema, -jnp.inf))
    mn = jnp.min(jnp.where(tracked, ema, jnp.inf))
    i = jnp.arange(n_bins, dtype=jnp.int32)
    # XLA turns a division by a constant into a multiplication by its
    # reciprocal (not exact); dividing by a value it cannot fold keeps the
    # IEEE quotient atropos computes.
    nbf = jnp.where(n >= 0, jnp.float32(n_bins), jnp.float32(1.0))
    step_ = (mx - mn) / nbf
    spaced = jnp.where(mx == mn, mn, _add_rounded(-(i.astype(jnp.float32) * step_), mx))
    # floor(i * n / n_bins) without overflowing int32 for large pools
    q, r = n // n_bins, n % n_bins
    ranks = jnp.minimum(i * q + (i * r) // n_bins, jnp.maximum(n - 1, 0))
    quant = _from_desc_keys(_select_desc(_desc_keys(ema), tracked, ranks))
    b = jnp.where(n < n_bins, spaced, quant)
    b = jnp.where(n > 0, b, jnp.float32(0.0))
    return b.astype(jnp.float32), n > 0


@jax.jit
def recompute_bins(state: CurriculumState, cfg: CurriculumConfig) -> CurriculumState:
    """Recompute and store the bin boundaries (atropos ``_recompute_bins``).

    With ``n`` tracked items and ``desc`` their EMAs in descending order:
    ``n == 0`` stores none (``has_boundaries = False``); ``n < n_bins`` uses
    equal spacing ``b_i = max - i*(max - min)/n_bins`` (all ``min`` if
    ``max == min``); otherwise ``b_i = desc[min(i*n // n_bins, n - 1)]``. The
    order statistics are exact (radix selection, no full sort). Does not
    change ``last_rebin_count`` (only :func:`update` does).

    Args:
      state: the scheduler state.
      cfg: its config.

    Returns:
      The state with new ``boundaries`` and ``has_boundaries``.

    Example::

        state = recompute_bins(state, cfg)   # reproduce atropos's lazy store
    """
    b, has = _compute_boundaries(state.ema, state.count, cfg.n_bins)
    return state.replace(boundaries=b, has_boundaries=has)


@jax.jit
def bin_boundaries(state: CurriculumState, cfg: CurriculumConfig) -> Array:
    """The boundaries binning uses now: f32[n_bins].

    The stored ones if ``has_boundaries``, else computed on the fly from the
    current EMAs (not stored; see :func:`recompute_bins`).
    """
    return lax.cond(
        state.has_boundaries,
        lambda: state.boundaries,
        lambda: _compute_boundaries(state.ema, state.count, cfg.n_bins)[0],
    )


def _bins_of(ema: Array, tracked: Array, b: Array, n_bins: int) -> Array:
    """First i with ``ema >= b_i`` (else the last bin); untracked -> middle bin."""
    # b is non-increasing, so #{i : b_i > ema} is the first i with ema >= b_i.
    gt = n_bins - _searchsorted(b[::-1], ema, "right").astype(jnp.int32)
    return jnp.where(tracked, jnp.minimum(gt, n_bins - 1), n_bins // 2).astype(jnp.int32)


# ====================================================================== update
def _check_ids(item_ids: Any, name: str) -> Array:
    ids = jnp.asarray(item_ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers, got dtype {ids.dtype}")
    return ids.astype(jnp.int32)


def _check_range(item_ids: Any, mask: Any, capacity: int, name: str) -> None:
    """Raise for out-of-range ids when they (and the mask) are concrete."""
    ids = _concrete(item_ids)
    if ids is None:
        return
    sel = np.ones(ids.shape, bool)
    if mask is not None:
        m = _concrete(mask)
        if m is None:
            return
        m = m.astype(bool)
        # a [P, G] mask: a row counts if any of its entries is masked in
        sel = np.any(m, axis=tuple(range(ids.ndim, m.ndim))) if m.ndim > ids.ndim else m
    bad = sel & ((ids < 0) | (ids >= capacity))
    if np.any(bad):
        pos = np.flatnonzero(bad)[:5].tolist()
        vals = ids.reshape(-1)[np.flatnonzero(bad)[:5]].tolist()
        raise ValueError(
            f"{name} must be in [0, capacity={capacity}); got {vals} at positions {pos} "
            "(mask them out, or trace the ids under jit to have them ignored)"
        )


def _sort_by_id(ids: Array, capacity: int) -> tuple[Array, Array]:
    """Stable sort of the batch by id: (sorted ids, their positions in the batch).

    Packing (id, position) into one integer key sorts several times faster on
    a CPU than a two-key sort; pools too large to pack use the two-key sort.
    """
    bsz = ids.shape[0]
    pos = jnp.arange(bsz, dtype=jnp.int32)
    if (capacity + 1) * bsz <= 2**31 - 1:
        key = lax.sort(ids * bsz + pos)
        return key // bsz, key % bsz
    if (capacity + 1) * bsz <= 2**32 - 1:
        key = lax.sort(ids.astype(jnp.uint32) * jnp.uint32(bsz) + pos.astype(jnp.uint32))
        return (key // bsz).astype(jnp.int32), (key % bsz).astype(jnp.int32)
    return lax.sort((ids, pos), num_keys=2)


def _affine_scan(m: Array, c: Array) -> tuple[Array, Array]:
    """Inclusive scan of the affine maps ``x -> m_j x + c_j`` (applied in order).

    Hillis-Steele doubling (log2(B) vector steps) is faster at the batch sizes
    of a training step; ``lax.associative_scan`` (O(B) work) for large batches.
    """
    d, n = 1, m.shape[0]
    if n > 2048:
        return lax.associative_scan(lambda a, b: (a[0] * b[0], b[0] * a[1] + b[1]), (m, c))
    while d < n:
        mp = jnp.concatenate([jnp.ones((d,), m.dtype), m[:-d]])
        cp = jnp.concatenate([jnp.zeros((d,), c.dtype), c[:-d]])
        m, c = mp * m, m * cp + c
        d *= 2
    return m, c


def _apply(state: CurriculumState, ids: Array, scores: Array, valid: Array,
           alpha: Array, capacity: int) -> CurriculumState:
    """Apply the valid entries in array order (see :func:`update`) without the rebin check.

    O(B): sort the batch by (id, position); a run of k equal ids maps the
    stored EMA x to ``(1 - a)^k x + C`` (C from one scan of the affine EMA maps,
    each run's first map having slope 0 so no segment flags are needed); one
    scatter writes each run's result (and count); ``last_update`` is a
    scatter-max (duplicates need no sort there).
    """
    bsz = ids.shape[0]
    if bsz == 0:
        return state
    drop = jnp.where(valid, ids, capacity)
    s_id, s_pos = _sort_by_id(drop, capacity)
    s_valid = s_id < capacity
    s_score = jnp.where(s_valid, scores[s_pos], 0.0)
    safe = jnp.where(s_valid, s_id, 0)
    first = jnp.concatenate([jnp.ones((1,), bool), s_id[1:] != s_id[:-1]])
    last = jnp.concatenate([s_id[1:] != s_id[:-1], jnp.ones((1,), bool)])
    old_count = state.count[safe]
    was_tracked = old_count > 0
    pos = jnp.arange(bsz, dtype=jnp.int32)
    run_len = pos - lax.cummax(jnp.where(first, pos, 0)) + 1  # at a run's last entry: its length k
    keep = 1.0 - alpha
    m = jnp.where(first, jnp.float32(0.0), keep)
    c = jnp.where(first & ~was_tracked, s_score, alpha * s_score)  # an untracked item starts at its score
    _, acc = _affine_scan(m, c)
    decay = jnp.where(run_len == 1, keep, keep ** run_len.astype(jnp.float32))
    tgt = jnp.where(last & s_valid, s_id, capacity)
    # ema = (1 - a)^k ema + C as two scatters: the product is stored, rounded,
    # before the sum, which a fused multiply-add (XLA contracts mul+add on CPU
    # and GPU) would skip; so single updates match atropos's float32
    # ``a*score + (1 - a)*ema`` bit for bit. Untracked items get 0 + C.
    ema = state.ema.at[tgt].set(jnp.where(was_tracked, decay * state.ema[safe], 0.0), mode="drop")
    # total_updates right after each valid entry, in array order
    after = state.total_updates + jnp.cumsum(valid.astype(jnp.int32))
    return state.replace(
        ema=ema.at[tgt].add(acc, mode="drop"),
        # written from the gathered counts: the scatter then depends on the gather
        # and XLA updates the donated buffer in place instead of copying it
        count=state.count.at[tgt].set(old_count + run_len, mode="drop"),
        last_update=state.last_update.at[drop].max(after, mode="drop"),
        total_updates=state.total_updates + jnp.sum(valid, dtype=jnp.int32),
    )


def _maybe_rebin(state: CurriculumState, cfg: CurriculumConfig) -> CurriculumState:
    due = state.total_updates - state.last_rebin_count >= jnp.asarray(cfg.rebin_interval, jnp.int32)
    # Only the small outputs go through the cond, so the pool is never copied.
    b, has = lax.cond(
        due,
        lambda: _compute_boundaries(state.ema, state.count, cfg.n_bins),
        lambda: (state.boundaries, state.has_boundaries),
    )
    return state.replace(
        boundaries=b, has_boundaries=has,
        last_rebin_count=jnp.where(due, state.total_updates, state.last_rebin_count),
    )


def update(state: CurriculumState, item_ids: Any, scores: Any, cfg: CurriculumConfig,
           mask: Any = None) -> CurriculumState:
    """Apply a batch of scores, each entry one atropos ``update(key, score)``.

    An entry is applied iff ``mask`` holds, its score is finite and
    ``0 <= id < N``; others are skipped and add no count. Applied entries go
    in array order (duplicate ids see the earlier entries' result)::

        untracked: ema = score;                   count = 1
        tracked:   ema = a*score + (1 - a)*ema;   count += 1
        total_updates += 1;  last_update[id] = total_updates

    Then, once after the batch, if ``total_updates - last_rebin_count >=
    rebin_interval`` the boundaries are recomputed and ``last_rebin_count =
    total_updates``. B = 1 is atropos exactly (in float32). Work is O(B) plus
    the rebin when due; use :data:`update_jit` (donates ``state``) so the pool
    is updated in place.

    Args:
      state: the scheduler state.
      item_ids: i32[B] item ids.
      scores: f32[B] rewards (higher = easier); not clipped.
      cfg: the config.
      mask: optional bool[B]; False entries are skipped.

    Returns:
      The new state.

    Raises:
      ValueError: wrong ranks/shapes, non-integer ids, or concrete
        out-of-range ids (traced ones are ignored instead).

    Example::

        state = update(state, jnp.array([3, 7, 3]), jnp.array([1.0, 0.0, 0.5]), cfg)
    """
    ids = _check_ids(item_ids, "item_ids")
    check_rank(ids, 1, "item_ids")
    scores = jnp.asarray(scores, jnp.float32)
    check_same_shape(ids, scores, "item_ids", "scores")
    if mask is not None:
        mask = jnp.asarray(mask, bool)
        check_same_shape(ids, mask, "item_ids", "mask")
    _check_range(item_ids, mask, cfg.capacity, "item_ids")
    return _update_core(state, ids, scores, cfg, mask)


@jax.jit
def _update_core(state, ids, scores, cfg, mask):
    # Jitted even when called eagerly: one compilation per shape instead of
    # dispatching the selection op by op.
    valid = jnp.isfinite(scores) & (ids >= 0) & (ids < cfg.capacity)
    if mask is not None:
        valid = valid & mask
    state = _apply(state, ids, scores, valid, _alpha(cfg), cfg.capacity)
    return _maybe_rebin(state, cfg)


def update_groups(state: CurriculumState, item_ids: Any, scores: Any, cfg: CurriculumConfig,
                  mask: Any = None) -> CurriculumState:
    """atropos ``update_batch``: each row is one update with the mean of its valid scores.

    Args:
      state: the scheduler state.
      item_ids: i32[P] one id per row (group).
      scores: f32[P, G] the group's rewards.
      cfg: the config.
      mask: optional bool[P, G] (valid entries) or bool[P] (valid rows).
        Non-finite scores are excluded from the mean; a row with no valid
        finite entry is skipped.

    Returns:
      The new state (rows applied in order, rebin check once after).

    Example::

        state = update_groups(state, jnp.array([5]), jnp.array([[1.0, 0.0, 0.0, 1.0]]), cfg)
        # ema[5] == 0.5, count[5] == 1
    """
    ids = _check_ids(item_ids, "item_ids")
    check_rank(ids, 1, "item_ids")
    scores = jnp.asarray(scores, jnp.float32)
    check_rank(scores, 2, "scores")
    if scores.shape[0] != ids.shape[0]:
        raise ValueError(f"scores must have shape ({ids.shape[0]}, G), got {scores.shape}")
    if mask is not None:
        mask = jnp.asarray(mask, bool)
        if mask.shape == ids.shape:
            mask = jnp.broadcast_to(mask[:, None], scores.shape)
        elif mask.shape != scores.shape:
            raise ValueError(f"mask must have shape {ids.shape} or {scores.shape}, got {mask.shape}")
    _check_range(item_ids, mask, cfg.capacity, "item_ids")
    return _update_groups_core(state, ids, scores, cfg, mask)


@jax.jit
def _update_groups_core(state, ids, scores, cfg, mask):
    ok = jnp.isfinite(scores)
    if mask is not None:
        ok = ok & mask
    n = jnp.sum(ok, axis=1, dtype=jnp.int32)
    total = jnp.sum(jnp.where(ok, scores, 0.0), axis=1)
    mean = total / jnp.maximum(n, 1).astype(jnp.float32)
    valid = (n > 0) & (ids >= 0) & (ids < cfg.capacity)
    state = _apply(state, ids, mean, valid, _alpha(cfg), cfg.capacity)
    return _maybe_rebin(state, cfg)


# ================================================================= per item
def difficulty(state: CurriculumState, item_ids: Any) -> tuple[Array, Array]:
    """Current EMA of items (atropos ``get_item_difficulty``).

    Args:
      state: the scheduler state.
      item_ids: i32[...] ids (out-of-range ids count as untracked).

    Returns:
      ``(ema f32[...], tracked bool[...])``; ``ema`` is NaN where not tracked.
    """
    return _difficulty_core(state, _check_ids(item_ids, "item_ids"))


@jax.jit
def _difficulty_core(state, ids):
    n = state.ema.shape[-1]
    inr = (ids >= 0) & (ids < n)
    safe = jnp.where(inr, ids, 0)
    tracked = inr & (state.count[safe] > 0)
    return jnp.where(tracked, state.ema[safe], jnp.nan), tracked


def item_bin(state: CurriculumState, item_ids: Any, cfg: CurriculumConfig) -> Array:
    """Difficulty bin of items (atropos ``get_item_bin``): i32[...], 0 = easiest.

    Untracked or out-of-range ids get ``n_bins // 2``. Boundaries are the
    stored ones if any, else computed on the fly (and not stored). The bin is
    the first i with ``ema >= b_i``, else ``n_bins - 1``.

    Example::

        bins = item_bin(state, jnp.arange(10), cfg)
    """
    return _item_bin_core(state, _check_ids(item_ids, "item_ids"), cfg)


@jax.jit
def _item_bin_core(state, ids, cfg):
    ema, tracked = _difficulty_core(state, ids)
    b = bin_boundaries(state, cfg)
    return _bins_of(jnp.where(tracked, ema, 0.0), tracked, b, cfg.n_bins)


# ========================================================== bin probabilities
def _progress(current_step: Any, total_steps: Any) -> Array:
    cs = jnp.asarray(current_step, jnp.float32)
    ts = jnp.maximum(jnp.asarray(total_steps, jnp.float32), 1.0)
    return jnp.clip(cs / ts, 0.0, 1.0)


def bin_probabilities(cfg: CurriculumConfig, current_step: Any, total_steps: Any,
                      tempered: bool = True) -> Array:
    """Sampling probabilities of the bins: f32[n_bins] (sums to 1).

    With ``p = clip(current_step / max(1, total_steps), 0, 1)`` and ``n = n_bins``:

    - ``uniform``: ``1/n`` (temperature ignored);
    - ``easy_first``: ``(1 - p) exp(-2i / max(1, n - 1)) + p/n``;
    - ``competence_based``: ``exp(-(i - p (n - 1))^2 / 2)``;
    - ``competence_sqrt``: ``clip(c n - i, 0, 1)`` with
      ``c = min(1, sqrt(step (1 - c0^2) / max(1, total) + c0^2))``;

    normalised, then if ``tempered`` and ``T != 1``,
    ``softmax(log(max(w, 1e-10)) / T)`` (atropos's ``sample_bin``). With
    ``T == 1`` this is atropos's ``_compute_bin_probabilities``.

    Args:
      cfg: the config (its strategy must not be ``prioritized``).
      current_step, total_steps: training progress; may be traced.
      tempered: apply the temperature.

    Raises:
      ValueError: for ``prioritized`` (its distribution depends on the pool;
        use :func:`sample_items`).

    References:
      atropos ``CurriculumScheduler``; Platanios et al. 2019 (arXiv:1903.09848).
    """
    if cfg.strategy == "prioritized":
        raise ValueError(
            "bin_probabilities is undefined for strategy 'prioritized' (its distribution "
            "depends on the pool); use sample_items"
        )
    return _bin_probabilities_core(cfg, jnp.asarray(current_step, jnp.float32),
                                   jnp.asarray(total_steps, jnp.float32), bool(tempered))


@partial(jax.jit, static_argnames=("tempered",))
def _bin_probabilities_core(cfg, current_step, total_steps, tempered):
    n = cfg.n_bins
    i = jnp.arange(n, dtype=jnp.float32)
    p = _progress(current_step, total_steps)
    if cfg.strategy == "uniform":
        return jnp.full((n,), 1.0 / n, jnp.float32)
    if cfg.strategy == "easy_first":
        w = (1.0 - p) * jnp.exp(-2.0 * i / max(1, n - 1)) + p / n
    elif cfg.strategy == "competence_based":
        w = jnp.exp(-0.5 * jnp.square(i - p * (n - 1)))
    else:  # competence_sqrt
        c0 = jnp.asarray(cfg.competence_c0, jnp.float32)
        t = jnp.maximum(jnp.asarray(current_step, jnp.float32), 0.0)
        tt = jnp.maximum(jnp.asarray(total_steps, jnp.float32), 1.0)
        c = jnp.minimum(1.0, jnp.sqrt(t * (1.0 - c0 * c0) / tt + c0 * c0))
        w = jnp.clip(c * n - i, 0.0, 1.0)
    w = w / jnp.sum(w)
    if tempered:
        temp = _temperature(cfg)
        tw = jax.nn.softmax(jnp.log(jnp.maximum(w, 1e-10)) / temp)
        w = jnp.where(temp == 1.0, w, tw)
    return w.astype(jnp.float32)


def sample_bin(key: Any, cfg: CurriculumConfig, current_step: Any, total_steps: Any,
               shape: Sequence[int] = ()) -> Array:
    """Draw target bins (atropos ``sample_bin``): i32[shape].

    ``uniform`` draws a uniform integer in ``[0, n_bins)``; the others draw
    from ``categorical(log bin_probabilities(...))``.

    Example::

        bins = sample_bin(0, cfg, step, 1000, shape=(64,))
    """
    key = as_key(key)
    shape = tuple(shape)
    if cfg.strategy == "uniform":
        return jax.random.randint(key, shape, 0, cfg.n_bins, dtype=jnp.int32)
    logp = jnp.log(bin_probabilities(cfg, current_step, total_steps))
    return jax.random.categorical(key, logp, shape=shape).astype(jnp.int32)


# ============================================================ item sampling
def _pad_rows(x: Array) -> Array:
    """Zero-pad the rows of a (small) tree level to a multiple of the block size."""
    pad = -x.shape[0] % _BLOCK
    return jnp.pad(x, [(0, pad), (0, 0)]) if pad else x


def _block_sums(w: Array) -> Array:
    """Sums of f32[N, C] over blocks of 128 rows: f32[ceil(N/128), C].

    The pool itself is never padded (a padded copy of a fused producer costs
    more than the whole reduction on a CPU); a partial last block is summed
    on its own.
    """
    n = w.shape[0]
    n0 = n - n % _BLOCK
    parts = []
    if n0:
        parts.append(w[:n0].reshape(n0 // _BLOCK, _BLOCK, w.shape[1]).sum(axis=1))
    if n0 < n:
        parts.append(w[n0:].sum(axis=0, keepdims=True))
    return jnp.concatenate(parts) if len(parts) > 1 else parts[0]


def _block_counts(bins: Array, n_bins: int) -> Array:
    """Per-block histogram of ``bins`` (i32[N], -1 = skip): f32[ceil(N/128), n_bins].

    A scatter-add: unlike a one-hot reduction its cost does not grow with n_bins.
    Counts are float32 for the sampling tree: exact up to 2^24 items per node.
    """
    n = bins.shape[0]
    nblk = -(-n // _BLOCK)
    blk = jnp.arange(n, dtype=jnp.int32) // _BLOCK
    idx = jnp.where(bins >= 0, blk * n_bins + bins, nblk * n_bins)
    hist = jnp.zeros((nblk * n_bins,), jnp.int32).at[idx].add(1, mode="drop")
    return hist.reshape(nblk, n_bins).astype(jnp.float32)


def _tree(level1: Array) -> list[Array]:
    """Block sums up to a root level of <= 128 nodes: list of f32[n_l, C] (rows padded)."""
    levels = [_pad_rows(level1)]
    while levels[-1].shape[0] > _BLOCK:
        x = levels[-1]
        levels.append(_pad_rows(x.reshape(-1, _BLOCK, x.shape[1]).sum(axis=1)))
    return levels


def _choose(w: Array, u: Array) -> Array:
    """Index k with probability ``w_k / sum(w)`` from a uniform ``u`` (inverse CDF)."""
    cs = jnp.cumsum(w)
    k = jnp.sum(cs <= u * cs[-1], dtype=jnp.int32)
    last = w.shape[0] - 1 - jnp.argmax(w[::-1] > 0).astype(jnp.int32)
    return jnp.minimum(k, last)


def _descend(levels: list[Array], leaf_weights, n: int, channel: Array, u: Array) -> Array:
    """One draw: child by child from the root, then a leaf (item) of the chosen block.

    Each level picks a child with a fresh uniform ``u[l]`` in proportion to its
    subtree weight, so the leaf comes out with probability ``w_leaf / total``.
    ``leaf_weights(ids, channel)`` gives the weights of in-range leaf ids.
    """
    offs = jnp.arange(_BLOCK, dtype=jnp.int32)
    root = levels[-1]
    root = jnp.pad(root, [(0, _BLOCK - root.shape[0]), (0, 0)])
    idx = _choose(root[:, channel], u[0])
    for j, lvl in enumerate(reversed(levels[:-1])):
        idx = idx * _BLOCK + _choose(lvl[idx * _BLOCK + offs, channel], u[j + 1])
    leaf = idx * _BLOCK + offs
    w = jnp.where(leaf < n, leaf_weights(jnp.minimum(leaf, n - 1), channel), 0.0)
    return idx * _BLOCK + _choose(w, u[len(levels)])


def _eligible(eligible: Any, n: int) -> Array:
    if eligible is None:
        return jnp.ones((n,), bool)
    e = jnp.asarray(eligible, bool)
    if e.shape != (n,):
        raise ValueError(f"eligible must have shape ({n},), got {e.shape}")
    return e


def _restrict(p: Array, nonempty: Array) -> Array:
    """Probabilities restricted to non-empty bins; if those carry none, mass to the nearest one."""
    n = p.shape[0]
    pr = jnp.where(nonempty, p, 0.0)
    tot = jnp.sum(pr)
    i = jnp.arange(n)
    dist = jnp.abs(i[:, None] - i[None, :]).astype(jnp.float32)
    dist = jnp.where(nonempty[None, :], dist, jnp.inf)
    nearest = jnp.argmin(dist, axis=1)  # ties go to the easier bin
    moved = jnp.zeros((n,), jnp.float32).at[nearest].add(p)
    return jnp.where(tot > 0, pr / jnp.where(tot > 0, tot, 1.0), moved / jnp.sum(moved))


def sample_items(key: Any, state: CurriculumState, cfg: CurriculumConfig, current_step: Any,
                 total_steps: Any, num: int, eligible: Any = None) -> Array:
    """Draw ``num`` item ids by the curriculum: i32[num] (with replacement).

    Bin strategies: each draw picks a bin from :func:`bin_probabilities`
    restricted to bins that hold at least one eligible item (renormalised; if
    those bins carry no probability, e.g. ``competence_sqrt`` early on with an
    empty easiest bin, each bin's mass moves to its nearest non-empty bin),
    then an item uniformly inside that bin. Untracked eligible items live in
    bin ``n_bins // 2`` (as in :func:`item_bin`), so with nothing tracked the
    draws are uniform over eligible items.

    ``prioritized`` (Prioritized Level Replay) over the tracked eligible
    items: ``score = -|ema - competence_threshold|`` (``priority="frontier"``;
    ``"hard"``: ``-ema``; ``"easy"``: ``ema``), ``rank`` = 1 + position in
    descending score (ties: lower id first), ``P_S ∝ rank^(-1/T)``,
    ``P_C ∝ total_updates - last_update`` (``P_S`` if all 0) and
    ``P = (1 - staleness_coeff) P_S + staleness_coeff P_C``. With no tracked
    eligible item the draws are uniform over eligible items; feeding unseen
    items is the caller's job (PLR's "new level" branch).

    Cost: one binning pass over the pool per call (``prioritized``: one
    ranking sort, O(N log N)), then O(log N) per draw.

    Args:
      key: PRNG key or int seed.
      state: the scheduler state.
      cfg: the config.
      current_step, total_steps: training progress (may be traced).
      num: number of draws (static).
      eligible: optional bool[N]: items that may be drawn (default all).

    Returns:
      i32[num] item ids; -1 where no item is eligible.

    Example::

        ids = sample_items(key, state, cfg, step, 10_000, num=256)

    References:
      Jiang et al. 2021 (arXiv:2010.03934); Platanios et al. 2019 (arXiv:1903.09848).
    """
    num = check_static_int(num, "num", minimum=0)
    key = as_key(key)
    elig = _eligible(eligible, cfg.capacity)
    return _sample_items_core(key, state, cfg, jnp.asarray(current_step, jnp.float32),
                              jnp.asarray(total_steps, jnp.float32), num, elig)


@partial(jax.jit, static_argnames=("num",))
def _sample_items_core(key, state, cfg, current_step, total_steps, num, elig):
    n = cfg.capacity
    if cfg.strategy == "prioritized":
        return _sample_prioritized(key, state, cfg, num, elig)
    nb = cfg.n_bins
    b = bin_boundaries(state, cfg)
    bins = _bins_of(state.ema, state.count > 0, b, nb)
    bins = jnp.where(elig, bins, -1)
    levels = _tree(_block_counts(bins, nb))
    counts = jnp.sum(levels[-1], axis=0)
    p = _restrict(_bin_probabilities_core(cfg, current_step, total_steps, True), counts > 0)
    # One draw of uniforms for everything (the bin by inverse CDF, then one per
    # tree level): every separate PRNG call adds noticeably to the compile time.
    u = jax.random.uniform(key, (num, len(levels) + 2), jnp.float32)
    chosen = jax.vmap(_choose, in_axes=(None, 0))(p, u[:, 0])

    def leaf_w(leaf, c):
        return (bins[leaf] == c).astype(jnp.float32)

    items = jax.vmap(lambda c, uu: _descend(levels, leaf_w, n, c, uu))(chosen, u[:, 1:])
    return jnp.where(jnp.sum(counts) > 0, items, -1).astype(jnp.int32)


def _priority_key(ema: Array, cfg: CurriculumConfig) -> Array:
    """``-score`` of ``prioritized`` (ascending = descending score)."""
    if cfg.priority == "frontier":
        return jnp.abs(ema - jnp.asarray(cfg.competence_threshold, jnp.float32))
    if cfg.priority == "hard":
        return ema
    return -ema


def _sample_prioritized(key, state, cfg, num, elig):
    n = cfg.capacity
    cand = elig & (state.count > 0)
    n_cand = jnp.sum(cand, dtype=jnp.int32)
    sk = jnp.where(cand, _priority_key(state.ema, cfg), jnp.inf)
    sk = jnp.where(sk == 0, jnp.float32(0.0), sk)  # -0.0 and +0.0 tie (lower id first)
    _, order = lax.sort((sk, jnp.arange(n, dtype=jnp.int32)), num_keys=2)
    r = jnp.arange(n, dtype=jnp.float32)
    rank_w = jnp.where(r < n_cand, jnp.exp(-jnp.log1p(r) / _temperature(cfg)), 0.0)
    stale = jnp.where(cand, (state.total_updates - state.last_update).astype(jnp.float32), 0.0)
    stale = jnp.maximum(stale, 0.0)
    # channels: 0 = rank distribution (indexed by rank), 1 = staleness (by id), 2 = eligible
    leaves = jnp.stack([rank_w, stale, elig.astype(jnp.float32)], axis=1)
    levels = _tree(_block_sums(leaves))
    use_stale = jnp.sum(levels[-1][:, 1]) > 0
    coeff = jnp.clip(jnp.asarray(cfg.staleness_coeff, jnp.float32), 0.0, 1.0)
    u = jax.random.uniform(key, (num, len(levels) + 2), jnp.float32)  # one PRNG call (see above)
    pick_stale = (u[:, 0] < coeff) & use_stale
    channel = jnp.where(n_cand > 0, jnp.where(pick_stale, 1, 0), 2).astype(jnp.int32)
    u = u[:, 1:]

    def leaf_w(leaf, c):
        return leaves[leaf, c]

    pos = jax.vmap(lambda c, uu: _descend(levels, leaf_w, n, c, uu))(channel, u)
    items = jnp.where(channel == 0, order[jnp.minimum(pos, n - 1)], pos)
    return jnp.where(jnp.any(elig), items, -1).astype(jnp.int32)


# ================================================================= step helper
def step(state: CurriculumState, key: Any, item_ids: Any, scores: Any, cfg: CurriculumConfig,
         current_step: Any, total_steps: Any, num: int, eligible: Any = None,
         mask: Any = None) -> tuple[CurriculumState, Array]:
    """One training-loop step: :func:`update` with the last batch's scores, then
    :func:`sample_items` for the next batch.

    Returns:
      ``(state, ids i32[num])``. Use :data:`step_jit` to donate ``state``.
    """
    state = update(state, item_ids, scores, cfg, mask)
    return state, sample_items(key, state, cfg, current_step, total_steps, num, eligible)


update_jit = jax.jit(update, donate_argnums=0)
"""``jax.jit(update, donate_argnums=0)``: updates the pool in place (O(B) per call).

The state passed in is consumed: use only the returned one. Ids are traced
here, so out-of-range ids are ignored rather than raised.
"""

update_groups_jit = jax.jit(update_groups, donate_argnums=0)
"""``jax.jit(update_groups, donate_argnums=0)`` (see :data:`update_jit`)."""

step_jit = jax.jit(step, static_argnames=("num",), donate_argnums=0)
"""``jax.jit(step, static_argnames="num", donate_argnums=0)``: update + sample in place."""


# ===================================================================== metrics
@jax.jit
def metrics(state: CurriculumState, cfg: CurriculumConfig) -> dict[str, Array]:
    """Jittable statistics of the scheduler.

    Returns:
      ``items_tracked`` i32[], ``mean_difficulty`` / ``min_difficulty`` /
      ``max_difficulty`` f32[] over tracked EMAs (NaN with nothing tracked),
      ``total_updates`` i32[], ``bin_<i>_count`` i32[] (tracked items per
      *stored* bin; 0 without stored boundaries) and ``has_boundaries`` bool[].
    """
    tracked = state.count > 0
    n = jnp.sum(tracked, dtype=jnp.int32)
    any_ = n > 0
    mean = jnp.sum(jnp.where(tracked, state.ema, 0.0)) / jnp.maximum(n, 1).astype(jnp.float32)
    out = {
        "items_tracked": n,
        "mean_difficulty": jnp.where(any_, mean, jnp.nan),
        "min_difficulty": jnp.where(any_, jnp.min(jnp.where(tracked, state.ema, jnp.inf)), jnp.nan),
        "max_difficulty": jnp.where(any_, jnp.max(jnp.where(tracked, state.ema, -jnp.inf)), jnp.nan),
        "total_updates": state.total_updates,
    }
    bins = _bins_of(state.ema, tracked, state.boundaries, cfg.n_bins)
    counts = jnp.zeros((cfg.n_bins,), jnp.int32).at[bins].add(
        (tracked & state.has_boundaries).astype(jnp.int32))
    for i in range(cfg.n_bins):
        out[f"bin_{i}_count"] = counts[i]
    out["has_boundaries"] = state.has_boundaries
    return out


def metrics_dict(state: CurriculumState, cfg: CurriculumConfig) -> dict[str, float]:
    """Host-side metrics with atropos's keys (for ``wandb.log``).

    With nothing tracked: ``{"curriculum/items_tracked": 0,
    "curriculum/strategy": 0}`` (ints). Otherwise floats:
    ``curriculum/items_tracked``, ``curriculum/{mean,min,max}_difficulty``,
    ``curriculum/total_updates`` and, only with stored boundaries,
    ``curriculum/bin_{i}_count``.
    """
    m = jax.device_get(metrics(state, cfg))
    if int(m["items_tracked"]) == 0:
        return {"curriculum/items_tracked": 0, "curriculum/strategy": 0}
    out = {
        "curriculum/items_tracked": float(m["items_tracked"]),
        "curriculum/mean_difficulty": float(m["mean_difficulty"]),
        "curriculum/min_difficulty": float(m["min_difficulty"]),
        "curriculum/max_difficulty": float(m["max_difficulty"]),
        "curriculum/total_updates": float(m["total_updates"]),
    }
    if bool(m["has_boundaries"]):
        for i in range(cfg.n_bins):
            out[f"curriculum/bin_{i}_count"] = float(m[f"bin_{i}_count"])
    return out


# ================================================================ string keys
class KeyIndex:
    """Host map between string item keys and pool ids, in first-seen order.

    Example::

        keys = KeyIndex(capacity=1000)
        ids = keys.ids(["q17", "q3", "q17"])      # array([0, 1, 0], dtype=int32)
        keys.ids(["new"], add=False)              # array([-1], dtype=int32)
        keys.key(1)                               # 'q3'
    """

    def __init__(self, capacity: int, keys: Iterable[str] = ()):
        self.capacity = check_static_int(capacity, "capacity", minimum=1)
        self._ids: dict[str, int] = {}
        self._keys: list[str] = []
        keys = list(keys)
        if keys:
            self.ids(keys, add=True)

    def ids(self, keys: str | Sequence[Any], add: bool = True) -> np.ndarray:
        """Ids of ``keys`` (a str or a nested sequence of str): np.int32 of the same shape.

        Unknown keys are added (``add=True``) or give -1.

        Raises:
          ValueError: a key is not a str, or adding would exceed the capacity
            (``"KeyIndex is full (capacity N)"``; nothing is added then).
        """
        arr = np.asarray(keys, dtype=object)
        flat = arr.reshape(-1).tolist()
        for k in flat:
            if not isinstance(k, str):
                raise ValueError(f"keys must be str, got {type(k).__name__} {k!r}")
        if add:
            new = list(dict.fromkeys(k for k in flat if k not in self._ids))
            if len(self._keys) + len(new) > self.capacity:
                raise ValueError(f"KeyIndex is full (capacity {self.capacity})")
            for k in new:
                self._ids[k] = len(self._keys)
                self._keys.append(k)
        out = np.fromiter((self._ids.get(k, -1) for k in flat), dtype=np.int32, count=len(flat))
        return out.reshape(arr.shape)

    def key(self, item_id: int) -> str:
        """The key of an id (``IndexError`` if unknown)."""
        i = int(item_id)
        if not 0 <= i < len(self._keys):
            raise IndexError(f"id {i} has no key (index holds {len(self._keys)} keys)")
        return self._keys[i]

    def keys(self) -> list[str]:
        """All keys in id order."""
        return list(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, k: object) -> bool:
        return k in self._ids

    def __repr__(self) -> str:
        return f"KeyIndex(capacity={self.capacity}, size={len(self)})"


# ================================================================ persistence
def _scalar(x: Any, name: str) -> float:
    a = np.asarray(jax.device_get(x))
    if a.shape != ():
        raise ValueError(f"{name} must be a scalar to be saved, got shape {a.shape} (a vmapped sweep?)")
    return a.item()


def state_dict(state: CurriculumState, cfg: CurriculumConfig, keys: KeyIndex | None = None) -> dict:
    """JSON-ready dict in atropos's ``state_dict`` layout, plus a ``jaxweight`` block.

    Args:
      state: a single (unbatched) scheduler state.
      cfg: its config.
      keys: the :class:`KeyIndex` naming the ids, or None to use ``str(id)``.

    Returns:
      ``{"strategy", "n_bins", "temperature", "ema_alpha",
      "competence_threshold", "item_scores": {key: [ema, count]},
      "bin_boundaries": [...] or [], "last_rebin_count", "jaxweight": {...}}``.
      atropos can load it (unless the strategy is one of the two new ones).
    """
    ema, count, last, b, has, lrc, tot = jax.device_get(
        (state.ema, state.count, state.last_update, state.boundaries, state.has_boundaries,
         state.last_rebin_count, state.total_updates))
    if np.ndim(count) != 1:
        raise ValueError(f"state must be a single scheduler (count of rank 1), got shape {np.shape(count)}")
    ids = np.flatnonzero(np.asarray(count) > 0)
    if keys is None:
        names = [str(int(i)) for i in ids]
    else:
        if len(ids) and ids[-1] >= len(keys):
            raise ValueError(f"state tracks id {int(ids[-1])}, which has no key in keys ({len(keys)} keys)")
        names = [keys.key(int(i)) for i in ids]
    item_scores = {k: [float(ema[i]), int(count[i])] for k, i in zip(names, ids)}
    block = {
        "version": 1,
        "capacity": cfg.capacity,
        "rebin_interval": int(_scalar(cfg.rebin_interval, "rebin_interval")),
        "total_updates": int(tot),
        "last_update": {k: int(last[i]) for k, i in zip(names, ids)},
        "competence_c0": float(_scalar(cfg.competence_c0, "competence_c0")),
        "staleness_coeff": float(_scalar(cfg.staleness_coeff, "staleness_coeff")),
        "priority": cfg.priority,
        "id_keys": keys is None,
    }
    if keys is not None:
        block["keys"] = keys.keys()
    return {
        "strategy": cfg.strategy,
        "n_bins": cfg.n_bins,
        "temperature": float(_scalar(cfg.temperature, "temperature")),
        "ema_alpha": float(_scalar(cfg.ema_alpha, "ema_alpha")),
        "competence_threshold": float(_scalar(cfg.competence_threshold, "competence_threshold")),
        "item_scores": item_scores,
        "bin_boundaries": [float(x) for x in b] if bool(has) else [],
        "last_rebin_count": int(lrc),
        "jaxweight": block,
    }


def load_state_dict(d: Mapping[str, Any], capacity: int, keys: KeyIndex | None = None
                    ) -> tuple[CurriculumConfig, CurriculumState, KeyIndex | None]:
    """Rebuild a scheduler from an atropos (or jaxweight) ``state_dict``.

    Plain atropos dicts (``item_scores`` values as lists or tuples) load with
    ``rebin_interval`` 50, ``total_updates`` = sum of counts and
    ``last_update`` 0. Items whose stored EMA is not finite (atropos stores
    NaN scores as given) are dropped, as :func:`update` would have skipped them.

    Args:
      d: the dict (e.g. ``json.load``-ed).
      capacity: pool size N of the new state.
      keys: optional existing :class:`KeyIndex` to map the keys into (new
        keys are added); by default a new one in the saved order.

    Returns:
      ``(cfg, state, keys)``; ``keys`` is None when the dict was saved with
      ``keys=None`` (keys are the ids themselves).

    Raises:
      ValueError: unknown strategy (same message as :func:`config`), more
        items than ``capacity``, or malformed entries.
    """
    strategy = _check_strategy(d["strategy"])
    jw = d.get("jaxweight") or {}
    n_bins = int(d["n_bins"])
    cfg = config(
        strategy, n_bins, capacity=capacity,
        temperature=float(d.get("temperature", 1.0)),
        ema_alpha=float(d.get("ema_alpha", 0.3)),
        competence_threshold=float(d.get("competence_threshold", 0.5)),
        rebin_interval=int(jw.get("rebin_interval", 50)),
        competence_c0=float(jw.get("competence_c0", 0.01)),
        staleness_coeff=float(jw.get("staleness_coeff", 0.3)),
        priority=jw.get("priority", "frontier"),
    )
    scores = d.get("item_scores", {}) or {}
    if len(scores) > capacity:
        raise ValueError(f"state dict has {len(scores)} items, more than capacity {capacity}")
    names, emas, counts = [], [], []
    for k, v in scores.items():
        if not isinstance(v, list | tuple) or len(v) != 2:
            raise ValueError(f"item_scores[{k!r}] must be [ema, count], got {v!r}")
        e, c = float(v[0]), int(v[1])
        if c < 1:
            raise ValueError(f"item_scores[{k!r}] has count {c}; counts must be >= 1")
        if not np.isfinite(e):
            continue
        names.append(str(k))
        emas.append(e)
        counts.append(c)
    if jw.get("id_keys", False):
        ids = np.asarray([int(k) for k in names], np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= capacity):
            raise ValueError(f"item ids must be in [0, {capacity}), got {int(ids.min())}..{int(ids.max())}")
        out_keys = None
    else:
        out_keys = keys if keys is not None else KeyIndex(capacity, jw.get("keys", ()))
        ids = out_keys.ids(names, add=True).astype(np.int64) if names else np.zeros((0,), np.int64)
    last_map = jw.get("last_update", {}) or {}
    last = [int(last_map.get(k, 0)) for k in names]
    ema = np.zeros((capacity,), np.float32)
    cnt = np.zeros((capacity,), np.int32)
    lu = np.zeros((capacity,), np.int32)
    ema[ids] = np.asarray(emas, np.float32)
    cnt[ids] = np.asarray(counts, np.int32)
    lu[ids] = np.asarray(last, np.int32)
    bb = list(d.get("bin_boundaries", []) or [])
    if len(bb) not in (0, n_bins):
        raise ValueError(f"bin_boundaries must have 0 or n_bins={n_bins} entries, got {len(bb)}")
    b = np.asarray(bb, np.float32) if bb else np.zeros((n_bins,), np.float32)
    state = CurriculumState(
        ema=jnp.asarray(ema), count=jnp.asarray(cnt), last_update=jnp.asarray(lu),
        boundaries=jnp.asarray(b), has_boundaries=jnp.asarray(bool(bb)),
        last_rebin_count=jnp.asarray(int(d.get("last_rebin_count", 0)), jnp.int32),
        total_updates=jnp.asarray(int(cnt.sum(dtype=np.int64)), jnp.int32),
    )
    return cfg, state, out_keys


def save_json(path: str | os.PathLike, state: CurriculumState, cfg: CurriculumConfig,
              keys: KeyIndex | None = None) -> Path:
    """Write :func:`state_dict` as JSON atomically (temp file + rename)."""
    return atomic_write_json(path, state_dict(state, cfg, keys))


def load_json(path: str | os.PathLike, capacity: int, keys: KeyIndex | None = None
              ) -> tuple[CurriculumConfig, CurriculumState, KeyIndex | None]:
    """Read a JSON state dict (atropos's or ours) with :func:`load_state_dict`."""
    with open(path, encoding="utf-8") as f:
        return load_state_dict(json.load(f), capacity, keys)


# ==================================================================== sharding
def state_sharding(cfg: CurriculumConfig, mesh: jax.sharding.Mesh, axis: str | None = None
                   ) -> CurriculumState:
    """Shardings that split the ``[N]`` leaves over a 1-D ``mesh`` axis (rest replicated).

    Use as ``jax.jit(..., in_shardings=..., out_shardings=...)`` or with
    :func:`shard_state`. ``capacity`` must divide evenly over the axis.
    """
    from jax.sharding import NamedSharding, PartitionSpec as P

    axis = axis if axis is not None else mesh.axis_names[0]
    ndev = mesh.shape[axis]
    if cfg.capacity % ndev:
        raise ValueError(f"capacity ({cfg.capacity}) must be a multiple of the {ndev} devices of axis {axis!r}")
    pool, rep = NamedSharding(mesh, P(axis)), NamedSharding(mesh, P())
    return CurriculumState(ema=pool, count=pool, last_update=pool, boundaries=rep,
                           has_boundaries=rep, last_rebin_count=rep, total_updates=rep)


def shard_state(state: CurriculumState, cfg: CurriculumConfig, mesh: jax.sharding.Mesh,
                axis: str | None = None) -> CurriculumState:
    """``jax.device_put`` the state with :func:`state_sharding`.

    Example::

        mesh = jax.make_mesh((8,), ("pool",))
        state = shard_state(init(cfg), cfg, mesh)
        state = update_jit(state, ids, scores, cfg)    # stays sharded
    """
    return jax.device_put(state, state_sharding(cfg, mesh, axis))
