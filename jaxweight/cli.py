"""Command line: ``python -m jaxweight demo [NAME] ...`` and ``python -m jaxweight bench ...``.

- ``python -m jaxweight demo --help`` lists the demos with their one-line descriptions;
  ``python -m jaxweight demo NAME --help`` prints one demo's options; ``python -m jaxweight demo``
  runs the default demo (preferences).
- A demo whose optional packages are missing exits with one line naming the extra to install
  (``the preferences demo needs gymnax: pip install -e ".[rl]"`` in a checkout), before anything is computed.
- Demos run with JAX's persistent compilation cache on (``$XDG_CACHE_HOME/jaxweight/jax-compile``,
  default ``~/.cache/jaxweight/jax-compile``; ``$JAXWEIGHT_CACHE_DIR`` or ``$JAX_COMPILATION_CACHE_DIR``
  choose another folder), so a second run of a demo loads its programs instead of compiling them.
  ``--no-compile-cache`` (anywhere on the command line) turns it off.
- ``python -m jaxweight bench`` runs the scripts in ``bench/`` of a source checkout.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import os
import sys
from pathlib import Path

# name -> module exposing ``main(argv) -> int``. A module that is not there (a demo still being
# written, a trimmed install) is listed as "not available" and refused with one line.
DEMOS = {
    "awr": "jaxweight.demos.awr",
    "curriculum": "jaxweight.demos.curriculum",
    "grpo": "jaxweight.demos.grpo",
    "lm": "jaxweight.demos.lm",
    "preferences": "jaxweight.demos.preferences",
}
DEFAULT_DEMO = "preferences"  # the main job: preference comparisons with a PPO agent

# name -> {importable module: extra that provides it}; checked before the demo is imported.
DEMO_REQUIRES: dict[str, dict[str, str]] = {
    "preferences": {"gymnax": "rl"},
}

BENCH_MODULES = ("random_weighting", "curriculum", "maxent", "preference", "preference_loop", "preference_h2h",
                 "preference_h2h_mujoco", "sync", "lm", "roofline")

USAGE = """\
usage: python -m jaxweight demo [NAME] [demo options]   run a demo (default: {default})
       python -m jaxweight demo --help                  list the demos
       python -m jaxweight demo NAME --help             options of one demo
       python -m jaxweight bench [--only MODULE] [--quick] [--json PATH]
       python -m jaxweight bench --suite device [--plan] [--call N] [--quick] [--out DIR]   the device rows
