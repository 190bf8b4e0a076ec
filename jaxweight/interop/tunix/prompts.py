"""``CurriculumPromptIterator``: a tunix train dataset drawn and updated by :mod:`jaxweight.curriculum`."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ... import checkpoint, curriculum

__all__ = ["ITEM_ID_KEY", "DRAW_KEY", "group_mean_scores", "CurriculumPromptIterator"]

ITEM_ID_KEY = "jaxweight_item_id"
DRAW_KEY = "jaxweight_draw"


def group_mean_scores(rewards: np.ndarray) -> np.ndarray:
    """Mean of each row's finite rewards: f32[P, G] -> f32[P] (NaN for a row with none: skipped)."""
    r = np.asarray(rewards, np.float32)
    ok = np.isfinite(r)
    n = ok.sum(axis=-1)
    total = np.where(ok, r, 0.0).sum(axis=-1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan).astype(np.float32)


class CurriculumPromptIterator:
    """A tunix train dataset whose prompts are drawn by :mod:`jaxweight.curriculum`.

    Each batch is ``batch_size`` rows of ``data`` drawn by :func:`jaxweight.curriculum.sample`
    (numpy arrays, as tunix repeats every leaf) plus the item ids (``"jaxweight_item_id"``)
    and the draw number (``"jaxweight_draw"``). Pass :meth:`metric_fn` to the learner
    (``metric_fns=[it.metric_fn]``): it scores each group (``score_fn``, default the mean of
    the finite rewards) and applies the scores with :func:`jaxweight.curriculum.update`.
    Batches without the draw number -- :meth:`eval_batches`, or any other eval dataset --
    never update the curriculum.

    Resume: the draw ``k`` uses ``fold_in(key(seed), k)``, so the state after ``k`` draws is the
    curriculum state and ``k``. With ``save_dir`` and ``save_every`` (tunix's checkpoint
    interval), the update of draw ``k - 1`` for ``k`` a multiple of ``save_every`` writes
    ``save_dir/curriculum_{k}.ckpt``: the state tunix's step ``k`` resumes from.
    On resume, ``restore(save_dir, tunix_step(learner))`` loads it and answers tunix's
    fast-forward (it skips as many batches as it had trained on) with placeholder batches
    that change nothing, so the resumed run draws exactly the batches of the original one.

    Args:
      data: columns of the pool, each of length ``N = cfg.capacity`` (``"prompts"`` required;
        other columns, e.g. answers, reach the reward functions as keyword arguments).
      cfg: a :func:`jaxweight.curriculum.config`.
      batch_size: prompts per batch (tunix's global batch).
      num_generations: G of the learner (rewards arrive as ``[P*G]``).
      seed: int seed of the draws.
      total_steps: training length for the strategies that move with time (``competence_sqrt``).
      score_fn: ``f32[P, G] rewards -> f32[P]`` scores (higher = easier; NaN skipped).
      save_dir, save_every: automatic snapshots (off when either is unset / 0).

    Example::

        import numpy as np
        from jaxweight import curriculum
        from jaxweight.interop.tunix import CurriculumPromptIterator

        prompts = np.array([f"question {i}" for i in range(8)])
        it = CurriculumPromptIterator({"prompts": prompts}, curriculum.config("prioritized", capacity=8),
                                      batch_size=2, num_generations=3)
        batch = next(it)                # what tunix's learner.train(it, eval_ds=it.eval_batches(2)) reads
        rows = {k: np.repeat(v, 3) for k, v in batch.items()}          # tunix repeats each prompt G times
        it.metric_fn(rewards=np.linspace(0, 1, 6), **{k: v for k, v in rows.items() if k != "prompts"})
        assert int(it.state.total_updates) == 2    # one score per prompt; pass it.metric_fn in metric_fns
    """

    def __init__(self, data: Mapping[str, Any], cfg: curriculum.CurriculumConfig, *, batch_size: int,
                 num_generations: int, seed: int = 0, total_steps: int | None = None,
                 score_fn: Callable[[np.ndarray], np.ndarray] | None = None,
                 save_dir: str | os.PathLike | None = None, save_every: int = 0):
        if "prompts" not in data:
            raise ValueError(f"data must have a 'prompts' column, got columns {sorted(data)}")
        cols = {k: np.asarray(v) for k, v in data.items()}
        for k, v in cols.items():
            if v.ndim < 1 or v.shape[0] != cfg.capacity:
                raise ValueError(f"data[{k!r}] must have cfg.capacity={cfg.capacity} rows, got shape {v.shape}")
        for name, v, lo in (("batch_size", batch_size, 1), ("num_generations", num_generations, 1),
                            ("save_every", save_every, 0)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        self.data, self.cfg = cols, cfg
        self.batch_size, self.num_generations = int(batch_size), int(num_generations)
        self.total_steps = total_steps
        self.score_fn = group_mean_scores if score_fn is None else score_fn
        self.save_dir = None if save_dir is None else Path(save_dir)
        self.save_every = int(save_every)
        self.key = jax.random.key(seed)
        self.state = curriculum.init(cfg)
        self.draws = 0
        self._skip = 0
        self._lock = threading.Lock()
        self._sample = jax.jit(curriculum.sample, static_argnames="num")
        self._update = jax.jit(curriculum.update)

    # -- the dataset side
    def __iter__(self):
        return self

    def _rows(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[ids] for k, v in self.data.items()}

    def __next__(self) -> dict[str, np.ndarray]:
        with self._lock:
            if self._skip > 0:  # tunix's fast-forward after a resume: nothing drawn, nothing changed
                self._skip -= 1
                return self._rows(np.arange(self.batch_size) % self.cfg.capacity)
            k = self.draws
            step = None if self.total_steps is None else k
            ids = np.asarray(self._sample(self.state, jax.random.fold_in(self.key, k), self.cfg,
                                          num=self.batch_size, step=step, total_steps=self.total_steps))
            self.draws = k + 1
        batch = self._rows(np.maximum(ids, 0))
        batch[ITEM_ID_KEY] = ids.astype(np.int32)
        batch[DRAW_KEY] = np.full(ids.shape, k, np.int32)
        return batch

    def eval_batches(self, batch_size: int, item_ids: Any = None) -> list[dict[str, np.ndarray]]:
        """Batches over ``item_ids`` (default the whole pool, in order) that never update the curriculum.

        A last partial batch is dropped, as tunix needs equal batches.
        """
        ids = np.arange(self.cfg.capacity) if item_ids is None else np.asarray(item_ids, np.int64)
        n = (ids.shape[0] // batch_size) * batch_size
        return [self._rows(ids[i:i + batch_size]) for i in range(0, n, batch_size)]

    # -- the update side
    def metric_fn(self, prompts: Any = None, completions: Any = None, rewards: Any = None, advantages: Any = None,
                  **kwargs: Any) -> dict[str, tuple[float, Callable]]:
        """tunix metric function: apply a train batch's group scores to the curriculum.

        Args:
          rewards: f32[P*G] (tunix's layout).
          kwargs: the batch's other columns; ``"jaxweight_item_id"`` i32[P*G] and
            ``"jaxweight_draw"`` must be there (else: an eval batch, nothing happens).

        Returns:
          ``{"curriculum/...": (value, np.mean)}`` for tunix's metrics (empty for eval batches).
        """
        if ITEM_ID_KEY not in kwargs or DRAW_KEY not in kwargs or rewards is None:
            return {}
        g = self.num_generations
        ids = np.asarray(kwargs[ITEM_ID_KEY])
        if ids.ndim != 1 or ids.shape[0] % g or np.shape(rewards) != ids.shape:
            raise ValueError(f"item ids {ids.shape} and rewards {np.shape(rewards)} must be [P*G] with "
                             f"num_generations={g}: the iterator's num_generations must be the learner's")
        ids = ids.reshape(-1, g)
        if np.any(ids != ids[:, :1]):
            raise ValueError(f"item ids do not come in groups of num_generations={g}: the iterator's "
                             "num_generations must be the learner's")
        scores = np.asarray(self.score_fn(np.asarray(rewards, np.float32).reshape(-1, g)), np.float32)
        # the state after draw k's update is the state a run resumed at tunix step k + 1 draws from
        done = int(np.max(np.asarray(kwargs[DRAW_KEY]))) + 1
        with self._lock:
            self.state = self._update(self.state, ids[:, 0].astype(np.int32), scores, self.cfg)
            state = self.state
            if self.save_dir is not None and self.save_every and done % self.save_every == 0:
                self._save_locked(self.path_for(done), done)
        return {k: (float(v), np.mean) for k, v in curriculum.metrics_dict(state, self.cfg).items()}

    # -- resume
    def path_for(self, step: int) -> Path:
        """``save_dir/curriculum_{step}.ckpt``."""
        if self.save_dir is None:
            raise ValueError("save_dir is not set")
        return self.save_dir / f"curriculum_{int(step)}.ckpt"

    def _save_locked(self, path: Path, draws: int) -> Path:
        tree = {"state": self.state, "draws": jnp.asarray(draws, jnp.int32)}
        return checkpoint.save(path, tree, metadata={"draws": draws, "kind": "tunix.CurriculumPromptIterator"})

    def save(self, path: str | os.PathLike) -> Path:
        """Write the curriculum state and the number of draws (a jaxweight checkpoint)."""
        with self._lock:
            return self._save_locked(Path(path), self.draws)

    def restore(self, path: str | os.PathLike, step: int | None = None) -> int:
        """Load a snapshot; ``step`` = :func:`tunix_step` of the resumed learner.

        Args:
          path: a file written by :meth:`save`, or ``save_dir`` (then the file for ``step``).
          step: tunix's restored step counter: that many batches tunix will skip are answered
            with placeholders. None: no placeholders (a run driven by hand).

        Returns:
          the number of draws restored.

        Raises:
          ValueError: the snapshot's draws differ from ``step`` (the snapshot is not the one
            of that tunix checkpoint).
        """
        p = Path(path)
        if p.is_dir():
            if step is None:
                raise ValueError("restore(save_dir) needs the tunix step to pick the snapshot")
            p = p / f"curriculum_{int(step)}.ckpt"
        with self._lock:
            tree = checkpoint.load(p, {"state": self.state, "draws": jnp.asarray(0, jnp.int32)})
            draws = int(tree["draws"])
            if step is not None and draws != int(step):
                raise ValueError(f"{p}: snapshot after {draws} draws, but tunix resumes at step {step}")
            self.state, self.draws = tree["state"], draws
            self._skip = 0 if step is None else draws
        return draws
