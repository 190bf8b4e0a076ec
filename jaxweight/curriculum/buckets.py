"""A curriculum over task *buckets*: the scheduler's items are buckets, problems are drawn inside them.

Over a large pool, item-level scheduling revisits almost nothing and learns about items
it will not see again. The pattern here: group the pool into ``K`` buckets of similar
problems (e.g. digits x operation x carries), give the scheduler ``capacity=K`` items (the
bucket ids), and each step draw bucket ids with :func:`jaxweight.curriculum.sample`, then a
fresh problem uniformly inside each chosen bucket (:func:`draw_in_buckets`); update the
scheduler with the *bucket* ids and the groups' rewards (``update_groups``), so what is
learned about a bucket transfers to its unseen problems. :func:`bucket_table` builds the
static lookup (problems sorted by bucket) once, on the host or under jit.

Example::

    import jax, jax.numpy as jnp
    from jaxweight import curriculum as cur

    bucket_of = jnp.array([0, 2, 1, 2, 0, 2])          # i32[N] bucket of each problem
    table = cur.bucket_table(bucket_of, num_buckets=3)
    cfg = cur.config("prioritized", n_bins=2, capacity=3)   # the items are the 3 buckets
    state = cur.update_groups(cur.init(cfg), jnp.array([0, 1, 2]), jnp.ones((3, 4)), cfg)
    b = cur.sample(state, jax.random.key(0), cfg, num=8, eligible=table.size > 0)
    items = cur.draw_in_buckets(jax.random.key(1), table, b)   # i32[8] problem ids
    assert bool(jnp.all(bucket_of[items] == b))
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from .._util import as_key, check_rank, check_static_int

__all__ = ["BucketTable", "bucket_table", "draw_in_buckets"]


@flax.struct.dataclass
class BucketTable:
    """Problems grouped by bucket (CSR layout).

    Attributes:
      order: i32[N] problem ids sorted by bucket (stable).
      start: i32[K] offset of each bucket's first problem in ``order``.
      size: i32[K] problems in each bucket (0 for an empty bucket).
    """

    order: jax.Array
    start: jax.Array
    size: jax.Array


def bucket_table(bucket_of: Any, *, num_buckets: int) -> BucketTable:
    """The :class:`BucketTable` of ``bucket_of: i32[N]`` (ids outside ``[0, num_buckets)`` belong to none).

    Args:
      bucket_of: i32[N] bucket id of each problem.
      num_buckets: static number of buckets K.
    """
    check_rank(bucket_of, 1, "bucket_of")
    k = check_static_int(num_buckets, "num_buckets", minimum=1)
    b = jnp.asarray(bucket_of, jnp.int32)
    b = jnp.where((b >= 0) & (b < k), b, k)                # out of range: after every bucket
    order = jnp.argsort(b, stable=True).astype(jnp.int32)
    size = jnp.bincount(b, length=k + 1)[:k].astype(jnp.int32)
    start = (jnp.cumsum(size) - size).astype(jnp.int32)
    return BucketTable(order=order, start=start, size=size)


def draw_in_buckets(key: Any, table: BucketTable, bucket_ids: Any) -> jax.Array:
    """i32[B] one problem drawn uniformly inside each bucket of ``bucket_ids: i32[B]``.

    A bucket id outside ``[0, K)`` or of an empty bucket gives -1.
    """
    check_rank(bucket_ids, 1, "bucket_ids")
    ids = jnp.asarray(bucket_ids, jnp.int32)
    k = table.size.shape[0]
    ok = (ids >= 0) & (ids < k)
    safe = jnp.where(ok, ids, 0)
    size = jnp.where(ok, table.size[safe], 0)
    u = jax.random.uniform(as_key(key), ids.shape)
    off = jnp.minimum((u * size).astype(jnp.int32), jnp.maximum(size - 1, 0))
    pos = jnp.clip(table.start[safe] + off, 0, table.order.shape[0] - 1)
    return jnp.where(size > 0, table.order[pos], -1).astype(jnp.int32)
