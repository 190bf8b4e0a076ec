"""How close a compiled program runs to this machine's limits, measured so the fraction cannot pass 1.

- **Numerator: the minimum bytes** a program must move, from its shapes: each input read once,
  each output written once, a donated state updated in place counting only the rows it touches
  (each hot path states its own, :mod:`hot_paths`). XLA's ``bytes accessed`` is kept beside it
  as *modelled traffic*: it counts both branches of a ``cond``, a whole buffer for a scatter of
  a few rows, an array once per reduction over it and a loop body once, so it is not a floor.
- **Denominator: a stream bandwidth measured in the same process, interleaved with the program**
  (:class:`Stream`): a jitted in-place ``x * a + b`` over a donated buffer of non-zero data, at
  least 4x the last-level cache, on every core XLA uses; page faults per call are recorded (near
  0: a fresh output would time the kernel's page faults instead). One stream call before each
  timed program call, so both see the same machine load; the fraction is
  ``(min_bytes / program median) / stream median``.
- A working set under 2x the last-level cache may run from cache: such a row is flagged
  ``cache_resident`` and gets no fraction.
- Compute-bound work: useful flops from the shapes against a matmul peak measured in the
  program's own dtype (:func:`matmul_peak`).
- Looped or latency-bound programs get no fraction: time per sequential iteration against a
  measured per-iteration floor (:func:`loop_floor`, :func:`dispatch_floor`) and throughput in
  the domain's unit.

A fraction above :data:`MAX_FRACTION` means the model of the limit is wrong: :func:`check`
raises, and the roofline bench fails.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MAX_FRACTION", "llc_bytes", "Stream", "matmul_peak", "loop_floor", "dispatch_floor", "xla_bytes",
           "tree_bytes", "check"]

MAX_FRACTION = 1.05


def llc_bytes() -> int:
    """The last-level cache of this machine in bytes (sysfs; 32 MiB if it cannot be read).

    On an accelerator the working set rule uses the device's L2 (50 MiB on an H100/H200 class part).
    """
    if jax.devices()[0].platform != "cpu":
        return 50 << 20
    best = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        txt = f.read_text().strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
        try:
            best = max(best, int(txt.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return best or (32 << 20)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt + resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def tree_bytes(tree: Any) -> int:
    """Bytes of every array leaf of ``tree`` (arrays or ``ShapeDtypeStruct``s)."""
    return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype")
                   and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)))


class Stream:
    """The in-process stream reference: ``x = x * a + b`` in place over ``nbytes`` of float32 (donated).

    Each call reads and writes every byte once: ``2 * nbytes`` moved. :meth:`once` times one call.
    """

    def __init__(self, nbytes: int | None = None):
        llc = llc_bytes()
        self.nbytes = int(max(nbytes or 0, 4 * llc))
        n = self.nbytes // 4
        self.x = jnp.asarray(np.random.default_rng(0).uniform(1.0, 2.0, n).astype(np.float32))
        self.fn = jax.jit(lambda a: a * np.float32(0.9999) + np.float32(1e-4), donate_argnums=0)
        self.x = jax.block_until_ready(self.fn(self.x))
        self.times: list[float] = []
        self.faults = 0
        self.calls = 0

    def once(self) -> float:
        f0 = _faults()
        t = time.perf_counter()
        self.x = jax.block_until_ready(self.fn(self.x))
        dt = time.perf_counter() - t
        self.faults += _faults() - f0
        self.calls += 1
        self.times.append(dt)
        return dt

    def summary(self, since: int = 0) -> dict:
        """Bandwidth over the calls from index ``since``: median and best, faults per call."""
        ts = np.asarray(self.times[since:] or self.times)
        return {"stream_bytes": self.nbytes, "stream_Bps": 2 * self.nbytes / float(np.median(ts)),
                "stream_best_Bps": 2 * self.nbytes / float(ts.min()), "stream_calls": int(ts.size),
                "stream_faults_per_call": self.faults / max(self.calls, 1)}


def _median_time(fn, *args, n: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def matmul_peak(size: int, dtype: Any = jnp.float32, n: int = 5) -> float:
    """Flop/s of a jitted ``size x size @ size x size`` matmul in ``dtype`` (its own precision)."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    return 2.0 * size**3 / _median_time(f, a, a, n=n)


def loop_floor(iterations: int, n: int = 5) -> float:
    """Seconds per iteration of a compiled ``fori_loop`` whose body is one tiny op (the loop's own cost)."""
    x = jnp.ones((64,), jnp.float32)
    f = jax.jit(lambda x: jax.lax.fori_loop(0, iterations, lambda i, c: c * 0.999 + 1e-3, x))
    return _median_time(f, x, n=n) / max(iterations, 1)


def dispatch_floor(n: int = 20) -> float:
    """Seconds of one call of a jitted, donated ``x + 1`` on 16 floats: the per-call floor."""
    f = jax.jit(lambda x: x + 1.0, donate_argnums=0)
    x = jax.block_until_ready(f(jnp.zeros((16,), jnp.float32)))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        x = jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def xla_bytes(compiled: Any) -> dict:
    """XLA's modelled traffic of a compiled program: ``{"modelled_bytes", "xla_flops", "has_loop"}``."""
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):  # older jax: one dict per partition
        ca = ca[0] if ca else {}
    ca = ca or {}
    try:
        text = compiled.as_text() or ""
    except Exception:  # noqa: BLE001 - some backends cannot print the compiled module
        text = ""
    return {"modelled_bytes": float(ca.get("bytes accessed", 0.0)), "xla_flops": float(ca.get("flops", 0.0)),
            "has_loop": " while(" in text or "\nwhile" in text or "= while" in text}


def check(rows: list[dict]) -> None:
    """Raise ``ValueError`` naming every row whose fraction is above :data:`MAX_FRACTION`."""
    bad = [f"{r.get('key', r.get('name'))} @ {r.get('size')}: {r[k]:.3f} ({k})" for r in rows
           for k in ("bandwidth_fraction", "flops_fraction") if r.get(k) is not None and r[k] > MAX_FRACTION]
    if bad:
        raise ValueError(f"roofline fraction above {MAX_FRACTION} (the limit's model is wrong): " + "; ".join(bad))


def cpu_threads() -> int:
    """The cores this process may use (XLA's CPU thread pool uses them all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
