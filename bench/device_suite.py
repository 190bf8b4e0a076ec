"""The device suite: every accelerator row in two prepared calls that cannot outrun the lease.

``python -m jaxweight bench --suite device --plan`` prints the calls, their parts and budgets as
JSON; ``bash bench/device_suite.sh 1`` then ``bash bench/device_suite.sh 2`` (sent at once, to the
warm machine) run them; ``--quick`` runs both calls' parts at CPU sizes (CI's check).

- The parent imports no JAX and holds no device memory: every part is a subprocess
  (``device_suite.py --child PART``) under a hard timeout, the smaller of the part's budget and
  what is left of the call's global deadline; a part that can no longer finish is skipped.
- Each call opens with a preflight (<= 30 s): ``JAX_PLATFORMS=cuda`` on the GPU size, a GPU
  asserted, every version printed, brax and gymnax imported from the carried wheels. Without
  ``.whl/`` the GPU call stops at once, before any child starts.
- Every child's output is streamed to ``$OUT/<part>.log`` and each measured point appended to
  ``$OUT/<part>.jsonl`` as it comes (a killed part keeps its points); the call's JSON
  ``device-suite-call<N>-<size>.json`` is rewritten after every part. Plots are drawn afterwards on
  the CPU machine (``bench/plot_device_suite.py``).

Rows: the hot paths at GPU sizes against the measured HBM stream (:mod:`bench_roofline`); the LM
step's tokens/s and model-flops utilisation against the matmul peak in the model's own dtype;
PPO against brax's PPO like for like (brax's own ``training/sps``, compile reported on both
sides, evaluation excluded from the rate, 2 seeds each); the preference loop over 1 to 1024
vmapped seeds; peak device memory of every child.
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

SIZES = ("quick", "cpu", "gpu")
# each call: (part, budget seconds); a call's parts sum to at most its budget
CALLS = {
    1: {"budget_s": 300, "parts": [("preflight", 30), ("limits", 30), ("hot_paths", 160), ("lm_step", 70)]},
    2: {"budget_s": 300, "parts": [("preflight", 30), ("ppo_vs_brax", 170), ("preference_seeds", 90)]},
}
PARTS = tuple(dict.fromkeys(p for c in CALLS.values() for p, _ in c["parts"]))
MIN_START_S = 15  # a part is not started with less than this left of its call
# the budgets are the GPU's; a CPU rehearsal compiles brax and the loop for minutes, so its budgets stretch
BUDGET_SCALE = {"gpu": 1.0, "quick": 4.0, "cpu": 8.0}

# what each part runs at each size; the GPU sizes are planned from the 2026-11-27 H200 run
# (jaxweight's PPO on halfcheetah, 2048 envs: ~48k env-steps/s after ~25 s of compilation)
PPO_HALFCHEETAH = ["--env", "brax:halfcheetah", "--num-envs", "2048", "--num-steps", "160", "--minibatches", "32",
                   "--epochs", "8", "--gamma", "0.95", "--ent", "1e-3", "--reward-scaling", "1",
                   "--max-grad-norm", "none", "--clip-eps", "0.3", "--tanh-squash", "--episodic", "--state-std",
                   "--brax-obs", "--gae-per-minibatch", "--unroll-length", "20", "--advantage", "lambda_return",
                   "--hidden", "32", "32", "32", "32", "--value-hidden", "256", "256", "256", "256", "256",
                   "--activation", "swish", "--eval-episodes", "16", "--seeds", "1"]
QUICK_PPO = dict(ours=["--env", "brax:inverted_pendulum", "--horizon", "50", "--num-envs", "16", "--num-steps", "16",
                       "--minibatches", "4", "--epochs", "1", "--eval-episodes", "2", "--seeds", "1"],
                 ref=["--env", "inverted_pendulum", "--num-envs", "16", "--batch-size", "16", "--num-minibatches", "4",
                      "--episode-length", "50"], steps=4096, evals=2, seeds=[0])
BUDGET = {
    # CI's check of every part: one seed count (2: the vmapped seeds' program) is the part's whole code path
    "quick": {"ppo": QUICK_PPO, "seeds": [2], "lm_seeds": 1},
    "cpu": {"ppo": dict(QUICK_PPO, steps=16384, evals=3), "seeds": [1, 2, 4], "lm_seeds": 1},
    # 2 seeds x 2 sides of 655k env-steps: ~14 s of training each at 48k/s, plus compile (25-50 s)
    "gpu": {"ppo": dict(ours=PPO_HALFCHEETAH, ref=["--env", "halfcheetah"], steps=655_360, evals=3, seeds=[0, 1]),
            "seeds": [1, 16, 128, 1024], "lm_seeds": 32},
}


def plan(size: str = "gpu") -> dict:
    """The calls, their parts and budgets (``bench --suite device --plan``)."""
    k = BUDGET_SCALE[size]
    return {"size": size, "budget_scale": k, "calls": [
        {"call": n, "command": f"bash bench/device_suite.sh {n}" + ("" if size == "gpu" else f" --size {size}"),
         "budget_s": k * c["budget_s"], "parts": [{"part": p, "budget_s": k * b} for p, b in c["parts"]],
         "planned_s": k * sum(b for _, b in c["parts"])} for n, c in CALLS.items()],
        "device_time_s": k * sum(c["budget_s"] for c in CALLS.values()), "preflight_s": k * CALLS[1]["parts"][0][1]}


# ------------------------------------------------------------------ the parent
def _write(path: Path, data: dict) -> None:
    """Atomically: a crash mid-write leaves the previous version."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def _points(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            continue
    return out


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_call(call: int, size: str, out: str | Path | None = None, log=print, deadline_s: float | None = None) -> dict:
    """Run one call's parts, each a child process under the call's deadline; returns the call's JSON dict."""
    c = CALLS[call]
    scale = BUDGET_SCALE[size]
    budget = float(deadline_s or c["budget_s"] * scale)
    t0 = time.monotonic()
    out_dir = Path(out or os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    out_json = out_dir / f"device-suite-call{call}-{size}.json"
    result = {"meta": {"call": call, "size": size, "budget_s": budget, "commit": _commit(),
                       "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                       "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}}
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    if size == "gpu":
        env["JAX_PLATFORMS"] = "cuda"
        if not list((ROOT / ".whl").glob("*.whl")):
            result["meta"]["stopped"] = "no .whl/ wheels carried: the brax and gymnax parts cannot run"
            log(f"[device suite] stopped: {result['meta']['stopped']} (carry .whl; bench/device_wheels.sh fetches it)")
            _write(out_json, result)
            return result
    for name, part_budget in c["parts"]:
        part_budget *= scale
        left = budget - (time.monotonic() - t0)
        timeout = min(part_budget, left - 2)
        if timeout < min(MIN_START_S, part_budget):
            result[name] = {"status": "skipped", "reason": f"{left:.0f} s left of the call's {budget:.0f} s"}
            log(f"[device suite] {name}: skipped ({left:.0f} s left)")
            continue
        logf, ptsf = out_dir / f"{name}.log", out_dir / f"{name}.jsonl"
        ptsf.unlink(missing_ok=True)
        log(f"[device suite] {name}: up to {timeout:.0f} s (log {logf})")
        ts = time.monotonic()
        with open(logf, "w") as lf:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", name, "--size", size,
                                     "--points", str(ptsf)], cwd=ROOT, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
                status = "ok" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                rc, status = None, "timed out"
        pts = _points(ptsf)
        result[name] = {"status": status, "rc": rc, "wall_s": time.monotonic() - ts, "timeout_s": timeout,
                        "points": pts}
        if status != "ok":
            result[name]["log_tail"] = logf.read_text()[-3000:]
        log(f"[device suite] {name}: {status} in {result[name]['wall_s']:.1f} s, {len(pts)} points")
        _write(out_json, result)
        if name == "preflight" and status != "ok":
            result["meta"]["stopped"] = "the preflight failed: nothing else was started"
            log(f"[device suite] stopped: {result['meta']['stopped']}")
            break
    result["meta"]["wall_s"] = time.monotonic() - t0
    result["meta"]["missing"] = missing_rows(result, call)
    _write(out_json, result)
    log(f"[device suite] wrote {out_json} ({result['meta']['wall_s']:.0f} s of {budget:.0f})")
    return result


