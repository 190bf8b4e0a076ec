"""Demo: which curriculum teaches a synthetic learner fastest?

``python -m jaxweight demo curriculum [--quick] [--out DIR] [--seeds S] [--strategies A,B]
[--seed N] [--strict] [--tensorboard DIR] [--no-progress]``

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
learning curves (items mastered vs samples) as a PNG (with matplotlib), the
numbers as JSON and one ``metrics.jsonl`` line per step, under ``--out``
(default ``jaxweight-out/curriculum/``). Compile time is reported apart from
run time; ``--strict`` exits 1 if no curriculum strategy beats uniform.

The bin strategies see unseen items in the middle bin (atropos semantics);
``prioritized`` replays tracked items only, so a fraction ``--fresh`` of its
batch are fresh uniform draws (PLR's "new level" branch).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxweight import curriculum as cur
from jaxweight.demos import _args
from jaxweight.demos import _common as C
from jaxweight.demos._args import STRATEGY_ORDER


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
        ids = cur.sample(state, k_items, cfg, step=t, total_steps=steps, num=batch)
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
        strategies: tuple[str, ...] = STRATEGY_ORDER, timer: C.Timer | None = None) -> dict:
    """All strategies, vmapped over seeds. Returns the curves and summary numbers.

    ``timer`` (a :class:`jaxweight.demos._common.Timer`) gets the compile time
    (ahead of time, per strategy) apart from the run time.
    """
    from tqdm.auto import tqdm

    timer = timer if timer is not None else C.Timer()
    key = jax.random.key(seed)
    k_pool, k_runs = jax.random.split(key)
    difficulty = jax.random.uniform(k_pool, (n_items,), jnp.float32)
    keys = jax.random.split(k_runs, seeds)
    samples = (np.arange(steps) + 1) * batch
    results = {"n_items": n_items, "steps": steps, "batch": batch, "group": group, "seeds": seeds,
               "n_bins": n_bins, "seed": seed, "samples": samples.tolist(), "strategies": {}}
    for strategy in tqdm(strategies, desc="strategies", disable=not progress):
        fn = jax.jit(jax.vmap(lambda k, s=strategy: simulate(
            k, s, difficulty, steps=steps, batch=batch, group=group, n_bins=n_bins, fresh=fresh,
            temperature=temperature)))
        before = dict(timer.seconds)
        compiled = timer.compile(fn, keys)
        with timer.section("run"):
            mastered, theta = jax.device_get(compiled(keys))
        frac = mastered / n_items  # [seeds, steps]
        half = [int(samples[np.argmax(f >= 0.5)]) if np.any(f >= 0.5) else None for f in frac]
        results["strategies"][strategy] = {
            "mastered_mean": frac.mean(0).tolist(),
            "mastered_std": frac.std(0).tolist(),
            "final_mean": float(frac[:, -1].mean()),
            "final_std": float(frac[:, -1].std()),
            "auc": float(frac.mean()),
            "samples_to_half": half,
            "compile_s": timer["compile"] - before.get("compile", 0.0),
            "run_s": timer["run"] - before.get("run", 0.0),
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


def _figure(plt, results: dict):
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
    return fig


def plot(results: dict, path: Path) -> Path | None:
    """The learning curves as a PNG (None, with a note, without matplotlib)."""
    return C.save_plot(lambda plt: _figure(plt, results), path)


def write_metrics(args: argparse.Namespace, results: dict) -> None:
    """One ``metrics.jsonl`` line per training step: ``curriculum/<strategy>/mastered`` (mean over seeds)."""
    with C.metrics_writer(args) as w:
        for t, n in enumerate(results["samples"]):
            row = {f"curriculum/{name}/mastered": r["mastered_mean"][t]
                   for name, r in results["strategies"].items()}
            w.write(t, row | {"curriculum/samples": float(n)})


def goals(results: dict) -> list[tuple[str, bool]]:
    """The demo's claim: some curriculum strategy beats uniform sampling (mean mastery over the run)."""
    st = results["strategies"]
    others = [k for k in st if k != "uniform"]
    if "uniform" not in st or not others:
        return []
    best = max(others, key=lambda k: st[k]["auc"])
    return [(f"a curriculum strategy ({best}) masters more items than uniform over the run",
             st[best]["auc"] > st["uniform"]["auc"])]


def main(argv: list[str] | None = None) -> int:
    a = _args.parse("curriculum", argv)  # bad values: one line, exit 2
    strategies = tuple(dict.fromkeys(a.strategies))
    if a.quick:
        sizes = dict(n_items=10_000, steps=150, batch=64, group=4, seeds=a.seeds or 2)
    else:
        sizes = dict(n_items=100_000, steps=200, batch=256, group=4, seeds=a.seeds or 4)
    timer = C.Timer()
    res = run(**sizes, progress=not a.no_progress, strategies=strategies, seed=a.seed, timer=timer)
    res["time"] = timer.as_dict()
    out = C.out_dir(a)
    js = C.write_results(a, res, "curriculum_results.json")  # before the plot: never lost to a plot error
    write_metrics(a, res)
    png = plot(res, out / "curriculum_learning_curves.png")
    print(f"Curriculum demo: {res['n_items']:,} items, {res['steps']} steps x {res['batch']} items "
          f"x {res['group']} attempts, {res['seeds']} seeds ({timer.summary()})")
    print(table(res))
    print(f"results: {os.fspath(js)}\nmetrics: {os.fspath(out / 'metrics.jsonl')}"
          + (f"\nplot: {os.fspath(png)}" if png is not None else ""))
    return C.finish(goals(res), a.strict)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
