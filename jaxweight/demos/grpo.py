"""GRPO advantages vs MaxEnt weights on a toy answer-selection task.

``python -m jaxweight demo grpo [--quick] [--steps N] [--out DIR] [--seed N] [--strict]
[--tensorboard DIR] [--no-progress]``

The task: ``P`` prompts, each with ``K`` candidate answers of which a few are
correct (reward 1; some wrong ones get partial credit). The policy is a
softmax over the candidates of each prompt (one logit table), initialised at
a reference policy that rarely picks a correct answer. Every step samples
``G`` answers per prompt and calls :func:`jaxweight.maxent.step` once,
which returns both the GRPO advantages and the MaxEnt weights (with the tau
controller steering the weight entropy to a target and the KL controller
steering beta). Two runs share the samples' random keys:

- **grpo**: policy gradient with the group advantages, ``-mean(A * log pi)``;
- **maxent**: listwise cross-entropy toward the MaxEnt weights: the policy,
  renormalised over each group's samples, is fitted to ``w``
  (``-sum_g w_g log softmax_g(log pi(a_g))``).

Both runs are one ``jax.lax.scan`` per chunk of steps, vmapped over the two
methods and compiled ahead of time. Outputs under ``--out`` (default
``jaxweight-out/grpo/``): ``metrics.jsonl`` (one line per step; TensorBoard too
with ``--tensorboard DIR``), ``results.json`` (final and last-20% metrics, the
settings, timing and goals), ``grpo_maxent.csv`` and ``grpo_maxent.png``.

Goals (``--strict`` exits 1 when one is missed): over the last 20% of the steps
the MaxEnt run's weight entropy is closer to its target than the same weights at
a fixed tau (at a small tau the entropy cannot fall below about
``ln(G * P(correct))``, so "within 10% of the target" is not always reachable);
the MaxEnt policy ends more diverse over the correct answers (by >= 0.1 on
[0, 1]); both runs reach P(correct) >= 0.75 from a reference below 0.1.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxweight import maxent as M
from jaxweight.checkpoint import save_bytes
from jaxweight.demos import _args
from jaxweight.demos import _common as C

__all__ = ["main", "run", "goals", "write_outputs", "DemoConfig"]

METHODS = ("grpo", "maxent")
METRICS = ("reward", "success", "entropy", "entropy_ema", "tau", "beta", "kl", "diversity", "ess")
# the names in metrics.jsonl / results.json: say which entropy it is (the policy has one too)
METRIC_KEYS = {"entropy": "weight_entropy", "entropy_ema": "weight_entropy_ema"}

TAIL_FRAC = 0.20      # goal: over the last 20% of the steps, the maxent EMA is nearer the target than fixed tau
MIN_SUCCESS = 0.75    # goal: both runs end with P(correct) >= 0.75
DIVERSITY_MARGIN = 0.1  # goal: maxent's final diversity (in [0, 1]) beats grpo's by at least this


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
    ctrl_cfg = M.config(
        cfg.tau0, cfg.beta0, q_temperature=0.5, normalize_by_tokens=False,
        schedule=M.TauSchedule(target_entropy=target, learning_rate=0.5, minimum_value=0.005,
                               maximum_value=20.0, warmup_steps=0),
        kl=M.KLController(target=0.5, horizon=20, step_size=0.2))
    rows = jnp.arange(cfg.prompts)[:, None]

    def init(is_maxent):
        params = task["ref_logits"]
        return params, opt.init(params), M.init(ctrl_cfg), jnp.int32(0)

    def step(carry, key, is_maxent):
        params, opt_state, ctrl, t = carry
        # GRPO runs the same step with its tau controller switched off (learning rate 0)
        lr = jnp.where(is_maxent, ctrl_cfg.schedule.learning_rate, 0.0)
        run_cfg = ctrl_cfg.replace(schedule=ctrl_cfg.schedule.replace(learning_rate=lr))
        actions = jax.random.categorical(key, params[:, None, :], axis=-1, shape=(cfg.prompts, g))
        rewards = task["rewards"][rows, actions]
        tok = task["lengths"][rows, actions]
        # each candidate is one "sequence": its reference log-prob is already per answer
        ref_lp = jax.nn.log_softmax(task["ref_logits"])[rows, actions]
        _, kl, _ = _policy_stats(params, task)
        new_ctrl, out = M.step(ctrl, rewards, ref_lp, run_cfg, token_counts=tok, global_step=t,
                               measured_kl=kl, kl_valid=is_maxent)
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
                   "entropy_ema": new_ctrl.entropy_ema,
                   "tau": ctrl.tau, "beta": ctrl.beta, "kl": kl, "diversity": div, "ess": out.ess_mean}
        return (params, opt_state, new_ctrl, t + 1), metrics

    def chunk(carry, keys, is_maxent):
        return jax.lax.scan(lambda c, k: step(c, k, is_maxent), carry, keys)

    both = jax.jit(jax.vmap(chunk, in_axes=(0, None, 0)))
    return jax.vmap(init), both, target


def metric_key(method: str, name: str) -> str:
    """The flat key of one metric: ``metric_key("maxent", "entropy") == "maxent/weight_entropy"``."""
    return f"{method}/{METRIC_KEYS.get(name, name)}"


def run(quick: bool = False, out: str | os.PathLike | None = None, *, steps: int | None = None,
        seed: int = 0, progress: bool = True, cfg: DemoConfig | None = None, writer: Any = None,
        tensorboard: str | os.PathLike | None = None, timer: C.Timer | None = None) -> dict[str, Any]:
    """Train both methods and return their per-step metrics.

    Args:
      quick: the small task (:data:`QUICK`) instead of the default one.
      out: folder for ``results.json``, ``metrics.jsonl``, the CSV and the plot (nothing written if None).
      steps: training steps (>= 1); default ``cfg.steps``.
      seed: PRNG seed of the task and the samples.
      progress: show a progress bar.
      cfg: the sizes and hyperparameters (default :class:`DemoConfig` or :data:`QUICK`).
      writer: a metrics writer (``write(step, flat_dict)``) that gets one line per step; with
        ``out`` and no ``writer``, ``out/metrics.jsonl`` (+ TensorBoard files in ``tensorboard``).
      tensorboard: folder for TensorBoard event files (with ``out`` and no ``writer``).
      timer: a :class:`jaxweight.demos._common.Timer` that gets ``compile`` and ``run`` seconds.

    Returns:
      ``{"grpo": {metric: np.ndarray[steps]}, "maxent": {...}, "target_entropy": float,
      "config": DemoConfig, "seed": int, "seconds": float (run), "compile_seconds": float,
      "time": {"time/compile_s", "time/run_s"}, "goals": [(text, met)], "paths": {name: path}}``.

    Example::

      res = run(quick=True, progress=False)
      res["maxent"]["diversity"][-1] > res["grpo"]["diversity"][-1]
    """
    cfg = cfg or (QUICK if quick else DemoConfig())
    if steps is not None:
        if isinstance(steps, bool) or int(steps) != steps or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        cfg = cfg.replace(steps=int(steps))
    if seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    timer = timer if timer is not None else C.Timer()
    key = jax.random.key(seed)
    k_task, k_run = jax.random.split(key)
    task = make_task(k_task, cfg)
    init, train, target = make_train(cfg, task)
    is_maxent = jnp.array([False, True])
    carry = init(is_maxent)
    keys = jax.random.split(k_run, cfg.steps)
    bounds = np.linspace(0, cfg.steps, max(1, min(cfg.chunks, cfg.steps)) + 1).astype(int)
    from tqdm.auto import tqdm

    own_writer = writer is None and out is not None
    if own_writer:  # before compiling: a missing tensorboardX is one line, not a lost run
        writer = C.metrics_writer(argparse.Namespace(out=out, tensorboard=tensorboard))
    chunks = []
    try:
        # one executable per distinct chunk length (an uneven split gives two), compiled before the loop
        compiled = {n: timer.compile(train, carry, keys[:n], is_maxent)
                    for n in sorted({int(b - a) for a, b in zip(bounds[:-1], bounds[1:])})}
        with tqdm(total=cfg.steps, desc="grpo vs maxent", unit="step", disable=not progress) as bar:
            for a, b in zip(bounds[:-1], bounds[1:]):
                with timer.section("run"):
                    carry, m = compiled[int(b - a)](carry, keys[a:b], is_maxent)
                    m = jax.device_get(m)
                chunks.append(m)
                if writer is not None:
                    for t in range(int(a), int(b)):
                        writer.write(t, {metric_key(meth, k): float(m[k][i, t - a])
                                         for i, meth in enumerate(METHODS) for k in METRICS})
                bar.update(int(b - a))
    finally:
        if own_writer:
            writer.close()
    hist = {k: np.concatenate([c[k] for c in chunks], axis=1) for k in METRICS}
    res: dict[str, Any] = {m: {k: hist[k][i] for k in METRICS} for i, m in enumerate(METHODS)}
    res.update(target_entropy=target, config=cfg, seed=seed, seconds=timer["run"],
               compile_seconds=timer["compile"], time=timer.as_dict())
    res["goals"] = goals(res)
    res["paths"] = write_outputs(res, Path(out)) if out is not None else {}
    if own_writer:
        res["paths"]["metrics"] = Path(out) / "metrics.jsonl"
    return res


def _tail_start(n: int) -> int:
    return min(n - 1, int(np.floor((1.0 - TAIL_FRAC) * n)))


def goals(res: dict[str, Any]) -> list[tuple[str, bool]]:
    """The demo's claims as ``(text, met)`` pairs (see the module docstring), numbers in the text."""
    g, mx, target = res["grpo"], res["maxent"], float(res["target_entropy"])
    t0 = _tail_start(len(mx["entropy_ema"]))
    ema = np.asarray(mx["entropy_ema"], np.float64)[t0:]
    fixed = np.asarray(g["entropy"], np.float64)[t0:]    # the same weights at a fixed tau
    dev = float(np.mean(np.abs(ema / target - 1.0)))
    dev_fixed = float(np.mean(np.abs(fixed / target - 1.0)))
    div_m, div_g = float(mx["diversity"][-1]), float(g["diversity"][-1])
    suc_m, suc_g = float(mx["success"][-1]), float(g["success"][-1])
    return [
        (f"the tau controller steers the weight entropy toward the target ({target:.3f}): over the last "
         f"{TAIL_FRAC:.0%} of steps the maxent EMA is {dev:.1%} from it on average, the same weights at a "
         f"fixed tau {dev_fixed:.1%}", dev < dev_fixed),
        (f"maxent keeps more diversity over correct answers than grpo at the end, by >= {DIVERSITY_MARGIN} "
         f"({div_m:.3f} vs {div_g:.3f})", div_m >= div_g + DIVERSITY_MARGIN),
        (f"both runs learn the task: final P(correct) >= {MIN_SUCCESS} (grpo {suc_g:.3f}, maxent {suc_m:.3f})",
         min(suc_g, suc_m) >= MIN_SUCCESS),
    ]


