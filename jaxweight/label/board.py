"""The open round of the labelling page: its pairs, answers so far, clips and the model's agreement.

:class:`LabelBoard` is what the web server and :class:`~jaxweight.label.HumanTeacher`
share (no web code here). :meth:`~LabelBoard.publish` opens a round with its
observations ``f32[P, 2, T, D]`` (and the reward model's predicted
probabilities ``f32[P]`` that the left fragment is preferred); labels of that
round already in the log, given for the same observations, count as answered.
:meth:`~LabelBoard.submit` checks an answer, appends it to the
:class:`~jaxweight.label.LabelLog` (durable) and only then records it;
:meth:`~LabelBoard.wait` blocks until every pair is answered. A refused answer
is a :class:`LabelError` with the HTTP status the server answers with, and
changes nothing.

Example::

    import tempfile, pathlib
    import numpy as np
    from jaxweight.label.board import LabelBoard
    from jaxweight.label.log import LabelLog
    from jaxweight.label.render import get_renderer
    log = LabelLog(pathlib.Path(tempfile.mkdtemp()) / "labels.jsonl")
    board = LabelBoard(log, get_renderer("cartpole"))
    board.publish(0, np.zeros((2, 2, 5, 4), np.float32), np.array([0.9, 0.2], np.float32))
    board.submit(0, 0, "left")
    board.submit(0, 1, "skip")
    prefs, valid = board.answers()
    assert prefs.tolist() == [1.0, 0.5] and valid.tolist() == [True, False]
    assert board.snapshot()["accuracy"] == {"agree": 1, "decided": 1}
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import numpy as np

from .choices import CHOICES, choice_preference
from .log import LabelLog, LabelRecord, pair_digest
from .render import Renderer, render_clip

__all__ = ["LabelBoard", "LabelError", "check_round_inputs"]

logger = logging.getLogger("jaxweight.label")


class LabelError(Exception):
    """A refused request: ``status`` is the HTTP status to answer with, ``message`` says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def check_round_inputs(round_index: Any, obs: Any, predicted: Any, obs_dim: int | None
                       ) -> tuple[int, np.ndarray, np.ndarray | None]:
    """``(round, obs f32[P, 2, T, D], predicted f32[P] | None)`` on the host, checked.

    Raises:
      ValueError: ``round_index`` not an int >= 0; ``obs`` not ``[P, 2, T, D]``
        with ``P, T >= 1`` and the renderer's ``D``; ``predicted`` not ``[P]``.
    """
    if isinstance(round_index, bool) or not isinstance(round_index, (int, np.integer)) or round_index < 0:
        raise ValueError(f"round_index must be an int >= 0, got {round_index!r}")
    a = np.asarray(obs, dtype=np.float32)
    if a.ndim != 4 or a.shape[1] != 2 or a.shape[0] < 1 or a.shape[2] < 1:
        raise ValueError(f"obs must have shape (P, 2, T, D) with P, T >= 1 (two fragments of T frames per pair), "
                         f"got {a.shape}")
    if obs_dim is not None and a.shape[3] != obs_dim:
        raise ValueError(f"obs must have D = {obs_dim} values per frame for this environment, got shape {a.shape}")
    pred = None
    if predicted is not None:
        pred = np.asarray(predicted, dtype=np.float32)
        if pred.shape != (a.shape[0],):
            raise ValueError(f"predicted must have shape ({a.shape[0]},) (one probability per pair), got {pred.shape}")
    return int(round_index), a, pred


@dataclasses.dataclass
class _Round:
    index: int
    obs: np.ndarray                  # f32[P, 2, T, D]
    predicted: np.ndarray | None     # f32[P]
    digests: list[str]
    labels: dict[int, LabelRecord]   # pair -> answer


