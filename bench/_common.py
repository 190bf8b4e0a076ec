"""Shared benchmark helpers: timing, records, the table.

Every ``bench/bench_<module>.py`` exposes ``run(quick: bool = False) -> list[dict]``
returning records built with :func:`record`, and ends with
``if __name__ == "__main__": main(run)`` so it also runs on its own.

Rules (CONVENTIONS.md): compile first and report compile time separately, warm
up, time N runs with ``jax.block_until_ready`` and ``time.perf_counter``, report
the median and the spread, and compare against a baseline measured in the same
run (the ratio is what counts; absolute times drift between machines).

Every record, and every JSON a bench script writes, carries where it came from
(:func:`provenance`: command, commit, machine, date, jax version, device), from
the same fields the demos' results carry.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["Timing", "time_jax", "time_stateful", "time_call", "record", "device_name", "provenance",
           "format_table", "main"]


class Timing(dict):
    """``{"median_s", "min_s", "max_s", "q25_s", "q75_s", "n", "compile_s"}``."""

    @property
    def median(self) -> float:
        return self["median_s"]


def _summary(times: list[float], compile_s: float | None = None) -> Timing:
    times = sorted(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return Timing(
        median_s=statistics.median(times), min_s=times[0], max_s=times[-1],
        q25_s=q[0], q75_s=q[2], n=len(times), compile_s=compile_s,
    )


def time_jax(fn: Callable, *args: Any, n: int = 20, warmup: int = 2, min_time_s: float = 0.0,
             max_time_s: float = 30.0) -> Timing:
    """Time a jitted JAX function.

    ``fn`` is jitted (if it is not already), lowered and compiled once (timed
    as ``compile_s``), run ``warmup`` times, then timed ``n`` times (or until
    ``min_time_s`` has passed, at most ``max_time_s``) with
    ``jax.block_until_ready``. Functions that donate their inputs (state
    threaded through a loop) need their own loop; see
    :func:`time_stateful`.
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - t0

    def call():
        return jax.block_until_ready(compiled(*args))

    for _ in range(warmup):
        call()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < n or (time.perf_counter() - start) < min_time_s:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > max_time_s and len(times) >= 3:
            break
    return _summary(times, compile_s)


def time_stateful(step: Callable, state: Any, *args: Any, n: int = 20, warmup: int = 2) -> tuple[Timing, Any]:
    """Time ``state = step(state, *args)`` (``step`` jitted, possibly donating ``state``).

    Returns the timing and the final state. Compile time is measured on the
    first call (``step.lower(state, *args).compile()``).
    """
    t0 = time.perf_counter()
    step.lower(state, *args).compile()
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        state = jax.block_until_ready(step(state, *args))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        state = jax.block_until_ready(step(state, *args))
        times.append(time.perf_counter() - t)
    return _summary(times, compile_s), state


def time_call(fn: Callable[[], Any], n: int = 5, warmup: int = 1, max_time_s: float = 60.0) -> Timing:
    """Time a plain Python callable (a baseline); blocks on JAX outputs if any."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < n:
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > max_time_s and len(times) >= 1:
            break
    return _summary(times)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """``data`` as JSON at ``path``, atomically (the public :func:`jaxweight.checkpoint.save_json`)."""
    from jaxweight.checkpoint import save_json

    save_json(path, data)


def device_name() -> str:
    d = jax.devices()[0]
    if d.platform == "cpu":
        return f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
    return f"{d.platform} ({d.device_kind})"


@functools.lru_cache(maxsize=1)
def _fixed_provenance() -> tuple:
    from jaxweight.demos import provenance as run_provenance

    p = run_provenance()
    return tuple((k, p[k]) for k in ("command", "commit", "machine"))


def provenance() -> dict:
    """``{"command", "commit", "machine", "date", "jax_version", "device"}`` of this run.

    The same fields as the demos' results (:func:`jaxweight.demos.provenance`); the
    command, commit and machine are read once per process (git runs once), the date each call.
    """
    import datetime

    return {**dict(_fixed_provenance()),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "jax_version": jax.__version__, "device": str(jax.devices()[0])}


def record(module: str, name: str, size: str, jaxweight_s: float, baseline: str,
           baseline_s: float | None, *, goal: str | None = None, met: bool | None = None,
           note: str = "", **extra: Any) -> dict:
    """One benchmark row: what was timed, against what, and where (:func:`provenance`).

    ``ratio`` is ``baseline_s / jaxweight_s`` (how many times faster jaxweight
    is; < 1 means slower). ``baseline`` may also be an absolute goal such as
    ``"floor"`` or ``"target 25 ms"``; ``goal`` states the goal in words and
    ``met`` whether this run reached it.
    """
    ratio = (baseline_s / jaxweight_s) if (baseline_s is not None and jaxweight_s > 0) else None
    rec = {
        "module": module, "name": name, "size": size,
        "jaxweight_s": jaxweight_s, "baseline": baseline, "baseline_s": baseline_s,
        "ratio": ratio, "device": device_name(), "jax_version": jax.__version__,
    }
    rec.update({k: v for k, v in provenance().items() if k not in rec})  # command, commit, machine, date
    if goal is not None:
        rec["goal"] = goal
    if met is not None:
        rec["met"] = bool(met)
    if note:
        rec["note"] = note
    rec.update(extra)
    return rec


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.1f} us"
    if x < 1:
        return f"{x * 1e3:.2f} ms"
    return f"{x:.2f} s"


def format_table(records: list[dict]) -> str:
    """A fixed-width text table of records (one row each)."""
    head = ["module", "name", "size", "jaxweight", "baseline", "baseline time", "ratio", "roofline", "goal", "met"]
    rows = []
    for r in records:
        ratio = r.get("ratio")
        rows.append([
            r["module"], r["name"], r["size"], _fmt_s(r["jaxweight_s"]), str(r["baseline"]),
            _fmt_s(r.get("baseline_s")), "-" if ratio is None else f"{ratio:,.1f}x",
            "-" if r.get("roofline_fraction") is None else f"{r['roofline_fraction']:.0%} ({r['bound']})",
            r.get("goal", ""), {True: "yes", False: "NO", None: ""}[r.get("met")],
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    notes = [f"  [{r['module']}/{r['name']}] {r['note']}" for r in records if r.get("note")]
    if records:
        out.append(f"device: {records[0]['device']}, jax {records[0]['jax_version']}")
    return "\n".join(out + (["notes:"] + notes if notes else []))


def main(run: Callable[..., list[dict]], add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
         ) -> None:
    """Entry point for running one bench script on its own: ``--quick``, ``--json PATH`` and the script's own
    options (``add_arguments(parser)``; each passed to ``run`` as the keyword of its ``dest``)."""
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", metavar="PATH")
    if add_arguments is not None:
        add_arguments(p)
    a = vars(p.parse_args())
    path = a.pop("json")
    recs = run(**a)
    print(format_table(recs))
    if path:
        write_json(path, recs)
    import _roofline  # noqa: PLC0415 - after the records are written: a failing check keeps them

    _roofline.check(recs)
