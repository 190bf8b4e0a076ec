"""HumanTeacher: a scripted person gets the synthetic teacher's answers; a crash loses no label."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.label.conftest import Api, Asker, random_obs, wait_for_round


def _person(api: Api, returns: np.ndarray, round_index: int) -> list[str]:
    """Answer every pair of the open round like the noiseless synthetic teacher: compare true returns.

    Watches each clip first, as a person would, and answers the pair the page shows next.
    """
    said = []
    while True:
        s = api.state()
        if s["done"]:
            return said
        p = s["pair"]
        for side in (0, 1):
            status, gif = api.request("GET", f"/clip/{round_index}/{p}/{side}?v={s['digest']}")
            assert status == 200 and gif[:6] == b"GIF89a"
        r0, r1 = returns[p]
        choice = "left" if r0 > r1 else "right" if r1 > r0 else "equal"
        status, body = api.label(round_index, p, choice)
        assert status == 200 and body["ok"], body
        said.append(choice)


def test_a_person_who_compares_true_returns_answers_like_the_noiseless_synthetic_teacher(teacher, api):
    pf = pytest.importorskip("jaxweight.preference")
    rng = np.random.default_rng(7)
    p, length = 24, 6
    rews = rng.integers(0, 2, size=(p, 2, length)).astype(np.float32)   # CartPole-like 0/1 rewards: ties happen
    obs = 0.05 * rng.normal(size=(p, 2, length + 1, 4)).astype(np.float32)
    obs[:, :, 1:, 2] += np.where(rews == 1, 0.0, 1.0)   # the clips show the rewards: a 0 step is a fallen pole
    pairs = pf.fragment_pairs_from_arrays(obs, np.zeros((p, 2, length), np.int32), rews)
    expected, _ = pf.synthetic_preferences(0, pairs, temperature=0.0)
    expected_valid = pf.synthetic_teacher(0, pairs, temperature=0.0).valid

    asker = Asker(teacher, 5, np.asarray(pairs.obs))
    wait_for_round(api, 5)
    said = _person(api, rews.sum(-1), 5)
    prefs, valid = asker.result()
    ties = int((rews.sum(-1)[:, 0] == rews.sum(-1)[:, 1]).sum())
    assert set(said) == {"left", "right"} and len(said) == p - ties      # ties are answered equal by the rule
    assert ties > 0 and teacher.rounds[5]["by_rule"] == ties
    np.testing.assert_array_equal(prefs, np.asarray(expected))
    np.testing.assert_array_equal(valid, np.asarray(expected_valid))
    assert prefs.dtype == np.float32 and prefs.shape == (p,) and valid.dtype == bool


def test_ask_takes_jax_arrays_and_reports_progress(web, tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    from jaxweight.label import HumanTeacher

    calls = []
    with HumanTeacher(tmp_path / "l.jsonl", "pendulum", announce=calls.append, poll_s=0.02,
                      progress=lambda r, n, total: calls.append((r, n, total))) as t:
        api = Api(t.url)
        asker = Asker(t, 0, jnp.asarray(random_obs(3, dim=3, frames=4)), jnp.asarray([0.9, 0.1, 0.4]))
        wait_for_round(api, 0)
        for p, c in enumerate(["left", "left", "skip"]):
            assert api.label(0, p, c)[0] == 200
            time.sleep(0.1)
        prefs, valid = asker.result()
    assert prefs.tolist() == [1.0, 1.0, 0.5] and valid.tolist() == [True, True, False]
    assert calls[0].startswith("[label] compare clips at http://127.0.0.1:") and t.url.split("token=")[1] in calls[0]
    counts = [c for c in calls[1:]]
    assert counts[0] == (0, 0, 3) and counts[-1] == (0, 3, 3)
    assert [n for _, n, _ in counts] == sorted({n for _, n, _ in counts})   # each count once, rising


def test_a_finished_round_in_the_log_returns_at_once_without_a_person(web, tmp_path):
    from jaxweight.label import HumanTeacher

    obs = random_obs(3)
    with HumanTeacher(tmp_path / "l.jsonl", "cartpole", announce=None, poll_s=0.02) as t:
        api = Api(t.url)
        asker = Asker(t, 2, obs)
        wait_for_round(api, 2)
        for p, c in enumerate(["right", "equal", "left"]):
            api.label(2, p, c)
        first = asker.result()
    with HumanTeacher(tmp_path / "l.jsonl", "cartpole", announce=None) as t:
        t0 = time.monotonic()
        again = t.ask(2, obs, timeout=5)
        assert time.monotonic() - t0 < 2
    np.testing.assert_array_equal(again[0], first[0])
    np.testing.assert_array_equal(again[1], first[1])


def test_timeout_keeps_the_round_open_and_its_answers(teacher, api):
    obs = random_obs(2)
    asker = Asker(teacher, 0, obs, timeout=0.5)
    wait_for_round(api, 0)
    api.label(0, 1, "right")
    with pytest.raises(TimeoutError, match="1 of 2 pairs answered"):
        asker.result()
    asker = Asker(teacher, 0, obs)                     # asked again: goes on from the kept answer
    wait_for_round(api, 0)
    assert api.state()["labelled"] == 1
    api.label(0, 0, "left")
    assert asker.result()[0].tolist() == [1.0, 0.0]


def test_one_round_at_a_time(teacher, api):
    asker = Asker(teacher, 0, random_obs(1))
    wait_for_round(api, 0)
    with pytest.raises(RuntimeError, match="one round at a time"):
        teacher.ask(1, random_obs(1))
    api.label(0, 0, "skip")
    assert asker.result()[1].tolist() == [False]


_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from jaxweight.label import HumanTeacher
    teacher = HumanTeacher(sys.argv[1], "cartpole", announce=None)
    print(teacher.start(), flush=True)
    teacher.ask(4, np.load(sys.argv[2]))
    print("finished", flush=True)
""")


