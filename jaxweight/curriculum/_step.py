"""One training-loop step: update with the last batch's scores, sample the next batch."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

from .._util import as_key, check_static_int
from ..metrics import flatten
from ._config import CurriculumConfig, _check_state
from .sampling import _check_progress, _eligible, _sample_core
from .state import CurriculumState, UpdateStats, _batch_stats, _prepare, _update_core

Array = jax.Array


@struct.dataclass
class StepOut:
    """What :func:`step` returns next to the state.

    Attributes:
      item_ids: i32[num] the next batch (ids in ``[0, N)``, -1 if nothing is eligible).
      stats: :class:`UpdateStats` of the batch just applied (``n_applied``,
        ``n_invalid``, ``n_nonfinite``, ``n_out_of_range``).
    """

    item_ids: Array
    stats: UpdateStats

    def to_dict(self) -> dict[str, float]:
        """``{"curriculum/n_applied": float, "curriculum/n_invalid": ..., ...}`` (host side)."""
        return flatten(self.stats, "curriculum")


def step(state: CurriculumState, key: Any, item_ids: Any, scores: Any, cfg: CurriculumConfig,
         current_step: Any, total_steps: Any, num: int, eligible: Any = None,
         mask: Any = None) -> tuple[CurriculumState, StepOut]:
    """:func:`update` with the last batch's scores, then :func:`sample` for the next batch.

    In a loop use :data:`step_jit` (state donated, updated in place).

    Args:
      state: the scheduler state.
      key: PRNG key or int seed for the sampling.
      item_ids: i32[B] ids of the last batch.
      scores: f32[B] their rewards (NaN/inf skipped and counted).
      cfg: the config.
      current_step, total_steps: training progress (finite).
      num: size of the next batch (static).
      eligible: optional bool[N] items that may be drawn.
      mask: optional bool[B] entries of the last batch to apply.

    Returns:
      ``(state, StepOut(item_ids i32[num], stats))``.

    Example::

        state, out = step_jit(state, key, ids, rewards, cfg, t, total, num=256)
        ids = out.item_ids; log(out.to_dict())
    """
    _check_state(state, cfg)
    ids, scores, mask = _prepare(item_ids, scores, cfg, mask)
    if scores.ndim != 1:
        raise ValueError(f"scores must have rank 1 like item_ids, got shape {scores.shape}")
    stats = _batch_stats(ids, scores, cfg, mask)
    state = _update_core(state, ids, scores, cfg, mask)
    cs, ts = _check_progress(current_step, total_steps)
    num = check_static_int(num, "num", minimum=0)
    nxt = _sample_core(state, as_key(key), cfg, cs, ts, num, _eligible(eligible, cfg.capacity))
    return state, StepOut(item_ids=nxt, stats=stats)


step_jit = jax.jit(step, static_argnames=("num",), donate_argnums=0)
"""``jax.jit(step, static_argnames="num", donate_argnums=0)``: update + sample in place."""
