"""Scheduler state, the batch update (atropos ``update`` / ``update_batch``), bins and metrics."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from .._util import as_f32, check_rank, concrete
from ..metrics import flatten
from ._apply import _apply
from ._config import CurriculumConfig, _alpha, _check_state
from ._select import _bins_of, _compute_boundaries

Array = jax.Array


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


def init(cfg: CurriculumConfig, key: Any = None) -> CurriculumState:
    """An empty scheduler state: nothing tracked, no boundaries.

    Args:
      cfg: the config (its ``capacity`` and ``n_bins`` set the shapes).
      key: accepted for the common ``init(cfg, key)`` shape and ignored (the
        state holds no randomness).

    Returns:
      ``CurriculumState`` with ``ema f32[N]``, ``count i32[N]``,
      ``last_update i32[N]``, ``boundaries f32[n_bins]`` and scalar leaves,
      all zero / False.

    Example::

        from jaxweight import curriculum as cur

        state = cur.init(cur.config(capacity=1000))
        assert state.ema.shape == (1000,) and int(state.total_updates) == 0
    """
    del key
    if not isinstance(cfg, CurriculumConfig):
        raise ValueError(f"cfg must be a CurriculumConfig (from curriculum.config), got {type(cfg).__name__}")
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


# ======================================================================= bins
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

    Raises:
      ValueError: the state's capacity or bin count is not the config's.

    Call it when ``has_boundaries`` is False to reproduce atropos's lazy store.
    """
    _check_state(state, cfg)
    b, has = _compute_boundaries(state.ema, state.count, cfg.n_bins)
    return state.replace(boundaries=b, has_boundaries=has)


def bin_boundaries(state: CurriculumState, cfg: CurriculumConfig) -> Array:
    """The boundaries binning uses now: f32[n_bins].

    The stored ones if ``has_boundaries``, else computed on the fly from the
    current EMAs (not stored; see :func:`recompute_bins`).
    """
    _check_state(state, cfg)
    return lax.cond(
        state.has_boundaries,
        lambda: state.boundaries,
        lambda: _compute_boundaries(state.ema, state.count, cfg.n_bins)[0],
    )


# ====================================================================== update
def _check_numbers(x: Any, name: str) -> None:
    """A ValueError naming ``x`` when it is host data that holds no numbers."""
    if not isinstance(x, jax.Array | jax.core.Tracer):
        a = np.asarray(x)
        if a.dtype.kind not in "biuf":
            raise ValueError(f"{name} must be numbers, got dtype {a.dtype}")


def _as_numbers(x: Any, name: str) -> Array:
    """``x`` as a jax array, or a ValueError naming it when it holds no numbers."""
    _check_numbers(x, name)
    return jnp.asarray(x)


def _check_ids(item_ids: Any, name: str) -> Array:
    ids = _as_numbers(item_ids, name)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers, got dtype {ids.dtype}")
    return ids.astype(jnp.int32)


def _check_ids_in_range(item_ids: Any, mask: Any, capacity: int) -> None:
    """Refuse concrete masked-in ids outside ``[0, capacity)`` (traced ones are skipped and counted).

    Only entries the mask keeps (rows with any kept entry for f32[P, G] scores) are
    checked, so masked-out padding may carry any id (e.g. -1); a traced mask skips the check.
    """
    ids = concrete(item_ids)
    if ids is None or ids.ndim != 1 or ids.dtype.kind not in "biu":
        return
    keep = np.ones(ids.shape, bool)
    if mask is not None:
        m = concrete(mask)
        if m is None:
            return
        m = np.asarray(m, bool)
        keep = m.reshape(m.shape[0], -1).any(axis=1) if m.ndim == 2 else m
    ids = ids.astype(np.int64)
    bad = keep & ((ids < 0) | (ids >= capacity))
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"item_ids must be in [0, {capacity}) (the pool capacity is {capacity}), got item_ids[{i}]="
            f"{int(ids[i])} ({int(bad.sum())} of {ids.size} out of range); mask out padding entries "
            f"with mask=")