def expected_rows(call: int | None = None) -> dict[str, list[str]]:
    """What a complete call holds: its parts; call 1 also every hot path."""
    import hot_paths

    calls = [call] if call else list(CALLS)
    parts = [p for n in calls for p, _ in CALLS[n]["parts"]]
    return {"parts": list(dict.fromkeys(parts)), "hot_paths": list(hot_paths.BUILDERS) if 1 in calls else []}


def missing_rows(result: dict, call: int | None = None) -> list[str]:
    """Parts absent or not ok, and hot paths with no ok point."""
    exp = expected_rows(call)
    miss = [p for p in exp["parts"] if result.get(p, {}).get("status") != "ok"]
    have = {r.get("key") for r in result.get("hot_paths", {}).get("points", []) if r.get("status") == "ok"}
    miss += [f"hot_paths/{n}" for n in exp["hot_paths"] if n not in have]
    return miss


# ------------------------------------------------------------------ the children
class _Emit:
    """Append one JSON line per measured point, flushed and synced (a kill keeps what came before)."""

    def __init__(self, path: str):
        self.f = open(path, "a")  # noqa: SIM115 - open for the child's life

    def __call__(self, point: dict) -> None:
        self.f.write(json.dumps(point, default=str) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())
        print(json.dumps({k: v for k, v in point.items() if not isinstance(v, (list, dict))}, default=str), flush=True)


