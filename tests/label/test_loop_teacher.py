"""A person as the preference loop's teacher: the driver's host-teacher path and ``demo preferences --teacher human``.

A scripted person who compares the true returns gives the run of the noiseless
synthetic teacher, bit for bit; a host teacher's skips reach the buffer as
invalid pairs; the host path compiles its own programs once; a resume with
another teacher is refused; and a demo run killed mid-round (SIGKILL) and
resumed keeps every label and ends where an uninterrupted run ends.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.label.conftest import Api

REPO = Path(__file__).resolve().parents[2]
WEB_REASON = "needs the label extra (pip install -e '.[label]')"


@pytest.fixture(scope="module")
def loops():
    """The preference loop's test helpers (they need gymnax, the rl extra)."""
    pytest.importorskip("gymnax", reason="needs the rl extra (pip install -e '.[rl]')")
    from tests.preference import test_loop

    return test_loop


@pytest.fixture(scope="module")
def oracle():
    """CartPole's true fragment returns from the observations alone: ``returns(obs f32[n, 2, L+1, 4]) -> [n, 2]``.

    (The fixed-horizon CartPole pays 1 for every step that ends upright and in bounds.)
    """
    pytest.importorskip("gymnax", reason="needs the rl extra (pip install -e '.[rl]')")
    from jaxweight.rl.envs import make_env

    env, params = make_env("cartpole")
    reward = jax.jit(jax.vmap(lambda o: env.transition_reward(params, None, None, o)))

    def returns(obs: np.ndarray) -> np.ndarray:
        nxt = np.asarray(obs, np.float32)[:, :, 1:]
        return np.asarray(reward(nxt.reshape(-1, nxt.shape[-1]))).reshape(nxt.shape[:3]).sum(-1)

    return returns


def _noiseless(returns: np.ndarray) -> list[str]:
    """The noiseless synthetic teacher's answer per pair, as a person clicks it."""
    r0, r1 = returns[:, 0], returns[:, 1]
    return np.where(r0 > r1, "left", np.where(r1 > r0, "right", "equal")).tolist()


def _by_digest(digest: str) -> str:
    """A person whose answer depends on the pair only (its digest), skips included."""
    return ("left", "right", "equal", "skip")[int(digest[:8], 16) % 4]


class _OracleTeacher:
    """A host teacher without a page: the noiseless answers from the true returns, every fourth pair skipped."""

    kind = "scripted"

    def __init__(self, returns):
        self.returns = returns
        self.asked: list[tuple[int, np.ndarray, np.ndarray]] = []

    def ask(self, round_index, obs, predicted):
        self.asked.append((round_index, obs, predicted))
        choice = np.asarray(_noiseless(self.returns(obs)))
        prefs = np.select([choice == "left", choice == "right"], [1.0, 0.0], 0.5).astype(np.float32)
        valid = np.arange(len(obs)) % 4 != 3
        return np.where(valid, prefs, 0.5).astype(np.float32), valid


