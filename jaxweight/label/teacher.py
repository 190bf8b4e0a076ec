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
the random token of the URL that :meth:`HumanTeacher.start` returns.

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
      port: the port (0: any free one).
      token: the URL's secret (default: a fresh ``secrets.token_urlsafe(32)``).
      frame_ms: milliseconds per clip frame (default: the renderer's).
      progress: ``progress(round_index, labelled, requested)``, called on the
        thread that waits in :meth:`ask` whenever the count changes (see :func:`tqdm_progress`).
      announce: called with one line holding the URL when the server starts
        (default ``print``; None: silent).
      max_body: the largest request body accepted, in bytes.
      poll_s: how often a waiting :meth:`ask` checks that the server still runs.

    Raises:
      ValueError: no renderer for ``env``; a non-loopback ``host``; a bad port or token.
      jaxweight.StateFileError: a damaged log (other than a torn last line).
    """

    #: the teacher's name in the preference loop's checkpoint fingerprint
    #: (:func:`jaxweight.preference.host_teacher.teacher_kind`): a resume with another teacher is refused
    kind = "human"

    def __init__(self, log_path: str | os.PathLike, env: Any, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, frame_ms: int | None = None, progress: Progress | None = None,
                 announce: Callable[[str], Any] | None = print, max_body: int = MAX_BODY, poll_s: float = 0.25):
        if not (isinstance(poll_s, (int, float)) and 0 < poll_s <= 60):
            raise ValueError(f"poll_s must be in (0, 60] seconds, got {poll_s!r}")
        renderer = get_renderer(env)
        self.log = LabelLog(log_path)
        self.board = LabelBoard(self.log, renderer, frame_ms=frame_ms)
        self.server = LabelServer(self.board, host=host, port=port, token=token, max_body=max_body)
        self.progress = progress
        self.announce = announce
        self.poll_s = float(poll_s)
        self._asking = threading.Lock()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/?token=...``."""
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.token

    def start(self) -> str:
        """Start the server (idempotent) and return the URL to open; ``announce`` hears it once."""
        started = self.server.running
        url = self.server.start()
        if not started and self.announce is not None:
            self.announce(f"[label] compare clips at {url}")
        return url

    def ask(self, round_index: int, obs: Any, predicted: Any = None, *,
            timeout: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Publish a round's pairs and wait until a person has answered each one.

        Answers of this round already in the log (given for the same
        observations) are reused; a round whose pairs are all answered returns
        at once. Host side: JAX arrays are copied to the host once
        (``np.asarray``); nothing is compiled or run on a device.

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
            self.board.publish(round_index, obs, predicted)
            deadline = None if timeout is None else time.monotonic() + timeout
            shown = None
            while True:
                done, total = self.board.counts()
                if self.progress is not None and done != shown:
                    self.progress(int(round_index), done, total)
                    shown = done
                if done == total:
                    return self.board.answers()
                if not self.server.running:
                    raise RuntimeError(f"the labelling server stopped with {done} of {total} pairs of round "
                                       f"{round_index} answered (all are in {self.log.path})")
                wait = self.poll_s if deadline is None else min(self.poll_s, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError(f"round {round_index}: {done} of {total} pairs answered after {timeout} s")
                self.board.wait(wait)
        finally:
            self._asking.release()

    def close(self) -> None:
        """Stop the server (labels are already on disk); idempotent."""
        self.server.close()

    def __enter__(self) -> HumanTeacher:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