def _prepare(item_ids: Any, scores: Any, mask: Any):
    """Checked ``(ids i32[B], scores f32[B] or f32[B, G], mask or None)`` of a batch (shapes, dtypes)."""
    ids = _check_ids(item_ids, "item_ids")
    check_rank(ids, 1, "item_ids")
    _check_numbers(scores, "scores")
    scores = as_f32(scores)   # host data without a conversion op (its NaNs are bad data, skipped)
    check_rank(scores, (1, 2), "scores")
    if scores.shape[0] != ids.shape[0]:
        raise ValueError(
            f"scores must have {ids.shape[0]} rows (one per item_ids entry), got shape {scores.shape} "
            f"for item_ids of shape {ids.shape}")
    if mask is not None:
        mask = jnp.asarray(mask, bool)
        if scores.ndim == 2 and mask.shape == ids.shape:
            mask = jnp.broadcast_to(mask[:, None], scores.shape)
        elif mask.shape != scores.shape:
            allowed = f"{ids.shape} or {scores.shape}" if scores.ndim == 2 else f"{scores.shape}"
            raise ValueError(f"mask must have shape {allowed} (like item_ids / scores), got {mask.shape}")
    return ids, scores, mask


def update(state: CurriculumState, item_ids: Any, scores: Any, cfg: CurriculumConfig, *,
           mask: Any = None) -> CurriculumState:
    """Apply a batch of scores, each entry one atropos ``update(key, score)``.

    In a training loop jit it with the state donated, ``jax.jit(cur.update,
    donate_argnums=0)``: the pool is then updated in place in O(B); without
    donation every call copies the whole pool.

    An entry is applied iff ``mask`` holds, its score is finite and
    ``0 <= id < N``; others are skipped and add no count (count them with
    :func:`batch_stats`, or use :func:`~jaxweight.curriculum.step`, which
    reports them). An id outside ``[0, N)`` is a caller's bug: when the ids
    are concrete (an eager call) a masked-in one raises ``ValueError``; traced
    ones (under ``jax.jit``) are skipped and counted as ``n_out_of_range``.
    Masked-out entries may carry any id (padding). Applied entries go in
    array order (duplicate ids see the earlier entries' result)::

        untracked: ema = score;                   count = 1
        tracked:   ema = a*score + (1 - a)*ema;   count += 1
        total_updates += 1;  last_update[id] = total_updates

    Then, once after the batch, if an entry was applied and ``total_updates -
    last_rebin_count >= rebin_interval``, the boundaries are recomputed and
    ``last_rebin_count = total_updates``. A batch with no valid entry leaves
    the state exactly unchanged. B = 1 is atropos exactly (in float32); a run
    of duplicate ids equals the sequential updates up to float32 rounding (which
    may differ by an ulp between eager and jitted calls: XLA fuses multiply-adds).

    Args:
      state: the scheduler state.
      item_ids: i32[B] item ids.
      scores: f32[B] rewards (higher = easier); not clipped; NaN/inf skipped.
      cfg: the config.
      mask: optional bool[B]; False entries are skipped.

    Returns:
      The new state.

    Raises:
      ValueError: wrong ranks/shapes, non-integer ids, a concrete masked-in id
        outside ``[0, N)`` (``"item_ids must be in [0, 100) (the pool capacity
        is 100), got item_ids[1]=100 ..."``), or a state whose capacity or bin
        count is not the config's.

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import curriculum as cur

        cfg = cur.config(capacity=100)
        update = jax.jit(cur.update, donate_argnums=0)    # the pool is updated in place
        state = update(cur.init(cfg), jnp.array([3, 7, 3]), jnp.array([1.0, 0.0, 0.5]), cfg)
        assert int(state.count[3]) == 2 and int(state.total_updates) == 3
    """
    _check_state(state, cfg)
    ids, scores, mask = _prepare(item_ids, scores, mask)
    if scores.ndim != 1:
        raise ValueError(f"scores must have rank 1 like item_ids (shape {ids.shape}), got shape "
                         f"{scores.shape}; use update_groups for [P, G] group scores")
    _check_ids_in_range(item_ids, mask, cfg.capacity)
    valid = _valid_entries(ids, scores, cfg, mask)
    # skipped scores are zeroed at once, so no NaN reaches an op (runs under jax_debug_nans)
    return _apply_and_rebin(state, ids, jnp.where(valid, scores, 0.0), valid, cfg)


def _valid_entries(ids, scores, cfg, mask):
    valid = jnp.isfinite(scores) & (ids >= 0) & (ids < cfg.capacity)
    return valid if mask is None else valid & mask