# ------------------------------------------------------------------ the driver with a person on the page
@pytest.mark.web
@pytest.mark.slow
def test_a_person_who_compares_true_returns_gives_the_noiseless_synthetic_teachers_run(loops, oracle, tmp_path):
    """Over HTTP, answering each pair the page shows after fetching its clips.

    The loop's synthetic teacher is noiseless at ``temperature=0`` (``sample`` is
    then irrelevant: the hard label is taken) with ``discount=1`` (a person
    compares whole fragments); its ties are 0.5, a person's "equal". With those
    settings the person's run is the synthetic one bit for bit: buffer, state, metrics.
    """
    pytest.importorskip("starlette", reason=WEB_REASON)
    pytest.importorskip("uvicorn", reason=WEB_REASON)
    from jaxweight.label import HumanTeacher

    class Watched(HumanTeacher):
        """The clips' observations as the person sees them (the test's stand-in for the person's eyes)."""

        def ask(self, round_index, obs, predicted=None, **kw):
            self.seen[round_index] = np.asarray(obs)
            return super().ask(round_index, obs, predicted, **kw)

    synthetic = loops.make_tiny()
    synthetic.temperature = 0.0
    synthetic.train(loops.SEED, loops.T, loops.C)

    person_said: list[str] = []
    teacher = Watched(tmp_path / "labels.jsonl", "cartpole", announce=None, poll_s=0.02, undo_s=0)
    teacher.seen = {}
    api = Api(teacher.start())
    stop = threading.Event()

    def person():
        while not stop.is_set():
            s = api.state()
            if s["round"] is None or s["done"] or s["round"] not in teacher.seen:
                time.sleep(0.01)
                continue
            r, p = s["round"], s["pair"]
            for side in (0, 1):
                status, gif = api.request("GET", f"/clip/{r}/{p}/{side}?v={s['digest']}")
                assert status == 200 and gif[:6] == b"GIF89a"
            choice = _noiseless(oracle(teacher.seen[r][p:p + 1]))[0]
            status, body = api.label(r, p, choice)
            assert status == 200, body
            person_said.append(choice)

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    human = loops.make_tiny()
    human.temperature = 0.0
    try:
        human.train(loops.SEED, loops.T, loops.C, teacher=teacher)
    finally:
        stop.set()
        teacher.close()
    plan = human.plan(loops.T, loops.C)
    asked = [teacher.rounds[i]["asked"] for i in range(plan.num_rounds)]
    by_rule = [teacher.rounds[i]["by_rule"] for i in range(plan.num_rounds)]
    assert [a + b for a, b in zip(asked, by_rule, strict=True)] == list(plan.schedule)
    assert len(person_said) == sum(asked) and set(person_said) == {"left", "right"}  # ties: answered by the rule
    assert [len(teacher.log.round_labels(i)) for i in range(plan.num_rounds)] == asked
    # pairs with nothing to judge (as many live steps in both clips) were answered equal by the rule: the
    # noiseless teacher's tie, as both returns are the same
    for i in range(plan.num_rounds):
        r = oracle(teacher.seen[i])
        assert int((r[:, 0] == r[:, 1]).sum()) == by_rule[i]
    a, b = synthetic.state.buffer, human.state.buffer
    np.testing.assert_array_equal(np.asarray(b.prefs), np.asarray(a.prefs))
    np.testing.assert_array_equal(np.asarray(b.pairs.valid), np.asarray(a.pairs.valid))
    for x, y in zip(jax.tree.leaves(synthetic.state), jax.tree.leaves(human.state), strict=True):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert human.history == synthetic.history
    programs = {n for (kind, n, *_) in human._jit if kind == "aot"}
    assert programs == {"init", "collect_pairs", "push", "fit_reward", "fit_agent", "finish"}


# ------------------------------------------------------------------ the driver with a host teacher (no page)
@pytest.mark.slow
def test_a_host_teachers_answers_reach_the_buffer_and_its_programs_compile_once(loops, oracle):
    """Skipped pairs are stored invalid; ``predicted`` is the model's ranking (it gives ``fresh_accuracy``);
    the host path compiles init + collect_pairs + push + fit_reward + fit_agent + finish once."""
    from jax._src import monitoring  # noqa: PLC0415 - JAX's own compile event (no public alias)

    pc = loops.make_dataset_loop(loops._random_policy_trajs(jax.random.key(0), 3_000))
    teacher = _OracleTeacher(oracle)
    plan = pc.plan(0, 60)
    events = []
    listen = lambda name, *_, **__: events.append(name)  # noqa: E731
    monitoring.register_event_duration_secs_listener(listen)
    try:
        pc.train(0, 0, 60, teacher=teacher)
        n = events.count("/jax/core/compile/backend_compile_duration")
        pc.train(1, 0, 60, teacher=teacher)
        assert events.count("/jax/core/compile/backend_compile_duration") == n
    finally:
        monitoring.unregister_event_duration_listener(listen)
    assert {n for (kind, n, *_) in pc._jit if kind == "aot"} == {
        "init", "collect_pairs", "push", "fit_reward", "fit_agent", "finish"}
    asked = teacher.asked[plan.num_rounds:]  # the second run's
    assert [r for r, _, _ in asked] == list(range(plan.num_rounds))
    assert [o.shape for _, o, _ in asked] == [(n, 2, pc.fragment_length + 1, 4) for n in plan.schedule]
    buf = pc.state.buffer
    start = np.cumsum((0,) + plan.schedule)
    for (i, obs, predicted), h in zip(asked, pc.history, strict=True):
        rets = oracle(obs)
        prefs, valid = teacher.ask(i, obs, predicted)
        stored = slice(start[i], start[i + 1])
        np.testing.assert_array_equal(np.asarray(buf.prefs[stored]), prefs)
        np.testing.assert_array_equal(np.asarray(buf.pairs.valid[stored]), valid)
        np.testing.assert_array_equal(np.asarray(buf.pairs.obs[stored]), obs)
        # predicted: the previous round's model, > 0.5 where it ranks the first fragment higher
        assert predicted.dtype == np.float32 and predicted.shape == (len(obs),)
        assert np.all((predicted >= 0) & (predicted <= 1))
        decided = rets[:, 0] != rets[:, 1]
        right = (predicted > 0.5) == (rets[:, 0] > rets[:, 1])
        assert h["fresh_decided"] == int(decided.sum())
        expected = float(right[decided].mean()) if decided.any() else 0.0  # 0: not measured (no NaN)
        assert h["fresh_accuracy"] == pytest.approx(expected, abs=1e-6)
        assert h["num_pairs"] == plan.schedule[i] and h["buffer_size"] == start[i + 1]
        # the teacher's entropy: ln 2 per "equal" answer, 0 per left/right, over the answered pairs
        equal = (prefs == 0.5) & valid
        assert h["teacher_entropy"] == pytest.approx(np.log(2) * equal.sum() / valid.sum(), rel=1e-6)
    assert not np.all(np.asarray(buf.pairs.valid)) and np.any(np.asarray(buf.pairs.valid))


