"""What every demo shares: argument types, common flags, metrics, plots, goals, timing, extras.

A demo's ``main`` built on this module::

    from jaxweight.demos import _common as C

    def main(argv=None) -> int:
        p = argparse.ArgumentParser(prog="python -m jaxweight demo mydemo", description=__doc__.split("\\n")[0])
        C.add_common_args(p, "mydemo")                       # --out --strict --tensorboard --seed --quick --no-progress
        p.add_argument("--steps", type=C.positive_int, default=None, help="training steps")
        p.add_argument("--lr", type=C.positive_float, default=3e-4, help="learning rate")
        args = p.parse_args(argv)                             # bad values: one line, exit 2, no traceback
        C.require_extra("gymnax", "rl", "the mydemo demo")   # one line + exit 1 when the extra is missing

        timer = C.Timer()
        step = timer.compile(jax.jit(step_fn), state, key)   # AOT lower+compile, counted as compile time
        with C.metrics_writer(args) as w, timer.section("run"):
            for i in range(n):
                state, out = step(state, key)
                w.write(i, out.to_dict())                     # metrics.jsonl (+ TensorBoard with --tensorboard)
            jax.block_until_ready(state)
        print(timer.summary())                                # "compile 3.1 s, run 12.4 s"

        C.write_results(args, {"rows": rows})                # results.json FIRST (never lost to a plot error)
        C.save_plot(lambda plt: make_figure(plt, rows), C.out_dir(args) / "mydemo.png")  # skipped without matplotlib
        return C.finish([("return >= 450", ret >= 450)], args.strict)   # exit 1 on a missed goal only with --strict

Everything here is host-side glue; the library modules never import it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxweight._install import install_hint

__all__ = [
    "OUT_ROOT",
    "positive_int",
    "nonneg_int",
    "positive_float",
    "nonneg_float",
    "prob",
    "open_prob",
    "int_range",
    "float_range",
    "comma_list",
    "folder",
    "add_common_args",
    "out_dir",
    "metrics_writer",
    "write_results",
    "provenance",
    "replace_config",
    "line_logger",
    "save_plot",
    "finish",
    "Timer",
    "missing_modules",
    "extra_message",
    "require_extra",
]

OUT_ROOT = "jaxweight-out"  # every demo writes under OUT_ROOT/<demo>/ by default (gitignored)


# --------------------------------------------------------------------------- argparse types
# Each raises argparse.ArgumentTypeError with a one-line message: argparse then prints
# "usage: ... error: argument --steps: must be an integer >= 1, got '0'" and exits 2 (no traceback).

def _num(text: str, kind: type) -> float | int:
    try:
        v = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return v


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for integers in ``[lo, hi]`` (either bound may be None)."""

    def parse(text: str) -> int:
        v = _num(text, int)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = (f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
            raise argparse.ArgumentTypeError(f"must be an integer {rng}, got {text!r}")
        return v

    parse.__name__ = "integer"  # argparse names the type in "invalid integer value" messages
    return parse


def float_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                hi_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for finite floats in ``[lo, hi]`` (``(lo`` / ``hi)`` with ``*_open``)."""

    def parse(text: str) -> float:
        v = _num(text, float)
        bad = ((lo is not None and (v <= lo if lo_open else v < lo))
               or (hi is not None and (v >= hi if hi_open else v > hi)))
        if bad:
            if hi is None:
                rng = f"{'>' if lo_open else '>='} {lo}"
            elif lo is None:
                rng = f"{'<' if hi_open else '<='} {hi}"
            else:
                rng = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be a number {rng}, got {text!r}")
        return v

    parse.__name__ = "number"
    return parse


positive_int = int_range(1)
positive_int.__doc__ = "argparse type: integer >= 1 (sizes, steps, seeds, rounds)."
nonneg_int = int_range(0)
nonneg_int.__doc__ = "argparse type: integer >= 0 (a seed, a count that may be zero)."
positive_float = float_range(0.0, lo_open=True)
positive_float.__doc__ = "argparse type: finite float > 0 (learning rates, temperatures)."
nonneg_float = float_range(0.0)
nonneg_float.__doc__ = "argparse type: finite float >= 0 (coefficients that may be off)."
prob = float_range(0.0, 1.0)
prob.__doc__ = "argparse type: probability in [0, 1]."
open_prob = float_range(0.0, 1.0, lo_open=True, hi_open=True)
open_prob.__doc__ = "argparse type: probability in (0, 1) (quantiles, discounts)."


def comma_list(choices: Sequence[str] | None = None, *, min_len: int = 1) -> Callable[[str], list[str]]:
    """An argparse ``type=`` for ``a,b,c`` (each entry one of ``choices`` when given)."""

    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        if len(items) < min_len:
            raise argparse.ArgumentTypeError(f"needs at least {min_len} comma-separated entr"
                                             f"{'y' if min_len == 1 else 'ies'}, got {text!r}")
        if choices is not None:
            bad = [s for s in items if s not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad))}; choose from "
                                                 f"{', '.join(choices)}")
        return items

    parse.__name__ = "list"
    return parse


def folder(text: str) -> str:
    """An argparse ``type=`` for an output folder: refused when it, or a folder above it, is an existing file."""
    p = Path(text).expanduser()
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                where = "" if q == p else f" ({str(q)!r} above it)"
                raise argparse.ArgumentTypeError(f"must be a folder, but {text!r}{where} is an existing file")
            break
    return text


folder.__name__ = "folder"


# --------------------------------------------------------------------------- common flags

def add_common_args(parser: argparse.ArgumentParser, demo_name: str, *, seed: bool = True,
                    quick: bool = True, progress: bool = True,
                    quick_help: str = "small version (a smoke run, < 1 min)") -> argparse.ArgumentParser:
    """Add the flags every demo shares; returns ``parser``.

    ``--out DIR`` (default ``jaxweight-out/<demo_name>/``), ``--strict`` (exit 1 when a stated goal
    is missed), ``--tensorboard DIR`` (event files besides ``metrics.jsonl``) and, unless turned
    off, ``--seed N`` (default 0), ``--quick`` and ``--no-progress``.
    """
    g = parser.add_argument_group("common demo options")
    default_out = f"{OUT_ROOT}/{demo_name}/"
    g.add_argument("--out", metavar="DIR", default=default_out, type=folder,
                   help=f"folder for results JSON, metrics.jsonl, checkpoints and plots (default {default_out})")
    g.add_argument("--strict", action="store_true",
                   help="exit with status 1 when a stated goal of the demo is missed")
    g.add_argument("--tensorboard", metavar="DIR", default=None, type=folder,
                   help=f"also write TensorBoard event files to DIR ({install_hint('tensorboard')})")
    if seed:
        g.add_argument("--seed", type=nonneg_int, default=0, help="the run's PRNG seed (default 0)")
    if quick:
        g.add_argument("--quick", action="store_true", help=quick_help)
    if progress:
        g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def out_dir(args: argparse.Namespace | str | os.PathLike) -> Path:
    """The demo's output folder (``args.out`` or a path), created if missing."""
    p = Path(getattr(args, "out", args))
    p.mkdir(parents=True, exist_ok=True)
    return p


def metrics_writer(args: argparse.Namespace, *, append: bool = False):
    """``metrics.jsonl`` in ``--out`` (always) plus TensorBoard files with ``--tensorboard DIR``.

    Returns a :class:`jaxweight.metrics.MultiWriter` (a context manager): ``w.write(step, flat_dict)``.
    A missing tensorboardX with ``--tensorboard`` exits with one line naming the extra.
    """
    from jaxweight import metrics

    tb = getattr(args, "tensorboard", None)
    if tb is not None:
        require_extra("tensorboardX", "tensorboard", "--tensorboard")
    return metrics.open_writers(out_dir(args), tb, append=append)


def write_results(args: argparse.Namespace | str | os.PathLike, results: Any,
                  name: str = "results.json") -> Path:
    """Write ``results`` (JSON-able; numpy/JAX scalars and arrays are converted) atomically to ``--out``.

    Call it before plotting, so computed results survive a plotting error. A dict gets the run's
    :func:`provenance` (command, commit, machine, date, jax version, device) for the keys it does not
    already have; the caller's dict is not changed.
    """
    from jaxweight.checkpoint import save_json

    if isinstance(results, dict):
        results = {**results, **{k: v for k, v in provenance().items() if k not in results}}
    return save_json(out_dir(args) / name, _jsonable(results))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist") and hasattr(x, "dtype"):  # numpy / jax arrays and scalars
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# --------------------------------------------------------------------------- plots

def save_plot(fig_fn: Callable[[Any], Any], path: str | os.PathLike, *, dpi: int = 100,
              log: Callable[[str], None] = print) -> Path | None:
    """Draw with ``fig_fn(plt) -> matplotlib Figure`` and write a PNG to ``path``; None when skipped.

    Without matplotlib, prints one note (``pip install -e ".[plots]"`` in a checkout) and returns None:
    write the results JSON before calling this. Uses the non-interactive Agg backend unless pyplot
    is already loaded (a notebook keeps its inline backend).
    """
    try:
        import matplotlib
    except ImportError:
        log(f"matplotlib is not installed: plot {Path(path).name} skipped ({install_hint('plots')})")
        return None
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxweight.checkpoint import save_bytes

    fig = fig_fn(plt)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return save_bytes(path, buf.getvalue())


# --------------------------------------------------------------------------- goals

def finish(goals: Iterable[tuple[str, bool]], strict: bool, *, log: Callable[[str], None] = print) -> int:
    """Print ``[met]`` / ``[NOT met]`` per goal; the exit code: 1 if ``strict`` and a goal is missed, else 0."""
    goals = [(str(t), bool(ok)) for t, ok in goals]
    for text, ok in goals:
        log(f"  [{'met' if ok else 'NOT met'}] {text}")
    missed = [t for t, ok in goals if not ok]
    if missed and strict:
        log(f"{len(missed)} goal(s) missed: exit status 1 (--strict)")
        return 1
    if missed:
        log(f"{len(missed)} goal(s) missed (--strict makes this exit with status 1)")
    return 0


# --------------------------------------------------------------------------- timing

class Timer:
    """Wall time per named section, compile time apart from run time.

    ``timer.compile(jitted, *args)`` lowers and compiles ahead of time (``jitted.lower(*args).compile()``),
    adds the seconds to ``"compile"`` and returns the compiled function; ``with timer.section("run"):``
    adds its wall time to ``"run"`` (block on the results inside it). With the persistent compilation
    cache the CLI turns on, a second run's ``compile`` is the time to load from the cache.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

    def compile(self, jitted: Any, *args: Any, **kwargs: Any) -> Any:
        """AOT-compile ``jitted`` (a ``jax.jit`` function) for these arguments, timed as ``"compile"``."""
        with self.section("compile"):
            return jitted.lower(*args, **kwargs).compile()

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    def as_dict(self, prefix: str = "time") -> dict[str, float]:
        """``{"time/compile_s": ..., "time/run_s": ...}`` (ready for a metrics writer or the results JSON)."""
        return {f"{prefix}/{k}_s": v for k, v in self.seconds.items()}

    def summary(self) -> str:
        """``"compile 3.1 s, run 12.4 s"``."""
        return ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()) or "nothing timed"


# --------------------------------------------------------------------------- optional extras

def replace_config(parser: argparse.ArgumentParser, cfg: Any, overrides: dict) -> Any:
    """``dataclasses.replace(cfg, **overrides)``; a value the config refuses is the parser's one-line error (exit 2)."""
    import dataclasses

    try:
        return dataclasses.replace(cfg, **overrides)
    except ValueError as e:
        parser.error(str(e))


def line_logger(args: argparse.Namespace) -> Callable[[str], None] | None:
    """One flushed line per progress message, or ``None`` with ``--no-progress``."""
    return None if args.no_progress else (lambda s: print(s, flush=True))


def provenance() -> dict:
    """Where a result came from, for its JSON (the one helper every demo and bench uses).

    ``{"command", "commit", "machine", "date", "jax_version", "device"}``: ``command``: this
    process's command line; ``commit``: ``git rev-parse HEAD`` of the checkout the package was
    imported from, with ``" + uncommitted changes"`` when tracked files differ from it (``None``
    outside a git checkout); ``machine``: processor, CPUs (and the CPUs this process may use, when
    fewer), OS; ``date``: UTC, ISO 8601 to the second; ``jax_version``; ``device``: JAX's first
    device (``None`` when jax is not imported yet, so that this never starts a backend).
    """
    import datetime
    import platform
    import subprocess

    root = Path(__file__).resolve().parents[2]
    commit = None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root, capture_output=True, timeout=10)
            commit = head.stdout.strip() + (" + uncommitted changes" if dirty.returncode else "")
    except (OSError, subprocess.SubprocessError):
        pass
    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    machine = f"{platform.machine()}, {cpus} CPUs" + (f" ({usable} usable)" if usable != cpus else "")
    jax = sys.modules.get("jax")
    device = None
    if jax is not None:
        try:
            device = str(jax.devices()[0])
        except RuntimeError:
            pass
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]), "commit": commit,
            "machine": f"{machine}, {platform.system()} {platform.release()}",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "jax_version": getattr(jax, "__version__", None), "device": device}


def missing_modules(modules: str | Iterable[str]) -> list[str]:
    """The top-level modules of ``modules`` that cannot be imported (checked without importing them)."""
    mods = [modules] if isinstance(modules, str) else list(modules)
    out = []
    for m in mods:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(m)
    return out


def extra_message(what: str, missing: Sequence[str], extra: str) -> str:
    """``'the preferences demo needs gymnax: pip install -e ".[rl]"'`` from a checkout, with
    ``pip install "jaxweight[rl]"`` from an installed wheel (:func:`jaxweight._install.install_hint`)."""
    return f"{what} needs {', '.join(missing)}: {install_hint(extra)}"


def require_extra(modules: str | Iterable[str], extra: str, what: str = "this demo") -> None:
    """Exit with one line naming the extra (:func:`extra_message`) when a module is missing.

    Call it at the top of a demo's ``main`` before importing the optional package; raises
    ``SystemExit`` (status 1, message on stderr, no traceback).
    """
    missing = missing_modules(modules)
    if missing:
        raise SystemExit(extra_message(what, missing, extra))
