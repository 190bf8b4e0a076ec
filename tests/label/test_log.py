"""The label log: durable appends, read back, torn last lines, damaged files."""

from __future__ import annotations

import json
import logging

import pytest

from jaxweight import StateFileError
from jaxweight.label import log as label_log
from jaxweight.label.log import LabelLog, LabelRecord, pair_digest


def _rec(pair, choice="left", round_index=0):
    return LabelRecord(round=round_index, pair=pair, choice=choice, time=1.5, digest=f"d{pair}")


def test_append_writes_one_json_line_and_fsyncs_before_returning(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "labels.jsonl"
    log = LabelLog(path)
    synced = []
    real = label_log.os.fsync

    def fsync(fd):
        synced.append(path.read_bytes())  # what is on disk when fsync is asked for
        real(fd)

    monkeypatch.setattr(label_log.os, "fsync", fsync)
    log.append(_rec(3, "equal", 2))
    assert synced and synced[-1].endswith(b"\n")
    assert json.loads(path.read_text()) == {"round": 2, "pair": 3, "choice": "equal", "time": 1.5, "digest": "d3"}
    assert LabelLog(path).records == [_rec(3, "equal", 2)]


def test_round_labels_are_the_latest_line_of_each_pair_and_undone_pairs_have_none(tmp_path):
    """A revision is a new line that supersedes the old one; "undone" takes the answer back."""
    log = LabelLog(tmp_path / "l.jsonl")
    for r in (_rec(0), _rec(1, "skip"), _rec(2, "equal"), _rec(0, "undone"), _rec(0, "right"), _rec(0, "right", 1),
              _rec(2, "undone")):
        log.append(r)
    got = LabelLog(tmp_path / "l.jsonl").round_labels(0)
    assert {p: r.choice for p, r in got.items()} == {1: "skip", 0: "right"}
    assert list(got) == [1, 0]                              # in the order the answers stand
    assert len(LabelLog(tmp_path / "l.jsonl").records) == 7  # nothing is rewritten


def test_a_torn_last_line_is_dropped_with_a_warning_and_cut_off(tmp_path, caplog):
    path = tmp_path / "l.jsonl"
    log = LabelLog(path)
    log.append(_rec(0))
    log.append(_rec(1))
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"round":0,"pair":2,"cho')          # a crash in the middle of a write
    with caplog.at_level(logging.WARNING, logger="jaxweight.label"):
        again = LabelLog(path)
    assert [r.pair for r in again.records] == [0, 1]
    assert "cut short by a crash" in caplog.text and "line 3" in caplog.text
    assert path.read_bytes() == whole                    # the tail is gone ...
    again.append(_rec(2, "right"))                       # ... so the next line starts clean
    assert [r.choice for r in LabelLog(path).records] == ["left", "left", "right"]


def test_a_torn_only_line_leaves_an_empty_log(tmp_path, caplog):
    path = tmp_path / "l.jsonl"
    path.write_bytes(b"\x00\x00\x00")
    with caplog.at_level(logging.WARNING, logger="jaxweight.label"):
        assert LabelLog(path).records == []
    assert path.read_bytes() == b"" and "line 1" in caplog.text


@pytest.mark.parametrize("bad", [
    b"not json",
    b'{"round":0,"pair":1,"choice":"maybe","time":0,"digest":"x"}',
    b'{"round":-1,"pair":1,"choice":"left","time":0,"digest":"x"}',
    b'{"round":0,"pair":true,"choice":"left","time":0,"digest":"x"}',
    b'{"round":0,"pair":1,"choice":"left","time":0}',
    b"[1, 2]",
])
def test_a_damaged_line_before_the_end_is_a_state_file_error_naming_file_and_line(tmp_path, bad):
    path = tmp_path / "l.jsonl"
    path.write_bytes(_rec(0).to_json().encode() + b"\n" + bad + b"\n" + _rec(2).to_json().encode() + b"\n")
    before = path.read_bytes()
    with pytest.raises(StateFileError, match=r"l\.jsonl: line 2 is not a label record"):
        LabelLog(path)
    assert path.read_bytes() == before                   # nothing rewritten


def test_pair_digest_depends_on_values_and_shape():
    import numpy as np

    a = np.zeros((2, 3, 4), np.float32)
    assert pair_digest(a) == pair_digest(a.copy()) and len(pair_digest(a)) == 16
    b = a.copy()
    b[1, 2, 3] = 1e-7
    assert pair_digest(b) != pair_digest(a)
    assert pair_digest(a.reshape(2, 4, 3)) != pair_digest(a)
