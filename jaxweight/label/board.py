"""The open round of the labelling page: its pairs, answers so far, clips, the model's agreement and the run's progress.

:class:`LabelBoard` is what the web server and :class:`~jaxweight.label.HumanTeacher`
share (no web code here). :meth:`~LabelBoard.publish` opens a round with its
observations ``f32[P, 2, T, D]`` (and the reward model's predicted
probabilities ``f32[P]`` that the left fragment is preferred); labels of that
round already in the log, given for the same observations, count as answered.
Pairs with nothing to judge are not asked (:func:`idle_pairs` says which:
the two clips have as many live steps, e.g. both fallen all along or both up
all along, so the noiseless synthetic teacher calls them equal; or the two
fragments are identical); they are answered by a rule, ``"equal"`` by default.
:meth:`~LabelBoard.submit` checks an answer, appends it to the
:class:`~jaxweight.label.LabelLog` (durable) and only then records it;
:meth:`~LabelBoard.undo` takes the round's last answer back (a new log line);
:meth:`~LabelBoard.wait` blocks until every pair is answered. A refused answer
is a :class:`LabelError` with the HTTP status the server answers with, and
changes nothing. :meth:`~LabelBoard.set_phase` tells the page what the run is
doing between rounds (preparing, training, evaluating, finished).

Example::

    import tempfile, pathlib
    import numpy as np
    from jaxweight.label.board import LabelBoard
    from jaxweight.label.log import LabelLog
    from jaxweight.label.render import get_renderer
    log = LabelLog(pathlib.Path(tempfile.mkdtemp()) / "labels.jsonl")
    board = LabelBoard(log, get_renderer("cartpole"))
    obs = np.zeros((3, 2, 5, 4), np.float32)  # 3 pairs of 4-step CartPole fragments, all upright ...
    obs[0, 1, 2:, 2] = 1.0                    # ... but in pair 0 the right pole falls at step 2,
    obs[1, 0, 3:, 2] = 1.0                    # in pair 1 the left one at step 3,
    obs[2, :, :, 2] = 1.0                     # and in pair 2 both were down all along: nothing to judge
    obs[2, 0, :, 0] = 1.0
    board.publish(0, obs, np.array([0.9, 0.2, 0.5], np.float32))
    board.submit(0, 0, "left")
    board.submit(0, 1, "skip")
    prefs, valid = board.answers()
    assert prefs.tolist() == [1.0, 0.5, 0.5] and valid.tolist() == [True, False, True]
    assert board.snapshot()["accuracy"] == {"agree": 1, "decided": 1}
    assert board.snapshot()["by_rule"] == 1
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .choices import CHOICES, choice_preference
from .log import UNDONE, LabelLog, LabelRecord, latest, pair_digest
from .render import Renderer, render_clip

__all__ = ["LabelBoard", "LabelError", "check_round_inputs", "idle_pairs", "IDLE_RULES", "PHASES"]

logger = logging.getLogger("jaxweight.label")

#: what a pair with nothing to judge gets: answered equal (the noiseless synthetic teacher's
#: answer, as both returns are the same), skipped (left out of training), or asked like any other
IDLE_RULES = ("equal", "skip", "ask")
#: what the run is doing, as the page shows it (``labelling``: a round is open)
PHASES = ("preparing", "labelling", "training", "evaluating", "finished", "stopped")
#: seconds per answer the time estimate assumes before the person has answered twice
_DEFAULT_LOOK_S = 6.0
#: a pair's low and high look time before the person has answered two
_LOOK_RANGE_S = (3.0, 10.0)


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


def idle_pairs(renderer: Renderer, obs: Any) -> np.ndarray:
    """``bool[P]``: the pairs of ``obs f32[P, 2, T, D]`` with nothing for a person to judge.

    With a renderer that says which frames are live (``Renderer.live``; for
    CartPole the steps it pays 1 for), a pair is idle when its two fragments
    have as many live steps after their first frame: both fallen (or absorbed)
    for every step, both up for every step, or both up for the same number of
    steps. Their returns are equal, so the noiseless synthetic teacher calls them
    equal, and the goal the page states tells them apart no better. A pair whose
    two fragments are the same observations is idle for every renderer.
    """
    a = np.asarray(obs, np.float32)
    same = np.all((a[:, 0] == a[:, 1]).reshape(a.shape[0], -1), axis=1)
    if renderer.live is None:
        return same
    steps = slice(1, None) if a.shape[2] > 1 else slice(None)
    live = np.asarray(renderer.live(a), bool)[..., steps].sum(-1)          # [P, 2] live steps per fragment
    return same | (live[:, 0] == live[:, 1])


@dataclasses.dataclass
class _Round:
    index: int
    obs: np.ndarray                  # f32[P, 2, T, D]
    predicted: np.ndarray | None     # f32[P]
    digests: list[str]
    idle: np.ndarray                 # bool[P]: answered by the rule, never asked
    nothing: np.ndarray              # bool[P]: nothing to judge (idle_pairs), asked or not
    labels: dict[int, LabelRecord]   # pair -> the person's answer, in the order they stand
    opened: float                    # time.monotonic() at publish
    closed: bool = False             # the loop took the answers: nothing changes any more


class LabelBoard:
    """The round being labelled and the run around it (thread-safe; one open round at a time).

    Args:
      log: where answers are appended (and earlier ones read back from).
      renderer: draws the clips.
      frame_ms: milliseconds per clip frame (default: the renderer's).
      idle: what pairs with nothing to judge (:func:`idle_pairs`) get: ``"equal"``
        (default), ``"skip"`` or ``"ask"`` (:data:`IDLE_RULES`).
      min_look_ms: the page ignores keys and clicks for this long after a new
        pair appears (a double press never answers a pair nobody saw).

    Raises:
      ValueError: an unknown ``idle`` rule or ``min_look_ms`` outside ``[0, 10000]``.
    """

    def __init__(self, log: LabelLog, renderer: Renderer, *, frame_ms: int | None = None, idle: str = "equal",
                 min_look_ms: int = 400):
        if idle not in IDLE_RULES:
            raise ValueError(f"idle must be one of {list(IDLE_RULES)}, got {idle!r}")
        if isinstance(min_look_ms, bool) or not isinstance(min_look_ms, int) or not 0 <= min_look_ms <= 10_000:
            raise ValueError(f"min_look_ms must be an int in [0, 10000] milliseconds, got {min_look_ms!r}")
        self.log = log
        self.renderer = renderer
        self.frame_ms = frame_ms
        self.idle = idle
        self.min_look_ms = min_look_ms
        self.cond = threading.Condition()
        self._round: _Round | None = None
        self._clips: dict[tuple[int, int, int], bytes] = {}
        self._schedule: tuple[int, ...] | None = None
        self._phase, self._message, self._phase_eta, self._phase_since = "preparing", None, None, time.monotonic()
        self._answer_gaps: list[float] = []    # seconds between a person's consecutive answers (this session)
        self._last_answer: float | None = None
        self._round_gaps: list[float] = []     # seconds from a round's close to the next one's publish
        self._closed_at: float | None = None
        self._asked = self._by_rule = 0        # pairs over the rounds published this session
        self._rounds_done = 0                  # rounds finished before this session (a resumed run)
        self._tail_s: float | None = None      # the evaluation after the last round, as measured before
        self._run_agree = [0, 0]               # (agree, decided) over the closed rounds of this session
        self.last_poll: float | None = None    # time.monotonic() of the page's last state request
        self.finished_seen = False             # a page has fetched the finished state

    # ------------------------------------------------------------ host side
    def set_plan(self, schedule: Sequence[int], *, rounds_done: int = 0, tail_s: float | None = None) -> None:
        """The run's pairs per round (the loop plan's ``schedule``): the page shows round r of R, k of N pairs.

        Args:
          schedule: pairs per round.
          rounds_done: rounds a resumed run finished before (their pairs count as done from the start,
            and the next round's answers already in the label log too).
          tail_s: seconds the evaluation after the last round took before (None: unknown), added to
            the time left and shown while it runs.

        Raises:
          ValueError: not a non-empty sequence of ints >= 0; ``rounds_done`` outside ``[0, len(schedule)]``;
            a negative ``tail_s``.
        """
        sched = tuple(schedule)
        if not sched or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in sched):
            raise ValueError(f"schedule must be a non-empty sequence of ints >= 0 (pairs per round), got {schedule!r}")
        if isinstance(rounds_done, bool) or not isinstance(rounds_done, (int, np.integer)) or \
                not 0 <= rounds_done <= len(sched):
            raise ValueError(f"rounds_done must be an int in [0, {len(sched)}], got {rounds_done!r}")
        if tail_s is not None and not (isinstance(tail_s, (int, float)) and tail_s >= 0):
            raise ValueError(f"tail_s must be None or seconds >= 0, got {tail_s!r}")
        with self.cond:
            self._schedule = tuple(int(n) for n in sched)
            self._rounds_done = int(rounds_done)
            self._tail_s = None if tail_s is None else float(tail_s)

    def set_phase(self, phase: str, *, message: str | None = None, eta_s: float | None = None) -> None:
        """What the run does while no round is open, for the page (e.g. ``"preparing"`` with the compile's ``eta_s``).

        Args:
          phase: one of :data:`PHASES`.
          message: a line the page shows (e.g. ``"results in out/cartpole.json"`` when finished).
          eta_s: how long the phase is expected to take, in seconds (None: unknown).

        Raises:
          ValueError: an unknown phase or a negative ``eta_s``.
        """
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {list(PHASES)}, got {phase!r}")
        if eta_s is not None and not (isinstance(eta_s, (int, float)) and eta_s >= 0):
            raise ValueError(f"eta_s must be None or seconds >= 0, got {eta_s!r}")
        with self.cond:
            self._phase, self._message, self._phase_eta = phase, message, eta_s
            self._phase_since = time.monotonic()
            self.cond.notify_all()

    def publish(self, round_index: int, obs: Any, predicted: Any = None) -> int:
        """Open round ``round_index`` with pairs ``obs f32[P, 2, T, D]`` and ``predicted f32[P]`` (or None).

        Answers of this round already in the log whose digest matches the pair
        are reused (the latest line of each pair); others for this round (other
        observations) are left in the log, unused, with a warning. Pairs with
        nothing to judge (:func:`idle_pairs`) are answered by the ``idle`` rule
        and never shown, unless the rule is ``"ask"`` or the log holds a person's answer.

        Returns:
          How many pairs were already answered from the log.

        Raises:
          ValueError: the shapes of :func:`check_round_inputs`.
        """
        r, a, pred = check_round_inputs(round_index, obs, predicted, self.renderer.obs_dim)
        digests = [pair_digest(a[p]) for p in range(a.shape[0])]
        mine = latest(x for x in self.log.records if x.round == r)
        labels = {p: rec for p, rec in mine.items() if p < len(digests) and rec.digest == digests[p]}
        stale = len(mine) - len(labels)
        if stale:
            logger.warning("label log %s: %d label(s) of round %d answer other observations than this round's; "
                           "they stay in the log, unused, and those pairs are asked again", self.log.path, stale, r)
        nothing = idle_pairs(self.renderer, a)
        idle = np.zeros((a.shape[0],), bool) if self.idle == "ask" else nothing.copy()
        idle[list(labels)] = False  # a person's answer in the log stands
        now = time.monotonic()
        with self.cond:
            if self._closed_at is not None:
                self._round_gaps.append(now - self._closed_at)
                self._closed_at = None
            self._round = _Round(r, a, pred, digests, idle, nothing, labels, now)
            self._clips = {}
            self._last_answer = None
            self._asked += int((~idle).sum())
            self._by_rule += int(idle.sum())
            self._phase, self._message, self._phase_eta = "labelling", None, None
            self.cond.notify_all()
        return len(labels)

    def close_round(self) -> None:
        """The loop took the open round's answers: later answers and undos of it are refused (409)."""
        with self.cond:
            if self._round is not None and not self._round.closed:
                self._round.closed = True
                a = _agreement(self._round)
                if a is not None:
                    self._run_agree[0] += a["agree"]
                    self._run_agree[1] += a["decided"]
                self._closed_at = time.monotonic()
                self._phase = "training"
                self._phase_since = self._closed_at
                self.cond.notify_all()

    def answers(self) -> tuple[np.ndarray, np.ndarray]:
        """``(prefs f32[P], valid bool[P])`` of the open round (unanswered pairs: 0.5, False).

        ``prefs`` is the probability that the left (first) fragment is preferred
        (see :func:`jaxweight.label.choice_preference`); pairs answered by the
        rule are ``(0.5, True)`` with ``idle="equal"``, ``(0.5, False)`` with ``"skip"``.

        Raises:
          RuntimeError: no round was published.
        """
        with self.cond:
            rd = self._require_round()
            n = rd.obs.shape[0]
            prefs = np.full((n,), 0.5, np.float32)
            valid = np.zeros((n,), bool)
            valid[rd.idle] = self.idle == "equal"
            for p, rec in rd.labels.items():
                prefs[p], valid[p] = choice_preference(rec.choice)
            return prefs, valid

    def counts(self) -> tuple[int, int]:
        """``(answered, requested)`` of the open round, pairs answered by the rule included (``(0, 0)`` before any)."""
        with self.cond:
            rd = self._round
            return (0, 0) if rd is None else (len(rd.labels) + int(rd.idle.sum()), rd.obs.shape[0])

    def round_stats(self) -> dict[str, int]:
        """The open round's ``{"pairs", "asked", "by_rule", "skipped"}``: pairs, pairs shown to the person,
        pairs answered by the rule (nothing to judge), the person's skips."""
        with self.cond:
            rd = self._require_round()
            return {"pairs": int(rd.obs.shape[0]), "asked": int((~rd.idle).sum()), "by_rule": int(rd.idle.sum()),
                    "skipped": sum(rec.choice == "skip" for rec in rd.labels.values())}

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every pair of the open round is answered or ``timeout`` seconds pass; True when done."""
        with self.cond:
            return self.cond.wait_for(self._done, timeout)

    def _done(self) -> bool:
        rd = self._round
        return rd is not None and len(rd.labels) + int(rd.idle.sum()) == rd.obs.shape[0]

    def _require_round(self) -> _Round:
        if self._round is None:
            raise RuntimeError("no round has been published yet")
        return self._round

    # ------------------------------------------------------------ page side
    def _open_round(self, round_index: Any, pair: Any) -> _Round:
        for name, v in (("round", round_index), ("pair", pair)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise LabelError(400, f"{name} must be an integer, got {v!r}")
        rd = self._round
        if rd is None:
            raise LabelError(409, "no round is open yet")
        if round_index != rd.index:
            raise LabelError(409, f"round {round_index} is not open (the open round is {rd.index})")
        if rd.closed:
            raise LabelError(409, f"round {rd.index} is closed: its answers went to training")
        if not 0 <= pair < rd.obs.shape[0]:
            raise LabelError(404, f"round {rd.index} has no pair {pair} (pairs 0..{rd.obs.shape[0] - 1})")
        return rd

    def submit(self, round_index: Any, pair: Any, choice: Any) -> dict[str, Any]:
        """Record one answer durably (log line fsync-ed first); returns :meth:`snapshot`.

        Raises:
          LabelError: 400 ``round`` / ``pair`` not ints or ``choice`` not a string;
            409 no round open, another round open, the round closed, the pair
            already answered or answered by the rule; 404 no such pair; 422 an
            unknown choice; 500 the log could not be written (nothing recorded).
        """
        if not isinstance(choice, str):
            raise LabelError(400, f"choice must be a string, got {choice!r}")
        with self.cond:
            rd = self._open_round(round_index, pair)
            if choice not in CHOICES:
                raise LabelError(422, f"choice must be one of {list(CHOICES)}, got {choice!r}")
            if pair in rd.labels:
                raise LabelError(409, f"pair {pair} of round {rd.index} is already labelled "
                                      f"({rd.labels[pair].choice!r}); undo it first to change it")
            if rd.idle[pair]:
                raise LabelError(409, f"pair {pair} of round {rd.index} has nothing to judge: it is answered "
                                      f"{self.idle!r} by the rule")
            rec = LabelRecord(round=rd.index, pair=pair, choice=choice, time=time.time(), digest=rd.digests[pair])
            self._append(rec)
            rd.labels[pair] = rec
            now = time.monotonic()
            if self._last_answer is not None:
                self._answer_gaps.append(min(now - self._last_answer, 120.0))
            self._last_answer = now
            self.cond.notify_all()
            return self._snapshot()

    def undo(self, round_index: Any, pair: Any) -> dict[str, Any]:
        """Take back the open round's last answer (``pair`` must be it): a new ``"undone"`` log line, fsync-ed;
        the pair is asked again. Returns :meth:`snapshot`.

        Raises:
          LabelError: 400 not ints; 409 no round open, another round, the round
            closed, or ``pair`` is not the round's last answer; 404 no such pair;
            500 the log could not be written (nothing changed).
        """
        with self.cond:
            rd = self._open_round(round_index, pair)
            last = next(reversed(rd.labels), None)
            if last != pair:
                raise LabelError(409, f"only the round's last answer can be undone (pair {last}), not pair {pair}"
                                 if last is not None else f"round {rd.index} has no answer to undo")
            self._append(LabelRecord(round=rd.index, pair=pair, choice=UNDONE, time=time.time(),
                                     digest=rd.digests[pair]))
            del rd.labels[pair]
            self._last_answer = None  # the time spent undoing is not a look
            self.cond.notify_all()
            return self._snapshot()

    def _append(self, rec: LabelRecord) -> None:
        try:
            self.log.append(rec)  # durable before anyone hears OK
        except OSError as e:
            raise LabelError(500, f"the label could not be saved ({e}); nothing was recorded") from None

    def snapshot(self) -> dict[str, Any]:
        """The page's view (JSON-ready): phase, round r of R, pairs k of N, the next pairs, the last answer,
        the model's agreement and an estimate of the time left."""
        with self.cond:
            return self._snapshot()

    def poll(self) -> dict[str, Any]:
        """:meth:`snapshot` for the page, remembering when it asked (the host waits for it to see the end)."""
        with self.cond:
            snap = self._snapshot()
            self.last_poll = time.monotonic()
            if snap["phase"] in ("finished", "stopped"):
                self.finished_seen = True
                self.cond.notify_all()
            return snap

    def _snapshot(self) -> dict[str, Any]:
        rd = self._round
        sched = self._schedule
        base: dict[str, Any] = {
            "env": self.renderer.name, "goal": self.renderer.goal, "phase": self._phase, "message": self._message,
            "phase_eta_s": None if self._phase_eta is None else max(
                0.0, self._phase_eta - (time.monotonic() - self._phase_since)),
            "rounds": None if sched is None else len(sched), "min_look_ms": self.min_look_ms, "idle_rule": self.idle,
            "round": None, "requested": 0, "labelled": 0, "asked": 0, "answered": 0, "by_rule": 0, "done": False,
            "pair": None, "upcoming": None, "digest": None, "upcoming_digest": None, "accuracy": None, "last": None,
            "overall": None if sched is None else {"done": self._done_before(sched), "total": sum(sched)},
            "left_s": None, "left_range_s": None, "run_agreement": self._run_agreement(rd),
        }
        if self._phase == "evaluating":  # what is left is the evaluation: its measured time, if any
            eta = base["phase_eta_s"]
            base["left_s"] = eta
            base["left_range_s"] = None if eta is None else [eta, eta]
        if rd is None:
            return base
        todo = [p for p in range(rd.obs.shape[0]) if p not in rd.labels and not rd.idle[p]]
        nxt = todo[0] if todo else None
        upcoming = todo[1] if len(todo) > 1 else None
        last = next(reversed(rd.labels), None)
        labelled = len(rd.labels) + int(rd.idle.sum())
        out = {
            **base, "round": rd.index, "requested": int(rd.obs.shape[0]), "labelled": labelled,
            "asked": int((~rd.idle).sum()), "answered": len(rd.labels), "by_rule": int(rd.idle.sum()),
            "done": not todo, "closed": rd.closed, "pair": nxt, "upcoming": upcoming,
            "digest": None if nxt is None else rd.digests[nxt],
            "upcoming_digest": None if upcoming is None else rd.digests[upcoming],
            "accuracy": _agreement(rd),
            "last": None if last is None or rd.closed else {"pair": last, "choice": rd.labels[last].choice},
        }
        if sched is not None:
            r = min(rd.index, len(sched))
            done = sum(sched[:r]) + (rd.obs.shape[0] if rd.closed else labelled)
            out["overall"] = {"done": int(min(done, sum(sched))), "total": sum(sched)}
            if self._phase != "evaluating":
                out["left_s"] = self._left_s(rd, sched, len(todo))
                out["left_range_s"] = self._left_range_s(rd, sched, len(todo))
        return out

    def _done_before(self, sched: tuple[int, ...]) -> int:
        """Pairs done before any round of this session opens: the rounds a resumed run finished, and the
        next round's pairs already answered in the label log."""
        k = min(self._rounds_done, len(sched))
        logged = 0 if k >= len(sched) else sum(rec.choice != "undone" for rec in
                                                latest(x for x in self.log.records if x.round == k).values())
        return int(min(sum(sched[:k]) + min(logged, sched[k] if k < len(sched) else 0), sum(sched)))

    def _run_agreement(self, rd: _Round | None) -> dict[str, int]:
        """``{"agree", "decided"}`` over this session's rounds: pairs with something to judge that the
        person answered left or right, the open round included."""
        agree, decided = self._run_agree
        if rd is not None and not rd.closed:
            a = _agreement(rd)
            if a is not None:
                agree, decided = agree + a["agree"], decided + a["decided"]
        return {"agree": int(agree), "decided": int(decided)}

    def _left_range_s(self, rd: _Round, sched: tuple[int, ...], todo: int) -> list[float]:
        """``[low, high]`` seconds left: the person's pace as the quartiles of their answer gaps (3 to 10 s a
        pair before two answers), the training between rounds as its shortest and longest so far, and the
        evaluation as measured before."""
        if len(self._answer_gaps) >= 2:
            lo_look, hi_look = (float(q) for q in np.percentile(self._answer_gaps, [25, 75]))
        else:
            lo_look, hi_look = _LOOK_RANGE_S
        seen = self._asked + self._by_rule
        share = self._asked / seen if seen else 1.0
        later = sched[rd.index + 1:] if rd.index + 1 <= len(sched) else ()
        gaps = self._round_gaps or [0.0]
        tail = self._tail_s or 0.0
        pairs = todo + share * sum(later)
        return [float(lo_look * pairs + min(gaps) * len(later) + tail),
                float(hi_look * pairs + max(gaps) * len(later) + tail)]

    def _left_s(self, rd: _Round, sched: tuple[int, ...], todo: int) -> float:
        """Seconds left: the pairs still to answer at the person's pace so far (6 s a pair before two answers,
        times the share of pairs asked), plus the training between rounds as measured (nothing before it is)."""
        look = float(np.median(self._answer_gaps)) if self._answer_gaps else _DEFAULT_LOOK_S
        seen = self._asked + self._by_rule
        share = self._asked / seen if seen else 1.0
        later = sched[rd.index + 1:] if rd.index + 1 <= len(sched) else ()
        gap = float(np.mean(self._round_gaps)) if self._round_gaps else 0.0
        return float(look * (todo + share * sum(later)) + gap * len(later))

    def session_stats(self) -> dict[str, int]:
        """Over the rounds published on this board: ``{"asked", "by_rule"}`` pairs."""
        with self.cond:
            return {"asked": self._asked, "by_rule": self._by_rule}

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
    answered equal or skip, pairs with nothing to judge (:func:`idle_pairs`:
    their returns tie, so neither side is right; asked with ``idle="ask"``) and
    pairs whose prediction is not in ``[0, 1]`` are not decided.
    """
    if rd.predicted is None:
        return None
    agree = decided = 0
    for p, rec in rd.labels.items():
        q = float(rd.predicted[p])
        if rec.choice not in ("left", "right") or not 0.0 <= q <= 1.0 or rd.nothing[p]:
            continue
        decided += 1
        agree += int((q > 0.5) == (rec.choice == "left"))
    return {"agree": agree, "decided": decided}
