"""The grpo demo: GRPO against MaxEnt-GRPO on a toy task, written with the public maxent API."""

import json
import math

import numpy as np
import pytest


@pytest.mark.slow
def test_grpo_demo_quick(tmp_path):
    from jaxweight.demos import grpo

    res = grpo.run(quick=True, out=tmp_path, progress=False)
    for method in ("grpo", "maxent"):
        hist = res[method]
        assert np.mean(hist["reward"][-5:]) > np.mean(hist["reward"][:5]) + 0.3, method
    # MaxEnt keeps the policy spread over the correct answers; GRPO collapses
    assert res["maxent"]["diversity"][-1] > res["grpo"]["diversity"][-1] + 0.2
    # the controller moves tau toward the target entropy at every unclamped step
    tau = np.log(res["maxent"]["tau"])
    ema = res["maxent"]["entropy_ema"]
    cfg = res["config"]
    moved = np.diff(tau)[1:]
    want = np.sign(res["target_entropy"] - ema[1:-1])
    free = np.exp(tau[2:]) > 0.005 * 1.0001
    assert free.sum() > 10
    np.testing.assert_array_equal(np.sign(moved)[free], want[free])
    assert np.all(res["grpo"]["tau"] == cfg.tau0)  # its controller is off
    assert (tmp_path / "grpo_maxent.png").exists() and (tmp_path / "grpo_maxent.csv").exists()
    # the demo's stated goals hold for the quick run, and compile time is apart from run time
    assert [ok for _, ok in res["goals"]] == [True, True, True], res["goals"]
    assert res["compile_seconds"] > 0 and res["seconds"] > 0
    assert set(res["paths"]) == {"results", "csv", "plot", "metrics"}


def _tfevent_scalars(folder, tag: str) -> list[float]:
    """``simple_value`` of every event of ``tag`` in ``folder``'s event files (TFRecord framing, no protobuf lib)."""
    import struct

    vals = []
    for f in sorted(folder.glob("events.out.tfevents.*")):
        data, i = f.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack_from("<Q", data, i)
            rec = data[i + 12:i + 12 + n]  # length, its crc, record, its crc
            i += 12 + n + 4
            # Summary.Value: field 1 ``tag`` (0x0a, length, bytes) then field 2 ``simple_value`` (0x15, f32)
            key = b"\x0a" + bytes([len(tag)]) + tag.encode() + b"\x15"
            j = rec.find(key)
            if j >= 0:
                vals.append(struct.unpack_from("<f", rec, j + len(key))[0])
    return vals


@pytest.mark.slow
def test_grpo_demo_main_quick_writes_results_metrics_csv_png(tmp_path, capsys):

    from jaxweight.demos import grpo

    assert grpo.main(["--quick", "--strict", "--out", str(tmp_path), "--no-progress"]) == 0  # goals met
    out = capsys.readouterr().out
    assert "compile " in out and ", run " in out and out.count("[met]") == 3 and "NOT met" not in out
    steps = grpo.QUICK.steps

    res = json.loads((tmp_path / "results.json").read_text())
    assert res["settings"]["steps"] == steps and res["settings"]["seed"] == 0
    assert res["target_entropy"] == pytest.approx(0.8 * math.log(grpo.QUICK.generations))
    assert res["final"]["maxent"]["diversity"] > res["final"]["grpo"]["diversity"] + 0.1
    assert res["final"]["grpo"]["tau"] == pytest.approx(grpo.QUICK.tau0)
    assert res["time"]["time/compile_s"] > 0 and res["time"]["time/run_s"] > 0
    assert [g["met"] for g in res["goals"]] == [True, True, True]

    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(steps))
    keys = {f"{m}/{k}" for m in ("grpo", "maxent") for k in (
        "reward", "success", "weight_entropy", "weight_entropy_ema", "tau", "beta", "kl", "diversity", "ess")}
    assert set(lines[0]) == keys | {"step"}
    assert lines[0]["maxent/tau"] == pytest.approx(grpo.QUICK.tau0)
    assert lines[-1]["maxent/diversity"] == pytest.approx(res["final"]["maxent"]["diversity"])
    assert lines[-1]["maxent/weight_entropy"] == pytest.approx(res["final"]["maxent"]["weight_entropy"])

    rows = (tmp_path / "grpo_maxent.csv").read_text().splitlines()
    assert len(rows) == steps + 1 and rows[0].startswith("step,grpo_reward,grpo_success,")
    assert float(rows[-1].split(",")[rows[0].split(",").index("maxent_diversity")]) == pytest.approx(
        res["final"]["maxent"]["diversity"], rel=1e-5)
    pytest.importorskip("matplotlib")
    assert (tmp_path / "grpo_maxent.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_grpo_demo_tensorboard_event_files(tmp_path):
    pytest.importorskip("tensorboardX")

    from jaxweight.demos import grpo

    tb = tmp_path / "tb"
    argv = ["--quick", "--steps", "4", "--out", str(tmp_path / "o"), "--tensorboard", str(tb), "--no-progress"]
    assert grpo.main(argv) == 0
    events = list(tb.glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    lines = [json.loads(ln) for ln in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    for tag in ("grpo/reward", "maxent/tau"):  # the event files hold the same numbers, step by step
        np.testing.assert_allclose(_tfevent_scalars(tb, tag), [r[tag] for r in lines], rtol=1e-6)


def test_grpo_demo_run_rejects_bad_steps_and_seed():
    from jaxweight.demos import grpo

    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        grpo.run(quick=True, steps=0, progress=False)
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        grpo.run(quick=True, seed=-1, progress=False)




@pytest.mark.fast
@pytest.mark.smoke
def test_grpo_demo_smoke_tiny(tmp_path):
    """Smoke (the fast tier's end-to-end run of the demo): a tiny task, both methods, outputs written."""
    from jaxweight.demos import grpo

    cfg = grpo.DemoConfig(prompts=8, candidates=6, generations=4, correct=2, steps=4, chunks=2)
    res = grpo.run(out=tmp_path, progress=False, cfg=cfg)
    for method in ("grpo", "maxent"):
        assert len(res[method]["reward"]) == 4 and np.all(np.isfinite(res[method]["reward"])), method
    assert (tmp_path / "results.json").stat().st_size > 0 and (tmp_path / "metrics.jsonl").stat().st_size > 0