@pytest.mark.parametrize("torn", [False, True])
def test_a_crash_mid_round_loses_no_label_and_the_round_resumes(web, tmp_path, caplog, torn):
    """A teacher process killed (SIGKILL) after k labels; a new one on the same log keeps them all."""
    from jaxweight.label import HumanTeacher

    p, k = 6, 4
    obs = random_obs(p, seed=3)
    np.save(tmp_path / "obs.npy", obs)
    log_path = tmp_path / "labels.jsonl"
    choices = ["left", "right", "equal", "skip", "right", "left"]
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(log_path), str(tmp_path / "obs.npy")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = child.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), child.stderr.read()
        api = Api(url)
        wait_for_round(api, 4)
        for i in range(k):
            if i == k - 1:                             # a slip, taken back and answered again
                assert api.label(4, i, "equal")[0] == 200
                assert api.request("POST", "/api/undo", {"round": 4, "pair": i})[0] == 200
            status, body = api.label(4, i, choices[i])
            assert status == 200, body
            # durable before OK: the line is on disk the moment the page hears it
            assert len(log_path.read_text().splitlines()) == i + 1 + 2 * (i == k - 1)
    finally:
        child.kill()                                   # no clean shutdown: a crash
        child.communicate(timeout=30)
    assert child.returncode != 0
    if torn:
        with open(log_path, "ab") as f:                # the crash also cut a fifth line short
            f.write(b'{"round":4,"pair":4,"choice":"ri')
    with HumanTeacher(log_path, "cartpole", announce=None, poll_s=0.02) as again:
        assert ("cut short by a crash" in caplog.text) == torn
        api = Api(again.url)
        asker = Asker(again, 4, obs)
        s = wait_for_round(api, 4)
        assert (s["labelled"], s["pair"]) == (k, k)     # every label kept; asks from the first unanswered
        assert api.label(4, 0, "right")[0] == 409       # a kept label cannot be given twice
        for i in range(k, p):
            assert api.label(4, i, choices[i])[0] == 200
        prefs, valid = asker.result()
    expected = {"left": (1.0, True), "right": (0.0, True), "equal": (0.5, True), "skip": (0.5, False)}
    assert prefs.tolist() == [expected[c][0] for c in choices]
    assert valid.tolist() == [expected[c][1] for c in choices]
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert [(x["round"], x["pair"], x["choice"]) for x in lines] == (
        [(4, i, c) for i, c in enumerate(choices[:k - 1])] + [(4, k - 1, "equal"), (4, k - 1, "undone")]
        + [(4, i, c) for i, c in enumerate(choices) if i >= k - 1])
    assert all(isinstance(x["time"], float) and len(x["digest"]) == 16 for x in lines)


def test_tqdm_progress_draws_one_bar_per_round(web, capsys):
    from jaxweight.label import tqdm_progress

    progress = tqdm_progress("labels")
    for call in [(0, 0, 3), (0, 2, 3), (0, 3, 3), (1, 1, 2), (1, 2, 2)]:
        progress(*call)
    err = capsys.readouterr().err
    assert "labels (round 0)" in err and "3/3" in err
    assert "labels (round 1)" in err and "2/2" in err