def _peak_memory() -> int | None:
    import jax

    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - CPU backends have none
        return None
    return stats.get("peak_bytes_in_use")


def child_preflight(size: str, emit) -> None:
    import importlib
    import importlib.metadata as md

    import jax

    dev = jax.devices()[0]
    if size == "gpu" and dev.platform != "gpu":
        raise SystemExit(f"preflight: expected a GPU, got {dev.platform} ({dev.device_kind})")
    versions = {}
    for pkg in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax", "numpy", "brax",
                "gymnax", "mujoco", "mujoco-mjx"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    for mod in ("brax", "gymnax"):
        importlib.import_module(mod)  # from the carried wheels; an ImportError fails the call here
    emit({"status": "ok", "python": sys.version.split()[0], "device": f"{dev.platform} ({dev.device_kind})",
          "devices": len(jax.devices()), "versions": versions})


def child_limits(size: str, emit) -> None:
    import jax.numpy as jnp

    import _roofline

    st = _roofline.Stream(2 << 30 if size == "gpu" else None)
    for _ in range(10):
        st.once()
    emit({"status": "ok", "what": "stream", **st.summary(), "llc_bytes": _roofline.llc_bytes()})
    mm = {"quick": 512, "cpu": 2048, "gpu": 8192}[size]
    for dt in (jnp.float32, jnp.bfloat16):
        emit({"status": "ok", "what": "matmul_peak", "dtype": jnp.dtype(dt).name, "size": mm,
              "flops": _roofline.matmul_peak(mm, dt)})
    emit({"status": "ok", "what": "dispatch_floor_s", "seconds": _roofline.dispatch_floor()})


def child_hot_paths(size: str, emit) -> None:
    import gc

    import jax

    import _roofline
    import bench_roofline
    import hot_paths

    stream = _roofline.Stream(2 << 30 if size == "gpu" else None)
    floors: dict = {}
    for key, build in hot_paths.BUILDERS.items():
        try:
            hp = build(size)
            r = bench_roofline.row(key, hp, stream, 3 if size == "quick" else 10, floors)
            emit({"status": "ok", **r, "peak_memory_bytes": _peak_memory()})
            del hp
        except Exception as e:  # noqa: BLE001 - the other paths' rows still count
            emit({"status": "failed", "key": key, "error": f"{type(e).__name__}: {e}"})
        gc.collect()
        jax.clear_caches()


