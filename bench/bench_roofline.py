"""The roofline of every hot path: how close each runs to this machine's memory bandwidth or matmul peak.

For each program of :data:`hot_paths.BUILDERS` (random-weight schedule, curriculum step, MaxEnt
fused step and weighted policy loss, active selection, one ensemble epoch, weight sync) at the
CPU benchmarks' sizes (``--quick``: small), one row: the median time, XLA's bytes accessed and
flops of the compiled program, and the roofline fraction against the copy bandwidth and matmul
peak measured in the same run (:mod:`_roofline`). The baseline column is the roofline time
itself (``max(bytes / bandwidth, flops / peak)``), so the ratio is the roofline fraction.
PPO and the preference loop's rounds are in the device suite (``bench/device_suite.py``).

Run: ``python bench/bench_roofline.py [--quick] [--json out.json]`` or
``python -m jaxweight bench --only roofline``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _roofline  # noqa: E402
import hot_paths  # noqa: E402
from _common import main, record  # noqa: E402

MODULE = "roofline"


def run(quick: bool = False) -> list[dict]:
    size = "quick" if quick else "cpu"
    limits = _roofline.machine_limits("quick" if quick else "auto")
    recs = []
    for name, build in hot_paths.BUILDERS.items():
        hp = build(size)
        m = hot_paths.measure(hp, n=3 if quick else 10)
        rf = _roofline.roofline(m["median_s"], m["cost"], limits)
        t_roof = rf["roofline_fraction"] * m["median_s"]
        recs.append(record(MODULE, hp.name, hp.size, m["median_s"], f"roofline ({rf['bound']})", t_roof,
                           compile_s=m["compile_s"], min_s=m["min_s"], max_s=m["max_s"], **rf,
                           copy_bandwidth_Bps=limits["copy_bandwidth_Bps"],
                           matmul_f32_flops=limits["matmul_f32_flops"], key=name,
                           note=hp.note + ("; XLA counts a loop body once: bytes, flops and the fraction are "
                                           "lower bounds" if rf["has_loop"] else "")))
    return recs


if __name__ == "__main__":
    main(run)
