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


def test_a_resumed_run_counts_its_finished_rounds_and_the_logged_answers_before_a_round_opens(tmp_path):
    board = _board(tmp_path)
    board.publish(2, random_obs(4))
    for p in range(3):
        board.submit(2, p, "left")
    board.undo(2, 2)
    again = LabelBoard(board.log, get_renderer("cartpole"))            # the run restarted with the same log
    again.set_plan([5, 5, 4, 4], rounds_done=2, tail_s=60)
    s = again.snapshot()
    assert s["round"] is None and s["overall"] == {"done": 5 + 5 + 2, "total": 18}
    with pytest.raises(ValueError, match="rounds_done"):
        again.set_plan([5, 5], rounds_done=3)


def test_agreement_leaves_out_pairs_with_nothing_to_judge_and_the_run_total_covers_closed_rounds(tmp_path):
    obs = random_obs(4)
    obs[2, :, :, 2] = 1.0                                                # both poles down all along: a tie
    board = LabelBoard(LabelLog(tmp_path / "l.jsonl"), get_renderer("cartpole"), idle="ask")
    board.publish(0, obs, np.array([0.9, 0.9, 0.9, 0.1], np.float32))
    for p, c in enumerate(["left", "right", "left", "right"]):
        board.submit(0, p, c)
    assert board.snapshot()["accuracy"] == {"agree": 2, "decided": 3}   # pair 2 was asked, but ties
    board.close_round()
    board.publish(1, random_obs(2, seed=3), np.array([0.8, 0.8], np.float32))
    board.submit(1, 0, "left")
    assert board.snapshot()["run_agreement"] == {"agree": 3, "decided": 4}


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


# ------------------------------------------------------------------ pairs with nothing to judge
def _fallen_pairs(p: int, fallen: list[int]) -> np.ndarray:
    """Live pairs (small values), except pairs in ``fallen``: both poles down for every step."""
    obs = random_obs(p)
    obs[fallen, :, :, 2] = 1.5 + obs[fallen, :, :, 2]
    return obs


@pytest.mark.parametrize(("rule", "prefs", "valid"), [("equal", 0.5, True), ("skip", 0.5, False)])
def test_pairs_with_nothing_to_judge_are_answered_by_the_rule_and_never_asked(tmp_path, rule, prefs, valid):
    board = LabelBoard(LabelLog(tmp_path / "l.jsonl"), get_renderer("cartpole"), idle=rule)
    obs = _fallen_pairs(5, [1, 3])
    obs[4, 1] = obs[4, 0]                                              # two identical fragments: nothing to tell apart
    board.publish(0, obs)
    s = board.snapshot()
    assert (s["requested"], s["asked"], s["by_rule"], s["labelled"], s["pair"], s["upcoming"]) == (5, 2, 3, 3, 0, 2)
    assert board.counts() == (3, 5) and board.round_stats() == {"pairs": 5, "asked": 2, "by_rule": 3, "skipped": 0}
    with pytest.raises(LabelError, match="nothing to judge") as e:
        board.submit(0, 1, "left")
    assert e.value.status == 409
    board.submit(0, 0, "left")
    board.submit(0, 2, "right")
    assert board.wait(0.01) and board.snapshot()["done"]
    p, v = board.answers()
    np.testing.assert_array_equal(p, [1.0, prefs, 0.0, prefs, prefs])
    np.testing.assert_array_equal(v, [True, valid, True, valid, valid])
    assert [r.pair for r in board.log.records] == [0, 2]               # the log holds the person's answers only
    assert board.session_stats() == {"asked": 2, "by_rule": 3}


def test_the_ask_rule_shows_every_pair(tmp_path):
    board = LabelBoard(LabelLog(tmp_path / "l.jsonl"), get_renderer("cartpole"), idle="ask")
    board.publish(0, _fallen_pairs(3, [1]))
    assert board.snapshot()["by_rule"] == 0 and board.counts() == (0, 3)
    board.submit(0, 1, "equal")


def test_a_persons_answer_in_the_log_stands_over_the_rule(tmp_path):
    obs = _fallen_pairs(2, [1])
    ask = LabelBoard(LabelLog(tmp_path / "l.jsonl"), get_renderer("cartpole"), idle="ask")
    ask.publish(0, obs)
    ask.submit(0, 1, "left")
    board = _board(tmp_path, "l.jsonl")
    assert board.publish(0, obs) == 1
    assert board.snapshot()["by_rule"] == 0 and board.answers()[0][1] == 1.0