def child_lm_step(size: str, emit) -> None:
    import dataclasses

    import jax
    import jax.numpy as jnp

    import _roofline
    from _common import time_jax

    from jaxweight.demos import lm

    cfg = lm.QUICK if size == "quick" else dataclasses.replace(lm.LMConfig(), seeds=BUDGET[size]["lm_seeds"])
    task = lm.make_task(cfg)
    pipe = lm.make_pipeline(cfg, task)
    params = pipe.random_params(jax.random.key(0))
    state = pipe.init(params, jax.random.key(1))
    t = time_jax(pipe.step_function, state, pipe.data, n=5 if size == "quick" else 10, warmup=2)
    _, m = pipe.step(state)
    n_params = sum(x.size for x in jax.tree.leaves(params)) // cfg.seeds
    dtype = jax.tree.leaves(params)[0].dtype
    comp, prompt = float(jnp.sum(m["tokens"])), float(jnp.sum(m["prompt_tokens"]))
    kept = cfg.prompts / cfg.sample_prompts  # dynamic sampling trains B of the P sampled groups
    # useful flops: 2 per parameter per sampled token (the actor's forward), and per trained token 2 for the
    # reference's forward and 6 for the learner's forward and backward; attention's T^2 term left out (T <= 32)
    flops = 2 * n_params * (comp + prompt) + 8 * n_params * kept * (comp + prompt)
    mm = {"quick": 512, "cpu": 2048, "gpu": 8192}[size]
    peak = _roofline.matmul_peak(mm, dtype)
    emit({"status": "ok", "runs": cfg.runs, "step_s": t["median_s"], "compile_s": t["compile_s"],
          "tokens_per_s": float(jnp.sum(m["tokens"])) / t["median_s"], "params_per_run": int(n_params),
          "dtype": jnp.dtype(dtype).name, "useful_flops": flops, "matmul_peak_flops": peak,
          "mfu": flops / t["median_s"] / peak, "peak_memory_bytes": _peak_memory()})


