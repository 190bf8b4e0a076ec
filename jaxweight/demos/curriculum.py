"""Demo: which curriculum teaches a synthetic learner fastest?

``python -m jaxweight demo curriculum [--quick] [--out DIR] [--seeds S] [--no-progress]``

A pool of 10^5 items has latent difficulties ``d_i ~ U(0, 1)``. The learner
has one competence ``theta``; it solves item i with probability
``sigmoid((theta - d_i) / tau)`` and learns from an item only near its level
(zone of proximal development): a batch raises ``theta`` by
``eta * mean_j exp(-((d_j - theta - delta) / sigma)^2 / 2)``. Items far too
easy or far too hard teach nothing, so the sampling strategy decides the
learning speed. Each step, the scheduler draws a batch of items, the learner
attempts each one ``G`` times, the group success rate updates the
scheduler (``update_groups``, atropos ``update_batch``) and ``theta`` moves.

An item is *mastered* when it is solved with probability >= 0.9. The demo
runs ``uniform``, ``easy_first``, ``competence_based``, ``competence_sqrt``
and ``prioritized`` (frontier priority: rewards near 0.5) as whole
``lax.scan`` training loops vmapped over seeds, prints a table and saves the
learning curves (items mastered vs samples) as a PNG plus the numbers as JSON.

The bin strategies see unseen items in the middle bin (atropos semantics);
``prioritized`` replays tracked items only, so a fraction ``--fresh`` of its
batch are fresh uniform draws (PLR's "new level" branch).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .. import curriculum as cur
from .._util import atomic_write_json

STRATEGY_ORDER = ("uniform", "easy_first", "competence_based", "competence_sqrt", "prioritized")

# Learner: success sigmoid width, learning kernel offset / width, rate, start.
TAU, DELTA, SIGMA, ETA, THETA0 = 0.05, 0.03, 0.05, 0.012, 0.05
MASTERY = 0.9


def simulate(key, strategy: str, difficulty, *, steps: int, batch: int, group: int,
             n_bins: int, fresh: float, temperature: float, eta: float = ETA):
    """One training run: per-step items mastered (i32[steps]) and competence (f32[steps])."""
    n = difficulty.shape[0]
    cfg = cur.config(strategy, n_bins, capacity=n, temperature=temperature,
                     competence_threshold=0.5, competence_c0=0.1)
    margin = TAU * np.log(MASTERY / (1 - MASTERY))

    def body(carry, t):
        state, theta, key = carry
        key, k_items, k_fresh, k_mix, k_try = jax.random.split(key, 5)
        ids = cur.sample_items(k_items, state, cfg, t, steps, batch)
        if strategy == "prioritized":
            new = jax.random.randint(k_fresh, (batch,), 0, n, dtype=jnp.int32)
            ids = jnp.where(jax.random.bernoulli(k_mix, fresh, (batch,)), new, ids)
        d = difficulty[ids]
        p = jax.nn.sigmoid((theta - d) / TAU)
        rewards = jax.random.bernoulli(k_try, p[:, None], (batch, group)).astype(jnp.float32)
        state = cur.update_groups(state, ids, rewards, cfg)
        gain = jnp.mean(jnp.exp(-0.5 * jnp.square((d - theta - DELTA) / SIGMA)))
        theta = theta + eta * gain
        mastered = jnp.sum(difficulty <= theta - margin, dtype=jnp.int32)
        return (state, theta, key), (mastered, theta)

    init = (cur.init(cfg), jnp.float32(THETA0), key)
    _, (mastered, theta) = jax.lax.scan(body, init, jnp.arange(steps, dtype=jnp.float32))
    return mastered, theta


def run(*, n_items: int, steps: int, batch: int, group: int, seeds: int, n_bins: int = 10,
        fresh: float = 0.25, temperature: float = 0.3, progress: bool = True, seed: int = 0,
        strategies: tuple[str, ...] = STRATEGY_ORDER) -> dict:
    """All strategies, vmapped over seeds. Returns the curves and summary numbers."""
    from tqdm.auto import tqdm

    key = jax.random.key(seed)
    k_pool, k_runs = jax.random.split(key)
    difficulty = jax.random.uniform(k_pool, (n_items,), jnp.float32)
    keys = jax.random.split(k_runs, seeds)
    samples = (np.arange(steps) + 1) * batch
    results = {"n_items": n_items, "steps": steps, "batch": batch, "group": group, "seeds": seeds,
               "n_bins": n_bins, "samples": samples.tolist(), "strategies": {}}
    for strategy in tqdm(strategies, desc="strategies", disable=not progress):
        t0 = time.perf_counter()
        fn = jax.jit(jax.vmap(lambda k, s=strategy: simulate(
            k, s, difficulty, steps=steps, batch=batch, group=group, n_bins=n_bins, fresh=fresh,
            temperature=temperature)))
        mastered, theta = jax.device_get(fn(keys))
        frac = mastered / n_items  # [seeds, steps]
        half = [int(samples[np.argmax(f >= 0.5)]) if np.any(f >= 0.5) else None for f in frac]
        results["strategies"][strategy] = {
            "mastered_mean": frac.mean(0).tolist(),
            "mastered_std": frac.std(0).tolist(),
            "final_mean": float(frac[:, -1].mean()),
            "final_std": float(frac[:, -1].std()),
            "auc": float(frac.mean()),
            "samples_to_half": half,
            "seconds": time.perf_counter() - t0,
        }
    return results


def table(results: dict) -> str:
    rows = [f"{'strategy':<18} {'mastered at end':>16} {'mean over run':>14} {'samples to 50%':>15}"]
    for name, r in sorted(results["strategies"].items(), key=lambda kv: -kv[1]["auc"]):
        half = [h for h in r["samples_to_half"] if h is not None]
        h = f"{np.mean(half):,.0f}" if len(half) == len(r["samples_to_half"]) else "not reached"
        rows.append(f"{name:<18} {100 * r['final_mean']:>8.1f}% ± {100 * r['final_std']:>4.1f} "
                    f"{100 * r['auc']:>13.1f}% {h:>15}")
    return "\n".join(rows)


def plot(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.asarray(results["samples"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in results["strategies"]:
        r = results["strategies"][name]
        m, sd = np.asarray(r["mastered_mean"]), np.asarray(r["mastered_std"])
        ax.plot(x, 100 * m, label=name)
        ax.fill_between(x, 100 * (m - sd), 100 * (m + sd), alpha=0.2)
    ax.set_xlabel("samples (items attempted)")
    ax.set_ylabel("items mastered (%)")
    ax.set_title(f"Synthetic learner, {results['n_items']:,} items, {results['seeds']} seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxweight demo curriculum", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small pool and few steps (< 30 s)")
    p.add_argument("--out", default="curriculum_demo", help="folder for the plot and the JSON results")
    p.add_argument("--seeds", type=int, default=None, help="runs per strategy (vmapped)")
    p.add_argument("--strategies", default=",".join(STRATEGY_ORDER),
                   help="comma-separated subset of " + ", ".join(STRATEGY_ORDER))
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    strategies = tuple(x.strip() for x in a.strategies.split(",") if x.strip())
    bad = [x for x in strategies if x not in STRATEGY_ORDER]
    if bad or not strategies:
        p.error(f"unknown strategies {bad}; choose from {', '.join(STRATEGY_ORDER)}")
    if a.quick:
        sizes = dict(n_items=10_000, steps=150, batch=64, group=4, seeds=a.seeds or 2)
    else:
        sizes = dict(n_items=100_000, steps=200, batch=256, group=4, seeds=a.seeds or 4)
    t0 = time.perf_counter()
    res = run(**sizes, progress=not a.no_progress, strategies=strategies)
    out = Path(a.out)
    png = plot(res, out / "curriculum_learning_curves.png")
    js = atomic_write_json(out / "curriculum_results.json", res)
    print(f"Curriculum demo: {res['n_items']:,} items, {res['steps']} steps x {res['batch']} items "
          f"x {res['group']} attempts, {res['seeds']} seeds ({time.perf_counter() - t0:.1f} s)")
    print(table(res))
    print(f"plot: {os.fspath(png)}\nresults: {os.fspath(js)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
