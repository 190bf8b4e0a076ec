"""The arithmetic study: ``demo lm --train-seeds N``, its parts and its pre-registered analysis.

The study trains ``N`` paired runs of ``full`` against ``grpo_uniform`` at the default settings
(1,200 steps), and on the first ``--ablation-seeds`` of them also the two ablations
``full_no_maxent`` (MaxEnt weights off, everything else of ``full`` on) and
``full_no_curriculum`` (curriculum off). The runs go in parts of ``--part-seeds`` training seeds,
each one vmapped :func:`jaxweight.demos.lm.run` under ``--out/part-p/`` with
``seed = --seed + seed_offset``: a part resumes on its own (its checkpoint) and a finished part
(``results.json`` with ``finished``) is never run again. The primary parts come first; an ablation
part repeats a primary part's seed and size, so its runs start from the same warm starts and
task draw as that part's (tested). A pair is one seed offset and one seed index.

The analysis below was fixed in code before any study run:

- **primary**: the paired run-level difference ``full - grpo_uniform`` of the final held-out
  greedy accuracy over 2-4 digits (``heldout_hard_accuracy_final``): mean, Student-t 95%
  interval over pairs and the two-sided Wilcoxon signed-rank p
  (:func:`._stats.paired_runs`). The headline claim holds if the interval excludes 0.
- **secondary** (reported, no claim on their own): the same difference of pass@8 and of the
  sampled token entropy at the end; the ablations ``full - full_no_maxent`` and
  ``full - full_no_curriculum`` on the primary metric over their pairs.
- nothing is tuned on the held-out split; every part's ``results.json`` stays on record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ._stats import paired_runs

__all__ = ["PRIMARY", "SECONDARY", "ABLATIONS", "plan", "analyse", "analyse_files"]

PRIMARY = ("full", "grpo_uniform", "heldout_hard_accuracy_final")
SECONDARY = ("pass_at_8_final", "sampled_entropy_final")
ABLATIONS = ("full_no_maxent", "full_no_curriculum")


def plan(train_seeds: int, part_seeds: int, ablation_seeds: int) -> list[dict]:
    """The parts of a study: ``[{"part", "seed_offset", "seeds", "arms"}]``.

    First the primary parts (``full`` and ``grpo_uniform``, ``train_seeds`` in all), then the
    ablation parts: the two ablation arms on the first ``ablation_seeds`` training seeds, each
    with the seed offset and size of a primary part, so they share its warm starts and pair
    with its ``full`` runs.
    """
    if part_seeds < 2:
        raise ValueError(f"part_seeds must be >= 2, got {part_seeds}")
    if not 0 <= ablation_seeds <= train_seeds:
        raise ValueError(f"ablation_seeds must be in [0, train_seeds={train_seeds}], got {ablation_seeds}")
    prim = [{"seed_offset": o, "seeds": min(part_seeds, train_seeds - o), "arms": list(PRIMARY[:2])}
            for o in range(0, train_seeds, part_seeds)]
    abl = [{**p, "arms": list(ABLATIONS)} for p in prim if p["seed_offset"] < ablation_seeds]
    return [{"part": i, **p} for i, p in enumerate(prim + abl)]


def _pairs(parts: list[tuple[dict, dict]], a: str, b: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed ``metric`` of arms ``a`` and ``b`` over parts of the same seed offset, pair by pair."""
    by_off: dict[int, dict] = {}
    for p, res in parts:
        by_off.setdefault(p["seed_offset"], {}).update(res["arms"])
    xa, xb = [], []
    for arms in by_off.values():
        if a in arms and b in arms and metric in arms[a]["per_seed"] and metric in arms[b]["per_seed"]:
            xa += arms[a]["per_seed"][metric]
            xb += arms[b]["per_seed"][metric]
    return np.asarray(xa, np.float64), np.asarray(xb, np.float64)


def _effect(parts: list[dict], a: str, b: str, metric: str) -> dict | None:
    xa, xb = _pairs(parts, a, b, metric)
    if xa.size == 0:
        return None
    out = paired_runs(xa[:, None, None], xb[:, None, None])
    return {"arm": a, "base": b, "metric": metric, **out, "arm_mean": float(xa.mean()), "base_mean": float(xb.mean())}