def _run_json(cmd: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        p = subprocess.run([sys.executable, *cmd, "--out", str(out)], cwd=ROOT, timeout=timeout)
        if p.returncode != 0 or not out.exists():
            raise RuntimeError(f"{' '.join(cmd[:2])} exited {p.returncode}")
        return json.loads(out.read_text())


def _steady_rate(curve: list[dict], seeds: int = 1) -> float | None:
    """Env-steps/s between the first and the last evaluation (compilation left out)."""
    pts = [c for c in curve if c.get("steps", 0) > 0]
    if len(pts) < 2:
        return None
    a, b = pts[0], pts[-1]
    return seeds * (b["steps"] - a["steps"]) / (b["elapsed_s"] - a["elapsed_s"])


def child_ppo_vs_brax(size: str, emit) -> None:
    """Each side of each seed in its own process: a side that fails is one failed point, and the other
    side still runs (the part then fails as a whole)."""
    b = BUDGET[size]["ppo"]
    timeout = 150 * BUDGET_SCALE[size]  # one side's run; the part's own deadline still holds
    failed = []

    def side(name: str, seed: int, cmd: list[str], point) -> None:
        try:
            emit({"status": "ok", "side": name, "seed": seed, **point(_run_json(cmd, timeout))})
        except Exception as e:  # noqa: BLE001 - the other side still runs
            traceback.print_exc()
            emit({"status": "failed", "side": name, "seed": seed, "error": f"{type(e).__name__}: {e}"})
            failed.append(f"{name} seed {seed}")

    def ours_point(ours: dict) -> dict:
        return {"env": ours["env"], "num_envs": ours["settings"]["num_envs"], "steps": b["steps"],
                "compile_s": ours.get("compile_s"),
                "steady_steps_per_s": _steady_rate(ours["curve"], ours["settings"]["seeds"]),
                "final_return": ours["curve"][-1]["return"] if ours["curve"] else None}

    def ref_point(ref: dict) -> dict:
        curve = ref["curve"]
        first = curve[0]["elapsed_s"] if curve else None  # brax evaluates at step 0 after compiling
        return {"env": ref["env"], "num_envs": ref["config"]["num_envs"], "steps": b["steps"],
                "compile_and_first_eval_s": first, "steady_steps_per_s": _steady_rate(curve),
                "brax_training_sps": [c.get("sps") for c in curve],
                "brax_training_walltime": [c.get("walltime") for c in curve],
                "final_return": curve[-1]["return"] if curve else None}

    for seed in b["seeds"]:
        side("jaxweight", seed, [str(HERE / "bench_preference_brax.py"), *b["ours"], "--steps", str(b["steps"]),
                                 "--evals", str(b["evals"]), "--seed", str(seed)], ours_point)
        side("brax", seed, [str(HERE / "bench_preference_brax_ref.py"), *b["ref"], "--steps", str(b["steps"]),
                            "--evals", str(b["evals"] + 1), "--seed", str(seed)], ref_point)
    if failed:
        raise RuntimeError(f"ppo_vs_brax: {', '.join(failed)} failed (see the points above)")


def child_preference_seeds(size: str, emit) -> None:
    import jax

    from jaxweight.demos import preferences as D

    for seeds in BUDGET[size]["seeds"]:
        s = D.settings("cartpole", quick=True, seeds=seeds, agent="ppo")
        pc = D.build(s)
        t0 = time.perf_counter()
        pc.train(0, s.total_timesteps, s.total_comparisons, num_seeds=seeds, progress=False)
        jax.block_until_ready(pc.state)
        wall = time.perf_counter() - t0
        emit({"status": "ok", "env": "cartpole", "seeds": seeds, "total_timesteps": s.total_timesteps,
              "wall_s": wall, "wall_per_seed_s": wall / seeds, "env_steps_per_s": seeds * s.total_timesteps / wall,
              "peak_memory_bytes": _peak_memory(), "note": "compile included (one program per seed count)"})


CHILDREN = {"preflight": child_preflight, "limits": child_limits, "hot_paths": child_hot_paths,
            "lm_step": child_lm_step, "ppo_vs_brax": child_ppo_vs_brax, "preference_seeds": child_preference_seeds}


def _child(name: str, size: str, points: str) -> int:
    emit = _Emit(points)
    try:
        CHILDREN[name](size, emit)
    except SystemExit as e:
        emit({"status": "failed", "error": str(e)})
        return 1
    except Exception as e:  # noqa: BLE001 - said in one point and in the log
        traceback.print_exc()
        emit({"status": "failed", "error": f"{type(e).__name__}: {e}"})
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxweight bench --suite device",
                                 description="The device suite's two prepared calls (see --plan).")
    ap.add_argument("--plan", action="store_true", help="print the calls, their parts and budgets as JSON")
    ap.add_argument("--call", type=int, choices=sorted(CALLS), default=None, help="run one call (default: both)")
    ap.add_argument("--size", choices=SIZES, default=None, help="gpu (default on the device), cpu or quick")
    ap.add_argument("--quick", action="store_true", help="the quick size (CI's check)")
    ap.add_argument("--out", default=None, help="output folder (default: $OUT, else .)")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--points", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    size = a.size or ("quick" if a.quick else "gpu")
    if a.child:
        return _child(a.child, size, a.points)
    if a.plan:
        print(json.dumps(plan(size), indent=1))
        return 0
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    bad = []
    for call in [a.call] if a.call else list(CALLS):
        res = run_call(call, size, a.out, log=log)
        bad += res["meta"].get("missing", []) + ([res["meta"]["stopped"]] if "stopped" in res["meta"] else [])
    if bad:
        print(f"[device suite] missing or not ok: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
