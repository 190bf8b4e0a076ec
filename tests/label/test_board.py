"""The open round: answers, reuse from the log, the model's agreement, clips, refusals that change nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("PIL", reason="clips need Pillow (the label extra)")

from jaxweight.label.board import LabelBoard, LabelError  # noqa: E402
from jaxweight.label.log import LabelLog  # noqa: E402
from jaxweight.label.render import get_renderer  # noqa: E402
from tests.label.conftest import random_obs  # noqa: E402


def _board(tmp_path, name="labels.jsonl"):
    return LabelBoard(LabelLog(tmp_path / name), get_renderer("cartpole"))


def test_answers_follow_the_synthetic_teacher_convention(tmp_path):
    board = _board(tmp_path)
    board.publish(0, random_obs(5))
    for p, c in enumerate(["left", "right", "equal", "skip"]):
        board.submit(0, p, c)
    prefs, valid = board.answers()
    np.testing.assert_array_equal(prefs, np.array([1.0, 0.0, 0.5, 0.5, 0.5], np.float32))
    np.testing.assert_array_equal(valid, [True, True, True, False, False])   # pair 4 not answered yet
    assert prefs.dtype == np.float32 and valid.dtype == bool
    assert board.counts() == (4, 5) and not board.wait(0.01)
    board.submit(0, 4, "left")
    assert board.wait(0.01) and board.snapshot()["done"]


def test_agreement_counts_pairs_answered_left_or_right_with_a_prediction_in_range(tmp_path):
    board = _board(tmp_path)
    pred = np.array([0.9, 0.9, 0.2, 0.5, np.nan, 1.5, 0.7], np.float32)
    board.publish(3, random_obs(7), pred)
    for p, c in enumerate(["left", "right", "right", "left", "left", "left", "equal"]):
        board.submit(3, p, c)
    # agree: 0 (0.9, left), 2 (0.2, right); disagree: 1, 3 (0.5 predicts right); 4, 5 not in [0, 1]; 6 equal
    assert board.snapshot()["accuracy"] == {"agree": 2, "decided": 4}
    board.publish(4, random_obs(2))
    assert board.snapshot()["accuracy"] is None                      # no prediction, nothing shown


def test_snapshot_names_the_next_pairs_and_their_digests(tmp_path):
    board = _board(tmp_path)
    assert board.snapshot()["round"] is None
    board.publish(2, random_obs(3))
    board.submit(2, 1, "left")
    s = board.snapshot()
    assert (s["round"], s["requested"], s["labelled"], s["pair"], s["upcoming"]) == (2, 3, 1, 0, 2)
    assert s["env"] == "cartpole" and "pole upright" in s["goal"] and len(s["digest"]) == 16


def test_labels_in_the_log_for_the_same_pairs_are_reused(tmp_path, caplog):
    obs = random_obs(4)
    board = _board(tmp_path)
    board.publish(1, obs)
    board.submit(1, 0, "right")
    board.submit(1, 2, "skip")
    again = _board(tmp_path)                                          # a restart on the same log
    assert again.publish(1, obs) == 2
    assert again.snapshot()["pair"] == 1
    prefs, valid = again.answers()
    np.testing.assert_array_equal(prefs[[0, 2]], [0.0, 0.5])
    np.testing.assert_array_equal(valid, [True, False, False, False])
    other = obs.copy()
    other[0, 0, 0, 0] += 1.0                                          # pair 0 is not the pair it was
    third = _board(tmp_path)
    with caplog.at_level(logging.WARNING, logger="jaxweight.label"):
        assert third.publish(1, other) == 1
    assert "1 label(s) of round 1 answer other observations" in caplog.text
    third.submit(1, 0, "left")                                        # asked again, answered anew
    assert third.answers()[0][0] == 1.0
    assert _board(tmp_path).publish(1, other) == 2                    # and that answer is reused next time


def test_refused_answers_change_nothing(tmp_path):
    board = _board(tmp_path)
    with pytest.raises(LabelError, match="no round is open") as e:
        board.submit(0, 0, "left")
    assert e.value.status == 409
    board.publish(0, random_obs(2))
    board.submit(0, 0, "left")
    log_bytes = board.log.path.read_bytes()
    cases = [((1, 0, "left"), 409, "round 1 is not open"), ((0, 2, "left"), 404, "no pair 2"),
             ((0, -1, "left"), 404, "no pair -1"), ((0, 1, "better"), 422, "choice must be one of"),
             ((0, 0, "right"), 409, "already labelled"), ((0, "1", "left"), 400, "pair must be an integer"),
             ((0, True, "left"), 400, "pair must be an integer"), ((0.0, 1, "left"), 400, "round must be"),
             ((0, 1, None), 400, "choice must be a string")]
    for args, status, match in cases:
        with pytest.raises(LabelError, match=match) as e:
            board.submit(*args)
        assert e.value.status == status, args
    assert board.log.path.read_bytes() == log_bytes and board.counts() == (1, 2)


def test_a_label_that_cannot_be_written_is_not_recorded(tmp_path, monkeypatch):
    board = _board(tmp_path)
    board.publish(0, random_obs(2))

    def full(record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(board.log, "append", full)
    with pytest.raises(LabelError, match="could not be saved.*nothing was recorded") as e:
        board.submit(0, 0, "left")
    assert e.value.status == 500 and board.counts() == (0, 2)


def test_clips_are_rendered_once_per_round_and_only_for_the_open_round(tmp_path):
    board = _board(tmp_path)
    board.publish(0, random_obs(2))
    gif = board.clip(0, 1, 0)
    assert gif[:6] == b"GIF89a" and board.clip(0, 1, 0) is gif        # cached
    assert board.clip(0, 1, 1) != gif
    for args in [(1, 0, 0), (0, 2, 0), (0, 0, 2)]:
        with pytest.raises(LabelError) as e:
            board.clip(*args)
        assert e.value.status == 404
    board.publish(1, random_obs(2, seed=1))
    with pytest.raises(LabelError):
        board.clip(0, 1, 0)


@pytest.mark.parametrize(("args", "match"), [
    ((-1, random_obs(2), None), "round_index must be an int >= 0"),
    ((True, random_obs(2), None), "round_index must be an int >= 0"),
    ((0, np.zeros((2, 3, 5, 4)), None), r"shape \(P, 2, T, D\)"),
    ((0, np.zeros((0, 2, 5, 4)), None), r"P, T >= 1"),
    ((0, np.zeros((2, 2, 5, 3)), None), "D = 4"),
    ((0, random_obs(2), np.zeros(3)), r"predicted must have shape \(2,\)"),
])
def test_bad_rounds_are_refused(tmp_path, args, match):
    board = _board(tmp_path)
    with pytest.raises(ValueError, match=match):
        board.publish(*args)
    assert board.snapshot()["round"] is None
