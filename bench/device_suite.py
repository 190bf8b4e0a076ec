"""The device suite: every accelerator row of jaxweight's benchmarks in one call, one JSON and one PNG.

``python -m jaxweight bench --suite device [--quick] [--out DIR]`` (or ``bench/device_suite.sh``
on a machine with a GPU and no network: it installs the carried wheels first). Parts, each
run on its own so that a failure of one still writes the others' rows (the JSON is
rewritten atomically after every part):

1. ``limits``: the machine's measured copy bandwidth and matmul peak (``_roofline``).
2. ``hot_paths``: each of :data:`hot_paths.BUILDERS` at the device's size (``gpu`` on an
   accelerator, ``cpu`` on a CPU, ``quick`` with ``--quick``): median time, compile time,
   XLA's bytes and flops, and the roofline fraction against the measured limits.
3. ``ppo_vs_brax``: jaxweight's PPO with brax's halfcheetah update (``bench_preference_brax.py``)
   and brax's own PPO (``bench_preference_brax_ref.py``), one after the other, each alone on
   the device, the same number of environments and steps: env-steps/s of each (between the
   first and the last evaluation, so compilation is left out) and the returns at equal steps.
4. ``preference_seeds``: the preference loop end to end (the ``preferences`` demo's settings)
   with many seeds in one vmapped program, on CartPole and on brax's inverted pendulum:
   wall per seed.
5. ``countdown``: the Countdown study (``demo lm --task countdown --train-seeds 32``: 3 arms x
   32 paired training runs in one program) on the accelerator, its quick size with ``--quick``,
   skipped at the CPU size: wall, its parts and the primary analysis.

Sizing (measured on the 2-core CPU, scaled by a stated estimate for one H200): see
:data:`BUDGET`; parts 1-4 are planned for <= 8 minutes on the GPU and the Countdown study after
them for 2-3 (a call stopped at its limit keeps every finished part's rows). ``--quick`` runs the
same parts at CPU sizes in a couple of minutes (CI runs it and checks that every row is there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

PARTS = ("limits", "hot_paths", "ppo_vs_brax", "preference_seeds", "countdown")

# What each part runs at each size. cpu-s: measured on the 2-core CPU at the quick size;
# the gpu sizes are planned from the 2026-11-27 H200 runs (jaxweight's PPO on halfcheetah,
# 2048 envs: ~48k env-steps/s after ~25 s of compilation) and the CPU timings scaled by the
# copy-bandwidth ratio (~4.3 TB/s against ~10 GB/s), so that the sum stays under 8 minutes.
PPO_HALFCHEETAH = ["--env", "brax:halfcheetah", "--num-envs", "2048", "--num-steps", "160", "--minibatches", "32",
                   "--epochs", "8", "--gamma", "0.95", "--ent", "1e-3", "--reward-scaling", "1",
                   "--max-grad-norm", "none", "--clip-eps", "0.3", "--tanh-squash", "--episodic", "--state-std",
                   "--brax-obs", "--gae-per-minibatch", "--unroll-length", "20", "--advantage", "lambda_return",
                   "--hidden", "32", "32", "32", "32", "--value-hidden", "256", "256", "256", "256", "256",
                   "--activation", "swish", "--eval-episodes", "16", "--seeds", "1"]
BUDGET = {
    "quick": {"ppo": dict(ours=["--env", "brax:inverted_pendulum", "--horizon", "50", "--num-envs", "16",
                                "--num-steps", "16", "--minibatches", "4", "--epochs", "1", "--eval-episodes", "2",
                                "--seeds", "1"],
                          ref=["--env", "inverted_pendulum", "--num-envs", "16", "--batch-size", "16",
                               "--num-minibatches", "4", "--episode-length", "50"],
                          steps=4096, evals=2, timeout=600),
              "seeds": dict(cartpole=2, brax=0, timeout=600),
              "countdown": dict(args=["--quick"], timeout=600)},
    "gpu": {"ppo": dict(ours=PPO_HALFCHEETAH, ref=["--env", "halfcheetah"], steps=2_621_440, evals=4, timeout=200),
            "seeds": dict(cartpole=64, brax=64, timeout=150),
            # 96 runs (3 arms x 32 seeds) of 200 steps: ~55 min on 2 CPU cores; planned at 2-3 min here
            "countdown": dict(args=["--train-seeds", "32"], timeout=240)},
}
BUDGET["cpu"] = {"ppo": dict(BUDGET["quick"]["ppo"], steps=16384, evals=3),
                 "seeds": dict(cartpole=4, brax=0, timeout=900), "countdown": None}


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _write(path: Path, data: dict) -> None:
    """Atomically: a crash mid-write leaves the previous version."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def _part(result: dict, name: str, fn, out_json: Path, log) -> None:
    t0 = time.perf_counter()
    log(f"[device suite] {name} ...")
    try:
        result[name] = {"status": "ok", **fn()}
    except Exception as e:  # noqa: BLE001 - one part failing must not lose the others' rows
        result[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc()[-4000:]}
    result[name]["wall_s"] = time.perf_counter() - t0
    log(f"[device suite] {name}: {result[name]['status']} in {result[name]['wall_s']:.1f} s")
    _write(out_json, result)