@pytest.mark.slow
def test_a_host_teacher_is_checked(loops):
    pc = loops.make_dataset_loop(loops._random_policy_trajs(jax.random.key(0), 3_000), num_iterations=1)

    class Answers:
        kind = "scripted"

        def __init__(self, fn):
            self.fn = fn

        def ask(self, round_index, obs, predicted):
            return self.fn(len(obs))

    good = Answers(lambda n: (np.full(n, 0.5, np.float32), np.ones(n, bool)))
    with pytest.raises(ValueError, match="labels one run: num_seeds must be None or 1, got 2"):
        pc.train(0, 0, 30, num_seeds=2, teacher=good)
    with pytest.raises(ValueError, match="labels one run"):
        pc.compile(0, 30, num_seeds=3, teacher=good)
    with pytest.raises(ValueError, match=r"teacher must have ask\(round_index, obs, predicted\)"):
        pc.train(0, 0, 30, teacher=object())
    assert pc.state is None
    bad = {
        "shape": (lambda n: (np.full(n + 1, 0.5, np.float32), np.ones(n + 1, bool)), r"must return \(prefs f32\[3\]"),
        "valid dtype": (lambda n: (np.full(n, 0.5, np.float32), np.ones(n, np.int32)), r"valid bool\[3\]"),
        "range": (lambda n: (np.full(n, 1.5, np.float32), np.ones(n, bool)), r"must lie in \[0, 1\]; round 0"),
        "nan": (lambda n: (np.full(n, np.nan, np.float32), np.ones(n, bool)), r"must lie in \[0, 1\]"),
    }
    for name, (fn, match) in bad.items():
        with pytest.raises(ValueError, match=match):
            pc.train(0, 0, 30, teacher=Answers(fn))
        assert pc.state is None, name  # nothing committed
    # NaN where the pair is skipped is not an answer: stored as 0.5, invalid
    pc.train(0, 0, 30, teacher=Answers(lambda n: (np.full(n, np.nan, np.float32), np.zeros(n, bool))))
    assert not np.any(np.asarray(pc.state.buffer.pairs.valid)) and np.all(np.asarray(pc.state.buffer.prefs) == 0.5)
    # with one seed (the demo's batched run of 1) a host teacher is fine
    pc.train(0, 0, 30, num_seeds=1, teacher=good)
    assert pc.state.buffer.prefs.shape == (1, 30) and np.all(np.asarray(pc.state.buffer.pairs.valid))


