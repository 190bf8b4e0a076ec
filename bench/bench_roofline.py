"""The roofline of every hot path, and how each one's cost grows with its size.

For each program of :data:`hot_paths.BUILDERS` at the CPU benchmarks' sizes (``--quick``: small),
one row (:mod:`_roofline` says how each figure is measured):

- memory-bound paths: the minimum bytes, XLA's modelled traffic beside it, the program's median
  time and the stream bandwidth measured interleaved with it, and the fraction
  ``(min_bytes / time) / stream``; a working set under 2x the last-level cache is flagged
  ``cache_resident`` instead. Baseline column: the roofline time ``min_bytes / stream``, so the
  ratio is the fraction.
- looped and latency-bound paths: time per sequential iteration against a measured
  per-iteration floor (the loop's own cost, or one call's dispatch), and throughput in the
  domain's unit. Baseline column: the floor times the iterations.

A fraction above 1.05 fails the run (:func:`_roofline.check`). ``--sweep``: every path at the
sizes of :data:`hot_paths.SWEEPS` (two decades or more), with time, throughput and fraction,
and the log-log growth exponent of time against size over the upper half of the sizes.

Run: ``python -m jaxweight bench --only roofline [--quick] [--json F]``;
``python bench/bench_roofline.py --sweep [--quick] --json F`` for the sweep (its plot:
``python bench/plot_roofline_sweep.py F out.png``).
"""

from __future__ import annotations

import gc
import math
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402

import _roofline  # noqa: E402
import hot_paths  # noqa: E402
from _common import main, record  # noqa: E402

MODULE = "roofline"


def row(key: str, hp: hot_paths.HotPath, stream: _roofline.Stream, n: int, floors: dict) -> dict:
    """One measured row of ``hp`` (see the module docstring)."""
    m = hot_paths.measure(hp, n=n, stream=stream)
    t = m["median_s"]
    llc = _roofline.llc_bytes()
    fields = {k: m[k] for k in m if k not in ("median_s",)}
    fields.update(key=key, kind=hp.kind, bound=hp.kind, n_size=hp.n, llc_bytes=llc, threads=_roofline.cpu_threads(),
                  throughput=hp.units / t, unit=hp.unit)
    baseline, base_s = "-", None
    if hp.min_bytes is not None:
        fields.update(min_bytes=hp.min_bytes, achieved_Bps=hp.min_bytes / t,
                      modelled_over_min=m["modelled_bytes"] / hp.min_bytes if hp.min_bytes else None)
    if hp.kind == "memory":
        resident = hp.min_bytes < 2 * llc
        frac = None if resident else (hp.min_bytes / t) / m["stream_Bps"]
        fields.update(cache_resident=resident, bandwidth_fraction=frac, roofline_fraction=frac)
        baseline, base_s = "roofline (min bytes / stream)", hp.min_bytes / m["stream_Bps"]
    else:
        it = max(hp.iterations, 1)
        if it > 1:
            if it not in floors:
                floors[it] = _roofline.loop_floor(it)
            floor, what = floors[it], f"fori_loop of {it} tiny iterations"
        else:
            if 1 not in floors:
                floors[1] = _roofline.dispatch_floor()
            floor, what = floors[1], "one jitted donated call (dispatch)"
        fields.update(iterations=it, per_iteration_s=t / it, per_iteration_floor_s=floor,
                      floor_program=what, bandwidth_fraction=None, roofline_fraction=None)
        baseline, base_s = "floor x iterations", floor * it
    return record(MODULE, hp.name, hp.size, t, baseline, base_s, note=hp.note, **fields)


def run(quick: bool = False, sweep: bool = False, only: str | None = None, n_size: int | None = None) -> list[dict]:
    size = "quick" if quick else "cpu"
    n = 3 if quick else 7
    stream = _roofline.Stream()
    floors: dict = {}
    recs = []
    keys = [k for k in hot_paths.BUILDERS if only in (None, k)]
    for key in keys:
        build = hot_paths.BUILDERS[key]
        sizes = hot_paths.SWEEPS[size][key] if sweep else [n_size]
        for s in sizes:
            hp = build(size, s)
            recs.append(row(key, hp, stream, n, floors))
            r = recs[-1]
            frac = r.get("bandwidth_fraction")
            print(f"[roofline] {key} {hp.size}: {r['jaxweight_s'] * 1e3:.3f} ms, "
                  + (f"{frac:.0%} of {r['stream_Bps'] / 1e9:.1f} GB/s" if frac is not None else
                     f"{r['throughput']:.3g} {r['unit']}" + (" (cache-resident)" if r.get("cache_resident") else "")),
                  file=sys.stderr, flush=True)
            del hp
            gc.collect()
    if sweep:
        for key in keys:
            pts = [r for r in recs if r["key"] == key]
            recs_exp = growth(pts)
            for r in pts:
                r.update(recs_exp)
    return recs


def growth(pts: list[dict]) -> dict:
    """Log-log slope of time against size over the upper half of the sizes, and the latency regime.

    ``latency_until``: the largest size whose time is within 2x of the smallest size's (below it,
    the per-call cost does not yet grow with the size).
    """
    x = np.log([p["n_size"] for p in pts])
    y = np.log([p["jaxweight_s"] for p in pts])
    h = max(2, math.ceil(len(pts) / 2))
    slope = float(np.polyfit(x[-h:], y[-h:], 1)[0])
    t0 = pts[0]["jaxweight_s"]
    flat = [p["n_size"] for p in pts if p["jaxweight_s"] <= 2 * t0]
    return {"growth_exponent": slope, "latency_until": max(flat)}


def _add(p):
    p.add_argument("--sweep", action="store_true", help="every path at the sizes of hot_paths.SWEEPS")
    p.add_argument("--only", default=None, help="one key of hot_paths.BUILDERS")
    p.add_argument("--n", dest="n_size", type=int, default=None, help="with --only: the path's main size")


if __name__ == "__main__":
    main(run, _add)