class LabelBoard:
    """The round being labelled (thread-safe; one open round at a time).

    Args:
      log: where answers are appended (and earlier ones read back from).
      renderer: draws the clips.
      frame_ms: milliseconds per clip frame (default: the renderer's).
    """

    def __init__(self, log: LabelLog, renderer: Renderer, *, frame_ms: int | None = None):
        self.log = log
        self.renderer = renderer
        self.frame_ms = frame_ms
        self.cond = threading.Condition()
        self._round: _Round | None = None
        self._clips: dict[tuple[int, int, int], bytes] = {}

    # ------------------------------------------------------------ host side
    def publish(self, round_index: int, obs: Any, predicted: Any = None) -> int:
        """Open round ``round_index`` with pairs ``obs f32[P, 2, T, D]`` and ``predicted f32[P]`` (or None).

        Answers of this round already in the log whose digest matches the pair
        are reused; others for this round (other observations) are left in the
        log, unused, with a warning.

        Returns:
          How many pairs were already answered from the log.

        Raises:
          ValueError: the shapes of :func:`check_round_inputs`.
        """
        r, a, pred = check_round_inputs(round_index, obs, predicted, self.renderer.obs_dim)
        digests = [pair_digest(a[p]) for p in range(a.shape[0])]
        labels: dict[int, LabelRecord] = {}
        stale = 0
        for rec in [x for x in self.log.records if x.round == r]:
            if rec.pair < len(digests) and rec.digest == digests[rec.pair]:
                labels.setdefault(rec.pair, rec)
            else:
                stale += 1
        if stale:
            logger.warning("label log %s: %d label(s) of round %d answer other observations than this round's; "
                           "they stay in the log, unused, and those pairs are asked again", self.log.path, stale, r)
        with self.cond:
            self._round = _Round(r, a, pred, digests, labels)
            self._clips = {}
            self.cond.notify_all()
        return len(labels)

    def answers(self) -> tuple[np.ndarray, np.ndarray]:
        """``(prefs f32[P], valid bool[P])`` of the open round (unanswered pairs: 0.5, False).

        ``prefs`` is the probability that the left (first) fragment is preferred
        (see :func:`jaxweight.label.choice_preference`).

        Raises:
          RuntimeError: no round was published.
        """
        with self.cond:
            rd = self._require_round()
            n = rd.obs.shape[0]
            prefs = np.full((n,), 0.5, np.float32)
            valid = np.zeros((n,), bool)
            for p, rec in rd.labels.items():
                prefs[p], valid[p] = choice_preference(rec.choice)
            return prefs, valid

    def counts(self) -> tuple[int, int]:
        """``(answered, requested)`` of the open round (``(0, 0)`` before any)."""
        with self.cond:
            rd = self._round
            return (0, 0) if rd is None else (len(rd.labels), rd.obs.shape[0])

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every pair of the open round is answered or ``timeout`` seconds pass; True when done."""
        with self.cond:
            return self.cond.wait_for(self._done, timeout)

    def _done(self) -> bool:
        rd = self._round
        return rd is not None and len(rd.labels) == rd.obs.shape[0]

    def _require_round(self) -> _Round:
        if self._round is None:
            raise RuntimeError("no round has been published yet")
        return self._round

    # ------------------------------------------------------------ page side
    def submit(self, round_index: Any, pair: Any, choice: Any) -> dict[str, Any]:
        """Record one answer durably (log line fsync-ed first); returns :meth:`snapshot`.

        Raises:
          LabelError: 400 ``round`` / ``pair`` not ints or ``choice`` not a string;
            409 no round open, another round open or the pair already answered;
            404 no such pair; 422 an unknown choice; 500 the log could not be
            written (nothing recorded).
        """
        for name, v in (("round", round_index), ("pair", pair)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise LabelError(400, f"{name} must be an integer, got {v!r}")
        if not isinstance(choice, str):
            raise LabelError(400, f"choice must be a string, got {choice!r}")
        with self.cond:
            rd = self._round
            if rd is None:
                raise LabelError(409, "no round is open yet")
            if round_index != rd.index:
                raise LabelError(409, f"round {round_index} is not open (the open round is {rd.index})")
            if not 0 <= pair < rd.obs.shape[0]:
                raise LabelError(404, f"round {rd.index} has no pair {pair} (pairs 0..{rd.obs.shape[0] - 1})")
            if choice not in CHOICES:
                raise LabelError(422, f"choice must be one of {list(CHOICES)}, got {choice!r}")
            if pair in rd.labels:
                raise LabelError(409, f"pair {pair} of round {rd.index} is already labelled "
                                      f"({rd.labels[pair].choice!r})")
            rec = LabelRecord(round=rd.index, pair=pair, choice=choice, time=time.time(), digest=rd.digests[pair])
            try:
                self.log.append(rec)  # durable before anyone hears OK
            except OSError as e:
                raise LabelError(500, f"the label could not be saved ({e}); nothing was recorded") from None
            rd.labels[pair] = rec
            self.cond.notify_all()
            return self._snapshot()

    def snapshot(self) -> dict[str, Any]:
        """The page's view (JSON-ready): round, requested, labelled, done, the next pairs, accuracy."""
        with self.cond:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        base = {"env": self.renderer.name, "goal": self.renderer.goal}
        rd = self._round
        if rd is None:
            return {**base, "round": None, "requested": 0, "labelled": 0, "done": False, "pair": None,
                    "upcoming": None, "digest": None, "upcoming_digest": None, "accuracy": None}
        todo = [p for p in range(rd.obs.shape[0]) if p not in rd.labels]
        nxt = todo[0] if todo else None
        upcoming = todo[1] if len(todo) > 1 else None
        return {
            **base, "round": rd.index, "requested": int(rd.obs.shape[0]), "labelled": len(rd.labels),
            "done": not todo, "pair": nxt, "upcoming": upcoming,
            "digest": None if nxt is None else rd.digests[nxt],
            "upcoming_digest": None if upcoming is None else rd.digests[upcoming],
            "accuracy": _agreement(rd),
        }

    def clip(self, round_index: int, pair: int, side: int) -> bytes:
        """The GIF of fragment ``side`` (0 left, 1 right) of a pair of the open round (rendered once, cached).

        Raises:
          LabelError: 404 no such round, pair or side.
        """
        with self.cond:
            rd = self._round
            if rd is None or round_index != rd.index:
                raise LabelError(404, f"round {round_index} is not open")
            if not 0 <= pair < rd.obs.shape[0] or side not in (0, 1):
                raise LabelError(404, f"round {rd.index} has no clip {pair}/{side}")
            key = (rd.index, pair, side)
            cached = self._clips.get(key)
            obs = rd.obs[pair, side]
        if cached is not None:
            return cached
        gif = render_clip(self.renderer, obs, frame_ms=self.frame_ms)  # outside the lock: labels never wait on it
        with self.cond:
            if self._round is rd:
                self._clips[key] = gif
        return gif


def _agreement(rd: _Round) -> dict[str, int] | None:
    """How often the model's predicted side matches the person's, on answered left/right pairs.

    The model predicts "left" when ``predicted > 0.5`` (as
    :func:`~jaxweight.preference.evaluation.preference_accuracy` ranks the
    first fragment higher only when its return is strictly higher); pairs
    answered equal or skip, and pairs whose prediction is not in ``[0, 1]``,
    are not decided.
    """
    if rd.predicted is None:
        return None
    agree = decided = 0
    for p, rec in rd.labels.items():
        q = float(rd.predicted[p])
        if rec.choice not in ("left", "right") or not 0.0 <= q <= 1.0:
            continue
        decided += 1
        agree += int((q > 0.5) == (rec.choice == "left"))
    return {"agree": agree, "decided": decided}
