"""On-device curriculum scheduler: the atropos ``CurriculumScheduler`` over a fixed pool.

Every item of a pool of ``N = cfg.capacity`` items (ids ``0..N-1``) keeps an
exponential moving average (EMA) of its rewards. Items are binned by quantile
of their EMA (bin 0 = easiest = highest reward) and a strategy picks which
bins to sample from as training progresses. The atropos semantics are kept
exactly for single updates, and made fast and composable:

* :func:`update` applies a whole batch of ``(id, score)`` pairs in array order
  in O(B) work, independent of the pool size. **Call it through**
  :data:`update_jit` **(or** :data:`step_jit` **)**: they donate the state, so the
  pool is updated in place. A plain ``jax.jit(update)`` copies the whole pool
  on every call (25 ms at 10^7 items against 0.45 ms donated); inside your own
  jitted training step, donate the state the same way.
* :func:`recompute_bins` finds the exact quantile boundaries with a radix
  selection over the float bit patterns (``_select.py``), tens of times faster
  than a full sort of the pool on a CPU.
* :func:`sample` draws ``num`` actual items: a bin by the strategy (only bins
  holding eligible items), then an item uniformly inside it, through a 128-ary
  tree of per-block bin counts (``_tree.py``; one binning pass per call).
* Two curricula from the literature on the same state: ``competence_sqrt``
  (Platanios et al. 2019) and ``prioritized`` (Prioritized Level Replay,
  Jiang et al. 2021).
* The atropos JSON format (string keys, ``state_dict``) is in
  :mod:`jaxweight.interop.atropos`; sharded pools in :mod:`.sharding`.

The component shape (the same for every stateful part of jaxweight)::

    from jaxweight import curriculum as cur

    cfg = cur.config("competence_sqrt", n_bins=5, capacity=100_000)
    state = cur.init(cfg)
    state = cur.update_jit(state, ids, rewards, cfg)           # i32[B], f32[B]; donates state
    batch = cur.sample(state, key, cfg, step, total_steps, num=256)
    state, out = cur.step_jit(state, key, ids, rewards, cfg, step, total_steps, num=256)
    cur.metrics_dict(state, cfg) | out.to_dict()               # {"curriculum/...": float}

Bad data: non-finite scores and (under jit) out-of-range ids are skipped and
counted (:func:`batch_stats`, ``StepOut.stats``); a batch with no valid entry
leaves the state exactly unchanged. Concrete out-of-range ids, a state whose
capacity is not the config's, non-finite progress and bad hyperparameters raise
``ValueError`` (the same message under ``jaxweight.checked(jax.jit(...))``).
Sampled ids are always in ``[0, N)`` (or -1 when nothing is eligible).

Many schedulers: every function is pure and vmappable, e.g. one pool per
environment (``jax.vmap(update, in_axes=(0, 0, 0, None))``) or a sweep over the
array leaves of the config. Under ``vmap`` the rebin ``cond`` becomes a
``select``, so the (cheap) selection then runs on every batch.

Sharded pools: :func:`shard_state` puts the ``[N]`` leaves on a 1-D device
mesh; every function accepts such a state and gives the same results.

References:
  atropos ``atroposlib/envs/curriculum.py`` (NousResearch, PR #428 / #430).
  E. A. Platanios et al., "Competence-based Curriculum Learning for Neural
  Machine Translation", NAACL 2019, arXiv:1903.09848.
  M. Jiang, E. Grefenstette, T. Rocktaschel, "Prioritized Level Replay",
  ICML 2021, arXiv:2010.03934 (and jaxued's ``LevelSampler``).
"""

from __future__ import annotations

from ._config import PRIORITIES, STRATEGIES, CurriculumConfig, config
from ._deprecated import KeyIndex, load_json, load_state_dict, sample_items, save_json, state_dict
from ._step import StepOut, step, step_jit
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
    update_groups_jit,
    update_jit,
)

__all__ = [
    "STRATEGIES",
    "PRIORITIES",
    "CurriculumConfig",
    "CurriculumState",
    "UpdateStats",
    "StepOut",
    "config",
    "init",
    "update",
    "update_groups",
    "update_jit",
    "update_groups_jit",
    "batch_stats",
    "step",
    "step_jit",
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
    # deprecated aliases (API.md names): see jaxweight.interop.atropos and sample
    "sample_items",
    "KeyIndex",
    "state_dict",
    "load_state_dict",
    "save_json",
    "load_json",
]
