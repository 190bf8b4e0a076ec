"""Command line: ``python -m jaxweight demo [NAME] ...`` and ``python -m jaxweight bench ...``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path

# name -> module exposing ``main(argv) -> int``
DEMOS = {
    "awr": "jaxweight.demos.awr",
    "curriculum": "jaxweight.demos.curriculum",
    "grpo": "jaxweight.demos.grpo",
    "preferences": "jaxweight.demos.preferences",
}
DEFAULT_DEMO = "preferences"  # the main job: preference comparisons with a PPO agent

BENCH_MODULES = ("random_weighting", "curriculum", "maxent", "preference", "sync")

USAGE = """\
usage: python -m jaxweight demo [NAME] [demo options]   (NAME: {demos}; default {default})
       python -m jaxweight bench [--only MODULE] [--quick] [--json PATH]
       python -m jaxweight demo NAME --help              (options of one demo)
"""


def _available_demos() -> list[str]:
    return [n for n, m in DEMOS.items() if importlib.util.find_spec(m) is not None]


def demo(argv: list[str]) -> int:
    names = _available_demos()
    if argv and not argv[0].startswith("-"):
        name, rest = argv[0], argv[1:]
    else:
        name, rest = DEFAULT_DEMO, argv
    if name not in DEMOS:
        print(f"unknown demo {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    if name not in names:
        print(f"demo {name!r} is not built yet; available: {', '.join(names)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(DEMOS[name]).main(rest) or 0)


def find_bench_dir() -> Path:
    """``$JAXWEIGHT_BENCH_DIR``, else ``./bench``, else the ``bench/`` folder of the checkout."""
    cands = []
    if os.environ.get("JAXWEIGHT_BENCH_DIR"):
        cands.append(Path(os.environ["JAXWEIGHT_BENCH_DIR"]))
    cands += [Path.cwd() / "bench", Path(__file__).resolve().parents[1] / "bench"]
    for c in cands:
        if (c / "_common.py").exists():
            return c
    raise SystemExit(
        "bench/ not found: run from a checkout of jaxweight (pip install -e .) or set JAXWEIGHT_BENCH_DIR"
    )


def bench(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxweight bench", description="Run the benchmarks in bench/.")
    p.add_argument("--only", action="append", choices=BENCH_MODULES, metavar="MODULE",
                   help=f"run only this module (repeatable): {', '.join(BENCH_MODULES)}")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")
    p.add_argument("--json", metavar="PATH", help="write the records as a JSON list to PATH")
    args = p.parse_args(argv)

    bdir = find_bench_dir()
    sys.path.insert(0, str(bdir))
    common = importlib.import_module("_common")
    records = []
    for mod in args.only or BENCH_MODULES:
        f = bdir / f"bench_{mod}.py"
        if not f.exists():
            print(f"[bench] {mod}: no {f.name} yet, skipped", file=sys.stderr)
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
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.format(demos=", ".join(DEMOS), default=DEFAULT_DEMO))
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        return demo(rest)
    if cmd == "bench":
        return bench(rest)
    print(f"unknown command {cmd!r}\n" + USAGE.format(demos=", ".join(DEMOS), default=DEFAULT_DEMO),
          file=sys.stderr)
    return 2


__all__ = ["main", "demo", "bench", "DEMOS", "DEFAULT_DEMO"]
