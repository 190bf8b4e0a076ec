"""A person as the preference loop's teacher: :class:`HumanTeacher`.

``ask(round, obs, predicted)`` publishes a round's fragment pairs on the
labelling page, blocks the calling thread until a person has answered every
pair in a browser, and returns ``(prefs f32[P], valid bool[P])`` in the
convention of :func:`~jaxweight.preference.synthetic_teacher`: ``prefs`` is
the probability that the first (left) fragment is preferred (left 1.0, right
0.0, equal 0.5), ``valid`` is False for skipped pairs (their ``prefs`` 0.5).
Every answer is in the JSON-lines log before the page hears OK; a teacher made
on the same log after a crash reuses that round's answers and asks only the
rest. The server (uvicorn, on a daemon thread) binds to 127.0.0.1 and needs
the random token of the URL that :meth:`HumanTeacher.start` returns; with
``keep_address=True`` the token and port are kept beside the log
(:mod:`~jaxweight.label.address`), so a restarted run serves the same URL and
an open tab goes on.

Pairs with nothing to judge (the two clips have as many live steps, e.g. both
fallen all along or both up all along, or the two are identical:
:func:`~jaxweight.label.board.idle_pairs`) are not shown: they are answered
``"equal"`` (``idle=``; what the noiseless synthetic teacher answers, both
returns being the same), counted in
:attr:`HumanTeacher.rounds` and announced. The page ignores keys and clicks
for ``min_look_ms`` after a pair appears, and the round's last answer can be
undone for ``undo_s`` seconds after the round's last pair is answered (then
the loop takes the round).

Usage (a person answers in the browser)::

    teacher = HumanTeacher("out/labels.jsonl", "cartpole", progress=tqdm_progress())
    print(teacher.start())                          # http://127.0.0.1:PORT/?token=...
    prefs, valid = teacher.ask(0, pairs.obs, predicted)   # blocks until every pair is answered
    teacher.close()

In the preference loop it is the host teacher of
``PreferenceComparisons.train(..., teacher=teacher)`` (one run): each round the
driver asks it between the compiled programs ``collect_pairs`` and ``push``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .address import address_path, load_address, save_address
from .board import LabelBoard
from .log import LabelLog
from .render import get_renderer
from .server import MAX_BODY, LabelServer

__all__ = ["HumanTeacher", "tqdm_progress"]

#: ``progress(round_index, labelled, requested)``
Progress = Callable[[int, int, int], Any]


def tqdm_progress(desc: str = "labels") -> Progress:
    """A ``progress(round_index, labelled, requested)`` drawing one tqdm bar per round (host side)."""
    from tqdm.auto import tqdm

    state: dict[str, Any] = {"round": None, "bar": None}

    def progress(round_index: int, labelled: int, requested: int) -> None:
        if state["round"] != round_index:
            if state["bar"] is not None:
                state["bar"].close()
            state["round"] = round_index
            state["bar"] = tqdm(total=requested, desc=f"{desc} (round {round_index})", unit="pair",
                                initial=labelled, dynamic_ncols=True)
        bar = state["bar"]
        bar.update(labelled - bar.n)
        if labelled >= requested:
            bar.close()

    return progress


class HumanTeacher:
    """Preferences from a person in a browser; the host object the preference loop calls.

    Args:
      log_path: the JSON-lines label log (created if missing, read back if not).
      env: the environment id (``"cartpole"``, ``"pendulum"``) or a built-in
        environment object; picks the clip renderer.
      host: a loopback address to bind (default ``127.0.0.1``).
      port: the port (0: any free one; with ``keep_address``, the kept one if free).
      token: the URL's secret (default: the kept one with ``keep_address``, else a
        fresh ``secrets.token_urlsafe(32)``).
      frame_ms: milliseconds per clip frame (default: the renderer's).
      progress: ``progress(round_index, labelled, requested)``, called on the
        thread that waits in :meth:`ask` whenever the count changes (see :func:`tqdm_progress`).
      announce: called with one line holding the URL when the server starts, and
        with a line per round that has pairs answered by the rule (default ``print``; None: silent).
      max_body: the largest request body accepted, in bytes.
      poll_s: how often a waiting :meth:`ask` checks that the server still runs.
      idle: pairs with nothing to judge are answered ``"equal"`` (default),
        ``"skip"``-ped, or ``"ask"``-ed like the others.
      min_look_ms: the page ignores keys and clicks this long after a new pair appears.
      undo_s: seconds after a round's last answer during which it can still be
        undone, before :meth:`ask` returns (0: return at once).
      keep_address: keep the token and the port in ``<log stem>.page.json`` beside
        the log (mode 0600) and reuse them: a restarted run serves the same URL.

    Raises:
      ValueError: no renderer for ``env``; a non-loopback ``host``; a bad port,
        token, ``idle``, ``min_look_ms``, ``undo_s`` or ``poll_s``.
      jaxweight.StateFileError: a damaged log (other than a torn last line).
    """

    #: the teacher's name in the preference loop's checkpoint fingerprint
    #: (:func:`jaxweight.preference.host_teacher.teacher_kind`): a resume with another teacher is refused
    kind = "human"

    def __init__(self, log_path: str | os.PathLike, env: Any, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, frame_ms: int | None = None, progress: Progress | None = None,
                 announce: Callable[[str], Any] | None = print, max_body: int = MAX_BODY, poll_s: float = 0.25,
                 idle: str = "equal", min_look_ms: int = 400, undo_s: float = 2.0, keep_address: bool = False):
        if not (isinstance(poll_s, (int, float)) and 0 < poll_s <= 60):
            raise ValueError(f"poll_s must be in (0, 60] seconds, got {poll_s!r}")
        if isinstance(undo_s, bool) or not (isinstance(undo_s, (int, float)) and 0 <= undo_s <= 60):
            raise ValueError(f"undo_s must be in [0, 60] seconds, got {undo_s!r}")
        renderer = get_renderer(env)
        self.log = LabelLog(log_path)
        self.board = LabelBoard(self.log, renderer, frame_ms=frame_ms, idle=idle, min_look_ms=min_look_ms)
        self.address_file = address_path(log_path) if keep_address else None
        kept = None if self.address_file is None else load_address(self.address_file)
        self._kept_port = kept["port"] if kept is not None and port == 0 else None
        if kept is not None and token is None:
            token = kept["token"]
        self._server_args = dict(host=host, token=token, max_body=max_body)
        self.server = LabelServer(self.board, port=port if self._kept_port is None else self._kept_port,
                                  **self._server_args)
        self.progress = progress
        self.announce = announce
        self.poll_s = float(poll_s)
        self.undo_s = float(undo_s)
        #: per round asked: ``{"pairs", "asked", "by_rule", "skipped"}`` (see :meth:`LabelBoard.round_stats`)
        self.rounds: dict[int, dict[str, int]] = {}
        self._asking = threading.Lock()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/?token=...``."""
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.token

    def set_plan(self, schedule: Any, *, rounds_done: int = 0, tail_s: float | None = None) -> None:
        """The run's pairs per round, for the page's "round r of R, pairs k of N", the rounds a resumed run
        finished before and the evaluation's measured time (see :meth:`LabelBoard.set_plan`)."""
        self.board.set_plan(schedule, rounds_done=rounds_done, tail_s=tail_s)

    def start(self) -> str:
        """Start the server (idempotent) and return the URL to open; ``announce`` hears it once.

        With ``keep_address``, a kept port that is taken now gives way to a free
        one (announced: an open tab then needs the new URL), and the address is
        written beside the log once the server listens.

        Raises:
          OSError: the port cannot be bound.
        """
        started = self.server.running
        try:
            url = self.server.start()
        except OSError:
            if self._kept_port is None or started:
                raise
            if self.announce is not None:
                self.announce(f"[label] the page's earlier port {self._kept_port} is taken: it moves to a new one")
            self._kept_port = None
            self.server = LabelServer(self.board, port=0, **self._server_args)
            url = self.server.start()
        if not started:
            if self.address_file is not None:
                save_address(self.address_file, self.server.token, self.server.port)
            if self.announce is not None:
                self.announce(f"[label] compare clips at {url}")
        return url

    def ask(self, round_index: int, obs: Any, predicted: Any = None, *,
            timeout: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Publish a round's pairs and wait until a person has answered each one.

        Answers of this round already in the log (given for the same
        observations) are reused; a round whose pairs are all answered returns
        at once. Pairs with nothing to judge are answered by the ``idle`` rule
        without being shown. Once the last pair is answered, the answer can be
        undone for ``undo_s`` seconds; then the round is closed and returned.
        Host side: JAX arrays are copied to the host once (``np.asarray``);
        nothing is compiled or run on a device.

        Args:
          round_index: the loop's round (``>= 0``; the log keys answers by it).
          obs: ``f32[P, 2, T, D]`` observations of both fragments of each pair
            (``FragmentPairs.obs``: ``T = L + 1``); ``obs[p, 0]`` is shown on the left.
          predicted: ``f32[P]`` the reward model's probability that the left
            fragment is preferred, or None; the page shows how often its side
            (``> 0.5``: left) matches the person's on pairs answered left or right.
          timeout: seconds to wait at most (None: until done).

        Returns:
          ``(prefs f32[P], valid bool[P])``: ``prefs`` the probability that the
          first (left) fragment is preferred (left 1.0, right 0.0, equal 0.5,
          skip 0.5), ``valid`` False for skipped pairs only.

        Raises:
          ValueError: bad shapes (see :func:`~jaxweight.label.board.check_round_inputs`).
          RuntimeError: another ``ask`` is waiting, or the server stopped.
          TimeoutError: ``timeout`` passed first (the round stays open; its answers
            are kept, and asking the same round again goes on from them).
        """
        if not self._asking.acquire(blocking=False):
            raise RuntimeError("another ask() is waiting for answers: one round at a time")
        try:
            self.start()
            before = self.board.publish(round_index, obs, predicted)
            stats = self.board.round_stats()
            self.rounds[int(round_index)] = stats
            if stats["by_rule"] and self.announce is not None:
                self.announce(f"[label] round {int(round_index) + 1}: {stats['by_rule']} of {stats['pairs']} pairs "
                              f"have nothing to judge (both clips as many steps up, e.g. both fallen all along): "
                              f"answered "
                              f"{self.board.idle!r} by rule, {stats['asked']} asked")
            deadline = None if timeout is None else time.monotonic() + timeout
            shown = None
            settle = None  # when the round, all answered by the person here, is taken
            while True:
                done, total = self.board.counts()
                if self.progress is not None and done != shown:
                    self.progress(int(round_index), done, total)
                    shown = done
                if done == total:
                    answered_here = self.board.counts()[0] - before - stats["by_rule"] > 0
                    if not answered_here or self.undo_s == 0:
                        break
                    settle = time.monotonic() + self.undo_s if settle is None else settle
                    if time.monotonic() >= settle:
                        break
                else:
                    settle = None
                if not self.server.running:
                    raise RuntimeError(f"the labelling server stopped with {done} of {total} pairs of round "
                                       f"{round_index} answered (all are in {self.log.path})")
                now = time.monotonic()
                wait = self.poll_s if deadline is None else min(self.poll_s, deadline - now)
                if settle is not None:
                    wait = min(wait, max(settle - now, 0.0))
                if deadline is not None and wait <= 0 and done < total:
                    raise TimeoutError(f"round {round_index}: {done} of {total} pairs answered after {timeout} s")
                with self.board.cond:  # wakes on any answer or undo
                    self.board.cond.wait(max(wait, 0.001))
            self.board.close_round()
            self.rounds[int(round_index)] = self.board.round_stats()
            return self.board.answers()
        finally:
            self._asking.release()

    def finish(self, message: str) -> None:
        """Tell the page the run is over (``message``, e.g. where the results are): it shows so and stops asking."""
        self.board.set_phase("finished", message=message)

    def stopped(self, message: str) -> None:
        """Tell the page the run was stopped (``message``, e.g. how to resume)."""
        self.board.set_phase("stopped", message=message)

    def close(self, wait_s: float = 3.0) -> None:
        """Stop the server (labels are already on disk); idempotent.

        After :meth:`finish` or :meth:`stopped`, a page that asked within the last
        few seconds gets up to ``wait_s`` seconds to fetch that last state first.
        """
        board = self.board
        with board.cond:
            recent = board.last_poll is not None and time.monotonic() - board.last_poll < 5.0
            if board.snapshot()["phase"] in ("finished", "stopped") and recent and self.server.running:
                board.cond.wait_for(lambda: board.finished_seen, wait_s)
        self.server.close()

    def __enter__(self) -> HumanTeacher:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