def test_the_rounds_last_answer_can_be_undone_before_the_loop_takes_the_round(web, tmp_path):
    from jaxweight.label import HumanTeacher

    with HumanTeacher(tmp_path / "labels.jsonl", "cartpole", announce=None, poll_s=0.02, undo_s=1.5) as t:
        api = Api(t.url)
        asker = Asker(t, 0, random_obs(2))
        wait_for_round(api, 0)
        assert api.label(0, 0, "left")[0] == 200
        t0 = time.monotonic()
        assert api.label(0, 1, "left")[0] == 200                     # the last pair: the round is answered ...
        time.sleep(0.3)
        assert asker.thread.is_alive()                                # ... but open for undo_s
        status, body = api.request("POST", "/api/undo", {"round": 0, "pair": 1})
        assert status == 200 and body["state"]["pair"] == 1 and not body["state"]["done"]
        time.sleep(1.6)
        assert asker.thread.is_alive()                                # an open pair: the round waits for it
        assert api.label(0, 1, "right")[0] == 200
        prefs, valid = asker.result(10)
        assert time.monotonic() - t0 >= 1.5 + 1.6
        assert prefs.tolist() == [1.0, 0.0] and t.rounds[0] == {"pairs": 2, "asked": 2, "by_rule": 0, "skipped": 0}
        status, body = api.request("POST", "/api/undo", {"round": 0, "pair": 1})
        assert status == 409 and "closed" in body["error"]           # taken by the loop: final
    assert [r.choice for r in t.log.records] == ["left", "left", "undone", "right"]


def test_pairs_with_nothing_to_judge_are_announced_and_counted(web, tmp_path):
    from jaxweight.label import HumanTeacher

    said = []
    obs = random_obs(4)
    obs[[0, 2], :, :, 2] += 1.5                                      # both poles down for every step
    with HumanTeacher(tmp_path / "labels.jsonl", "cartpole", announce=said.append, poll_s=0.02, undo_s=0) as t:
        api = Api(t.url)
        asker = Asker(t, 3, obs)
        s = wait_for_round(api, 3)
        assert (s["pair"], s["upcoming"], s["by_rule"]) == (1, 3, 2)
        assert api.label(3, 1, "left")[0] == 200 and api.label(3, 3, "skip")[0] == 200
        prefs, valid = asker.result()
    assert prefs.tolist() == [0.5, 1.0, 0.5, 0.5] and valid.tolist() == [True, True, True, False]
    assert t.rounds == {3: {"pairs": 4, "asked": 2, "by_rule": 2, "skipped": 1}}
    assert any("round 4: 2 of 4 pairs have nothing to judge" in x and "answered 'equal' by rule" in x for x in said)


def test_a_restart_with_keep_address_serves_the_same_url_and_a_fresh_one_a_new_token(web, tmp_path):
    """The token (and port) kept beside the log, mode 0600: an open tab goes on; without the file: a new token."""
    import os

    from jaxweight.label import HumanTeacher
    from jaxweight.label.address import address_path

    log = tmp_path / "labels.jsonl"
    first = HumanTeacher(log, "cartpole", announce=None, keep_address=True)
    url = first.start()
    kept = address_path(log)
    assert kept.name == "labels.page.json" and os.stat(kept).st_mode & 0o777 == 0o600
    assert json.loads(kept.read_text()) == {"token": first.token, "port": first.server.port}
    old = Api(url)
    first.close()
    again = HumanTeacher(log, "cartpole", announce=None, keep_address=True)
    try:
        assert again.start() == url                                 # same token, same port
        assert old.state()["round"] is None                         # the open tab's requests work
    finally:
        again.close()
    kept.unlink()                                                   # a fresh run removes it
    fresh = HumanTeacher(log, "cartpole", announce=None, keep_address=True)
    try:
        fresh.start()
        assert fresh.token != first.token
        status, body = old.request("GET", "/api/state") if fresh.server.port == old.port else (403, {"code": "token"})
        assert status == 403 and body["code"] == "token"
    finally:
        fresh.close()


def test_a_kept_port_that_is_taken_gives_way_to_a_free_one(web, tmp_path):
    from jaxweight.label import HumanTeacher
    from jaxweight.label.address import address_path, save_address

    log = tmp_path / "labels.jsonl"
    with HumanTeacher(tmp_path / "other.jsonl", "cartpole", announce=None) as busy:
        save_address(address_path(log), "k" * 43, busy.server.port)
        said = []
        t = HumanTeacher(log, "cartpole", announce=said.append, keep_address=True)
        try:
            url = t.start()
            assert t.token == "k" * 43 and t.server.port != busy.server.port
            assert any("is taken" in x for x in said) and any(url in x for x in said)
        finally:
            t.close()


def test_close_after_finish_waits_for_an_open_page_to_see_it(web, tmp_path):
    from jaxweight.label import HumanTeacher

    t = HumanTeacher(tmp_path / "labels.jsonl", "cartpole", announce=None)
    api = Api(t.start())
    api.state()                                                     # a page is watching
    t.finish("run finished: results in out/cartpole.json")
    seen = {}

    def page():
        time.sleep(0.4)
        seen.update(api.state())

    import threading

    th = threading.Thread(target=page)
    th.start()
    t.close(wait_s=5)
    th.join()
    assert seen["phase"] == "finished" and seen["message"] == "run finished: results in out/cartpole.json"