def analyse(parts: list[tuple[dict, dict]], planned_pairs: int) -> dict:
    """The pre-registered analysis over ``(plan entry, results.json dict)`` of the parts run so far."""
    fin = [(p, r) for p, r in parts if r.get("finished")]
    a, b, m = PRIMARY
    prim = _effect(fin, a, b, m)
    out = {"planned_pairs": planned_pairs, "finished_parts": len(fin),
           "pairs": 0 if prim is None else prim["runs"], "primary": prim,
           "secondary": {k: _effect(fin, a, b, k) for k in SECONDARY},
           "ablations": {x: _effect(fin, a, x, m) for x in ABLATIONS}}
    ci = None if prim is None else prim["ci95"]
    out["complete"] = out["pairs"] >= planned_pairs
    out["primary_claim"] = (None if not out["complete"] or ci is None else
                            "full above grpo_uniform" if ci[0] > 0 else
                            "full below grpo_uniform" if ci[1] < 0 else "no difference resolved")
    return out


def run_study(cfg, *, train_seeds: int, part_seeds: int, ablation_seeds: int, seed: int, out: Path,
              resume: bool, checkpoint: bool, run, log) -> dict:
    """Run (or continue) every part in order, then write ``--out/study.json``; returns it."""
    import dataclasses

    t0 = time.perf_counter()
    parts = plan(train_seeds, part_seeds, ablation_seeds)
    done = []
    for p in parts:
        pdir = out / f"part-{p['part']}"
        rj = pdir / "results.json"
        if rj.exists():
            prev = json.loads(rj.read_text())
            if prev.get("finished"):
                log(f"part {p['part']}: finished earlier ({rj})")
                done.append((p, prev))
                continue
        log(f"part {p['part']} of {len(parts)}: {p['seeds']} training seeds x arms {','.join(p['arms'])}")
        pcfg = dataclasses.replace(cfg, seeds=p["seeds"], arms=tuple(p["arms"]))
        res = run(pcfg, seed=seed + p["seed_offset"], out=pdir, resume=resume,
                  checkpoint=pdir / "checkpoint.jwc" if checkpoint else None, progress=log)
        res.pop("_state", None)
        done.append((p, res))
    study = {"plan": parts, "seed": seed, "analysis": analyse(done, train_seeds),
             "wall_seconds_this_call": time.perf_counter() - t0,
             "part_wall_seconds": [r.get("wall_seconds") for _, r in done],
             "parts": [str(out / f"part-{p['part']}" / "results.json") for p in parts]}
    from .. import _common

    _common.write_results(out, study, "study.json")
    return study


def analyse_files(files: list[str | Path], *, train_seeds: int, part_seeds: int, ablation_seeds: int) -> dict:
    """:func:`analyse` over part files on record: ``files[p]`` is part ``p``'s ``results.json``.

    The analysis of a study still running (``complete`` False, no claim) or of its committed parts::

        python -m jaxweight.demos.lm._study --train-seeds 16 --part-seeds 4 --ablation-seeds 8 \\
            bench/results/lm-study/part-0-cpu-2core.json bench/results/lm-study/part-1-cpu-2core.json
    """
    parts = plan(train_seeds, part_seeds, ablation_seeds)
    if len(files) > len(parts):
        raise ValueError(f"the plan has {len(parts)} parts, got {len(files)} files")
    return analyse([(p, json.loads(Path(f).read_text())) for p, f in zip(parts, files)], train_seeds)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m jaxweight.demos.lm._study",
                                 description="the study's pre-registered analysis over its part files, in part order")
    ap.add_argument("files", nargs="+", help="part-0's results.json, part-1's, ...")
    ap.add_argument("--train-seeds", type=int, default=16)
    ap.add_argument("--part-seeds", type=int, default=4)
    ap.add_argument("--ablation-seeds", type=int, default=8)
    a = ap.parse_args()
    print(json.dumps(analyse_files(a.files, train_seeds=a.train_seeds, part_seeds=a.part_seeds,
                                   ablation_seeds=a.ablation_seeds), indent=1))