def _group_rows(ids, scores, cfg, mask):
    """Row means over valid finite entries: (mean f32[P], valid rows bool[P])."""
    ok = jnp.isfinite(scores)
    if mask is not None:
        ok = ok & mask
    n = jnp.sum(ok, axis=1, dtype=jnp.int32)
    total = jnp.sum(jnp.where(ok, scores, 0.0), axis=1)
    mean = total / jnp.maximum(n, 1).astype(jnp.float32)
    return mean, (n > 0) & (ids >= 0) & (ids < cfg.capacity)


def _apply_and_rebin(state, ids, scores, valid, cfg):
    state = _apply(state, ids, scores, valid, _alpha(cfg), cfg.capacity)
    due = jnp.any(valid) & (state.total_updates - state.last_rebin_count
                            >= jnp.asarray(cfg.rebin_interval, jnp.int32))
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


def update_groups(state: CurriculumState, item_ids: Any, scores: Any, cfg: CurriculumConfig, *,
                  mask: Any = None) -> CurriculumState:
    """atropos ``update_batch``: each row is one update with the mean of its valid scores.

    Jit it with the state donated, as :func:`update`.

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

    Raises:
      ValueError: as :func:`update`; a concrete id outside ``[0, N)`` of a row
        with a masked-in entry is refused, traced ones are skipped and counted.

    Example::

        import jax.numpy as jnp
        from jaxweight import curriculum as cur

        cfg = cur.config(capacity=10)
        state = cur.update_groups(cur.init(cfg), jnp.array([5]), jnp.array([[1.0, 0.0, 0.0, 1.0]]), cfg)
        assert float(state.ema[5]) == 0.5 and int(state.count[5]) == 1
    """
    _check_state(state, cfg)
    ids, scores, mask = _prepare(item_ids, scores, mask)
    if scores.ndim != 2:
        raise ValueError(f"scores must have shape ({ids.shape[0]}, G), got {scores.shape}")
    _check_ids_in_range(item_ids, mask, cfg.capacity)
    mean, valid = _group_rows(ids, scores, cfg, mask)
    return _apply_and_rebin(state, ids, mean, valid, cfg)


@struct.dataclass
class UpdateStats:
    """What a batch did to the scheduler (all i32[]).

    Attributes:
      n_applied: entries (rows for group scores) applied as updates.
      n_invalid: masked-in entries (rows) skipped: non-finite score (rows: no
        finite score) or out-of-range id.
      n_nonfinite: masked-in scores that are NaN or +-inf (entries, also for
        group scores).
      n_out_of_range: masked-in entries (rows) whose id is outside ``[0, N)``.
    """

    n_applied: Array
    n_invalid: Array
    n_nonfinite: Array
    n_out_of_range: Array

    def to_dict(self) -> dict[str, float]:
        """``{"curriculum/n_applied": float, ...}`` (host side)."""
        return flatten(self, "curriculum")


def batch_stats(item_ids: Any, scores: Any, cfg: CurriculumConfig, *, mask: Any = None) -> UpdateStats:
    """Count what :func:`update` (f32[B] scores) or :func:`update_groups` (f32[P, G]) would apply.

    Example::

        import jax.numpy as jnp
        from jaxweight import curriculum as cur

        stats = cur.batch_stats(jnp.array([0, 1, 99]), jnp.array([1.0, jnp.nan, 0.5]), cur.config(capacity=10))
        assert int(stats.n_applied) == 1 and int(stats.n_invalid) == 2
    """
    ids, scores, mask = _prepare(item_ids, scores, mask)
    m = jnp.ones(scores.shape, bool) if mask is None else mask
    nonfinite = jnp.sum(m & ~jnp.isfinite(scores), dtype=jnp.int32)
    row_in = m if scores.ndim == 1 else jnp.any(m, axis=1)
    oor = row_in & ((ids < 0) | (ids >= cfg.capacity))
    if scores.ndim == 1:
        valid = _valid_entries(ids, scores, cfg, mask)
    else:
        valid = _group_rows(ids, scores, cfg, mask)[1]
    n_applied = jnp.sum(valid, dtype=jnp.int32)
    return UpdateStats(
        n_applied=n_applied,
        n_invalid=jnp.sum(row_in, dtype=jnp.int32) - n_applied,
        n_nonfinite=nonfinite,
        n_out_of_range=jnp.sum(oor, dtype=jnp.int32),
    )


