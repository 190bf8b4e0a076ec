"""One training-loop step: update with the last batch's scores, sample the next batch."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

from ..metrics import flatten
from ._config import CurriculumConfig, _check_state
from .sampling import sample
from .state import CurriculumState, UpdateStats, batch_stats, update

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


def step(state: CurriculumState, key: Any, item_ids: Any, scores: Any, cfg: CurriculumConfig, *,
         num: int, step: Any = None, total_steps: Any = None, eligible: Any = None,
         mask: Any = None) -> tuple[CurriculumState, StepOut]:
    """:func:`~jaxweight.curriculum.update` with the last batch's scores, then
    :func:`~jaxweight.curriculum.sample` for the next batch.

    In a loop jit it with the state donated (``jax.jit(cur.step,
    donate_argnums=0, static_argnames="num")``): the pool is updated in place.

    Args:
      state: the scheduler state.
      key: PRNG key or int seed for the sampling.
      item_ids: i32[B] ids of the last batch.
      scores: f32[B] their rewards (NaN/inf skipped and counted; an id outside
        ``[0, N)`` raises ``ValueError`` when concrete and is skipped and
        counted when traced, as in :func:`~jaxweight.curriculum.update`).
      cfg: the config.
      num: size of the next batch (static).
      step, total_steps: training progress (finite); required by the
        strategies that move with time.
      eligible: optional bool[N] items that may be drawn.
      mask: optional bool[B] entries of the last batch to apply.

    Returns:
      ``(state, StepOut(item_ids i32[num], stats))``.

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import curriculum as cur

        cfg = cur.config("competence_sqrt", capacity=1000)
        run = jax.jit(cur.step, donate_argnums=0, static_argnames="num")
        state, out = run(cur.init(cfg), jax.random.key(0), jnp.arange(8), jnp.linspace(0, 1, 8), cfg,
                         num=16, step=1, total_steps=100)
        assert out.item_ids.shape == (16,) and out.to_dict()["curriculum/n_applied"] == 8.0
    """
    _check_state(state, cfg)
    stats = batch_stats(item_ids, scores, cfg, mask=mask)
    if jax.numpy.ndim(scores) != 1:
        raise ValueError(f"scores must have rank 1 like item_ids, got shape {jax.numpy.shape(scores)}")
    state = update(state, item_ids, scores, cfg, mask=mask)
    nxt = sample(state, key, cfg, num=num, step=step, total_steps=total_steps, eligible=eligible)
    return state, StepOut(item_ids=nxt, stats=stats)
