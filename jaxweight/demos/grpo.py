"""GRPO advantages vs MaxEnt weights on a toy answer-selection task.

``python -m jaxweight demo grpo [--quick] [--out DIR] [--steps N] [--seed S] [--no-progress]``

The task: ``P`` prompts, each with ``K`` candidate answers of which a few are
correct (reward 1; some wrong ones get partial credit). The policy is a
softmax over the candidates of each prompt (one logit table), initialised at
a reference policy that rarely picks a correct answer. Every step samples
``G`` answers per prompt and calls :func:`jaxweight.maxent.maxent_step` once,
which returns both the GRPO advantages and the MaxEnt weights (with the tau
controller steering the weight entropy to a target and the KL controller
steering beta). Two runs share the samples' random keys:

- **grpo**: policy gradient with the group advantages, ``-mean(A * log pi)``;
- **maxent**: listwise cross-entropy toward the MaxEnt weights: the policy,
  renormalised over each group's samples, is fitted to ``w``
  (``-sum_g w_g log softmax_g(log pi(a_g))``).

Both runs, all steps, are one ``jax.lax.scan`` vmapped over the two methods.
Outputs (in ``--out``, default ``./grpo_demo``): ``grpo_maxent.png`` (reward,
weight entropy vs target, tau and beta trajectories, policy diversity over the
correct answers) and ``grpo_maxent.csv`` (every step), and a table printed at
the end.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import controllers as C
from .. import maxent as M

__all__ = ["main", "run", "DemoConfig"]

METHODS = ("grpo", "maxent")
METRICS = ("reward", "success", "entropy", "entropy_ema", "tau", "beta", "kl", "diversity", "ess")


@flax.struct.dataclass
class DemoConfig:
    prompts: int = flax.struct.field(pytree_node=False, default=256)
    candidates: int = flax.struct.field(pytree_node=False, default=24)
    generations: int = flax.struct.field(pytree_node=False, default=16)
    correct: int = flax.struct.field(pytree_node=False, default=4)
    steps: int = flax.struct.field(pytree_node=False, default=300)
    chunks: int = flax.struct.field(pytree_node=False, default=10)
    learning_rate: float = flax.struct.field(pytree_node=False, default=0.05)
    tau0: float = flax.struct.field(pytree_node=False, default=0.5)
    beta0: float = flax.struct.field(pytree_node=False, default=0.05)
    target_frac: float = flax.struct.field(pytree_node=False, default=0.8)


QUICK = DemoConfig(prompts=64, candidates=12, generations=8, correct=3, steps=80, chunks=4,
                   learning_rate=0.1)


def make_task(key: jax.Array, cfg: DemoConfig) -> dict[str, jax.Array]:
    """Rewards, lengths and reference logits of every (prompt, candidate)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    p, k = cfg.prompts, cfg.candidates
    order = jnp.argsort(jax.random.uniform(k1, (p, k)), axis=1)
    correct = order < cfg.correct
    partial = (order >= cfg.correct) & (order < 2 * cfg.correct)
    rewards = jnp.where(correct, 1.0, jnp.where(partial, 0.25, 0.0))
    lengths = jax.random.randint(k2, (p, k), 4, 64).astype(jnp.float32)
    # a reference policy that prefers wrong answers: correct ones start rare
    ref_logits = jax.random.normal(k3, (p, k)) - 1.5 * correct + 0.5 * jax.random.normal(k4, (p, k)) * partial
    return {"rewards": rewards, "correct": correct, "lengths": lengths, "ref_logits": ref_logits}


