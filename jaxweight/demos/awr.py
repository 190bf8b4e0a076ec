"""Demo ``awr``: learn loss-component weights from random-weighting rollouts with AWR.

The problem is a small stand-in for crystallographic refinement: recover a
smooth 1-D signal ``x*`` (64 samples) from 32 noisy random projections
``y = A x* + noise`` (fewer measurements than unknowns, so restraints are
needed), starting from a noisy reference model ``x_ref``. The refinement runs
30 gradient steps on a weighted sum of five loss components::

    data       1/2 |A x - y|^2                 (the "X-ray" term)
    smooth     1/2 |D1 x|^2                    (first differences, a bond-like restraint)
    curvature  1/2 |D2 x|^2                    (second differences, an angle-like restraint)
    ridge      1/2 |x|^2                       (magnitude)
    reference  1/2 |x - x_ref|^2               (stay near the starting model)

with step size ``1 / sum_k w_k L_k`` (``L_k`` the Lipschitz constant of each
term), so any weights give a stable descent and only their ratios matter.
16 further projections are held out: the relative residual on them,
``R_free = |A_free x - y_free| / |y_free|``, plays the role of crystallography's
R-free. The noise level, the quality of the reference and the smoothness of
the signal vary per instance, so the best weights do too.

Steps:
  1. sample random log-weight schedules for >= 1024 rollouts with
     :func:`jaxweight.random_weighting.sample_schedule` and run them all in one
     jitted, vmapped call;
  2. advantage of a rollout = its ``-log R_free`` standardised within its
     instance (all rollouts of an instance start from the same problem);
  3. fit :class:`jaxweight.awr.WeightPolicy` by AWR on
     (instance features + step fraction, log-weights, advantage);
  4. on fresh instances never used for fitting, compare the held-out error
     reached with the policy's weights, the default weights (all log-weights
     0) and random weights; repeated for several seeds.

Features are all computable without the truth: the (known) noise level, the
reference's residual on the working data, its roughness, the data scale and
the step fraction.

Run ``python -m jaxweight demo awr [--quick] [--out DIR] [--seeds N] [--seed S] [--strict]
[--tensorboard DIR]``. Writes ``awr_demo.json`` (results, first), ``metrics.jsonl``
(per-epoch AWR loss and per-seed results), ``awr_demo.txt`` and ``awr_demo.png``
(with matplotlib) under ``--out`` (default ``jaxweight-out/awr/``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxweight import awr, maxent
from jaxweight import random_weighting as rw
from jaxweight.checkpoint import save_json
from jaxweight.demos import _args
from jaxweight.demos import _common as C

COMPONENTS = ("data", "smooth", "curvature", "ridge", "reference")
FEATURES = ("log noise", "log ref. residual", "log ref. roughness", "log data scale", "step fraction")
DIM, N_WORK, N_FREE, STEPS = 64, 32, 16, 30


@struct.dataclass
class Instances:
    """A batch of problems (leading axis n)."""

    x_true: jax.Array      # f32[n, D]
    A: jax.Array           # f32[n, M, D] working projections
    y: jax.Array           # f32[n, M]
    A_free: jax.Array      # f32[n, Mf, D] held-out projections
    y_free: jax.Array      # f32[n, Mf]
    x_ref: jax.Array       # f32[n, D] starting / reference model
    sigma: jax.Array       # f32[n] noise level (known to the user)
    lipschitz: jax.Array   # f32[n, K] per-term Lipschitz constants


def _one_instance(key: jax.Array) -> Instances:
    ks = jax.random.split(key, 8)
    grid = jnp.arange(DIM, dtype=jnp.float32)
    centres = jax.random.uniform(ks[0], (4,), minval=0.0, maxval=DIM)
    width = jnp.exp(jax.random.uniform(ks[1], (), minval=np.log(2.0), maxval=np.log(10.0)))
    amp = jax.random.normal(ks[2], (4,))
    x = jnp.sum(amp[:, None] * jnp.exp(-0.5 * ((grid[None] - centres[:, None]) / width) ** 2), axis=0)
    A = jax.random.normal(ks[3], (N_WORK + N_FREE, DIM)) / np.sqrt(DIM)
    sigma = jnp.exp(jax.random.uniform(ks[4], (), minval=np.log(0.02), maxval=np.log(0.5)))
    y = A @ x + sigma * jax.random.normal(ks[5], (N_WORK + N_FREE,))
    tau = jnp.exp(jax.random.uniform(ks[6], (), minval=np.log(0.05), maxval=np.log(1.0)))
    e = jnp.convolve(jax.random.normal(ks[7], (DIM,)), jnp.exp(-0.5 * (jnp.arange(-6, 7) / 2.0) ** 2), mode="same")
    x_ref = x + tau * e / jnp.sqrt(jnp.mean(e**2))
    Aw = A[:N_WORK]
    # |A|_2^2 by power iteration (an SVD per instance compiles slowly); |D1|^2 <= 4, |D2|^2 <= 16
    v = jax.lax.fori_loop(0, 30, lambda _, v: (u := Aw.T @ (Aw @ v)) / jnp.linalg.norm(u), jnp.ones((DIM,)) / 8.0)
    L = jnp.stack([1.01 * jnp.linalg.norm(Aw @ v) ** 2, 4.0, 16.0, 1.0, 1.0]).astype(jnp.float32)
    return Instances(x, Aw, y[:N_WORK], A[N_WORK:], y[N_WORK:], x_ref, sigma, L)


@functools.partial(jax.jit, static_argnames="n")
def _make_instances(key: jax.Array, n: int) -> Instances:
    return jax.vmap(_one_instance)(jax.random.split(key, n))


def instances(key: Any, n: int) -> Instances:
    """``n`` random problem instances from ``key`` (a key or an int seed)."""
    return _make_instances(jax.random.key(key) if isinstance(key, int) else key, n=n)


def _d1(x):
    return x[1:] - x[:-1]


def _d2(x):
    return x[2:] - 2 * x[1:-1] + x[:-2]


def _terms(x, p: Instances):
    r = p.A @ x - p.y
    return jnp.stack([0.5 * r @ r, 0.5 * jnp.sum(_d1(x) ** 2), 0.5 * jnp.sum(_d2(x) ** 2),
                      0.5 * x @ x, 0.5 * jnp.sum((x - p.x_ref) ** 2)])


def refine(p: Instances, log_weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Run one refinement (single instance) with per-step log-weights f32[S, K].

    Returns ``(R_free, relative error to the truth)``.
    """
    def body(x, lw):
        w = jnp.exp(lw)
        g = jax.grad(lambda x: jnp.dot(w, _terms(x, p)))(x)
        return x - g / jnp.dot(w, p.lipschitz), None

    x, _ = jax.lax.scan(body, p.x_ref, log_weights)
    r_free = jnp.linalg.norm(p.A_free @ x - p.y_free) / jnp.linalg.norm(p.y_free)
    err = jnp.linalg.norm(x - p.x_true) / jnp.linalg.norm(p.x_true)
    return r_free, err


