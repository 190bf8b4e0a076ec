"""How close a compiled program runs to the machine's limits (the roofline).

XLA's cost analysis of the compiled program gives the bytes it reads and writes and the
flops it does; the machine's limits are measured in the same process through the same JAX:
the copy bandwidth (a jitted ``x * 2`` over a large array: it reads and writes every byte
once, the way a device-to-device copy does) and the matmul peak (a large square matmul).
A program's roofline time is ``max(bytes / bandwidth, flops / peak)``; its roofline
fraction is that time over the measured time (1.0: it runs at the machine's limit).

One caveat, recorded with every row as ``has_loop``: XLA counts a loop's body once, not once
per iteration, so for a program with a ``while`` loop (a scan over minibatches, a sort's
passes) the bytes and flops are a lower bound and so is the fraction.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["cost", "machine_limits", "roofline", "copy_bandwidth", "matmul_peak"]


def cost(compiled: Any) -> dict:
    """``{"bytes": float, "flops": float, "has_loop": bool}`` of a compiled program.

    ``compiled`` is what ``jax.jit(f).lower(*args).compile()`` returns.
    """
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):  # older jax: one dict per partition
        ca = ca[0] if ca else {}
    ca = ca or {}
    try:
        text = compiled.as_text() or ""
    except Exception:  # noqa: BLE001 - some backends cannot print the compiled module
        text = ""
    return {"bytes": float(ca.get("bytes accessed", 0.0)), "flops": float(ca.get("flops", 0.0)),
            "has_loop": " while(" in text or "\nwhile" in text or "= while" in text}


def _median_time(fn, *args, n: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(nbytes: int, n: int = 10) -> float:
    """Bytes per second of a jitted ``x * 2`` over ``nbytes`` of float32 (read + write counted)."""
    x = jnp.ones((max(1, nbytes // 4),), jnp.float32)
    f = jax.jit(lambda a: a * 2.0).lower(x).compile()
    moved = cost(f)["bytes"] or 2.0 * x.size * 4
    return moved / _median_time(f, x, n=n)


def matmul_peak(size: int, dtype: Any = jnp.float32, n: int = 5) -> float:
    """Flop/s of a jitted ``size x size @ size x size`` matmul in ``dtype``."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    return 2.0 * size**3 / _median_time(f, a, a, n=n)


@functools.cache
def machine_limits(scale: str = "auto") -> dict:
    """The measured limits of the default device: copy bandwidth, f32 (and on GPUs bf16) matmul peak.

    ``scale``: ``"quick"`` (seconds, small arrays), ``"full"`` or ``"auto"`` (full on an
    accelerator, 256 MiB / 2048^2 on a CPU). Cached per process.
    """
    dev = jax.devices()[0]
    accel = dev.platform != "cpu"
    if scale == "quick":
        nbytes, mm = 32 << 20, 512
    elif accel:
        nbytes, mm = 4 << 30, 8192
    else:
        nbytes, mm = 256 << 20, 2048
    out = {"copy_bytes": nbytes, "copy_bandwidth_Bps": copy_bandwidth(nbytes),
           "matmul_size": mm, "matmul_f32_flops": matmul_peak(mm, jnp.float32)}
    if accel:
        out["matmul_bf16_flops"] = matmul_peak(mm, jnp.bfloat16)
    return out


def roofline(seconds: float, c: dict, limits: dict, peak_key: str = "matmul_f32_flops") -> dict:
    """The roofline fields of one measured program (``c`` from :func:`cost`)."""
    bw, peak = limits["copy_bandwidth_Bps"], limits[peak_key]
    t_mem, t_flop = c["bytes"] / bw, c["flops"] / peak
    bound = "memory" if t_mem >= t_flop else "compute"
    return {
        "bytes_accessed": c["bytes"], "flops": c["flops"], "has_loop": c["has_loop"],
        "achieved_Bps": c["bytes"] / seconds if seconds > 0 else None,
        "bandwidth_fraction": (c["bytes"] / seconds) / bw if seconds > 0 else None,
        "flops_fraction": (c["flops"] / seconds) / peak if seconds > 0 else None,
        "bound": bound,
        "roofline_fraction": max(t_mem, t_flop) / seconds if seconds > 0 else None,
    }