def _policy_stats(logits: jax.Array, task: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(success prob, KL to reference, diversity) averaged over prompts.

    Diversity is the entropy of the policy restricted to the correct answers,
    normalised by ``ln(#correct)``: 1 when every correct answer is equally
    likely, 0 when the policy has collapsed onto one of them.
    """
    logp = jax.nn.log_softmax(logits)
    ref = jax.nn.log_softmax(task["ref_logits"])
    p = jnp.exp(logp)
    success = jnp.sum(p * task["correct"], axis=1)
    kl = jnp.sum(p * (logp - ref), axis=1)
    pc = jnp.where(task["correct"], p, 0.0) / jnp.maximum(success[:, None], 1e-12)
    h = -jnp.sum(jnp.where(pc > 0, pc * jnp.log(jnp.where(pc > 0, pc, 1.0)), 0.0), axis=1)
    n = jnp.sum(task["correct"], axis=1)
    return jnp.mean(success), jnp.mean(kl), jnp.mean(h / jnp.log(jnp.maximum(n, 2)))


def make_train(cfg: DemoConfig, task: dict[str, jax.Array]):
    """``(init, train, target)`` for both methods at once.

    ``init(is_maxent bool[2]) -> carry`` and ``train(carry, keys, is_maxent) -> (carry, metrics)``
    (``len(keys)`` steps, one jitted scan, vmapped over the two methods); ``target`` is the
    target weight entropy of the MaxEnt run.
    """
    g = cfg.generations
    opt = optax.adam(cfg.learning_rate)
    target = cfg.target_frac * float(np.log(g))
    kl_ctl = C.KLController(target=0.5, horizon=20, step_size=0.2)
    rows = jnp.arange(cfg.prompts)[:, None]

    def init(is_maxent):
        params = task["ref_logits"]
        ctrl = C.init_controller(cfg.tau0, cfg.beta0)
        return params, opt.init(params), ctrl, jnp.int32(0)

    def step(carry, key, is_maxent):
        params, opt_state, ctrl, t = carry
        # GRPO runs the same fused call with its tau controller switched off
        sched = C.TauSchedule(target_entropy=target, learning_rate=jnp.where(is_maxent, 0.5, 0.0),
                              minimum_value=0.005, maximum_value=20.0, warmup_steps=0)
        actions = jax.random.categorical(key, params[:, None, :], axis=-1, shape=(cfg.prompts, g))
        rewards = task["rewards"][rows, actions]
        tok = task["lengths"][rows, actions]
        # each candidate is one "sequence": its reference log-prob is already per answer
        ref_lp = jax.nn.log_softmax(task["ref_logits"])[rows, actions]
        _, kl, _ = _policy_stats(params, task)
        out = M.maxent_step(ctrl, rewards, ref_lp, tok, schedule=sched, global_step=t,
                            kl=kl_ctl, measured_kl=jnp.where(is_maxent, kl, jnp.nan),
                            q_temperature=0.5, normalize_by_tokens=False)
        w = jax.lax.stop_gradient(out.weights)
        adv = jax.lax.stop_gradient(out.advantages)

        def loss(params):
            logp = jax.nn.log_softmax(params)[rows, actions]
            pg = -jnp.mean(adv * logp)
            # listwise: the policy renormalised over the group's samples should match w
            listwise = -jnp.sum(w * jax.nn.log_softmax(logp, axis=1)) / cfg.prompts
            return jnp.where(is_maxent, listwise, pg)

        grads = jax.grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        success, kl, div = _policy_stats(params, task)
        metrics = {"reward": jnp.mean(rewards), "success": success, "entropy": out.entropy.mean,
                   "entropy_ema": out.state.entropy_ema,
                   "tau": ctrl.tau, "beta": ctrl.beta, "kl": kl, "diversity": div, "ess": out.ess_mean}
        return (params, opt_state, out.state, t + 1), metrics

    def chunk(carry, keys, is_maxent):
        return jax.lax.scan(lambda c, k: step(c, k, is_maxent), carry, keys)

    both = jax.jit(jax.vmap(chunk, in_axes=(0, None, 0)))
    return jax.vmap(init), both, target


def run(quick: bool = False, out: str | os.PathLike | None = None, *, steps: int | None = None,
        seed: int = 0, progress: bool = True, cfg: DemoConfig | None = None) -> dict[str, Any]:
    """Train both methods and return their per-step metrics.

    Returns:
      ``{"grpo": {metric: np.ndarray[steps]}, "maxent": {...}, "target_entropy": float,
      "config": DemoConfig, "seconds": float}``; with ``out`` the plot and CSV are written.
    """
    cfg = cfg or (QUICK if quick else DemoConfig())
    if steps is not None:
        cfg = cfg.replace(steps=int(steps))
    key = jax.random.key(seed)
    k_task, k_run = jax.random.split(key)
    task = make_task(k_task, cfg)
    init, train, target = make_train(cfg, task)
    is_maxent = jnp.array([False, True])
    carry = init(is_maxent)
    keys = jax.random.split(k_run, cfg.steps)
    bounds = np.linspace(0, cfg.steps, max(1, min(cfg.chunks, cfg.steps)) + 1).astype(int)
    chunks = []
    t0 = time.perf_counter()
    try:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps, desc="grpo vs maxent", unit="step", disable=not progress)
    except ImportError:  # pragma: no cover - tqdm is a dependency
        bar = None
    for a, b in zip(bounds[:-1], bounds[1:]):
        carry, m = train(carry, keys[a:b], is_maxent)
        chunks.append(jax.device_get(m))
        if bar is not None:
            bar.update(int(b - a))
    if bar is not None:
        bar.close()
    secs = time.perf_counter() - t0
    hist = {k: np.concatenate([c[k] for c in chunks], axis=1) for k in METRICS}
    res: dict[str, Any] = {m: {k: hist[k][i] for k in METRICS} for i, m in enumerate(METHODS)}
    res.update(target_entropy=target, config=cfg, seconds=secs)
    if out is not None:
        write_outputs(res, Path(out))
    return res


def write_outputs(res: dict[str, Any], out: Path) -> list[Path]:
    """``grpo_maxent.csv`` (every step) and ``grpo_maxent.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "grpo_maxent.csv"
    steps = len(res["grpo"]["reward"])
    tmp = csv_path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step"] + [f"{m}_{k}" for m in METHODS for k in METRICS])
        for t in range(steps):
            w.writerow([t] + [f"{float(res[m][k][t]):.6g}" for m in METHODS for k in METRICS])
    os.replace(tmp, csv_path)
    png = out / "grpo_maxent.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    x = np.arange(steps)
    colors = {"grpo": "tab:blue", "maxent": "tab:orange"}
    for m in METHODS:
        axes[0, 0].plot(x, res[m]["reward"], label=f"{m} sampled reward", color=colors[m], alpha=0.8)
        axes[0, 0].plot(x, res[m]["success"], "--", label=f"{m} P(correct)", color=colors[m])
        axes[1, 1].plot(x, res[m]["diversity"], label=m, color=colors[m])
    axes[0, 0].set(title="reward", xlabel="step")
    axes[0, 0].legend(fontsize=8)
    axes[0, 1].plot(x, res["maxent"]["entropy"], color=colors["maxent"], alpha=0.5, label="maxent weight entropy")
    axes[0, 1].plot(x, res["maxent"]["entropy_ema"], color=colors["maxent"], label="its EMA (controller input)")
    axes[0, 1].plot(x, res["grpo"]["entropy"], color=colors["grpo"], alpha=0.6, label="same weights, fixed tau")
    axes[0, 1].axhline(res["target_entropy"], color="k", ls=":", label="target")
    axes[0, 1].set(title="weight entropy (nats)", xlabel="step")
    axes[0, 1].legend(fontsize=8)
    ax = axes[1, 0]
    ax.plot(x, res["maxent"]["tau"], color="tab:red", label="tau")
    ax.set(title="controllers (maxent run)", xlabel="step", ylabel="tau")
    ax2 = ax.twinx()
    ax2.plot(x, res["maxent"]["beta"], color="tab:green", label="beta")
    ax2.set_ylabel("beta")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    axes[1, 1].set(title="diversity over correct answers (1 = all equally likely)", xlabel="step")
    axes[1, 1].legend(fontsize=8)
    fig.tight_layout()
    tmp_png = png.with_name(png.stem + ".tmp.png")
    fig.savefig(tmp_png, dpi=110)
    plt.close(fig)
    os.replace(tmp_png, png)
    return [csv_path, png]


def summary_table(res: dict[str, Any], rows: int = 6) -> str:
    """A fixed-width table of both runs at a few steps."""
    steps = len(res["grpo"]["reward"])
    idx = sorted(set(np.linspace(0, steps - 1, rows).astype(int)))
    head = ["step"] + [f"{m}:{k}" for m in METHODS for k in ("reward", "success", "diversity")] + [
        "maxent:entropy", "maxent:tau", "maxent:beta"]
    lines = [head]
    for t in idx:
        row = [str(t)]
        for m in METHODS:
            row += [f"{res[m][k][t]:.3f}" for k in ("reward", "success", "diversity")]
        row += [f"{res['maxent'][k][t]:.3f}" for k in ("entropy", "tau", "beta")]
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(lines[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines[1:]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxweight demo grpo", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small task and few steps (< 30 s)")
    p.add_argument("--out", default="grpo_demo", help="folder for grpo_maxent.png / .csv (default ./grpo_demo)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 300, quick 80)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    res = run(quick=a.quick, out=a.out, steps=a.steps, seed=a.seed, progress=not a.no_progress)
    cfg = res["config"]
    print(f"GRPO vs MaxEnt: {cfg.prompts} prompts x {cfg.generations} generations, {cfg.candidates} candidates "
          f"({cfg.correct} correct), {cfg.steps} steps in {res['seconds']:.1f} s; "
          f"target weight entropy {res['target_entropy']:.3f}")
    print(summary_table(res))
    out = Path(a.out)
    print(f"wrote {out / 'grpo_maxent.png'} and {out / 'grpo_maxent.csv'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