def results_dict(res: dict[str, Any]) -> dict[str, Any]:
    """What ``results.json`` holds: settings, target, final and last-20% metrics per method, timing, goals."""
    cfg = res["config"]
    n = len(res["grpo"]["reward"])
    lo = _tail_start(n)
    settings = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    return {
        "demo": "grpo",
        "settings": settings | {"steps": n, "seed": res["seed"]},
        "target_entropy": float(res["target_entropy"]),
        "final": {m: {METRIC_KEYS.get(k, k): float(res[m][k][-1]) for k in METRICS} for m in METHODS},
        "last_20pct_mean": {m: {METRIC_KEYS.get(k, k): float(np.mean(res[m][k][lo:])) for k in METRICS}
                            for m in METHODS},
        "time": res["time"],
        "goals": [{"goal": t, "met": bool(ok)} for t, ok in res["goals"]],
    }


def csv_text(res: dict[str, Any]) -> str:
    """Every step of both runs: ``step,grpo_reward,...,maxent_ess``."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["step"] + [f"{m}_{k}" for m in METHODS for k in METRICS])
    for t in range(len(res["grpo"]["reward"])):
        w.writerow([t] + [f"{float(res[m][k][t]):.6g}" for m in METHODS for k in METRICS])
    return buf.getvalue()


def write_outputs(res: dict[str, Any], out: str | os.PathLike) -> dict[str, Path]:
    """``results.json`` first, then ``grpo_maxent.csv`` and ``grpo_maxent.png`` (with matplotlib) in ``out``.

    Returns ``{"results": path, "csv": path, "plot": path}`` (no ``"plot"`` when it was skipped).
    """
    out = C.out_dir(out)
    paths = {"results": C.write_results(out, results_dict(res))}  # before the plot: never lost to it
    paths["csv"] = save_bytes(out / "grpo_maxent.csv", csv_text(res).encode("utf-8"))
    png = C.save_plot(lambda plt: make_figure(plt, res), out / "grpo_maxent.png", dpi=110)
    if png is not None:
        paths["plot"] = png
    return paths


def make_figure(plt, res: dict[str, Any]):
    """The 2x2 figure: reward, weight entropy vs target, tau and beta, diversity."""
    steps = len(res["grpo"]["reward"])
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
    return fig


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
    a = _args.parse("grpo", argv)  # bad values: one line, exit 2
    timer = C.Timer()
    res = run(quick=a.quick, out=a.out, steps=a.steps, seed=a.seed, progress=not a.no_progress,
              tensorboard=a.tensorboard, timer=timer)
    cfg = res["config"]
    print(f"GRPO vs MaxEnt: {cfg.prompts} prompts x {cfg.generations} generations, {cfg.candidates} candidates "
          f"({cfg.correct} correct), {cfg.steps} steps ({timer.summary()}); "
          f"target weight entropy {res['target_entropy']:.3f}")
    print(summary_table(res))
    for name, path in res["paths"].items():
        print(f"{name}: {os.fspath(path)}")
    return C.finish(res["goals"], a.strict)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
