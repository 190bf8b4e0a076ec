"""The O(B) batch update: a batch of (id, score) entries applied in array order.

Sort the batch by (id, position); a run of k equal ids maps the stored EMA x
to ``(1 - a)^k x + C`` (C from one scan of the affine EMA maps); one scatter
writes each run's result. The cost is independent of the pool size N, and with
a donated state the pool is updated in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


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


def _apply(state, ids: Array, scores: Array, valid: Array,
           alpha: Array, capacity: int):
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