@pytest.mark.slow
def test_a_resume_with_another_teacher_is_refused_unless_allowed(loops, oracle, tmp_path):
    from jaxweight import checkpoint
    from jaxweight.preference import driver as dr

    trajs = loops._random_policy_trajs(jax.random.key(0), 3_000)
    pc = loops.make_dataset_loop(trajs)

    class Stop(Exception):
        pass

    def stop_after_round_1(i):
        if i == 1:
            raise Stop

    with pytest.raises(Stop):
        pc.train(0, 0, 60, stop_after_round_1, checkpoint_dir=tmp_path)
    assert checkpoint.load_metadata(tmp_path / dr.CHECKPOINT_NAME)["fingerprint"]["teacher"] == "synthetic"
    teacher = _OracleTeacher(oracle)
    with pytest.raises(ValueError, match=r"settings differ: teacher \(checkpoint 'synthetic', now 'scripted'\)"):
        loops.make_dataset_loop(trajs).train(0, 0, 60, checkpoint_dir=tmp_path, resume=True, teacher=teacher)
    with pytest.raises(ValueError, match="teacher"):
        pc.check_checkpoint(tmp_path, 0, 60, teacher=teacher)
    assert pc.check_checkpoint(tmp_path, 0, 60) == []
    assert teacher.asked == []
    other = loops.make_dataset_loop(trajs)
    other.train(0, 0, 60, checkpoint_dir=tmp_path, resume=True, teacher=teacher, allow_changed=["teacher"])
    assert [r for r, _, _ in teacher.asked] == [2, 3]                  # from the last finished round on
    assert other.overrides[-1]["changed"] == ["teacher (checkpoint 'synthetic', now 'scripted')"]
    assert checkpoint.load_metadata(tmp_path / dr.CHECKPOINT_NAME)["fingerprint"]["teacher"] == "scripted"


# ------------------------------------------------------------------ the demo
def test_demo_settings_for_a_person(loops):
    from jaxweight.demos import preferences as demo

    for env in ("cartpole", "pendulum"):
        for quick in (False, True):
            s = demo.settings(env, quick, teacher="human")
            assert s.seeds == 1 and s.teacher == "human"
            assert s.total_comparisons == (80 if quick else 300)
            plan = demo.build(s).plan(s.total_timesteps, s.total_comparisons)
            first = 24 if (quick and env == "cartpole") else 20 if quick else 30
            assert 7 <= min(plan.schedule) and max(plan.schedule) <= first, (env, quick, plan.schedule)
            if quick and env == "cartpole":
                # something to judge in the first two minutes: 100-step episodes, 30% of the pairs in round 0
                assert plan.schedule[0] == 24 and s.horizon == 100 and s.exploration_frac == 0.5
                assert demo.goal_return(dataclasses.asdict(s)) == pytest.approx(90.0)
            else:
                assert s.horizon is None and s.exploration_frac == 0.0 and s.initial_comparison_frac == 0.1
            if not quick:
                assert plan.num_rounds == 16 and plan.schedule[:3] == (30, 26, 24) and plan.schedule[-1] == 13
    assert demo.settings("cartpole", teacher="human", total_comparisons=40).total_comparisons == 40
    assert demo.settings().teacher == "synthetic" and demo.settings().total_comparisons == 2000
    with pytest.raises(ValueError, match="a person labels one run: --teacher human takes one seed, got --seeds 2"):
        demo.settings(seeds=2, teacher="human")
    with pytest.raises(ValueError, match="teacher must be one of"):
        demo.settings(teacher="oracle")
    with pytest.raises(ValueError, match="needs an output folder"):
        demo.run(teacher="human", out=None)


def test_demo_refuses_a_human_run_it_cannot_do_in_one_line(loops, monkeypatch, capsys, tmp_path):
    from jaxweight.demos import _common as C
    from jaxweight.demos import preferences as demo

    def fails(argv, expect):
        with pytest.raises(SystemExit) as e:  # refused by the command line, before jax is needed
            demo.main(argv + ["--out", str(tmp_path / "out")])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("python -m jaxweight demo preferences: error: ") and expect in err[0]

    fails(["--teacher", "human", "--seeds", "2"], "a person labels one run: --teacher human takes one seed")
    fails(["--port", "8123"], "--port is the labelling page's: it needs --teacher human")
    fails(["--idle", "ask"], "--idle is the labelling page's: it needs --teacher human")
    real = C.missing_modules
    monkeypatch.setattr(C, "missing_modules", lambda mods: ["starlette", "uvicorn"] if "starlette" in mods
                        else real(mods))
    from jaxweight._install import install_hint
    fails(["--teacher", "human"], f"--teacher human needs starlette, uvicorn: {install_hint('label')}")
    assert not (tmp_path / "out").exists()  # refused before anything was written


