"""The roofline's measurement rules and the device suite's plan (bench/_roofline.py, bench/hot_paths.py,
bench/bench_roofline.py, bench/device_suite.py).

The suite's parts themselves run in CI's device step (``bench --suite device --quick``, brax installed);
here: the rules that keep a fraction at or below 1, and every GPU-size program traced without memory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _roofline  # noqa: E402
import bench_roofline  # noqa: E402
import device_suite  # noqa: E402
import hot_paths  # noqa: E402


def test_check_fails_a_fraction_above_1_05_and_passes_one_below():
    ok = [{"key": "a", "size": "s", "bandwidth_fraction": 1.04}, {"key": "b", "size": "s", "bandwidth_fraction": None}]
    _roofline.check(ok)
    with pytest.raises(ValueError, match=r"b @ s: 1\.200"):
        _roofline.check(ok + [{"key": "b", "size": "s", "bandwidth_fraction": 1.2}])


@pytest.mark.fast
def test_a_memory_row_uses_min_bytes_over_the_interleaved_stream():
    """weight sync at 48 MiB (a working set of 96 MiB, above 2x this machine's last-level cache)."""
    if 96 << 20 < 2 * _roofline.llc_bytes():
        pytest.skip("this machine's last-level cache holds the working set")  # pragma: no cover
    stream = _roofline.Stream()
    hp = hot_paths.weight_sync("cpu", 48)
    assert hp.min_bytes == 2 * (48 << 20)                       # the learner read once, the actor written once
    r = bench_roofline.row("weight_sync", hp, stream, 3, {})
    assert r["stream_bytes"] >= 4 * _roofline.llc_bytes() and r["stream_calls"] == 3
    assert r["stream_faults_per_call"] < 1                       # donated: no fresh pages timed
    assert 0 < r["bandwidth_fraction"] <= _roofline.MAX_FRACTION
    assert r["bandwidth_fraction"] == pytest.approx(hp.min_bytes / r["jaxweight_s"] / r["stream_Bps"])
    assert r["modelled_bytes"] > 0 and r["cache_resident"] is False


def test_min_bytes_rules():
    hp = hot_paths.maxent_step("quick")
    out = jax.eval_shape(hp.fn, *hp.args)
    assert hp.min_bytes == _roofline.tree_bytes(hp.args) + _roofline.tree_bytes(out)   # read once, written once
    cur = hot_paths.curriculum_step("quick", 1_000_000)
    # touched rows only: far less than the pool, which one pass over would read
    assert cur.min_bytes < _roofline.tree_bytes(cur.args[0]) / 4
    small = bench_roofline.row("maxent_step", hp, _roofline.Stream(), 3, {})
    assert small["cache_resident"] is True and small["bandwidth_fraction"] is None


def test_latency_rows_report_iterations_floor_and_throughput():
    hp = hot_paths.ensemble_epoch("quick", 64)
    r = bench_roofline.row("ensemble_epoch", hp, _roofline.Stream(), 3, {})
    assert r["iterations"] == 2 and r["per_iteration_s"] == pytest.approx(r["jaxweight_s"] / 2)
    assert 0 < r["per_iteration_floor_s"] < r["per_iteration_s"] and r["bandwidth_fraction"] is None
    assert r["throughput"] == pytest.approx(64 / r["jaxweight_s"]) and r["unit"] == "pairs/s"


def test_growth_exponent_of_a_linear_cost():
    pts = [{"n_size": n, "jaxweight_s": 1e-6 + 1e-8 * n} for n in (10, 100, 1000, 10_000, 100_000)]
    g = bench_roofline.growth(pts)
    assert g["growth_exponent"] == pytest.approx(1.0, abs=0.1) and g["latency_until"] == 100


@pytest.mark.fast
@pytest.mark.parametrize("key", list(hot_paths.BUILDERS))
def test_every_gpu_size_builder_traces_with_eval_shape(key):
    """The GPU sizes are built and traced abstractly: no array is allocated, no NumPy draw is made."""
    box = {}

    def make():
        box["hp"] = hot_paths.BUILDERS[key]("gpu")
        return box["hp"].args

    args = jax.eval_shape(make)
    out = jax.eval_shape(box["hp"].fn, *args)
    assert jax.tree.leaves(out)
    if box["hp"].kind == "memory":
        assert box["hp"].min_bytes > 0


def test_hot_path_sizes_are_checked():
    with pytest.raises(ValueError, match="size must be one of"):
        hot_paths.weight_sync("huge")


def test_sweeps_cover_two_decades_at_four_sizes():
    for size in ("quick", "cpu"):
        for key, ns in hot_paths.SWEEPS[size].items():
            assert key in hot_paths.BUILDERS and len(ns) >= 4 and ns == sorted(ns)
            if size == "cpu":
                assert ns[-1] / ns[0] >= 100, key


def test_plan_is_two_calls_within_300_s_each_opening_with_a_preflight(capsys):
    plan = device_suite.plan("gpu")
    assert [c["call"] for c in plan["calls"]] == [1, 2]
    for c in plan["calls"]:
        assert c["budget_s"] <= 300 and c["planned_s"] <= c["budget_s"]
        assert c["parts"][0] == {"part": "preflight", "budget_s": 30}
    assert device_suite.main(["--plan"]) == 0
    assert json.loads(capsys.readouterr().out) == plan


def test_gpu_call_without_wheels_stops_before_any_child(tmp_path, monkeypatch):
    monkeypatch.setattr(device_suite, "ROOT", tmp_path)   # a checkout with no .whl/
    res = device_suite.run_call(1, "gpu", tmp_path / "out", log=lambda m: None)
    assert "no .whl" in res["meta"]["stopped"]
    assert not list((tmp_path / "out").glob("*.log"))
    assert json.loads((tmp_path / "out" / "device-suite-call1-gpu.json").read_text())["meta"]["stopped"]


def test_a_part_past_its_timeout_is_killed_and_keeps_its_points(tmp_path, monkeypatch):
    """A child that emits one point and hangs: killed at the call's deadline; the point is in the JSON."""
    monkeypatch.setitem(device_suite.CALLS, 9, {"budget_s": 6, "parts": [("hang", 6)]})
    monkeypatch.setattr(device_suite, "MIN_START_S", 1)
    script = tmp_path / "child.py"
    script.write_text("import sys, json, time\np = sys.argv[sys.argv.index('--points') + 1]\n"
                      "open(p, 'a').write(json.dumps({'status': 'ok', 'what': 'first'}) + '\\n')\ntime.sleep(60)\n")
    monkeypatch.setattr(device_suite, "__file__", str(script))
    res = device_suite.run_call(9, "quick", tmp_path / "out", log=lambda m: None, deadline_s=6)
    assert res["hang"]["status"] == "timed out" and res["hang"]["points"] == [{"status": "ok", "what": "first"}]
    assert res["meta"]["wall_s"] < 10


def test_missing_rows_names_absent_parts_and_paths():
    res = {"preflight": {"status": "ok"}, "hot_paths": {"status": "ok", "points": [
        {"key": "maxent_step", "status": "ok"}, {"key": "weight_sync", "status": "failed"}]}}
    miss = device_suite.missing_rows(res, 1)
    assert "limits" in miss and "hot_paths/weight_sync" in miss and "hot_paths/maxent_step" not in miss
    assert "ppo_vs_brax" in device_suite.missing_rows(res)
