"""On-device curriculum scheduler: the atropos ``CurriculumScheduler`` over a fixed pool.

Each item of a pool of ``N = cfg.capacity`` items (ids ``0..N-1``) keeps an EMA
of its rewards; items are binned by quantile of their EMA (bin 0 = easiest) and
a strategy picks which bins to draw from as training progresses (atropos's
three, ``competence_sqrt`` of Platanios et al. 2019 and ``prioritized``, i.e.
Prioritized Level Replay, Jiang et al. 2021). :func:`update` applies a batch in
O(B) work, independent of N, when the state is donated; :func:`sample` draws
items through a tree of per-block bin counts. String keys: :class:`KeyIndex`;
atropos's JSON format: :mod:`jaxweight.interop.atropos`; sharded pools:
:func:`shard_state`. Bad scores, and ids outside ``[0, N)`` under ``jax.jit``, are
skipped and counted (:class:`UpdateStats`; concrete out-of-range ids raise); a batch
with no valid entry leaves the state unchanged.

Example::

    import jax, jax.numpy as jnp
    from jaxweight import curriculum as cur

    cfg = cur.config("competence_sqrt", n_bins=5, capacity=100_000)   # every check runs here
    state = cur.init(cfg)
    step = jax.jit(cur.step, donate_argnums=0, static_argnames="num")   # the pool updates in place
    ids, rewards = jnp.arange(256), jnp.linspace(0.0, 1.0, 256)
    state, out = step(state, jax.random.key(0), ids, rewards, cfg, num=256, step=1, total_steps=1000)
    logs = cur.metrics_dict(state, cfg) | out.to_dict()               # {"curriculum/...": float}
    assert out.item_ids.shape == (256,) and logs["curriculum/items_tracked"] == 256.0
"""

from __future__ import annotations

from ._config import PRIORITIES, STRATEGIES, CurriculumConfig, config
from ._step import StepOut, step
from .buckets import BucketTable, bucket_table, draw_in_buckets
from .keys import KeyIndex
from .sampling import bin_probabilities, sample, sample_bin
from .sharding import shard_state, state_sharding
from .state import (
    CurriculumState,
    UpdateStats,
    batch_stats,
    bin_boundaries,
    difficulty,
    init,
    item_bin,
    metrics,
    metrics_dict,
    recompute_bins,
    update,
    update_groups,
)

__all__ = [
    "STRATEGIES",
    "PRIORITIES",
    "CurriculumConfig",
    "CurriculumState",
    "UpdateStats",
    "StepOut",
    "KeyIndex",
    "config",
    "init",
    "step",
    "update",
    "update_groups",
    "batch_stats",
    "difficulty",
    "item_bin",
    "recompute_bins",
    "bin_boundaries",
    "bin_probabilities",
    "sample_bin",
    "sample",
    "metrics",
    "metrics_dict",
    "state_sharding",
    "shard_state",
    "BucketTable",
    "bucket_table",
    "draw_in_buckets",
]