def _digest_person(api: Api, stop: threading.Event, said: list, *, until: tuple[int, int] | None = None) -> None:
    """Answer every pair the page shows by its digest; with ``until=(round, k)`` stop after k labels of that round."""
    while not stop.is_set():
        try:
            s = api.state()
        except OSError:  # the run ended (or was killed)
            return
        if s["round"] is None or s["done"]:
            time.sleep(0.02)
            continue
        if until is not None and s["round"] == until[0] and s["answered"] >= until[1]:
            return
        choice = _by_digest(s["digest"])
        status, body = api.label(s["round"], s["pair"], choice)
        assert status == 200, body
        said.append((s["round"], s["pair"], choice, s["digest"]))


class _DemoRun:
    """``python -m jaxweight demo preferences --teacher human`` in a subprocess, tiny, with a scripted person."""

    # --idle ask: this tiny run's untrained agent is fallen in most fragments; the rule would leave few pairs to ask
    ARGS = ["--teacher", "human", "--rounds", "2", "--comparisons", "14", "--timesteps", "1024",
            "--fragment-length", "5", "--no-baseline", "--no-progress", "--seed", "3", "--idle", "ask"]

    def __init__(self, out: Path, *extra: str):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as a user runs it
        self.proc = subprocess.Popen([sys.executable, "-m", "jaxweight", "demo", "preferences", "--out", str(out),
                                      *self.ARGS, *extra], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        while True:
            line = self.proc.stdout.readline()
            assert line, "the demo ended before printing its URL: " + "".join(self.lines) + self.proc.stderr.read()
            self.lines.append(line)
            if line.startswith("[label] compare clips at "):
                self.url = line.split(" at ", 1)[1].strip()
                break
        self.api = Api(self.url)
        self.said: list = []
        self.stop = threading.Event()

    def person(self, **kw) -> threading.Thread:
        t = threading.Thread(target=_digest_person, args=(self.api, self.stop, self.said), kwargs=kw, daemon=True)
        t.start()
        return t

    def finish(self, timeout: float = 600) -> str:
        out, err = self.proc.communicate(timeout=timeout)
        self.stop.set()
        assert self.proc.returncode == 0, "".join(self.lines) + out + err[-3000:]
        return "".join(self.lines) + out


@pytest.mark.web
@pytest.mark.slow
def test_human_teacher_on_an_env_without_a_renderer_is_a_clear_error(tmp_path, capsys):
    """``--teacher human`` on an environment id without a clip renderer: one line, exit 2."""
    pytest.importorskip("gymnax", reason="needs the rl extra (pip install -e '.[rl]')")
    pytest.importorskip("PIL", reason="needs the label extra (pip install -e '.[label]')")
    pytest.importorskip("starlette", reason="needs the label extra (pip install -e '.[label]')")
    from jaxweight.demos import preferences as demo

    code = demo.main(["--env", "gymnax:Acrobot-v1", "--teacher", "human", "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "no renderer for environment 'gymnax:Acrobot-v1'" in err, err


@pytest.mark.web
@pytest.mark.slow
def test_a_demo_run_killed_mid_round_resumes_with_every_label_and_ends_like_an_uninterrupted_one(loops, tmp_path):
    pytest.importorskip("starlette", reason=WEB_REASON)
    pytest.importorskip("uvicorn", reason=WEB_REASON)
    tag = "cartpole"
    whole, cut = tmp_path / "whole", tmp_path / "cut"

    run = _DemoRun(whole)
    assert run.url.startswith("http://127.0.0.1:") and "?token=" in run.url
    run.person()
    printed = run.finish()
    assert "by the human teacher" in printed and f"labels: {whole / 'checkpoints' / tag / 'labels.jsonl'}" in printed
    res = json.loads((whole / f"{tag}.json").read_text())
    schedule = res["plan"]["schedule"]
    asked = [res["label_rounds"][str(i)]["asked"] for i in range(len(schedule))]
    by_rule = [res["label_rounds"][str(i)]["by_rule"] for i in range(len(schedule))]
    assert len(run.said) == sum(asked) and asked[1] >= 4
    said_in = lambda i: [p for r, p, *_ in run.said if r == i]  # noqa: E731

    killed = _DemoRun(cut)
    killed.person(until=(1, 2)).join(timeout=600)
    assert [(r, p) for r, p, *_ in killed.said] == [(0, p) for p in said_in(0)] + [(1, p) for p in said_in(1)[:2]]
    killed.proc.send_signal(signal.SIGKILL)                             # no clean shutdown: a crash
    killed.proc.communicate(timeout=60)
    assert killed.proc.returncode == -signal.SIGKILL
    labels = cut / "checkpoints" / tag / "labels.jsonl"
    assert len(labels.read_text().splitlines()) == asked[0] + 2

    resumed = _DemoRun(cut, "--resume")
    assert resumed.url == killed.url                                    # the same address: an open tab goes on
    assert any(f"resuming: 1 of {len(schedule)} rounds done; continuing with round 2 of {len(schedule)}" in x
               for x in resumed.lines)
    assert any(f"({asked[0] + 2} lines given before)" in x for x in resumed.lines)
    deadline = time.monotonic() + 600
    while (s := resumed.api.state())["round"] != 1:                     # compiled, round 1 replayed ...
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (s["answered"], s["pair"]) == (2, said_in(1)[2])              # ... with its two labels kept
    assert s["digest"] == run.said[asked[0] + 2][3]                      # the same pairs came back
    resumed.person()
    printed = resumed.finish()
    n = len(schedule)
    assert (f"[label] round 2 of {n}: {2 + by_rule[1]}/{schedule[1]} pairs answered; waiting for the rest on the "
            "page") in printed
    assert f"[label] round 2 of {n}: {schedule[1]}/{schedule[1]} pairs answered\n" in printed

    answers = lambda path: [(x["round"], x["pair"], x["choice"], x["digest"])  # noqa: E731
                            for x in map(json.loads, path.read_text().splitlines())]
    assert answers(labels) == answers(whole / "checkpoints" / tag / "labels.jsonl") == run.said
    ckpt = Path("checkpoints") / tag / "loop_state.ckpt"
    assert (cut / ckpt).read_bytes() == (whole / ckpt).read_bytes()     # state, history and fingerprint
    a, b = (json.loads((d / f"{tag}.json").read_text()) for d in (whole, cut))
    assert b["history"] == a["history"] and b["final"] == a["final"]
    buf_valid = [h["stored_valid"][0] for h in a["history"]]
    skips = sum(c == "skip" for _, _, c, _ in run.said)
    assert buf_valid[-1] == sum(schedule) - skips


@pytest.mark.web
@pytest.mark.slow
def test_ctrl_c_prints_one_line_and_a_fresh_run_never_resumes_the_earlier_one(loops, tmp_path):
    """SIGINT while round 1 waits on the page: one line on stderr (labels kept, --resume), exit 130, the open
    page told. A fresh run over it moves its checkpoint aside: a --resume after the fresh run stops in its
    first round starts that round again, it does not continue the earlier, finished run."""
    pytest.importorskip("starlette", reason=WEB_REASON)
    pytest.importorskip("uvicorn", reason=WEB_REASON)
    out, tag = tmp_path / "out", "cartpole"
    stopped = _DemoRun(out)
    deadline = time.monotonic() + 600
    while stopped.api.state()["phase"] != "labelling":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    stopped.proc.send_signal(signal.SIGINT)
    rest, err = stopped.proc.communicate(timeout=120)
    assert stopped.proc.returncode == 130, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines == [f"[preferences] stopped: labels kept in {out / 'checkpoints' / tag / 'labels.jsonl'}; run again "
                     "with --resume to continue"], err
    assert "Traceback" not in err

    finished = _DemoRun(out)                                            # a whole run, then a fresh one stopped early
    finished.person()
    finished.finish()
    ckpt = out / "checkpoints" / tag / "loop_state.ckpt"
    assert ckpt.exists()
    fresh = _DemoRun(out)
    assert any("is moved aside" in x for x in fresh.lines) and not ckpt.exists()
    assert len(list(ckpt.parent.glob("loop_state-*.ckpt"))) == 1
    fresh.proc.kill()
    fresh.proc.communicate(timeout=60)
    resumed = _DemoRun(out, "--resume")
    assert any("starting a new run (no checkpoint to resume)" in x for x in resumed.lines), resumed.lines
    resumed.proc.kill()
    resumed.proc.communicate(timeout=60)