# ------------------------------------------------------------------ parts
def part_limits(size: str) -> dict:
    import _roofline

    return {"limits": _roofline.machine_limits("quick" if size == "quick" else "auto")}


def part_hot_paths(size: str) -> dict:
    import _roofline
    import hot_paths

    limits = _roofline.machine_limits("quick" if size == "quick" else "auto")
    rows = []
    for name, build in hot_paths.BUILDERS.items():
        row = {"name": name}
        try:
            hp = build(size)
            m = hot_paths.measure(hp, n=3 if size == "quick" else 10)
            row.update(status="ok", title=hp.name, size=hp.size, note=hp.note, median_s=m["median_s"],
                       min_s=m["min_s"], max_s=m["max_s"], n=m["n"], compile_s=m["compile_s"],
                       **_roofline.roofline(m["median_s"], m["cost"], limits))
            del hp, m
        except Exception as e:  # noqa: BLE001 - the other paths' rows still count
            row.update(status="failed", error=f"{type(e).__name__}: {e}")
        rows.append(row)
    return {"size": size, "rows": rows}


def _run_json(cmd: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        p = subprocess.run([sys.executable, *cmd, "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode != 0 or not out.exists():
            raise RuntimeError(f"{' '.join(cmd[:2])} exited {p.returncode}: {(p.stderr or p.stdout)[-2000:]}")
        return json.loads(out.read_text())


def _steady_rate(curve: list[dict], seeds: int = 1) -> float | None:
    """Env-steps/s between the first and the last evaluation (compilation left out)."""
    pts = [c for c in curve if c.get("steps", 0) > 0]
    if len(pts) < 2:
        return None
    a, b = pts[0], pts[-1]
    return seeds * (b["steps"] - a["steps"]) / (b["elapsed_s"] - a["elapsed_s"])


def _nearest(curve: list[dict], steps: int) -> dict:
    """brax's evaluation nearest to ``steps`` (its steps are whole training steps, ours whole chunks)."""
    pts = [c for c in curve if c.get("steps", 0) > 0]
    if not pts:
        return {"brax": None, "brax_steps": None}
    c = min(pts, key=lambda c: abs(c["steps"] - steps))
    return {"brax": c["return"], "brax_steps": c["steps"]}


def part_ppo_vs_brax(size: str) -> dict:
    b = BUDGET[size]["ppo"]
    steps, evals = b["steps"], b["evals"]
    ours = _run_json([str(HERE / "bench_preference_brax.py"), *b["ours"], "--steps", str(steps),
                      "--evals", str(evals)], b["timeout"])
    # brax evaluates at step 0 too: evals + 1 evaluations put its points where ours are
    ref = _run_json([str(HERE / "bench_preference_brax_ref.py"), *b["ref"], "--steps", str(steps),
                     "--evals", str(evals + 1)], b["timeout"])
    r_ours, r_ref = _steady_rate(ours["curve"], ours["settings"]["seeds"]), _steady_rate(ref["curve"])
    at_equal = [dict(steps=c["steps"], ours=c["return"], **_nearest(ref["curve"], c["steps"])) for c in ours["curve"]]
    return {"env": ours["env"], "num_envs": ours["settings"]["num_envs"], "steps": steps,
            "ours_steps_per_s": r_ours, "brax_steps_per_s": r_ref,
            "ratio": (r_ours / r_ref) if (r_ours and r_ref) else None,
            "ours_compile_s": ours.get("compile_s"), "returns_at_equal_steps": at_equal,
            "random_return": ours.get("random_return"), "ours": ours, "brax": ref}


def _seeds_run(env: str, seeds: int, quick: bool) -> dict:
    import jax

    from jaxweight.demos import preferences as D

    s = D.settings(env, quick=quick, seeds=seeds, agent="ppo")  # the PPO loop's seeds (the part's rows)
    pc = D.build(s)
    t0 = time.perf_counter()
    pc.train(0, s.total_timesteps, s.total_comparisons, num_seeds=seeds, progress=False)
    jax.block_until_ready(pc.state)
    wall = time.perf_counter() - t0
    return {"env": env, "seeds": seeds, "total_timesteps": s.total_timesteps,
            "total_comparisons": s.total_comparisons, "wall_s": wall, "wall_per_seed_s": wall / seeds,
            "quick_settings": quick}


def part_preference_seeds(size: str) -> dict:
    b = BUDGET[size]["seeds"]
    out = {"cartpole": _seeds_run("cartpole", b["cartpole"], quick=(size == "quick"))}
    if b["brax"]:
        try:
            out["brax:inverted_pendulum"] = _seeds_run("brax:inverted_pendulum", b["brax"], quick=True)
        except Exception as e:  # noqa: BLE001 - the CartPole row stands on its own
            out["brax:inverted_pendulum"] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    else:
        out["brax:inverted_pendulum"] = {"status": "skipped", "reason": f"not run at size {size!r} (GPU only)"}
    return out


def part_countdown(size: str) -> dict:
    """The Countdown study (``demo lm --task countdown``) at 32 training seeds on the accelerator, its
    quick size with ``--quick``; not at the CPU size (about an hour on 2 cores: run the demo itself)."""
    b = BUDGET[size]["countdown"]
    if b is None:
        return {"status_detail": "skipped", "reason": "the 32-seed study takes about an hour on 2 CPU cores: "
                "python -m jaxweight demo lm --task countdown --train-seeds 32"}
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        cmd = ["-m", "jaxweight", "demo", "lm", "--task", "countdown", *b["args"], "--out", d, "--no-progress"]
        p = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=b["timeout"])
        out = Path(d) / "results.json"
        if not out.exists():
            raise RuntimeError(f"demo lm --task countdown exited {p.returncode}: {(p.stderr or p.stdout)[-2000:]}")
        res = json.loads(out.read_text())
    keep = ("primary", "primary_how", "config", "wall_seconds", "warm_start_seconds", "compile_seconds",
            "train_seconds", "eval_seconds", "seconds_per_step", "device")
    return {"command": "python -m jaxweight demo lm --task countdown " + " ".join(b["args"]),
            "goals_exit_status": p.returncode, **{k: res.get(k) for k in keep},
            "arms": {a: {k: r.get(k) for k in ("pass_at_8", "coverage_at_8", "mean_at_8", "per_seed", "takeoff")}
                     for a, r in res["arms"].items()}}


RUNNERS = {"limits": part_limits, "hot_paths": part_hot_paths, "ppo_vs_brax": part_ppo_vs_brax,
           "preference_seeds": part_preference_seeds, "countdown": part_countdown}


# ------------------------------------------------------------------ plot
def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in result.get("hot_paths", {}).get("rows", []) if r.get("status") == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    names = [r["name"].replace("_", " ") for r in rows]
    ax.barh(names, [r["roofline_fraction"] for r in rows], color=["C0" if r["bound"] == "memory" else "C1"
                                                                  for r in rows])
    ax.axvline(0.5, color="grey", ls="--", lw=1)
    ax.set_xlabel("roofline fraction (blue: memory-bound, orange: compute-bound)")
    ax.set_title(f"hot paths, {result['meta']['device']}")
    ax.invert_yaxis()
    ax = axes[1]
    pvb = result.get("ppo_vs_brax", {})
    if pvb.get("status") == "ok":
        ax.bar(["jaxweight PPO", "brax PPO"], [pvb["ours_steps_per_s"] or 0, pvb["brax_steps_per_s"] or 0])
        ax.set_ylabel("env-steps/s")
        ax.set_title(f"PPO on {pvb['env']}, {pvb['num_envs']} envs")
    else:
        ax.text(0.5, 0.5, f"PPO vs brax: {pvb.get('status', 'not run')}", ha="center")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------ entry
def expected_rows() -> dict[str, list[str]]:
    """What a complete JSON holds: every part, every hot path."""
    import hot_paths

    return {"parts": list(PARTS), "hot_paths": list(hot_paths.BUILDERS)}


def missing_rows(result: dict) -> list[str]:
    """Names of expected parts or hot-path rows absent from ``result`` (failed ones are present)."""
    exp = expected_rows()
    miss = [p for p in exp["parts"] if p not in result]
    have = {r["name"] for r in result.get("hot_paths", {}).get("rows", [])}
    miss += [f"hot_paths/{n}" for n in exp["hot_paths"] if n not in have]
    return miss


def run(quick: bool = False, out: str | None = None, parts: list[str] | None = None, log=print) -> dict:
    import jax

    dev = jax.devices()[0]
    size = "quick" if quick else ("cpu" if dev.platform == "cpu" else "gpu")
    out_dir = Path(out or os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    out_json = out_dir / f"device-suite-{size}.json"
    result = {"meta": {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "commit": _commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "device": f"{dev.platform} ({dev.device_kind})",
        "jax_version": jax.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "size": size}}
    t0 = time.perf_counter()
    for name in parts or PARTS:
        if name not in RUNNERS:
            raise ValueError(f"parts: unknown part {name!r}; known: {', '.join(PARTS)}")
        _part(result, name, lambda n=name: RUNNERS[n](size), out_json, log)
    result["meta"]["wall_s"] = time.perf_counter() - t0
    result["meta"]["missing"] = missing_rows(result)
    _write(out_json, result)
    png = out_dir / f"device-suite-{size}.png"
    result["meta"]["plot"] = png.name if plot(result, png) else None
    _write(out_json, result)
    log(f"[device suite] wrote {out_json} ({result['meta']['wall_s']:.0f} s)")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxweight bench --suite device",
                                 description="Run every device benchmark once; one JSON and one PNG.")
    ap.add_argument("--quick", action="store_true", help="CPU sizes, a couple of minutes (CI's check)")
    ap.add_argument("--out", default=None, help="output folder (default: $OUT, else .)")
    ap.add_argument("--parts", default=None, help=f"comma-separated subset of {','.join(PARTS)}")
    a = ap.parse_args(argv)
    res = run(a.quick, a.out, a.parts.split(",") if a.parts else None, log=lambda m: print(m, file=sys.stderr,
                                                                                             flush=True))
    failed = [p for p in PARTS if res.get(p, {}).get("status") == "failed"]
    if res["meta"]["missing"] or failed:
        print(f"[device suite] missing: {res['meta']['missing']}, failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
