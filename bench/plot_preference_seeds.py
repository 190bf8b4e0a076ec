"""Draw the preferences demo's figure over the seeds of several runs.

Seeds that ran as separate programs (``--seed 0``, ``--seed 1``, ...) each leave
a results JSON; this merges them along the seed axis and draws the figure the
demo draws for one program of many seeds (:func:`jaxweight.demos.preferences.plot`):
true return and reward accuracy per round, one thin line a seed, their mean,
and the baseline's mean.

    python bench/plot_preference_seeds.py RUN.json [RUN.json ...] --out FIG.png

The runs must share their settings except the seed (``settings.seeds`` may differ).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from jaxweight.demos import preferences as demo

_PER_SEED_FINAL = ("return", "return_deterministic", "heldout_accuracy", "heldout_decided", "pearson")


def merge(runs: list[dict]) -> dict:
    """One results dict whose seed axis is the seeds of ``runs``, in order.

    Raises:
      ValueError: no runs, or runs whose settings (other than the seed count) or
        numbers of rounds differ.
    """
    if not runs:
        raise ValueError("no runs to merge")
    def same(s):
        return {k: v for k, v in s.items() if k != "seeds"}
    first = runs[0]
    for i, r in enumerate(runs[1:], 1):
        if same(r["settings"]) != same(first["settings"]):
            diff = sorted(k for k in set(r["settings"]) | set(first["settings"])
                          if k != "seeds" and r["settings"].get(k) != first["settings"].get(k))
            raise ValueError(f"run {i} has other settings than run 0: {diff}")
        if len(r["history"]) != len(first["history"]):
            raise ValueError(f"run {i} has {len(r['history'])} rounds, run 0 {len(first['history'])}")

    def cat(values):
        return np.concatenate([np.asarray(v).reshape(-1) for v in values]).tolist()

    per_seed = ("gt_return", "reward_accuracy", "fresh_accuracy", "fresh_decided")
    # the x axis (steps a round) is the same for every seed: the first run's
    history = [dict({k: cat([r["history"][j][k] for r in runs]) for k in per_seed},
                    agent_steps=first["history"][j]["agent_steps"])
               for j in range(len(first["history"]))]
    final = {k: cat([r["final"][k] for r in runs]) for k in _PER_SEED_FINAL if k in first["final"]}
    baseline = None
    if all(r.get("baseline_return") is not None for r in runs):
        baseline = cat([r["baseline_return"] for r in runs])
    settings = dict(first["settings"], seeds=int(sum(len(np.asarray(r["final"]["return"]).reshape(-1))
                                                     for r in runs)))
    return {"settings": settings, "history": history, "final": final, "baseline_return": baseline}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="results JSONs of the demo")
    ap.add_argument("--out", type=Path, required=True, help="PNG to write")
    a = ap.parse_args(argv)
    res = merge([json.loads(p.read_text()) for p in a.runs])
    path = demo.plot(res, a.out)
    print(f"{res['settings']['seeds']} seeds -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
