"""The label log: one JSON line per answer, durable before the page hears OK.

Each line is a :class:`LabelRecord`::

    {"round": 3, "pair": 17, "choice": "left", "time": 1767225600.12, "digest": "9f2c..."}

``round`` and ``pair`` say which question it answers (pair ``p`` of the
observations passed to ``HumanTeacher.ask`` for that round), ``choice`` is one
of :data:`~jaxweight.label.CHOICES` or ``"undone"`` (:data:`UNDONE`: the
person took the pair's answer back), ``time`` the Unix time it arrived and
``digest`` a hash of the pair's observations (:func:`pair_digest`): a label is
reused only for the pair it was given for. The log is append-only: a revision
is a new line, and the *latest* line of a pair is its answer (``"undone"``:
none), for a resume and for training alike. :meth:`LabelLog.append` writes the
line, flushes and ``os.fsync``-s the file (and its folder when it creates the
file) before returning. On open the log is read back: a last line cut short by
a crash (no newline, or not JSON) is dropped with a warning and cut off the
file, so the next append starts on a clean line; a bad line anywhere else is
:class:`jaxweight.StateFileError` naming the file and the line.

Example::

    import tempfile, pathlib
    from jaxweight.label.log import LabelLog, LabelRecord
    path = pathlib.Path(tempfile.mkdtemp()) / "labels.jsonl"
    log = LabelLog(path)
    log.append(LabelRecord(round=0, pair=1, choice="left", time=0.0, digest="ab"))
    log.append(LabelRecord(round=0, pair=1, choice="undone", time=1.0, digest="ab"))   # taken back
    log.append(LabelRecord(round=0, pair=1, choice="right", time=2.0, digest="ab"))    # answered again
    assert LabelLog(path).round_labels(0)[1].choice == "right"
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .choices import CHOICES

__all__ = ["LabelRecord", "LabelLog", "pair_digest", "UNDONE", "latest"]

logger = logging.getLogger("jaxweight.label")

_FIELDS = {"round": int, "pair": int, "choice": str, "time": float, "digest": str}
#: the choice of a line that takes a pair's answer back (the pair is asked again)
UNDONE = "undone"
_LOG_CHOICES = (*CHOICES, UNDONE)


def pair_digest(obs_pair: Any) -> str:
    """A short hex hash of one pair's observations ``f32[2, T, D]`` (shape and float32 bytes)."""
    a = np.ascontiguousarray(np.asarray(obs_pair, dtype=np.float32))
    h = hashlib.sha256(repr(a.shape).encode())
    h.update(a.tobytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class LabelRecord:
    """One answer of the log.

    Attributes:
      round: the round it was asked in (``>= 0``).
      pair: the pair's index in that round's observations (``>= 0``).
      choice: ``"left"``, ``"right"``, ``"equal"``, ``"skip"``, or ``"undone"``
        (the answer before it was taken back).
      time: Unix time (seconds) when the server received it.
      digest: :func:`pair_digest` of the pair it answers.
    """

    round: int
    pair: int
    choice: str
    time: float
    digest: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> LabelRecord:
        """Parse one line.

        Raises:
          ValueError: not a JSON object of exactly the record's fields with their types,
            a negative round or pair, or an unknown choice.
        """
        d = json.loads(line)
        if not isinstance(d, dict) or set(d) != set(_FIELDS):
            raise ValueError(f"expected an object with fields {sorted(_FIELDS)}")
        for k, typ in _FIELDS.items():
            ok = isinstance(d[k], (int, float) if typ is float else typ) and not isinstance(d[k], bool)
            if not ok:
                raise ValueError(f"field {k!r} must be {typ.__name__}, got {d[k]!r}")
        if d["round"] < 0 or d["pair"] < 0:
            raise ValueError(f"round and pair must be >= 0, got {d['round']}, {d['pair']}")
        if d["choice"] not in _LOG_CHOICES:
            raise ValueError(f"choice must be one of {list(_LOG_CHOICES)}, got {d['choice']!r}")
        return cls(round=d["round"], pair=d["pair"], choice=d["choice"], time=float(d["time"]), digest=d["digest"])


def _state_file_error(msg: str) -> Exception:
    from jaxweight import StateFileError  # the library's one error for a malformed file (imported on need)

    return StateFileError(msg)


class LabelLog:
    """An append-only JSON-lines file of :class:`LabelRecord` (thread-safe appends).

    Args:
      path: the file (created with its folder if missing).

    Raises:
      jaxweight.StateFileError: a line other than the last is not a record
        (the message names the file and the line number).
      OSError: the file cannot be read or created.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.records: list[LabelRecord] = []
        self._load()

    def _load(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.path.parent)
            return
        data = self.path.read_bytes()
        complete, newline, tail = data.rpartition(b"\n")  # tail: the bytes after the last newline
        lines = complete.split(b"\n") if newline else []
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                self.records.append(LabelRecord.from_json(raw.decode("utf-8")))
            except (ValueError, UnicodeDecodeError) as e:
                raise _state_file_error(f"label log {self.path}: line {i + 1} is not a label record ({e}); "
                                        "fix or move the file") from None
        if tail:  # every append ends with a newline: this is a write cut short by a crash
            logger.warning("label log %s: dropping its last line %d, cut short by a crash (no newline): %r",
                           self.path, len(lines) + 1, tail[:80])
            self._truncate(len(data) - len(tail))

    def _truncate(self, size: int) -> None:
        with open(self.path, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())

    def append(self, record: LabelRecord) -> None:
        """Write one line, flush and ``fsync`` it; only then is it in :attr:`records`."""
        line = (record.to_json() + "\n").encode("utf-8")
        with self._lock:
            with open(self.path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.records.append(record)

    def round_labels(self, round_index: int) -> dict[int, LabelRecord]:
        """``{pair: record}`` of a round: the latest line of each pair, pairs taken back left out."""
        with self._lock:
            return latest(r for r in self.records if r.round == round_index)


def latest(records: Any) -> dict[int, LabelRecord]:
    """``{pair: record}``: the last record of each pair among ``records`` (of one round), ``"undone"`` ones dropped."""
    out: dict[int, LabelRecord] = {}
    for r in records:
        out.pop(r.pair, None)  # re-inserted last: the dict keeps the order the answers stand in
        if r.choice != UNDONE:
            out[r.pair] = r
    return out


def _fsync_dir(folder: Path) -> None:
    """Make a new file's directory entry durable (where the platform allows opening folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
