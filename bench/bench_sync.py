"""Benchmarks of ``jaxweight.sync``.

1. Same-device tick: time per eager ``step`` / ``WeightSync`` call, and proof that
   no byte is copied (the returned leaves are the learner's device buffers).
2. Cross-device sync of a ~100 MB parameter pytree between two CPU devices
   against a bare ``jax.device_put`` of the same arrays (and, for reference,
   one ``device_put`` per leaf).
3. Sync cost per collected batch as a fraction of one reward-training step at
   the default interval (1: torchrl's ``make_trainer`` registers
   ``UpdateWeights(collector, update_weights_interval=1)``): inside the jitted
   step, and through the host hook on the same and on another device.

Parts 2 and 3 need 2 devices. Run standalone, this script asks for 2 fake CPU
devices before JAX starts; inside ``python -m jaxweight bench`` (JAX already
started, with one CPU device) it runs the whole benchmark in a subprocess that
has them.

Run: ``python bench/bench_sync.py [--quick] [--json out.json]``.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
_SUB_FLAG = "--records-to"

if __name__ == "__main__":
    # standalone: two fake CPU devices for the cross-device part, set before JAX starts
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=2").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _p in (str(_HERE), str(_ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import main, record  # noqa: E402

from jaxweight import sync  # noqa: E402

MODULE = "sync"


def _param_tree(total_mb: float, seed: int = 0) -> dict:
    """An MLP-like params dict of about ``total_mb`` MB: 8 f32 weight matrices + biases + batch stats."""
    n_layers = 8
    per = int(total_mb * 2**20 / 4 / n_layers)
    width = 1024
    rows = max(1, per // width)
    rng = np.random.RandomState(seed)
    tree = {}
    for i in range(n_layers):
        tree[f"layer{i}"] = {
            "kernel": rng.standard_normal((rows, width)).astype(np.float32),
            "bias": np.zeros((width,), np.float32),
        }
    tree["batch_stats"] = {"mean": np.zeros((width,), np.float32), "var": np.ones((width,), np.float32)}
    return tree


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _per_call(fn, calls: int, repeats: int) -> tuple[float, list[float]]:
    """Median seconds per call of ``fn()`` over ``repeats`` runs of ``calls`` calls each."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        last = None
        for _ in range(calls):
            last = fn()
        jax.block_until_ready(last)
        out.append((time.perf_counter() - t) / calls)
    return statistics.median(out), out


# ------------------------------------------------------------------- part 1
def bench_same_device(quick: bool) -> list[dict]:
    mb = 20 if quick else 100
    learner = jax.device_put(_param_tree(mb))
    size = f"{_nbytes(learner) / 2**20:.0f} MB, {len(jax.tree.leaves(learner))} leaves"
    t0 = time.perf_counter()
    cfg = sync.config(1)
    state, actor, _ = sync.step(sync.init(cfg), learner, learner, cfg)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    # as in a training loop, every tick sees a new learner tree and the actor is the previous one
    learners = [learner, jax.tree.map(jnp.copy, learner)]
    box = {"state": state, "actor": actor, "i": 0}

    def one_tick():
        box["i"] ^= 1
        box["state"], box["actor"], fired = sync.step(box["state"], learners[box["i"]], box["actor"], cfg)
        return box["state"]

    calls, repeats = (200, 7) if quick else (1000, 11)
    _per_call(one_tick, 50, 1)  # warm-up
    t_tick, all_tick = _per_call(one_tick, calls, repeats)
    current = learners[box["i"]]
    same = all(a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer()
               for a, b in zip(jax.tree.leaves(box["actor"]), jax.tree.leaves(current)))
    copied = 0 if same else _nbytes(learner)

    hook = sync.WeightSync(1)
    hbox = {"actor": learner, "i": 0}

    def one_hook():
        hbox["i"] ^= 1
        hbox["actor"] = hook(learners[hbox["i"]], hbox["actor"])
        return hbox["actor"]

    _per_call(one_hook, 50, 1)
    t_hook, all_hook = _per_call(one_hook, calls, repeats)
    hook_same = all(a is b for a, b in zip(jax.tree.leaves(hbox["actor"]), jax.tree.leaves(learners[hbox["i"]])))
    goal = "<= 50 us per tick, 0 bytes copied"
    return [
        record(MODULE, "same-device tick (eager tick)", size, t_tick, "target 50 us", 50e-6,
               goal=goal, met=(t_tick <= 50e-6 and copied == 0), bytes_copied=copied, compile_s=compile_s,
               min_s=min(all_tick), max_s=max(all_tick),
               note=f"returned leaves are the learner's buffers (unsafe_buffer_pointer equal): {same}; "
                    f"min {min(all_tick) * 1e6:.1f} us over {repeats} runs of {calls} ticks ("
                    "counters on the host (NumPy int32) plus the tree check; no dispatch)"),
        record(MODULE, "same-device tick (WeightSync hook)", size, t_hook, "target 50 us", 50e-6,
               goal=goal, met=(t_hook <= 50e-6 and hook_same), bytes_copied=0 if hook_same else _nbytes(learner),
               min_s=min(all_hook), max_s=max(all_hook),
               note=f"returned leaves are the learner's arrays: {hook_same}; counters kept on the host"),
    ]


