"""A small language model learns integer arithmetic with GRPO: the whole jaxweight stack at once.

``python -m jaxweight demo lm [--quick] [--compare] [--out DIR] [--steps N] [--seeds S] [--arms a,b] ...``

``--task countdown`` runs the other task instead, ModeBench Countdown with Dr.GRPO against
xDr.GRPO and the paper's evaluation (:mod:`._countdown`); this page is the arithmetic task.

A 2-layer causal transformer (flax, character vocabulary) answers ``a+b`` / ``a-b`` with 1 to 4
digit operands. Every distinct problem is in one split (train / validation / held-out, by a hash):
the RL pool and the warm start use train problems only. After a supervised warm start (the frozen
warm-start model is also the reference policy), **one jitted function** does a whole GRPO step
(:mod:`._pipeline`): level-balanced fresh draws, or a fresh problem inside a task bucket
(digits x operation x carries) the curriculum picks; the actor samples ``G`` completions per
prompt (oversampled: dynamic sampling keeps the groups with a signal); the reward is an exact
match of the answer; :func:`jaxweight.maxent.step` turns rewards and reference log-probs into
MaxEnt weights and steers tau; :func:`jaxweight.maxent.policy_loss` gives the clipped loss with
a fixed KL coefficient; optax; :func:`jaxweight.sync.step` copies learner -> actor every ``k``
steps; the curriculum learns each bucket's success. The library calls are the fields of :class:`Parts`.

Default: ``full`` vs ``grpo_uniform`` (plain GRPO: no SEED, curriculum, dynamic sampling or KL
controller), one seed each. ``--compare``: every arm of :data:`ARMS` x 3 seeds, mean and 95%
interval. Outputs under ``--out`` (default ``jaxweight-out/lm/``): ``results.json``,
``metrics.jsonl``, ``lm_grpo.png`` and ``checkpoint.jwc`` (``--resume`` continues from it).

``run(..., devices=(learner_devices, actor_devices))`` puts the learner and the actor on different
device groups, the runs sharded over each; the result equals the single-device run (tested on 8
fake CPU devices). On several hosts, start every process with ``jax.distributed.initialize()``,
build the two groups from ``jax.devices()`` and call the same ``run`` everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import checkpoint as ckpt
from .. import _args, _common
from .._args import LM_COMPARE_SEEDS as COMPARE_SEEDS
from ._pipeline import (
    ARM_FLAGS,
    ARMS,
    EVAL_SETS,
    HARD_LEVELS,
    QUICK,
    LMConfig,
    Parts,
    Pipeline,
    State,
    Task,
    device_cluster_ids,
    device_rewards,
    make_pipeline,
    make_task,
    warm_start,
)
from ._task import N_BUCKETS, N_LEVELS, bucket_name

__all__ = ["LMConfig", "QUICK", "ARMS", "ARM_FLAGS", "Parts", "Task", "make_task", "warm_start", "Pipeline",
           "make_pipeline", "run", "main", "device_rewards", "device_cluster_ids", "pass_at_k", "COMPARE_SEEDS"]



def pass_at_k(correct: np.ndarray, n: int, k: int) -> np.ndarray:
    """Unbiased pass@k per problem from ``correct`` of ``n`` samples (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    c = np.asarray(correct, np.int64)
    return np.array([1.0 if n - x < k else 1.0 - math.comb(n - x, k) / math.comb(n, k) for x in c.ravel()]
                    ).reshape(c.shape)


def _interval(x) -> list | None:
    """The 95% Student-t interval of the mean of ``x`` over seeds (``None`` for fewer than 2)."""
    # scipy is a dependency of jax (jax.scipy wraps it), so it is always installed with jaxweight
    from scipy.stats import t as student_t  # noqa: PLC0415  (imported on use: the demo's start stays quick)

    x = np.asarray(x, np.float64)
    if x.size < 2:
        return None
    h = float(student_t.ppf(0.975, x.size - 1)) * x.std(ddof=1) / math.sqrt(x.size)
    return [float(x.mean() - h), float(x.mean() + h)]


def _placements(devices):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    ldev, adev = devices
    lm = Mesh(np.asarray(ldev), ("r",))
    am = Mesh(np.asarray(adev), ("r",))
    return (NamedSharding(lm, P("r")), NamedSharding(lm, P()), NamedSharding(am, P("r")))


def _place_state(state: State, shardings) -> State:
    l_r, l_rep, a_r = shardings
    return State(runs=jax.device_put(state.runs, l_r), actor=jax.device_put(state.actor, a_r),
                 ref=jax.device_put(state.ref, l_r), sync=jax.device_put(state.sync, l_rep),
                 step=jax.device_put(state.step, l_rep))


def _multi_device_chunk(pipe: Pipeline, shardings, n: int):
    """The same steps as ``pipe.chunk`` with learner and actor on different devices."""
    choose, act, learn = pipe.phases
    l_r, _, a_r = shardings
    j_choose, j_act, j_learn = jax.jit(choose), jax.jit(act), jax.jit(learn)
    R = pipe.cfg.runs

    def run_chunk(state: State):
        ms = []
        for _ in range(n):
            x, runs = j_choose(state)
            y = j_act(state.actor, jax.device_put(x, a_r))             # learner -> actor devices
            y = jax.device_put(y, l_r)                                 # actor -> learner devices
            runs, m = j_learn(runs, state.ref, x, y, state.step)
            sync, actor, _ = pipe.parts.sync_step(state.sync, runs.learner, state.actor, pipe.cfg.sync_interval,
                                                  placement=a_r)
            m["staleness"] = jnp.broadcast_to(pipe.parts.staleness(sync).astype(jnp.float32), (R,))
            state = State(runs=runs, actor=actor, ref=state.ref, sync=sync, step=state.step + 1)
            ms.append(m)
        return state, jax.tree.map(lambda *x: jnp.stack(x), *ms)

    return run_chunk


def _checkpoint_target(pipe: Pipeline) -> State:
    return pipe.init(pipe.random_params(jax.random.key(0)), jax.random.key(0))


def _sampled(pipe: Pipeline, params, seed: int) -> dict:
    out = jax.device_get(pipe.evaluate_sampled(params, jax.random.key(seed + 10_000)))
    return {k: np.asarray(v).tolist() for k, v in out.items()}


def run(cfg: LMConfig | None = None, *, quick: bool = False, seed: int = 0, out: str | Path | None = None,
        checkpoint: str | Path | None = None, resume: bool = False, stop_after_chunks: int | None = None,
        devices: tuple | None = None, writer: Any = None, progress: Any = None) -> dict:
    """Warm start, then train every arm x seed; returns the results dict (see ``results.json``).

    Args:
      cfg: settings (default :class:`LMConfig`, or :data:`QUICK` with ``quick=True``).
      seed: the task, warm start and RL keys derive from it.
      out: if given, ``results.json`` is written there (the CLI also writes the plot).
      checkpoint: file for the whole state, saved after every chunk.
      resume: continue from ``checkpoint`` if it exists (same numbers as an uninterrupted run).
      stop_after_chunks: stop (as if killed) after this many chunks of this call.
      devices: ``(learner_devices, actor_devices)`` to split the pipeline (runs sharded over each).
      writer: a metrics writer (``write(step, flat_dict)``), e.g. ``_common.metrics_writer(args)``.
      progress: callable ``progress(str)`` for one line per chunk.
    """
    cfg = cfg or (QUICK if quick else LMConfig())
    t_wall = time.perf_counter()
    timer = _common.Timer()
    task = make_task(cfg, seed)
    pipe = make_pipeline(cfg, task)
    names = [f"{a}/s{s}" for a in cfg.arms for s in range(cfg.seeds)]
    k_sft, k_rl = jax.random.split(jax.random.key(seed))
    meta: dict[str, Any] = {}
    state = None
    if resume and checkpoint is not None and Path(checkpoint).exists():
        state, meta = ckpt.load_with_metadata(checkpoint, _checkpoint_target(pipe))
        if meta.get("config") != _config_dict(cfg):
            raise ValueError(f"checkpoint {str(checkpoint)!r} was written with other settings; "
                             "remove it or use the same flags")
        if progress:
            progress(f"resumed from {checkpoint} at step {int(state.step)}")
        if writer is not None and hasattr(writer, "keep_through"):  # lines the checkpoint does not cover
            writer.keep_through(int(state.step))
    if state is None:
        with timer.section("warm_start"):
            ref, sft_losses = warm_start(cfg, task, jax.random.split(k_sft, cfg.seeds))
            jax.block_until_ready(ref)
        state = pipe.init(ref, k_rl)
        with timer.section("eval"):
            acc0 = np.asarray(pipe.evaluate(state.runs.learner))
            samp0 = _sampled(pipe, state.runs.learner, seed)
        meta = {"config": _config_dict(cfg), "evals": [{"step": 0, "acc": acc0.tolist()}],
                "sampled_start": samp0, "train_seconds": 0.0, "compile_seconds": 0.0, "eval_seconds": 0.0,
                "tokens": 0.0, "prompt_tokens": 0.0, "history": [], "buckets": [],
                "warm_start_seconds": timer["warm_start"],
                "sft_loss_final": np.asarray(sft_losses[:, -1]).tolist()}
        if writer is not None:
            writer.write(0, _eval_dict(acc0, names))
    shardings = None
    if devices is not None:
        shardings = _placements(devices)
        state = _place_state(state, shardings)
    compiled: dict[int, Any] = {}
    chunks_done = 0
    while int(state.step) < cfg.steps:
        if stop_after_chunks is not None and chunks_done >= stop_after_chunks:
            break
        s0 = int(state.step)
        n = min(cfg.chunk, cfg.steps - s0)
        if n not in compiled:
            if devices is None:
                with timer.section("compile"):
                    compiled[n] = functools.partial(pipe.chunk, n=n)
                    if ("chunk", n) not in pipe.fns.compiled:
                        pipe.fns.compiled[("chunk", n)] = pipe.fns.chunk_jit.lower(state, pipe.data, n).compile()
            else:
                compiled[n] = _multi_device_chunk(pipe, shardings, n)
        t0 = time.perf_counter()
        state, m = compiled[n](state)
        m = jax.device_get(m)
        dt = time.perf_counter() - t0
        meta["train_seconds"] += dt
        meta["tokens"] += float(np.sum(m["tokens"]))
        meta["prompt_tokens"] += float(np.sum(m["prompt_tokens"]))
        step = int(state.step)
        counts = np.asarray(m.pop("bucket_counts"))                               # [n, R, K]
        meta["buckets"].append({"step": step, "share": (counts.sum(0) / np.maximum(
            counts.sum((0, 2))[:, None], 1)).tolist()})
        te = cfg.trace_every
        for j in range(0, n, te):
            meta["history"].append({"step": s0 + min(j + te, n), **{
                k: np.asarray(v)[j:j + te].mean(0).tolist() for k, v in m.items()}})
        if writer is not None:
            for i in range(n):
                writer.write(s0 + i + 1, {f"{nm}/{k}": float(v[i, r]) for k, v in m.items()
                                          for r, nm in enumerate(names)})
        if step % cfg.eval_every == 0 or step == cfg.steps:
            t1 = time.perf_counter()
            acc = np.asarray(pipe.evaluate(state.runs.learner))
            ev = {"step": step, "acc": acc.tolist()}
            if step == cfg.steps:
                meta["sampled_final"] = _sampled(pipe, state.runs.learner, seed)
            meta["evals"].append(ev)
            meta["eval_seconds"] += time.perf_counter() - t1
            if writer is not None:
                writer.write(step, _eval_dict(acc, names))
        if checkpoint is not None:
            ckpt.save(checkpoint, jax.device_get(state), metadata=meta)
        chunks_done += 1
        if progress:
            hard = np.asarray(meta["evals"][-1]["acc"])[:, 0, list(HARD_LEVELS)].mean(1)
            progress(f"step {step}/{cfg.steps}: {dt / n:.3f} s/step; held-out (2-4 digits) " + ", ".join(
                f"{nm} {a:.3f}" for nm, a in zip(names, hard)))
    meta["compile_seconds"] = meta.get("compile_seconds", 0.0) + timer["compile"]
    meta["eval_seconds"] += timer["eval"]
    res = _results(cfg, task, meta, state, time.perf_counter() - t_wall)
    res["finished"] = int(state.step) >= cfg.steps
    if out is not None:
        _common.write_results(out, res)
    res["_state"] = state
    return res


def _config_dict(cfg: LMConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["arms"] = list(cfg.arms)
    return d


def _eval_dict(acc: np.ndarray, names) -> dict:
    d = {}
    for r, nm in enumerate(names):
        for si, s in enumerate(EVAL_SETS):
            d[f"{nm}/{s}/hard"] = float(np.mean(acc[r, si, list(HARD_LEVELS)]))
            for lv in range(N_LEVELS):
                d[f"{nm}/{s}/{lv + 1}digit"] = float(acc[r, si, lv])
    return d


def _pass_block(samp: dict, task: Task, cfg: LMConfig) -> dict:
    """Per run: pass@k (mean over hard levels of the per-level mean), entropy, distinct answers."""
    n = cfg.pass_k_samples
    lv = task.pass_k.level
    ks = [k for k in (1, 8, 32) if k <= n]
    correct = np.asarray(samp["correct"])                                        # [R, H]
    out = {"pass": {}, "entropy": np.asarray(samp["entropy"]), "distinct": np.asarray(samp["distinct"]).mean(1)}
    for k in ks:
        p = pass_at_k(correct, n, k)
        out["pass"][str(k)] = np.mean([p[:, lv == h].mean(1) for h in HARD_LEVELS], axis=0)
    return out


def _results(cfg: LMConfig, task: Task, meta: dict, state: State, wall: float) -> dict:
    evals = meta["evals"]
    acc = np.asarray([e["acc"] for e in evals])                                 # [E, R, 3, L]
    hard = list(HARD_LEVELS)
    counts = {s: np.bincount(task.evals[s].level, minlength=N_LEVELS).tolist() for s in EVAL_SETS}
    p0 = _pass_block(meta["sampled_start"], task, cfg)
    p1 = _pass_block(meta["sampled_final"], task, cfg) if "sampled_final" in meta else None
    hist = meta["history"]
    steps_done = int(state.step)
    arms = {}
    for i, a in enumerate(cfg.arms):
        sl = slice(i * cfg.seeds, (i + 1) * cfg.seeds)
        per_seed = {
            "heldout_hard_accuracy_start": acc[0, sl, 0][:, hard].mean(1),
            "heldout_hard_accuracy_final": acc[-1, sl, 0][:, hard].mean(1),
            "validation_hard_accuracy_final": acc[-1, sl, 1][:, hard].mean(1),
            "inpool_hard_accuracy_final": acc[-1, sl, 2][:, hard].mean(1),
        }
        per_seed["gain"] = per_seed["heldout_hard_accuracy_final"] - per_seed["heldout_hard_accuracy_start"]
        for k, v in p0["pass"].items():
            per_seed[f"pass_at_{k}_start"] = v[sl]
        per_seed["sampled_entropy_start"] = p0["entropy"][sl]
        per_seed["distinct_answers_start"] = p0["distinct"][sl]
        if p1 is not None:
            for k, v in p1["pass"].items():
                per_seed[f"pass_at_{k}_final"] = v[sl]
            per_seed["sampled_entropy_final"] = p1["entropy"][sl]
            per_seed["distinct_answers_final"] = p1["distinct"][sl]
        arm = {k: float(np.mean(v)) for k, v in per_seed.items()}
        by_level = {s: {str(lv + 1): float(acc[-1, sl, si, lv].mean()) for lv in range(N_LEVELS)}
                    for si, s in enumerate(EVAL_SETS)}
        arm.update({
            "flags": dict(zip(("curriculum", "maxent", "dynamic_sampling", "seed_grpo", "kl_controller"),
                              ARM_FLAGS[a])),
            "heldout_accuracy_by_level_start": {str(lv + 1): float(acc[0, sl, 0, lv].mean()) for lv in range(N_LEVELS)},
            "heldout_accuracy_by_level_final": by_level["heldout"],
            "validation_accuracy_by_level_final": by_level["validation"],
            "inpool_accuracy_by_level_final": by_level["inpool"],
            "pass_at_k_start": {k: float(np.mean(v[sl])) for k, v in p0["pass"].items()},
            "pass_at_k_final": ({k: float(np.mean(v[sl])) for k, v in p1["pass"].items()} if p1 else None),
            "per_seed": {k: np.asarray(v).tolist() for k, v in per_seed.items()},
            "interval95": {k: _interval(v) for k, v in per_seed.items()} if cfg.seeds > 1 else None,
        })
        arm["per_seed"]["heldout_accuracy_by_level_final"] = acc[-1, sl, 0].tolist()
        # curves: greedy accuracy at each evaluation, against the KL of the steps before it
        kl_at = []
        for e in evals:
            hs = [h for h in hist if e["step"] - cfg.eval_every < h["step"] <= e["step"]]
            kl_at.append(float(np.mean([np.mean(h["kl"][sl]) for h in hs])) if hs else 0.0)
        arm["curve"] = {"steps": [e["step"] for e in evals],
                        "heldout_hard": acc[:, sl, 0][:, :, hard].mean((1, 2)).tolist(),
                        "validation_hard": acc[:, sl, 1][:, :, hard].mean((1, 2)).tolist(),
                        "inpool_hard": acc[:, sl, 2][:, :, hard].mean((1, 2)).tolist(),
                        "heldout_by_level": acc[:, sl, 0].mean(1).tolist(), "kl": kl_at}
        trace = {k: [float(np.mean(h[k][sl])) for h in hist] for k in (hist[0] if hist else {}) if k != "step"}
        trace["steps"] = [h["step"] for h in hist]
        arm["trace"] = trace
        arm["bucket_share"] = {"steps": [b["step"] for b in meta["buckets"]],
                               "share": [np.asarray(b["share"])[sl].mean(0).tolist() for b in meta["buckets"]]}
        arms[a] = arm
    train = meta["train_seconds"]
    return {
        "wall_seconds": wall, "train_seconds": train, "compile_seconds": meta.get("compile_seconds", 0.0),
        "warm_start_seconds": meta.get("warm_start_seconds", 0.0), "eval_seconds": meta.get("eval_seconds", 0.0),
        "seconds_per_step": train / max(steps_done, 1),
        "tokens_per_second": meta["tokens"] / max(train, 1e-9),
        "prompt_tokens_per_second": meta["prompt_tokens"] / max(train, 1e-9),
        "steps": steps_done, "runs": cfg.runs, "config": meta["config"],
        "split": {"how": "each distinct problem is in one split by a fixed hash: train 80% (RL pool and warm "
                         "start), validation 10% (tuning), held-out 10% (reported); disjoint at every level",
                  "problems_per_level": counts, "pool_per_level": np.bincount(task.pool.level, minlength=N_LEVELS).tolist(),
                  "headline": "held-out greedy accuracy, mean of the 2-, 3- and 4-digit levels; the 1-digit "
                              f"level has only {counts['heldout'][0]} held-out problems and is left out of it",
                  "pass_at_k_problems": len(task.pass_k), "pass_at_k_samples": cfg.pass_k_samples},
        "bucket_names": [bucket_name(k) for k in range(N_BUCKETS)],
        "completions_sampled_per_run": steps_done * cfg.sample_prompts * cfg.generations,
        "completions_trained_per_run": steps_done * cfg.prompts * cfg.generations,
        "target_entropy": cfg.target_entropy_frac * math.log(cfg.generations),
        "sft_loss_final": meta.get("sft_loss_final"), "arms": arms,
    }


# ===================================================================== report
def summary_table(res: dict) -> str:
    """Held-out (hard levels) accuracy per arm: start -> final, per level, pass@k, entropy."""
    ks = list(next(iter(res["arms"].values()))["pass_at_k_start"])
    head = (["arm", "start", "final", "gain", "1d", "2d", "3d", "4d", "val", "in-pool"]
            + [f"pass@{k}" for k in ks] + ["entropy", "per seed final"])
    rows = [head]
    for a, r in res["arms"].items():
        pk = r["pass_at_k_final"] or {}
        ci = (r.get("interval95") or {}).get("heldout_hard_accuracy_final")
        rows.append([a, f"{r['heldout_hard_accuracy_start']:.3f}", f"{r['heldout_hard_accuracy_final']:.3f}",
                     f"{r['gain']:+.3f}"] + [f"{x:.2f}" for x in r["heldout_accuracy_by_level_final"].values()]
                    + [f"{r['validation_hard_accuracy_final']:.3f}", f"{r['inpool_hard_accuracy_final']:.3f}"]
                    + [f"{pk.get(k, float('nan')):.3f}" for k in ks]
                    + [f"{r.get('sampled_entropy_final', float('nan')):.3f}",
                       " ".join(f"{x:.3f}" for x in r["per_seed"]["heldout_hard_accuracy_final"])
                       + (f" (95% CI {ci[0]:.3f}..{ci[1]:.3f})" if ci else "")])
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i in (0, len(head) - 1) else c.rjust(w[i])  # noqa: E731
                              for i, c in enumerate(r))
    return "\n".join([fmt(rows[0]), fmt(["-" * x for x in w])] + [fmt(r) for r in rows[1:]])


def plot(plt, res: dict):
    """Held-out and validation accuracy, 4-digit level, accuracy vs KL, entropy, diversity, clipping,
    zero-variance groups, curriculum bucket shares, pass@k."""
    fig, ax = plt.subplots(2, 4, figsize=(20, 8.5))
    palette = ("tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
    colors = dict(zip(ARM_FLAGS, palette))
    for a, r in res["arms"].items():
        c, t, col = r["curve"], r["trace"], colors[a]
        ax[0, 0].plot(c["steps"], c["heldout_hard"], "-o", ms=3, color=col, label=f"{a} held-out")
        ax[0, 0].plot(c["steps"], c["validation_hard"], ":", color=col, label=f"{a} validation")
        ax[0, 0].plot(c["steps"], c["inpool_hard"], "--", color=col, alpha=0.5, label=f"{a} in-pool")
        ax[0, 1].plot(c["steps"], [x[-1] for x in c["heldout_by_level"]], "-o", ms=3, color=col, label=a)
        ax[0, 2].plot(c["kl"], c["heldout_hard"], "-o", ms=3, color=col, label=a)
        ax[0, 3].plot(t["steps"], t["entropy"], color=col, label=f"{a} token entropy")
        ax[1, 0].plot(t["steps"], t["distinct_answers"], color=col, label=f"{a} distinct answers / group")
        ax[1, 1].plot(t["steps"], t["frac_zero_std"], color=col, label=f"{a} sampled")
        ax[1, 1].plot(t["steps"], t["frac_zero_std_trained"], ":", color=col, label=f"{a} trained on")
        ax[1, 1].plot(t["steps"], t["clip_fraction"], "--", color=col, alpha=0.6, label=f"{a} clip fraction")
    cur_arm = next((a for a, r in res["arms"].items() if r["flags"]["curriculum"]), None)
    if cur_arm is not None:
        bs = res["arms"][cur_arm]["bucket_share"]
        share = np.asarray(bs["share"]).T
        keep = share.max(1) > 0
        names = [n for n, k in zip(res["bucket_names"], keep) if k]
        ax[1, 2].stackplot(bs["steps"], share[keep], labels=names)
        ax[1, 2].set_ylim(0, 1)
        ax[1, 2].legend(fontsize=5, ncol=2, loc="upper left")
    arms = list(res["arms"])
    ks = list(res["arms"][arms[0]]["pass_at_k_start"])
    w = 0.8 / max(len(arms), 1)
    for i, a in enumerate(arms):
        r = res["arms"][a]
        x = np.arange(len(ks)) + i * w
        ax[1, 3].bar(x, [r["pass_at_k_start"][k] for k in ks], w, color=colors[a], alpha=0.3)
        if r["pass_at_k_final"]:
            ax[1, 3].bar(x, [r["pass_at_k_final"][k] - r["pass_at_k_start"][k] for k in ks], w,
                         bottom=[r["pass_at_k_start"][k] for k in ks], color=colors[a], label=a)
    ax[1, 3].set_xticks(np.arange(len(ks)) + w * (len(arms) - 1) / 2, [f"pass@{k}" for k in ks])
    titles = ["greedy accuracy, 2-4 digits (held-out / validation / in-pool)", "held-out accuracy, 4 digits",
              "held-out accuracy (2-4 digits) vs KL to reference", "policy token entropy (nats)",
              "distinct answers per group of G", "zero-variance groups; clip fraction",
              f"curriculum bucket shares ({cur_arm})", "held-out pass@k, 2-4 digits (light: start)"]
    for a_, tt in zip(ax.flat, titles):
        a_.set(title=tt)
        if a_ is not ax[1, 2]:
            a_.legend(fontsize=6)
    ax[0, 2].set_xlabel("mean k3 KL to the reference over the preceding steps")
    fig.tight_layout()
    return fig




def main(argv: list[str] | None = None) -> int:
    task, rest = _args.split_task(argv)
    if task == "countdown":
        from ._countdown import main as countdown_main

        return countdown_main(rest)
    p = _args.parser("lm")
    a = _args.parse("lm", argv)  # bad values and refused combinations: one line, exit 2
    cfg = QUICK if a.quick else LMConfig()
    over = {"steps": a.steps, "seeds": a.seeds, "prompts": a.prompts, "sample_prompts": a.sample_prompts,
            "generations": a.generations, "lr": a.lr, "kl_coef": a.kl_coef, "temperature": a.temperature,
            "sync_interval": a.sync_interval, "replay": a.replay, "sft_steps": a.sft_steps}
    over = {k: v for k, v in over.items() if v is not None}
    if a.compare:
        over.setdefault("arms", ARMS)
        over["seeds"] = max(over.get("seeds", COMPARE_SEEDS), COMPARE_SEEDS)
    if a.arms is not None:
        over["arms"] = tuple(a.arms)
    if a.eval_every is not None:
        over["eval_every"] = over["chunk"] = a.eval_every
    if a.prompts is not None and a.sample_prompts is None:
        over["sample_prompts"] = max(cfg.sample_prompts * a.prompts // cfg.prompts, a.prompts)
    cfg = _common.replace_config(p, cfg, over)
    out = _common.out_dir(a)
    log = _common.line_logger(a)
    if a.train_seeds is not None:
        return _study_main(a, cfg, out, log)
    with _common.metrics_writer(a, append=a.resume) as w:
        res = run(cfg, seed=a.seed, out=out, checkpoint=None if a.no_checkpoint else out / "checkpoint.jwc",
                  resume=a.resume, writer=w, progress=log)
    res.pop("_state", None)
    png = _common.save_plot(lambda plt: plot(plt, res), out / "lm_grpo.png")
    print(f"demo lm: {cfg.runs} runs ({len(cfg.arms)} arms x {cfg.seeds} seeds), {res['steps']} steps of "
          f"{cfg.prompts} of {cfg.sample_prompts} sampled prompts x {cfg.generations} completions; wall "
          f"{res['wall_seconds']:.1f} s (warm start {res['warm_start_seconds']:.1f} s, compile "
          f"{res['compile_seconds']:.1f} s, evaluation {res['eval_seconds']:.1f} s, {res['seconds_per_step']:.3f} "
          f"s/step, {res['tokens_per_second']:.0f} completion + {res['prompt_tokens_per_second']:.0f} prompt tokens/s)")
    print(res["split"]["headline"])
    print(summary_table(res))
    print(f"wrote {out / 'results.json'}, {out / 'metrics.jsonl'}" + (f", {png}" if png is not None else ""))
    goals = []
    arms = res["arms"]
    if not a.quick and "full" in arms:
        f = arms["full"]
        if not a.compare:
            goals.append(("the run finishes within 10 minutes (the default run's budget)", res["wall_seconds"] <= 600))
        goals.append(("full: held-out gain (2-4 digits) >= 0.20 over the warm start", f["gain"] >= 0.20))
        goals.append(("full: 4-digit held-out accuracy above 30%",
                      f["heldout_accuracy_by_level_final"]["4"] > 0.30))
        if "grpo_uniform" in arms and f["pass_at_k_final"] and cfg.seeds >= COMPARE_SEEDS:
            g0 = arms["grpo_uniform"]
            goals.append(("full within 2 points of plain GRPO on pass@1",
                          f["pass_at_k_final"]["1"] >= g0["pass_at_k_final"]["1"] - 0.02))
            goals.append(("full above plain GRPO on pass@32 or on sampled token entropy",
                          f["pass_at_k_final"].get("32", 0) > g0["pass_at_k_final"].get("32", 0)
                          or f["sampled_entropy_final"] > g0["sampled_entropy_final"]))
    return _common.finish(goals, a.strict)


def _study_main(a, cfg: LMConfig, out: Path, log) -> int:
    from . import _study

    _common.require_extra("statsmodels", "stats", "demo lm --train-seeds")
    st = _study.run_study(cfg, train_seeds=a.train_seeds, part_seeds=a.part_seeds,
                             ablation_seeds=a.ablation_seeds, seed=a.seed, out=out, resume=a.resume,
                             checkpoint=not a.no_checkpoint, run=run, log=log or (lambda s: None))
    an = st["analysis"]
    pr = an["primary"]
    print(f"demo lm --train-seeds {a.train_seeds}: {an['pairs']} of {an['planned_pairs']} pairs")
    for name, e in [("primary", pr), *an["secondary"].items(), *an["ablations"].items()]:
        if e is not None:
            ci = "n/a" if e["ci95"] is None else f"[{e['ci95'][0]:+.4f}, {e['ci95'][1]:+.4f}]"
            print(f"  {name}: {e['arm']} - {e['base']} on {e['metric']}: {e['estimate']:+.4f} {ci}, "
                  f"Wilcoxon p {e['p_wilcoxon']}, {e['runs']} pairs")
    print(f"  claim: {an['primary_claim']}")
    print(f"wrote {out / 'study.json'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
