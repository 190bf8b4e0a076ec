"""The seam between the preference loop's compiled phases and a teacher on the host.

A host teacher (e.g. :class:`jaxweight.label.HumanTeacher`, a person on a
labelling page) has ``ask(round_index, obs f32[n, 2, L+1, D], predicted f32[n])
-> (prefs f32[n], valid bool[n])``: ``prefs`` is the probability that the first
fragment of each pair is preferred (the synthetic teacher's convention) and
``valid`` False leaves a pair unanswered (skipped). The driver runs the round's
``collect_pairs`` program, calls :func:`ask_teacher` between it and ``push``,
and fingerprints the teacher's :func:`teacher_kind` in its checkpoints.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

Array = jax.Array

__all__ = ["teacher_kind", "check_teacher", "ask_teacher"]


def teacher_kind(teacher: Any) -> str:
    """The fingerprint's name of a teacher: ``"synthetic"`` for None, else ``teacher.kind`` or its class name."""
    if teacher is None:
        return "synthetic"
    return str(getattr(teacher, "kind", None) or type(teacher).__name__)


def check_teacher(teacher: Any, num_seeds: int | None) -> None:
    """Refuse a teacher without ``ask`` or a host teacher asked to label several seeds (``ValueError``)."""
    if teacher is None:
        return
    if not callable(getattr(teacher, "ask", None)):
        raise ValueError(f"teacher must have ask(round_index, obs, predicted) -> (prefs, valid) (e.g. "
                         f"jaxweight.label.HumanTeacher), got {type(teacher).__name__}")
    if num_seeds is not None and num_seeds != 1:
        raise ValueError(f"a host teacher ({teacher_kind(teacher)}) labels one run: num_seeds must be None or 1, "
                         f"got {num_seeds}")


def ask_teacher(teacher: Any, i: int, n: int, pairs: Any, predicted: Array, batched: bool) -> tuple[np.ndarray, np.ndarray]:
    """Host: ``teacher.ask(i, obs[:n], predicted[:n])``, checked and padded to ``(prefs f32[P], valid bool[P])``.

    ``P`` is the plan's ``max_pairs``: past ``n`` the preferences are 0.5 and
    invalid (``push`` stores only the first ``n``).

    Raises:
      ValueError: answers of another shape, or a valid preference outside ``[0, 1]``.
    """
    obs, pred = jax.device_get((pairs.obs, predicted))
    obs, pred = (obs[0], pred[0]) if batched else (obs, pred)
    p_max = pred.shape[0]
    prefs, valid = teacher.ask(i, np.asarray(obs[:n], np.float32), np.asarray(pred[:n], np.float32))
    prefs, valid = np.asarray(prefs), np.asarray(valid)
    if prefs.shape != (n,) or valid.shape != (n,) or valid.dtype != bool:
        raise ValueError(f"the teacher's ask() must return (prefs f32[{n}], valid bool[{n}]) for round {i}, got "
                         f"shapes {prefs.shape} and {valid.shape} ({valid.dtype})")
    prefs = prefs.astype(np.float32)
    bad = valid & ~((prefs >= 0.0) & (prefs <= 1.0))  # NaN fails both comparisons
    if np.any(bad):
        raise ValueError(f"the teacher's preferences must lie in [0, 1]; round {i} has {prefs[bad][:3].tolist()}")
    full = np.full((p_max,), 0.5, np.float32)
    full[:n] = np.where(valid, prefs, 0.5)
    answered = np.zeros((p_max,), bool)
    answered[:n] = valid
    return (full[None], answered[None]) if batched else (full, answered)