def _interleaved(fns: dict, rounds: int, calls: int) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument ``fn``, ``rounds`` times, the variants interleaved.

    Interleaving makes drifting machine load hit every variant alike, and a
    new order every round keeps one variant from always running in the
    allocator state another one leaves behind. Each round runs ``calls`` calls
    back to back and blocks once at the end.
    """
    times = {k: [] for k in fns}
    for f in fns.values():  # warm-up (and compile)
        for _ in range(3):
            jax.block_until_ready(f())
    order = list(fns)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            f = fns[k]
            t = time.perf_counter()
            out = None
            for _ in range(calls):
                out = f()
            jax.block_until_ready(out)
            times[k].append((time.perf_counter() - t) / calls)
    return times


# ------------------------------------------------------------------- part 2
def bench_cross_device(quick: bool) -> list[dict]:
    src, dst = jax.devices()[:2]
    mb = 20 if quick else 100
    learner = jax.device_put(_param_tree(mb), src)
    nbytes = _nbytes(learner)
    size = f"{nbytes / 2**20:.0f} MB, {len(jax.tree.leaves(learner))} leaves, {src.id}->{dst.id}"
    n = 9 if quick else 25
    actor = jax.device_put(learner, dst)

    xcfg = sync.config(1, placement=dst)
    box = {"state": sync.init(xcfg), "actor": actor}

    def one_tick():
        box["state"], box["actor"], _ = sync.step(box["state"], learner, box["actor"], xcfg)
        return box["actor"]

    hook = sync.WeightSync(1, placement=dst)  # donates the old actor buffers
    hbox = {"actor": jax.device_put(learner, dst)}

    def one_hook():
        hbox["actor"] = hook(learner, hbox["actor"])
        return hbox["actor"]

    bbox = {}

    def bare():
        bbox["out"] = None  # free the previous copy first, as the syncs do
        bbox["out"] = jax.device_put(learner, dst)
        return bbox["out"]

    def per_leaf():
        return jax.tree.map(lambda x: jax.device_put(x, dst), learner)

    fns = {"bare": bare, "per_leaf": per_leaf, "tick": one_tick, "hook": one_hook}
    times = _interleaved(fns, n, 1)
    med = {k: statistics.median(v) for k, v in times.items()}
    q = {k: statistics.quantiles(v, n=4) for k, v in times.items()}
    assert all(x.devices() == {dst} for x in jax.tree.leaves(box["actor"]))
    gbs = lambda t: nbytes / t / 1e9  # noqa: E731
    out = []
    for name, k in (("cross-device sync (tick, interval 1)", "tick"),
                    ("cross-device sync (WeightSync, donating)", "hook")):
        ratio = med["bare"] / med[k]
        out.append(record(
            MODULE, name, size, med[k], "bare jax.device_put of the tree", med["bare"],
            goal=">= 0.8x the throughput of a bare device_put", met=ratio >= 0.8,
            gbytes_per_s=gbs(med[k]), baseline_gbytes_per_s=gbs(med["bare"]), spread_s=[q[k][0], q[k][2]],
            baseline_spread_s=[q["bare"][0], q["bare"][2]],
            note=f"{gbs(med[k]):.1f} GB/s vs {gbs(med['bare']):.1f} GB/s bare; one device_put per leaf: "
                 f"{med['per_leaf'] * 1e3:.1f} ms",
        ))
    return out


def _run_in_subprocess(quick: bool) -> list[dict]:
    """Run the whole benchmark in a fresh process that has 2 fake CPU devices."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=2"])
    env["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sync.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), _SUB_FLAG, str(path)] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, env=env, cwd=_ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"sync benchmark subprocess failed:\n{proc.stderr[-3000:]}")
        return json.loads(path.read_text())


# ------------------------------------------------------------------- part 3
def bench_fraction_of_training_step(quick: bool) -> list[dict]:
    """Sync cost per collected batch at the default interval, against one reward-training step.

    The learner is a reward net trained with ``training.step`` at the
    ``RewardTrainer`` defaults; the actor is the copy of its params that a
    trajectory generator would read. At interval 1 every batch fires.
    """
    from jaxweight.preference import RewardMLP, RewardTrainer, training

    interval = sync.DEFAULT_INTERVAL
    length, d = (25, 4) if quick else (50, 4)
    trainer = RewardTrainer(RewardMLP(), progress=False)  # imitation defaults: batch 32, AdamW 1e-3
    cfg = trainer.config
    b = cfg.batch_size
    pairs, prefs = _random_pairs(b, length, d)
    state0 = trainer.init(0, jax.tree.map(lambda x: x[:1], pairs).transitions())
    n_params = sum(x.size for x in jax.tree.leaves(state0.params))
    size = f"RewardTrainer defaults (batch {b}, RewardMLP(32,32), {n_params} params), L={length}, D={d}"
    rounds, calls = (9, 10) if quick else (21, 20)

    inner = 10  # training steps per jitted scan: the step as a jitted training loop runs it
    n_ticks = 1000  # ticks per jitted scan: resolves a tick's cost inside a jitted loop

    step = jax.jit(lambda st, pr, pf: training.step(st, pr, pf, cfg)[0])

    @jax.jit
    def step_loop(st, pr, pf):
        return jax.lax.scan(lambda c, _: (training.step(c, pr, pf, cfg)[0], None), st, None, length=inner)[0]

    def tick_loop(mode):
        def body(carry, _):
            ss, lp, ap = carry
            lp = jax.tree.map(lambda x: x * 0.999, lp)  # stands in for the optimiser update
            if mode != "none":
                ss, ap, _ = sync.step(ss, lp, ap, sync.config(interval, copy_on_same_device=(mode == "copy")))
            return (ss, lp, ap), None

        return jax.jit(lambda ss, lp, ap: jax.lax.scan(body, (ss, lp, ap), None, length=n_ticks)[0])

    tick_args = (sync.init(sync.config(interval)), state0.params, jax.device_put(state0.params, may_alias=False))
    tick_loops = {m: tick_loop(m) for m in ("none", "alias", "copy")}
    boxes = {"step": state0, "step_loop": state0}

    def run_step():
        boxes["step"] = step(boxes["step"], pairs, prefs)
        return boxes["step"]

    def run_step_loop():
        boxes["step_loop"] = step_loop(boxes["step_loop"], pairs, prefs)
        return boxes["step_loop"]

    learner = state0.params
    hook_same = sync.WeightSync(interval)
    # a new learner tree on every batch, the actor being the previous one
    learners, hbox = [learner, jax.tree.map(jnp.copy, learner)], [learner, 0]

    def same():
        hbox[1] ^= 1
        hbox[0] = hook_same(learners[hbox[1]], hbox[0])
        return hbox[0]

    fns = {"step": run_step, "step_loop": run_step_loop, "hook_same": same}
    fns.update({f"ticks_{m}": (lambda f=f: f(*tick_args)) for m, f in tick_loops.items()})
    devs = jax.devices()
    if len(devs) >= 2:
        learner = jax.device_put(learner, devs[0])
        hook_cross = sync.WeightSync(interval, placement=devs[1])
        xbox = [sync.place(learner, devs[1])]

        def cross():
            xbox[0] = hook_cross(learner, xbox[0])
            return xbox[0]

        fns["hook_cross"] = cross
        fns["bare_put"] = lambda: jax.device_put(learner, devs[1])
    times = _interleaved(fns, rounds, calls)
    times["step_loop"] = [t / inner for t in times["step_loop"]]
    med = {k: statistics.median(v) for k, v in times.items()}
    goal = "<= 1% of a training step"
    rows = []

    def row(name, cost, base_key, what, note):
        base = med[base_key]
        frac = cost / base
        per_1pct = max(1, math.ceil(frac / 0.01))
        rows.append(record(
            MODULE, name, size, cost, what, base, goal=goal, met=frac <= 0.01, fraction=frac,
            interval=interval, interval_for_1pct=per_1pct,
            note=f"{note}; {100 * frac:.2f}% of a {base * 1e3:.2f} ms step at interval {interval}"
                 + ("" if per_1pct == 1 else f" (<= 1% from interval {per_1pct} on)")))

    scan_what = f"one reward-training step inside a jitted lax.scan of {inner} steps"
    for m, label, what_tick in (
            ("alias", "same device, tick inside a jitted training loop", "actor = learner params, no copy"),
            ("copy", "copy_on_same_device, tick inside a jitted training loop", "a copy of the params every tick")):
        paired = [(t - s) / n_ticks for t, s in zip(times[f"ticks_{m}"], times["ticks_none"])]
        cost = statistics.median(paired)
        q = statistics.quantiles(paired, n=4)
        row(f"{label} (interval {interval})", max(cost, 0.0), "step_loop", scan_what,
            f"{what_tick}: {cost * 1e9:.0f} ns per tick (quartiles {q[0] * 1e9:.0f} .. {q[2] * 1e9:.0f} ns; "
            f"jitted scans of {n_ticks} learner updates with and without the tick)")
    host_what = "one reward-training step (a jitted training.step call per batch)"
    row(f"same device, WeightSync host hook (interval {interval})", med["hook_same"], "step", host_what,
        f"host hook {med['hook_same'] * 1e6:.1f} us per batch, no copy")
    if "hook_cross" in med:
        row(f"device 0 -> 1, WeightSync host hook (interval {interval})", med["hook_cross"], "step", host_what,
            f"host hook copying the params on every batch: {med['hook_cross'] * 1e6:.1f} us; a bare "
            f"jax.device_put of the same params takes {med['bare_put'] * 1e6:.1f} us (fake CPU devices: "
            f"a fixed cost per transfer)")
    return rows


def _random_pairs(p: int, length: int, d: int):
    from jaxweight.preference import FragmentPairs

    rng = np.random.RandomState(0)
    pairs = FragmentPairs(
        obs=jnp.asarray(rng.randn(p, 2, length + 1, d), jnp.float32),
        acts=jnp.asarray(rng.randn(p, 2, length, 1), jnp.float32),
        rews=jnp.asarray(rng.randn(p, 2, length), jnp.float32),
        terminal=jnp.zeros((p, 2), bool), valid=jnp.ones((p,), bool))
    return pairs, jnp.asarray(rng.rand(p) < 0.5, jnp.float32)


def run(quick: bool = False) -> list[dict]:
    """All records. Needs 2 devices; with fewer (``python -m jaxweight bench`` on a
    CPU machine) it runs in a subprocess that has 2 fake CPU devices."""
    if len(jax.devices()) < 2:
        return _run_in_subprocess(quick)
    rows = bench_same_device(quick)
    rows += bench_cross_device(quick)
    rows += bench_fraction_of_training_step(quick)
    return rows


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == _SUB_FLAG:
        Path(sys.argv[2]).write_text(json.dumps(run(quick="--quick" in sys.argv)))
    else:
        main(run)