# ------------------------------------------------------------------ undo
def test_the_last_answer_can_be_undone_and_the_log_keeps_the_revision(tmp_path):
    board = _board(tmp_path)
    obs = random_obs(3)
    board.publish(0, obs)
    board.submit(0, 0, "left")
    board.submit(0, 1, "left")
    assert board.snapshot()["last"] == {"pair": 1, "choice": "left"}
    with pytest.raises(LabelError, match=r"only the round's last answer can be undone \(pair 1\)") as e:
        board.undo(0, 0)
    assert e.value.status == 409
    s = board.undo(0, 1)
    assert (s["pair"], s["labelled"], s["last"]) == (1, 1, {"pair": 0, "choice": "left"})   # asked again
    board.submit(0, 1, "right")
    board.submit(0, 2, "equal")
    assert board.answers()[0].tolist() == [1.0, 0.0, 0.5]
    assert [(r.pair, r.choice) for r in board.log.records] == [(0, "left"), (1, "left"), (1, "undone"), (1, "right"),
                                                               (2, "equal")]
    again = _board(tmp_path)                                           # resume reads the latest answer
    assert again.publish(0, obs) == 3 and again.answers()[0].tolist() == [1.0, 0.0, 0.5]
    again.close_round()
    for call in (lambda: again.undo(0, 2), lambda: again.submit(0, 2, "left")):
        with pytest.raises(LabelError, match="round 0 is closed") as e:
            call()
        assert e.value.status == 409
    assert again.snapshot()["last"] is None


def test_undo_with_nothing_to_undo_is_refused(tmp_path):
    board = _board(tmp_path)
    board.publish(0, random_obs(2))
    with pytest.raises(LabelError, match="no answer to undo"):
        board.undo(0, 0)
    assert board.log.records == []


# ------------------------------------------------------------------ where the run is
def test_the_snapshot_says_round_r_of_r_pairs_k_of_n_and_the_time_left(tmp_path, monkeypatch):
    from jaxweight.label import board as board_module

    now = [100.0]
    monkeypatch.setattr(board_module.time, "monotonic", lambda: now[0])
    board = _board(tmp_path)
    s = board.snapshot()
    assert (s["phase"], s["round"], s["rounds"], s["overall"]) == ("preparing", None, None, None)
    board.set_plan([3, 2, 2])
    board.set_phase("preparing", eta_s=40)
    now[0] += 15
    s = board.snapshot()
    assert s["rounds"] == 3 and s["overall"] == {"done": 0, "total": 7} and s["phase_eta_s"] == 25
    board.publish(0, random_obs(3))
    for p in range(3):
        board.submit(0, p, "left")
        now[0] += 4                                                    # 4 s a pair
    s = board.snapshot()
    assert s["overall"] == {"done": 3, "total": 7} and s["left_s"] == 4 * 4
    board.close_round()
    assert board.snapshot()["phase"] == "training"
    now[0] += 30                                                       # 30 s of training between rounds
    board.publish(1, random_obs(2, seed=1))
    s = board.snapshot()
    assert (s["round"], s["phase"], s["overall"]) == (1, "labelling", {"done": 3, "total": 7})
    assert s["left_s"] == 4 * (2 + 2) + 30                              # 2 pairs now, 2 in the last round, 1 gap
    assert s["left_range_s"] == [4 * (2 + 2) + 30] * 2                  # every gap was 4 s, one round gap
    board.submit(1, 0, "left")
    now[0] += 10
    board.submit(1, 1, "left")
    s = board.snapshot()
    lo, hi = s["left_range_s"]
    assert lo < hi and lo == pytest.approx(4 * 2 + 30) and hi == pytest.approx(np.percentile([4, 4, 10], 75) * 2 + 30)
    board.close_round()
    board.set_phase("evaluating", eta_s=70)
    now[0] += 20
    s = board.snapshot()                                                 # never "1 s left" while it evaluates
    assert s["left_s"] == 50 and s["left_range_s"] == [50, 50]
    board.set_phase("evaluating")
    assert board.snapshot()["left_range_s"] is None                      # not measured: nothing promised
    board.set_phase("finished", message="run finished: results in out/cartpole.json")
    assert board.poll()["message"] == "run finished: results in out/cartpole.json" and board.finished_seen
    with pytest.raises(ValueError, match="phase must be one of"):
        board.set_phase("napping")
    with pytest.raises(ValueError, match="schedule must be a non-empty sequence"):
        board.set_plan([])


@pytest.mark.parametrize(("kwargs", "match"), [({"idle": "maybe"}, "idle must be one of"),
                                               ({"min_look_ms": -1}, "min_look_ms must be an int in"),
                                               ({"min_look_ms": 0.5}, "min_look_ms must be an int in")])
def test_board_settings_are_checked(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LabelBoard(LabelLog(tmp_path / "l.jsonl"), get_renderer("cartpole"), **kwargs)