# ================================================================= per item
def difficulty(state: CurriculumState, item_ids: Any) -> tuple[Array, Array]:
    """Current EMA of items (atropos ``get_item_difficulty``).

    Args:
      state: the scheduler state.
      item_ids: i32[...] ids (out-of-range ids count as untracked).

    Returns:
      ``(ema f32[...], tracked bool[...])``; ``ema`` is 0 where not tracked
      (``tracked`` says which entries are measured; no NaN sentinel).
    """
    ids = _check_ids(item_ids, "item_ids")
    n = state.ema.shape[-1]
    inr = (ids >= 0) & (ids < n)
    safe = jnp.where(inr, ids, 0)
    tracked = inr & (state.count[safe] > 0)
    return jnp.where(tracked, state.ema[safe], jnp.float32(0.0)), tracked


def item_bin(state: CurriculumState, item_ids: Any, cfg: CurriculumConfig) -> Array:
    """Difficulty bin of items (atropos ``get_item_bin``): i32[...], 0 = easiest.

    Untracked or out-of-range ids get ``n_bins // 2``. Boundaries are the
    stored ones if any, else computed on the fly (and not stored). The bin is
    the first i with ``ema >= b_i``, else ``n_bins - 1``.

    Example::

        import jax.numpy as jnp
        from jaxweight import curriculum as cur

        cfg = cur.config(capacity=3)
        state = cur.update(cur.init(cfg), jnp.arange(3), jnp.array([0.9, 0.5, 0.1]), cfg)
        assert cur.item_bin(state, jnp.arange(3), cfg).tolist() == [0, 3, 4]
    """
    ema, tracked = difficulty(state, item_ids)
    b = bin_boundaries(state, cfg)
    return _bins_of(ema, tracked, b, cfg.n_bins)


# ===================================================================== metrics
def metrics(state: CurriculumState, cfg: CurriculumConfig) -> dict[str, Array]:
    """Jittable statistics of the scheduler.

    Returns:
      ``items_tracked`` i32[], ``mean_difficulty`` / ``min_difficulty`` /
      ``max_difficulty`` f32[] over tracked EMAs (0 with nothing tracked:
      ``items_tracked == 0`` says so; no NaN or inf sentinel),
      ``total_updates`` i32[], ``bin_<i>_count`` i32[] (tracked items per
      *stored* bin; 0 without stored boundaries) and ``has_boundaries`` bool[].
    """
    _check_state(state, cfg)
    tracked = state.count > 0
    n = jnp.sum(tracked, dtype=jnp.int32)
    any_ = n > 0
    mean = jnp.sum(jnp.where(tracked, state.ema, 0.0)) / jnp.maximum(n, 1).astype(jnp.float32)
    # the neutral elements of min / max over finite EMAs: float32's extremes, not +-inf
    zero, big = jnp.float32(0.0), jnp.float32(np.finfo(np.float32).max)
    out = {
        "items_tracked": n,
        "mean_difficulty": jnp.where(any_, mean, zero),
        "min_difficulty": jnp.where(any_, jnp.min(jnp.where(tracked, state.ema, big)), zero),
        "max_difficulty": jnp.where(any_, jnp.max(jnp.where(tracked, state.ema, -big)), zero),
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
    """Host-side metrics with atropos's keys (for ``wandb.log`` or a metrics writer).

    With nothing tracked: ``{"curriculum/items_tracked": 0,
    "curriculum/strategy": 0}`` (ints, as atropos). Otherwise floats (built
    with :func:`jaxweight.metrics.flatten`): ``curriculum/items_tracked``,
    ``curriculum/{mean,min,max}_difficulty``, ``curriculum/total_updates`` and,
    only with stored boundaries, ``curriculum/bin_{i}_count``.
    """
    m = jax.device_get(metrics(state, cfg))
    if int(m["items_tracked"]) == 0:
        return {"curriculum/items_tracked": 0, "curriculum/strategy": 0}
    names = ["items_tracked", "mean_difficulty", "min_difficulty", "max_difficulty", "total_updates"]
    if bool(m["has_boundaries"]):
        names += [f"bin_{i}_count" for i in range(cfg.n_bins)]
    return flatten({k: m[k] for k in names}, "curriculum")  # atropos's key order
