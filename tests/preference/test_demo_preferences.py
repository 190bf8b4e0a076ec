"""The ``preferences`` demo: settings, CLI wiring, and the quick run end to end."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxweight import cli
from jaxweight.demos import preferences as demo


def test_settings_and_plan():
    s = demo.settings()
    assert (s.env, s.seeds, s.fragment_length, s.total_comparisons) == ("cartpole", 4, 20, 2000)
    q = demo.settings("cartpole", quick=True)
    assert q.quick and q.seeds == 2 and q.total_comparisons < s.total_comparisons
    assert q.num_iterations < s.num_iterations and q.total_timesteps == s.total_timesteps
    assert demo.settings("pendulum", seeds=3).seeds == 3
    with pytest.raises(ValueError, match="env must be 'cartpole', 'pendulum', 'gymnax:<id>' or 'brax:<name>'"):
        demo.settings("acrobot")
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        demo.settings(seeds=0)
    pc = demo.build(q)
    plan = pc.plan(q.total_timesteps, q.total_comparisons)
    assert sum(plan.schedule) == q.total_comparisons and plan.num_rounds == q.num_iterations + 1
    # PPO anneals its learning rate over exactly the agent steps of the run
    assert float(pc.generator.hparams.anneal_steps) == sum(plan.agent_steps)
    assert not pc.sample_labels and pc.ensemble
    # every main hyperparameter can be set (the CLI flags fill these in)
    o = demo.settings("cartpole", quick=True, num_iterations=3, total_comparisons=300, total_timesteps=9_000,
                      fragment_length=10, num_members=4, reward_learning_rate=3e-3, learning_rate=None)
    assert (o.num_iterations, o.total_comparisons, o.total_timesteps, o.fragment_length, o.num_members) == (
        3, 300, 9_000, 10, 4) and o.learning_rate == q.learning_rate
    pc = demo.build(o)
    assert float(pc.reward_trainer.config.learning_rate) == pytest.approx(3e-3)
    assert pc.reward_trainer.config.num_members == 4 and pc.config.fragment_length == 10
    with pytest.raises(ValueError, match="unknown settings"):
        demo.settings(bogus=1)


def test_cli_dispatches_to_the_demo(capsys):
    assert cli.DEMOS["preferences"] == "jaxweight.demos.preferences"
    with pytest.raises(SystemExit) as e:
        cli.demo(["preferences", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--resume" in out and "--env ENV" in out and "gymnax:<id>" in out and "--seeds" in out
    for flag in ("--rounds", "--comparisons", "--timesteps", "--fragment-length", "--members", "--reward-lr",
                 "--agent-lr", "--agent", "--strict", "--tensorboard", "--resume-override", "--out"):
        assert flag in out, flag
    assert "jaxweight-out/preferences/" in out


def test_table_and_goals_format():
    res = {
        "settings": {"env": "cartpole", "quick": False},
        "final": {"return": np.array([500.0, 420.0]), "return_deterministic": np.array([500.0, 430.0]),
                  "heldout_accuracy": np.array([0.99, 0.95]), "heldout_decided": np.array([900, 800]),
                  "pearson": np.array([0.97, 0.9])},
        "history": [{"reward_accuracy": [0.6, 0.55]}],
        "baseline_return": np.array([500.0, 480.0]),
        "wall_s": 610.0,
    }
    table = demo.format_table(res)
    assert "460.0+-56.6" in table and "97.0+-2.8%" in table and "490.0+-14.1" in table
    mean_row = next(line for line in table.splitlines() if line.lstrip().startswith("mean"))
    assert mean_row.split()[4] == "850"  # decided: the mean over seeds, like every other column
    columns, legend = table.splitlines()[0], table.split("\n\n", 1)[1]
    for col in ("true return", "greedy", "held-out acc", "decided", "pearson", "PPO on true r"):
        assert col in columns and f"  {col}  " in legend, col  # every column says what it is
    assert "train acc" not in table
    assert demo.goals(res) == [("mean ground-truth return 460.0 >= 450", True),
                               ("mean held-out accuracy 97.0% >= 90%", True),
                               ("wall time 610 s <= 600 s", False)]
    res["settings"]["env"] = "pendulum"
    assert demo.goals(res) == []


def test_progress_legend_explains_the_bars_accuracies():
    """The line under the progress bar names each accuracy the bar shows, and the tie rule it states is the
    training metric's: a tie (label 0.5) counts as agreeing only when the model does not favour the first."""
    import jax.numpy as jnp

    from jaxweight.preference import training
    from jaxweight.preference.driver import _postfix

    host = {"reward_loss": [0.6], "reward_accuracy": [0.56], "fresh_accuracy": [1.0], "fresh_decided": [9],
            "round": [1], "gt_episodes": [8], "gt_return": [500.0]}
    shown = [k for k in _postfix(host) if "acc" in k]
    assert shown == ["acc", "new_acc"]
    for key, line in zip(shown, demo.PROGRESS_LEGEND):
        assert line.startswith(f"[preferences] {key}")
    assert "tie" in demo.PROGRESS_LEGEND[0] and "ties left out" in demo.PROGRESS_LEGEND[1]
    probs, ties = jnp.array([0.4, 0.5, 0.6]), jnp.full((3,), 0.5)
    zeros, mask = jnp.zeros(3), jnp.ones(3, bool)
    assert float(training._sums(ties, mask, zeros, probs, probs)[1]) == 2.0  # the 0.6 one favours the first


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    """The quick demo: 2 seeds in one vmapped program; the agent, trained on the learned reward only,
    balances the pole, and the learned reward tracks the true one on held-out episodes.

    It runs as a user runs it: ``python -m jaxweight demo preferences`` in a fresh process on one
    device. (Under the suite's 8 fake CPU devices XLA orders some float sums differently and one
    of the two quick seeds ends below the goal: RL on two seeds has little margin.)
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "jaxweight", "demo", "preferences", "--quick", "--out", str(tmp_path),
         "--no-progress", "--strict"],
        env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "held-out acc" in out and "mean" in out and "[met] mean held-out accuracy" in out
    assert "compiled the loop in" in out and "compile" in out and "run" in out
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and all("preference/reward_accuracy/mean" in json.dumps(r) for r in rows)
    png = tmp_path / "cartpole_quick.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "checkpoints" / "cartpole_quick" / "loop_state.ckpt").exists()
    res = json.loads((tmp_path / "cartpole_quick.json").read_text())
    final = res["final"]
    assert len(final["return"]) == 2 and len(res["history"]) == res["settings"]["num_iterations"] + 1
    assert all(p > 0.8 for p in final["pearson"]), final["pearson"]           # held-out transitions
    assert all(a > 0.9 for a in final["heldout_accuracy"]), final["heldout_accuracy"]
    assert np.mean(final["return"]) > 300, final["return"]                     # a random policy gets ~20
    # the loop's accounting made it into the history
    assert [h["buffer_size"][0] for h in res["history"]] == list(np.cumsum(res["plan"]["schedule"]))


def test_checkpoint_status_line(tmp_path):
    """The demo says whether it resumes (rounds counted from 1), moves an earlier run's checkpoint aside, or starts
    anew."""
    from jaxweight import checkpoint
    from jaxweight.preference.driver import CHECKPOINT_NAME

    assert demo._checkpoint_status(tmp_path, False, 7) == "[preferences] starting a new run"
    assert "no checkpoint to resume" in demo._checkpoint_status(tmp_path, True, 7)
    checkpoint.save(tmp_path / CHECKPOINT_NAME, {"x": np.zeros(2, np.float32)}, metadata={"rounds_done": 3})
    assert demo._checkpoint_status(tmp_path, True, 7).startswith(
        "[preferences] resuming: 3 of 7 rounds done; continuing with round 4 of 7")
    over = demo._checkpoint_status(tmp_path, False, 7)
    assert "3 of 7 rounds done" in over and "moved aside" in over and "--resume" in over
    checkpoint.save(tmp_path / CHECKPOINT_NAME, {"x": np.zeros(2, np.float32)}, metadata={"rounds_done": 7})
    assert "all 7 rounds are done already" in demo._checkpoint_status(tmp_path, True, 7)
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"garbage")
    assert "cannot be read" in demo._checkpoint_status(tmp_path, True, 7)


def test_resume_of_a_finished_run_says_so_and_exits_0_without_evaluating(tmp_path, capsys, monkeypatch):
    """A checkpoint with every round done and its results JSON written after it: ``--resume`` prints the
    results path and exits 0; the loop is never trained or evaluated again."""
    import dataclasses
    import json
    import time

    from jaxweight import checkpoint
    from jaxweight.preference.driver import CHECKPOINT_NAME

    s = demo.settings("cartpole", quick=True)
    rounds = demo.build(s).plan(s.total_timesteps, s.total_comparisons).num_rounds
    tag = demo.file_tag("cartpole", quick=True)
    ck = tmp_path / "checkpoints" / tag
    checkpoint.save(ck / CHECKPOINT_NAME, {"x": np.zeros(2, np.float32)}, metadata={"rounds_done": rounds})
    time.sleep(0.05)
    results = tmp_path / f"{tag}.json"
    results.write_text(json.dumps({"settings": demo._json_ready(dataclasses.asdict(s)), "marker": 1}))
    monkeypatch.setattr(demo, "_run", lambda *a, **k: pytest.fail("a finished run was run again"))
    assert demo.main(["--quick", "--resume", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr()
    assert f"[preferences] finished earlier: results in {results}" in out.out
    assert f"this run is finished: all {rounds} rounds done; results in {results}" in out.out + out.err
    # other settings, or a checkpoint newer than the results (an evaluation that never finished): not finished
    assert demo.finished_results(ck, results, rounds, {**dataclasses.asdict(s), "seeds": 7}) is None
    assert demo.finished_results(ck, results, rounds + 1, dataclasses.asdict(s)) is None
    time.sleep(0.05)
    checkpoint.save(ck / CHECKPOINT_NAME, {"x": np.zeros(2, np.float32)}, metadata={"rounds_done": rounds})
    assert demo.finished_results(ck, results, rounds, dataclasses.asdict(s)) is None


def test_figure_leaves_out_rounds_without_a_decided_fresh_pair():
    """``fresh_accuracy`` is 0 where no new pair was decided (``fresh_decided`` 0): not measured, so not plotted."""
    pytest.importorskip("matplotlib", reason="needs matplotlib (the notebooks extra)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(0.6, 0.7, 9, 8), (0.0, 0.9, 0, 5), (0.0, 0.0, 0, 0), (0.95, 1.0, 4, 6)]   # (acc0, acc1, n0, n1)
    hist = [{"agent_steps": [1000, 1000], "gt_return": [10.0, 20.0], "reward_accuracy": [0.8, 0.9],
             "fresh_accuracy": [a0, a1], "fresh_decided": [n0, n1]} for a0, a1, n0, n1 in rows]
    res = {"history": hist, "settings": {"env": "cartpole"}, "baseline_return": None,
           "final": {"heldout_accuracy": np.array([0.9, 0.95])}}
    fig = demo.make_figure(plt, res)
    try:
        ax = fig.axes[1]
        per_seed = [np.asarray(line.get_ydata(), np.float64) for line in ax.lines[:2]]
        np.testing.assert_array_equal(per_seed[0], [0.6, np.nan, np.nan, 0.95])
        np.testing.assert_array_equal(per_seed[1], [0.7, 0.9, np.nan, 1.0])
        mean = next(line for line in ax.lines if line.get_label().startswith("on each round's new comparisons"))
        np.testing.assert_allclose(np.asarray(mean.get_ydata(), np.float64), [0.65, 0.9, np.nan, 0.975])
    finally:
        plt.close(fig)