demo option: --no-compile-cache (do not use JAX's persistent compilation cache)
demos: {demos}
"""

_NO_CACHE_FLAG = "--no-compile-cache"


def _usage() -> str:
    return USAGE.format(demos=", ".join(_available_demos()), default=DEFAULT_DEMO)


# ----------------------------------------------------------------------------- compilation cache

def compile_cache_dir() -> Path:
    """Where the CLI keeps JAX's persistent compilation cache.

    ``$JAXWEIGHT_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxweight/jax-compile``, else
    ``~/.cache/jaxweight/jax-compile``.
    """
    if os.environ.get("JAXWEIGHT_CACHE_DIR"):
        return Path(os.environ["JAXWEIGHT_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "jaxweight" / "jax-compile"


def enable_compile_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache (every program, however fast it compiled).

    A cache folder the user already chose (``$JAX_COMPILATION_CACHE_DIR`` or
    ``jax.config.jax_compilation_cache_dir``) is kept. Returns the folder, or None when it
    cannot be created (then nothing is cached).
    """
    import jax

    chosen = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    folder = Path(path) if path is not None else Path(chosen) if chosen else compile_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return folder


# ----------------------------------------------------------------------------- demos

def _available_demos() -> list[str]:
    return [n for n in DEMOS if _find(DEMOS[n]) is not None]


def _find(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def describe(name: str) -> str:
    """The demo's one-line description: the first line of its module docstring, read without importing it."""
    spec = _find(DEMOS[name])
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return "(not available in this install)"
    from .demos._args import doc_line

    line = doc_line(DEMOS[name].removeprefix("jaxweight.demos."))
    prefix = f"Demo ``{name}``: "
    if line.startswith(prefix):
        line = line[len(prefix):]
    elif line.startswith("Demo: "):
        line = line[len("Demo: "):]
    return line[:1].upper() + line[1:]


def missing_extra(name: str) -> str | None:
    """The one line saying which extra a demo needs, or None when its optional packages are there."""
    from .demos._common import extra_message, missing_modules

    needs = DEMO_REQUIRES.get(name, {})
    missing = missing_modules(needs)
    if not missing:
        return None
    extras = sorted({needs[m] for m in missing})
    return extra_message(f"the {name} demo", missing, ",".join(extras))


def list_demos() -> str:
    """The text of ``python -m jaxweight demo --help``."""
    width = max(len(n) for n in DEMOS)
    lines = ["usage: python -m jaxweight demo [NAME] [options]   (NAME defaults to "
             f"{DEFAULT_DEMO}; python -m jaxweight demo NAME --help for its options)", "", "demos:"]
    for n in DEMOS:
        if _find(DEMOS[n]) is None:
            continue
        extra = missing_extra(n)
        note = f"  [{extra.split(': ', 1)[1]}]" if extra else ""
        lines.append(f"  {n.ljust(width)}  {describe(n)}{note}")
    lines += ["", "common demo options: --out DIR (default jaxweight-out/NAME/), --quick, --seed N, --strict,",
              "  --tensorboard DIR, --no-progress; --no-compile-cache turns off the persistent compilation cache"]
    return "\n".join(lines)


def demo(argv: list[str], *, compile_cache: bool = False) -> int:
    """``python -m jaxweight demo [NAME] [options]``; returns the exit status.

    The arguments are checked before the demo (and jax) is imported, so a mistyped flag is refused
    at once (:mod:`jaxweight.demos._args`); then, with ``compile_cache``, the persistent compilation
    cache is turned on and the demo runs.
    """
    if argv and argv[0] in ("-h", "--help", "--list", "list"):
        print(list_demos())
        return 0
    if argv and not argv[0].startswith("-"):
        name, rest = argv[0], argv[1:]
    else:
        name, rest = DEFAULT_DEMO, argv
    available = _available_demos()
    if name not in DEMOS:
        print(f"unknown demo {name!r}; available: {', '.join(available)}", file=sys.stderr)
        return 2
    if name not in available:
        print(f"demo {name!r} is not available in this install; available: {', '.join(available)}",
              file=sys.stderr)
        return 2
    need = missing_extra(name)
    if need:
        print(need, file=sys.stderr)
        return 1
    from .demos import _args

    if name == "lm":
        task, args = _args.split_task(rest)
        parsed = _args.parse("lm-countdown" if task == "countdown" else "lm", args)  # exits 2 on a refusal
    else:
        parsed = _args.parse(name, rest)
    if compile_cache:
        enable_compile_cache()
    try:
        return int(importlib.import_module(DEMOS[name]).main(rest) or 0)
    except OSError as e:  # a full disk, a folder gone read-only: one line, no traceback
        print(os_error_line(name, e, parsed.out, resumes=hasattr(parsed, "resume")), file=sys.stderr)
        return 1


# errors of the device under the output folder: what the user can act on is the folder
_DISK_ERRNOS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted"}


def os_error_line(name: str, err: OSError, out: str, *, resumes: bool) -> str:
    """The one line ending a demo whose write (or other system call) failed.

    It names the folder and what to do; the files a demo writes atomically (results, checkpoints,
    labels) are whole, so a demo that resumes goes on from its last good checkpoint."""
    again = "run again with --resume: it goes on from the last good checkpoint" if resumes else "run again"
    where = f" ({err.filename})" if err.filename else ""
    if err.errno in _DISK_ERRNOS:
        return (f"python -m jaxweight demo {name}: error: {_DISK_ERRNOS[err.errno]} writing under {out}{where}: "
                f"free space or fix its permissions (or choose another --out), then {again}")
    return f"python -m jaxweight demo {name}: error: {err.strerror or err}{where} (output folder {out}); {again}"


# ----------------------------------------------------------------------------- bench

class BenchNotFound(RuntimeError):
    """``bench/`` is not there (an installed wheel carries no benchmark scripts)."""


BENCH_HINT = ("bench/ not found: python -m jaxweight bench runs the bench/ scripts of a source checkout "
              "(run it in the checkout's root, or set JAXWEIGHT_BENCH_DIR=/path/to/jaxweight/bench)")


def find_bench_dir() -> Path:
    """``$JAXWEIGHT_BENCH_DIR``, else ``./bench``, else the ``bench/`` folder next to the package."""
    cands = []
    if os.environ.get("JAXWEIGHT_BENCH_DIR"):
        cands.append(Path(os.environ["JAXWEIGHT_BENCH_DIR"]).expanduser())
    cands += [Path.cwd() / "bench", Path(__file__).resolve().parents[1] / "bench"]
    for c in cands:
        if (c / "_common.py").exists():
            return c.resolve()
    raise BenchNotFound(BENCH_HINT)


def _file_path(text: str) -> str:
    """argparse ``type=`` of an output file: refused (one line, exit 2) when it is an existing folder or a
    folder above it is an existing file, so the benchmarks never run to fail at the end."""
    p = Path(text).expanduser()
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"must be a file path, but {text!r} is an existing folder")
    for q in p.parents:
        if q.exists():
            if not q.is_dir():
                raise argparse.ArgumentTypeError(f"must be a file path, but {str(q)!r} above it is an existing file")
            break
    return text


def bench(argv: list[str]) -> int:
    """``python -m jaxweight bench [--only MODULE] [--quick] [--json PATH]``; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m jaxweight bench",
                                description="Run the benchmarks in bench/ (a source checkout) and print a table.")
    p.add_argument("--only", action="append", choices=BENCH_MODULES, metavar="MODULE",
                   help=f"run only this module (repeatable): {', '.join(BENCH_MODULES)}")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")
    p.add_argument("--json", metavar="PATH", type=_file_path, help="write the records as a JSON list to PATH")
    p.add_argument("--suite", choices=("device",),
                   help="device: every accelerator row in two prepared calls (bench/device_suite.py; --plan shows them)")
    p.add_argument("--out", metavar="DIR", help="with --suite: the output folder (default: $OUT, else .)")
    p.add_argument("--plan", action="store_true", help="with --suite: print its calls, parts and budgets as JSON")
    p.add_argument("--call", type=int, choices=(1, 2), help="with --suite: run one of its two calls")
    p.add_argument("--size", choices=("quick", "cpu", "gpu"), help="with --suite: its size (default gpu; --quick)")
    args = p.parse_args(argv)
    if args.suite is None and (args.out or args.plan or args.call or args.size):
        p.error("--out, --plan, --call and --size go with --suite")
    if args.suite and (args.only or args.json):
        p.error("--only and --json do not go with --suite (it writes its own JSON under --out)")

    try:
        bdir = find_bench_dir()
    except BenchNotFound as e:
        print(str(e), file=sys.stderr)
        return 2
    # bench scripts import ``bench._common``: the folder above bench/ goes on the path too
    for d in (str(bdir.parent), str(bdir)):
        if d not in sys.path:
            sys.path.insert(0, d)
    if args.suite == "device":
        suite = importlib.import_module("device_suite")
        return suite.main((["--quick"] if args.quick else []) + (["--out", args.out] if args.out else [])
                          + (["--plan"] if args.plan else []) + (["--call", str(args.call)] if args.call else [])
                          + (["--size", args.size] if args.size else []))
    common = importlib.import_module("_common")
    records = []
    for mod in args.only or BENCH_MODULES:
        f = bdir / f"bench_{mod}.py"
        if not f.exists():
            print(f"[bench] {mod}: no {f.name} here, skipped", file=sys.stderr)
            continue
        spec = importlib.util.spec_from_file_location(f"bench_{mod}", f)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        print(f"[bench] {mod} ...", file=sys.stderr, flush=True)
        records += m.run(quick=args.quick)
    print(common.format_table(records))
    if args.json:
        from ._util import atomic_write_json

        atomic_write_json(args.json, records)
        print(f"wrote {len(records)} records to {args.json}")
    # a roofline fraction above 1.05 means the limit's model is wrong: the run fails (records kept)
    bad = [f"{r.get('module')}/{r.get('name')} @ {r.get('size')}: {r[k]:.3f}" for r in records
           for k in ("bandwidth_fraction", "flops_fraction") if isinstance(r.get(k), (int, float)) and r[k] > 1.05]
    if bad:
        print("bench: roofline fraction above 1.05 (a broken measurement): " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxweight`` and the ``jaxweight`` script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    use_cache = _NO_CACHE_FLAG not in argv
    argv = [a for a in argv if a != _NO_CACHE_FLAG]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        # the benchmarks report compile time themselves: the cache is for demos only
        return demo(rest, compile_cache=use_cache)
    if cmd == "bench":
        return bench(rest)
    print(f"unknown command {cmd!r}: use 'demo' or 'bench' (python -m jaxweight --help)", file=sys.stderr)
    return 2


__all__ = ["main", "demo", "bench", "DEMOS", "DEFAULT_DEMO", "DEMO_REQUIRES", "BENCH_MODULES",
           "list_demos", "describe", "missing_extra", "enable_compile_cache", "compile_cache_dir",
           "find_bench_dir", "os_error_line"]