@jax.jit
def refine_batch(p: Instances, log_weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Refinements of many instances, several schedules each: lw f32[n, G, S, K] -> (f32[n, G], f32[n, G])."""
    return jax.vmap(lambda q, lw: jax.vmap(lambda l: refine(q, l))(lw))(p, log_weights)


@jax.jit
def features(p: Instances) -> jax.Array:
    """Policy inputs f32[n, S, F] (see FEATURES); computable without the truth."""
    def one(q):
        r0 = jnp.linalg.norm(q.A @ q.x_ref - q.y) / np.sqrt(N_WORK)
        rough = jnp.linalg.norm(_d2(q.x_ref)) / jnp.linalg.norm(q.x_ref)
        scale = jnp.linalg.norm(q.y) / np.sqrt(N_WORK)
        base = jnp.log(jnp.stack([q.sigma, r0, rough, scale]))
        t = (jnp.arange(STEPS, dtype=jnp.float32) + 0.5) / STEPS
        return jnp.concatenate([jnp.broadcast_to(base, (STEPS, 4)), t[:, None]], axis=1)

    return jax.vmap(one)(p)


@functools.partial(jax.jit, static_argnames="per_instance")
def collect(key: jax.Array, cfg: rw.RandomWeightingConfig, p: Instances, per_instance: int):
    """Random-weight rollouts: ``per_instance`` schedules per instance, all in one jitted call.

    Returns ``(log_weights f32[n, G, S, K], r_free f32[n, G], err f32[n, G])``.
    """
    n = p.sigma.shape[0]
    lw = rw.sample_schedule(key, cfg, n * per_instance, STEPS).reshape(n, per_instance, STEPS, len(COMPONENTS))
    r_free, err = refine_batch(p, lw)
    return lw, r_free, err


@functools.partial(jax.jit, static_argnames="per_instance")
def evaluate(key: jax.Array, cfg: rw.RandomWeightingConfig, p: Instances, policy_log_weights: jax.Array,
             per_instance: int):
    """Test rollouts in one call: default weights, the policy's, and ``per_instance`` random schedules.

    Returns ``(r_free, err)``, each f32[m, 2 + per_instance]: column 0 default, 1 policy, then random.
    """
    m = p.sigma.shape[0]
    rand = rw.sample_schedule(key, cfg, m * per_instance, STEPS).reshape(m, per_instance, STEPS, len(COMPONENTS))
    lw = jnp.concatenate([jnp.zeros_like(rand[:, :1]), policy_log_weights[:, None], rand], axis=1)
    return refine_batch(p, lw)


def group_advantages(r_free: jax.Array) -> jax.Array:
    """Reward ``-log R_free`` standardised within each instance's group: f32[n, G].

    The library's GRPO group advantage (:func:`jaxweight.maxent.group_advantages`)
    with the population std (``ddof=0``) and ``eps=1e-6``.
    """
    return maxent.group_advantages(-jnp.log(r_free), eps=1e-6, ddof=0)


SIZES = {
    # instances for fitting, rollouts per instance, fresh test instances, random rollouts per test instance, epochs
    "full": dict(train=256, group=16, test=512, test_group=16, epochs=25, seeds=3),
    "quick": dict(train=64, group=16, test=256, test_group=8, epochs=12, seeds=1),
}


def _progress_callback(total: int, desc: str, writer=None, seed: int = 0):
    """An AWR ``callback(epoch, metrics)``: a tqdm bar (demos may draw one) and/or metrics lines."""
    bar = None
    if total > 0 and desc:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, leave=False)
    if bar is None and writer is None:
        return None

    def callback(epoch: int, m: dict) -> None:
        if bar is not None:
            bar.set_postfix(loss=f"{m['loss']:.4f}")
            bar.update(1)
            if epoch + 1 >= total:
                bar.close()
        if writer is not None:
            writer.write(epoch, {f"awr/seed{seed}/loss": m["loss"]})

    return callback


def run_seed(seed: int, sizes: dict, cfg: rw.RandomWeightingConfig, *, temperature: float = 0.5,
             progress: bool = True, log=print, writer=None) -> dict:
    """Collect, fit and evaluate once; returns per-instance arrays (NumPy) and the fitted params."""
    k_train, k_roll, k_fit, k_rand = jax.random.split(jax.random.key(seed), 4)
    n, G = sizes["train"], sizes["group"]
    t0 = time.perf_counter()
    both = instances(k_train, n + sizes["test"])
    train = jax.tree.map(lambda x: x[:n], both)
    test = jax.tree.map(lambda x: x[n:], both)
    lw, r_free, _ = collect(k_roll, cfg, train, per_instance=G)
    jax.block_until_ready(r_free)
    log(f"  [seed {seed}] collected {n * G} random-weight rollouts ({n} instances x {G}, {STEPS} steps, "
        f"{len(COMPONENTS)} components) in {time.perf_counter() - t0:.1f} s")

    adv = group_advantages(r_free)                                           # [n, G]
    F = features(train)                                                      # [n, S, F]
    nf = F.shape[-1]
    rows_x = jnp.broadcast_to(F[:, None], (n, G, STEPS, nf)).reshape(-1, nf)
    rows_a = lw.reshape(-1, len(COMPONENTS))
    rows_adv = jnp.broadcast_to(adv[:, :, None], (n, G, STEPS)).reshape(-1)
    t0 = time.perf_counter()
    fit_cfg = awr.config(len(COMPONENTS), temperature=temperature, learning_rate=3e-3, mean_bounds=(-3.0, 3.0))
    params, metrics = awr.fit_weight_policy(
        k_fit, rows_x, rows_a, rows_adv, fit_cfg, num_epochs=sizes["epochs"], batch_size=512,
        callback=_progress_callback(sizes["epochs"], f"AWR fit (seed {seed})" if progress else "", writer, seed))
    loss = np.asarray(metrics["loss"])
    log(f"  [seed {seed}] AWR fit on {rows_x.shape[0]} rows, {sizes['epochs']} epochs in "
        f"{time.perf_counter() - t0:.1f} s (loss {loss[0]:.3f} -> {loss[-1]:.3f}, "
        f"weight ESS {float(metrics['weight_ess']):.2f})")

    t0 = time.perf_counter()
    Ft = features(test)
    lw_pol = awr.predict_log_weights(params, Ft)                             # [m, S, K]
    rf, err = (np.asarray(a) for a in evaluate(k_rand, cfg, test, lw_pol, per_instance=sizes["test_group"]))
    out = {
        "seed": seed,
        "r_free": {"default": rf[:, 0], "policy": rf[:, 1], "random": rf[:, 2:].mean(1),
                   "best_random": rf[:, 2:].min(1)},
        "error": {"default": err[:, 0], "policy": err[:, 1], "random": err[:, 2:].mean(1)},
        "policy_log_weights": np.asarray(lw_pol),
        "test_features": np.asarray(Ft),
        "loss": loss,
        "params": params,
    }
    log(f"  [seed {seed}] evaluated on {sizes['test']} fresh instances in {time.perf_counter() - t0:.1f} s")
    return out


def _mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(np.mean(x)), float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


def summarize(results: list[dict]) -> list[dict]:
    """One row per (seed, method): mean R_free / error with standard errors and the win rate vs default."""
    rows = []
    for res in results:
        d = res["r_free"]["default"]
        for m in ("default", "random", "policy", "best_random"):
            rf = res["r_free"][m]
            mr, sr = _mean_se(rf)
            row = {"seed": res["seed"], "method": m, "r_free_mean": mr, "r_free_se": sr,
                   "win_rate_vs_default": float(np.mean(rf < d)) if m != "default" else None}
            if m in res["error"]:
                row["error_mean"], row["error_se"] = _mean_se(res["error"][m])
            rows.append(row)
    return rows


LABELS = {"default": "default weights (log w = 0)", "random": "random weights (mean rollout)",
          "policy": "AWR policy", "best_random": "best of random (oracle, uses R_free)"}


def format_table(rows: list[dict]) -> str:
    head = f"{'seed':>4}  {'weights':38s} {'R_free (held out)':>20s} {'error vs truth':>18s} {'beats default':>14s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        err = f"{r['error_mean']:.4f} +- {r['error_se']:.4f}" if "error_mean" in r else "-"
        win = "-" if r["win_rate_vs_default"] is None else f"{100 * r['win_rate_vs_default']:.0f}%"
        lines.append(f"{r['seed']:>4}  {LABELS[r['method']]:38s} {r['r_free_mean']:.4f} +- {r['r_free_se']:.4f}"
                     f"   {err:>18s} {win:>14s}")
    return "\n".join(lines)


def policy_wins(rows: list[dict]) -> bool:
    """True if in every seed the policy's mean R_free is below that of the default and the random weights."""
    ok = True
    for p in (r for r in rows if r["method"] == "policy"):
        others = [q["r_free_mean"] for q in rows if q["seed"] == p["seed"] and q["method"] in ("default", "random")]
        ok &= p["r_free_mean"] < min(others)
    return ok


def plot(results: list[dict], path: Path, log=print) -> Path | None:
    """Four panels: mean R_free per method and seed, policy vs default per instance,
    the learned log-weight schedule, AWR loss. None (and one note) without matplotlib."""
    return C.save_plot(lambda plt: _figure(plt, results), path, log=log)


def _figure(plt, results: list[dict]):
    fig, ax = plt.subplots(2, 2, figsize=(12, 9))
    methods = ("default", "random", "policy", "best_random")
    colors = {"default": "tab:gray", "random": "tab:orange", "policy": "tab:blue", "best_random": "tab:green"}
    width = 0.8 / len(results)
    for i, res in enumerate(results):
        for j, m in enumerate(methods):
            mu, se = _mean_se(res["r_free"][m])
            ax[0, 0].bar(j + (i - (len(results) - 1) / 2) * width, mu, width * 0.9, yerr=2 * se, color=colors[m],
                         alpha=0.5 + 0.5 * (i + 1) / len(results), capsize=2)
    ax[0, 0].set_xticks(range(len(methods)), [LABELS[m].split(" (")[0] for m in methods], rotation=10)
    ax[0, 0].set_ylabel("mean held-out R_free (lower is better)")
    ax[0, 0].set_title(f"fresh test instances, {len(results)} seed(s), bars = +-2 s.e.")

    res = results[0]
    d, p = res["r_free"]["default"], res["r_free"]["policy"]
    ax[0, 1].scatter(d, p, s=6, alpha=0.6)
    lim = [min(d.min(), p.min()) * 0.9, max(d.max(), p.max()) * 1.1]
    ax[0, 1].plot(lim, lim, "k--", lw=1)
    ax[0, 1].set_xscale("log")
    ax[0, 1].set_yscale("log")
    ax[0, 1].set_xlabel("R_free with default weights")
    ax[0, 1].set_ylabel("R_free with AWR policy weights")
    ax[0, 1].set_title(f"seed {res['seed']}: policy better on {100 * np.mean(p < d):.0f}% of instances")

    lw = res["policy_log_weights"]                           # [m, S, K]
    steps = np.arange(1, STEPS + 1)
    for k, c in enumerate(COMPONENTS):
        q10, q50, q90 = np.percentile(lw[:, :, k], [10, 50, 90], axis=0)
        ax[1, 0].plot(steps, q50, label=c, color=f"C{k}")
        ax[1, 0].fill_between(steps, q10, q90, color=f"C{k}", alpha=0.15)
    ax[1, 0].axhline(0.0, color="k", lw=0.8, ls=":")
    ax[1, 0].set_xlabel("refinement step")
    ax[1, 0].set_ylabel("predicted log-weight (median, 10-90% over instances)")
    ax[1, 0].legend(fontsize=8, ncol=2)
    ax[1, 0].set_title("learned schedule; the bands show per-instance adaptation")

    for res in results:
        ax[1, 1].plot(res["loss"], label=f"seed {res['seed']}")
    ax[1, 1].set_xlabel("epoch")
    ax[1, 1].set_ylabel("AWR loss (weighted NLL)")
    ax[1, 1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def run(quick: bool = False, seeds: int | None = None, out: str | os.PathLike | None = None,
        progress: bool = True, log=print, *, seed: int = 0, tensorboard: str | None = None) -> dict:
    """The whole demo; returns ``{"rows", "results", "paths"}`` (used by the tests and the notebook).

    Seeds ``seed, seed + 1, ...``. With ``out``: ``awr_demo.json`` first, then
    ``metrics.jsonl`` (+ TensorBoard files with ``tensorboard``), the table and the plot.
    """
    sizes = dict(SIZES["quick" if quick else "full"])
    if seeds is not None:
        sizes["seeds"] = seeds
    # wide exploration: the base spreads weights over ~e^{+-1.5}, steps add a schedule
    cfg = rw.config(COMPONENTS, trajectory_sigmas=1.5, step_sigmas=0.3)
    log(f"[awr demo] {sizes['seeds']} seed(s); per seed {sizes['train']} x {sizes['group']} = "
        f"{sizes['train'] * sizes['group']} training rollouts, {sizes['test']} fresh test instances")
    t_all = time.perf_counter()
    args = argparse.Namespace(out=out, tensorboard=tensorboard)
    writer = C.metrics_writer(args) if out is not None else contextlib.nullcontext()
    with writer as w:
        results = [run_seed(s, sizes, cfg, progress=progress, log=log, writer=w)
                   for s in range(seed, seed + sizes["seeds"])]
        rows = summarize(results)
        if w is not None:
            for r in rows:
                w.write(r["seed"], {f"awr/{r['method']}/{k}": v for k, v in r.items()
                                    if k not in ("seed", "method") and v is not None})
    log("")
    log(format_table(rows))
    total_s = time.perf_counter() - t_all
    log(f"total {total_s:.1f} s")
    paths = {}
    if out is not None:
        out = Path(out)
        paths["json"] = str(save_json(out / "awr_demo.json", {"sizes": sizes, "rows": rows, "total_s": total_s,
                                                              **C.provenance()}))
        paths["table"] = str(_write_text(out / "awr_demo.txt", format_table(rows) + "\n"))
        paths["metrics"] = str(out / "metrics.jsonl")
        png = plot(results, out / "awr_demo.png", log=log)
        if png is not None:
            paths["plot"] = str(png)
    return {"rows": rows, "results": results, "paths": paths}


def _write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    a = _args.parse("awr", argv)  # bad values: one line, exit 2
    res = run(quick=a.quick, seeds=a.seeds, out=a.out, progress=not a.no_progress, seed=a.seed,
              tensorboard=a.tensorboard)
    for k, v in res["paths"].items():
        print(f"wrote {k}: {v}")
    ok = policy_wins(res["rows"])
    return C.finish([("AWR policy beats default and random weights on held-out R_free in every seed", ok)],
                    a.strict)


if __name__ == "__main__":
    sys.exit(main())
