"""The roofline arithmetic and the device suite (bench/device_suite.py) at its quick size.

The suite's PPO-against-brax part needs the brax extra and compiles brax's environments for
minutes on a CPU: CI runs the whole quick suite in its brax step; here it runs without it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _roofline  # noqa: E402
import device_suite  # noqa: E402
import hot_paths  # noqa: E402


def test_cost_reads_bytes_and_flops_of_a_compiled_program():
    x = jnp.ones((1 << 16,), jnp.float32)
    c = _roofline.cost(jax.jit(lambda a: a * 2.0 + 1.0).lower(x).compile())
    assert c["bytes"] == pytest.approx(2 * x.size * 4)      # read once, written once
    assert c["flops"] >= x.size and c["has_loop"] is False
    looped = jax.jit(lambda a: jax.lax.fori_loop(0, 3, lambda i, y: y * 2.0, a)).lower(x).compile()
    assert _roofline.cost(looped)["has_loop"] is True


def test_roofline_fraction_is_the_roofline_time_over_the_measured_time():
    limits = {"copy_bandwidth_Bps": 100.0, "matmul_f32_flops": 1000.0}
    mem = _roofline.roofline(2.0, {"bytes": 100.0, "flops": 10.0, "has_loop": False}, limits)
    assert mem["bound"] == "memory" and mem["roofline_fraction"] == pytest.approx(0.5)
    assert mem["bandwidth_fraction"] == pytest.approx(0.5) and mem["flops_fraction"] == pytest.approx(0.005)
    comp = _roofline.roofline(4.0, {"bytes": 100.0, "flops": 2000.0, "has_loop": False}, limits)
    assert comp["bound"] == "compute" and comp["roofline_fraction"] == pytest.approx(0.5)


def test_hot_path_sizes_are_checked():
    with pytest.raises(ValueError, match="size must be one of"):
        hot_paths.weight_sync("huge")


def test_missing_rows_names_absent_parts_and_paths():
    res = {"limits": {}, "hot_paths": {"rows": [{"name": "maxent_step"}]}}
    miss = device_suite.missing_rows(res)
    assert "ppo_vs_brax" in miss and "hot_paths/weight_sync" in miss and "hot_paths/maxent_step" not in miss


@pytest.mark.slow
def test_quick_suite_writes_every_row(tmp_path):
    """Every part but the brax one and the Countdown study (the brax and stats extras: CI's device-suite
    step runs them) at the quick size: one JSON, every hot path measured, a plot."""
    parts = [p for p in device_suite.PARTS if p not in ("ppo_vs_brax", "countdown")]
    res = device_suite.run(quick=True, out=str(tmp_path), parts=parts, log=lambda m: None)
    saved = json.loads((tmp_path / "device-suite-quick.json").read_text())
    for key in ("command", "machine", "device", "jax_version", "date", "size"):
        assert saved["meta"][key]
    assert saved["meta"]["missing"] == ["ppo_vs_brax", "countdown"]
    assert all(saved[p]["status"] == "ok" for p in parts), {p: saved[p].get("error") for p in parts}
    rows = saved["hot_paths"]["rows"]
    assert [r["name"] for r in rows] == list(hot_paths.BUILDERS)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["bytes_accessed"] > 0 and r["median_s"] > 0 and math.isfinite(r["roofline_fraction"])
    assert saved["preference_seeds"]["cartpole"]["wall_per_seed_s"] > 0
    assert res["meta"]["plot"] is None or (tmp_path / res["meta"]["plot"]).stat().st_size > 0
