"""A small language model learns integer arithmetic with GRPO: the whole jaxweight stack at once.

``python -m jaxweight demo lm [--quick] [--out DIR] [--steps N] [--seeds S] [--arms a,b] ...``

A 2-layer causal transformer (flax, character vocabulary) answers ``a+b`` / ``a-b`` with 1 to 4
digit operands. After a supervised warm start (the frozen warm-start model is also the reference
policy), **one jitted function** does a whole GRPO step (:mod:`._lm_pipeline`): the curriculum
(Prioritized Level Replay over 131,072 string-keyed problems) picks ``B`` prompts; the actor
samples ``G`` completions per prompt; the reward is an exact match of the answer (equal to the host
path ``maxent.extract_answer``), SEED-GRPO clusters equal answers; :func:`jaxweight.maxent.step`
turns rewards and reference log-probs into MaxEnt weights and steers tau / beta; the learner takes
an optax step; :func:`jaxweight.sync.step` copies learner -> actor every ``k`` steps; the curriculum
learns each prompt's success. The library calls are the fields of :class:`Parts`.

Arms (same sample budget, vmapped with the seeds in one program): ``full`` (curriculum + MaxEnt),
``grpo_uniform`` (plain GRPO advantages, uniform sampling), ``grpo_curriculum`` and
``maxent_uniform``. Outputs under ``--out`` (default ``jaxweight-out/lm/``): ``results.json``,
``metrics.jsonl``, ``lm_grpo.png`` and ``checkpoint.jwc`` (``--resume`` continues from it).

``run(..., devices=(learner_devices, actor_devices))`` puts the learner (curriculum, optimiser,
controllers, reference) and the actor (sampling) on different device groups, the runs sharded over
each; the result equals the single-device run (tested on 8 fake CPU devices). On several hosts,
start every process with ``jax.distributed.initialize()``, build the two groups from
``jax.devices()`` and call the same ``run`` everywhere; write host outputs from process 0 only.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import checkpoint as ckpt
from . import _common
from ._lm_pipeline import (
    _ARM_FLAGS,
    ARMS,
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
from ._lm_task import N_LEVELS

__all__ = ["LMConfig", "QUICK", "ARMS", "Parts", "Task", "make_task", "warm_start", "Pipeline", "make_pipeline",
           "run", "main", "device_rewards", "device_cluster_ids"]


# ======================================================================== run
def _accuracy_block(acc: np.ndarray, arms, seeds) -> dict:
    """acc f32[R, N_LEVELS] -> per arm {overall, per_level, per_seed, per_seed_per_level}."""
    out = {}
    for i, a in enumerate(arms):
        a_acc = np.asarray(acc[i * seeds:(i + 1) * seeds], np.float64)      # [S, L]
        out[a] = {"overall": float(a_acc.mean()), "per_level": a_acc.mean(0).tolist(),
                  "per_seed": a_acc.mean(1).tolist(), "per_seed_per_level": a_acc.tolist()}
    return out


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
    if state is None:
        with timer.section("warm_start"):
            ref, sft_losses = warm_start(cfg, task, jax.random.split(k_sft, cfg.seeds))
            jax.block_until_ready(ref)
        state = pipe.init(ref, k_rl)
        acc0 = np.asarray(pipe.evaluate(state.runs.learner))
        meta = {"config": _config_dict(cfg), "evals": [{"step": 0, "acc": acc0.tolist()}],
                "train_seconds": 0.0, "compile_seconds": 0.0, "tokens": 0.0, "history": [],
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
        step = int(state.step)
        means = {k: np.asarray(v).mean(0).tolist() for k, v in m.items()}       # per run
        meta["history"].append({"step": step, **means})
        if writer is not None:
            for i in range(n):
                writer.write(s0 + i + 1, {f"{nm}/{k}": float(v[i, r]) for k, v in m.items()
                                          for r, nm in enumerate(names)})
        if step % cfg.eval_every == 0 or step == cfg.steps:
            acc = np.asarray(pipe.evaluate(state.runs.learner))
            meta["evals"].append({"step": step, "acc": acc.tolist()})
            if writer is not None:
                writer.write(step, _eval_dict(acc, names))
        if checkpoint is not None:
            ckpt.save(checkpoint, jax.device_get(state), metadata=meta)
        chunks_done += 1
        if progress:
            ov = np.asarray(meta["evals"][-1]["acc"]).mean(1)
            progress(f"step {step}/{cfg.steps}: {dt / n:.3f} s/step; held-out " + ", ".join(
                f"{nm} {a:.2f}" for nm, a in zip(names, ov)))
    meta["compile_seconds"] = meta.get("compile_seconds", 0.0) + timer["compile"]
    res = _results(cfg, meta, state, time.perf_counter() - t_wall)
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
        d[f"{nm}/heldout/overall"] = float(np.mean(acc[r]))
        for lv in range(N_LEVELS):
            d[f"{nm}/heldout/level{lv + 1}"] = float(acc[r, lv])
    return d


def _results(cfg: LMConfig, meta: dict, state: State, wall: float) -> dict:
    evals = meta["evals"]
    acc0 = np.asarray(evals[0]["acc"])
    acc1 = np.asarray(evals[-1]["acc"])
    start = _accuracy_block(acc0, cfg.arms, cfg.seeds)
    final = _accuracy_block(acc1, cfg.arms, cfg.seeds)
    steps_done = int(state.step)
    arms = {}
    for i, a in enumerate(cfg.arms):
        sl = slice(i * cfg.seeds, (i + 1) * cfg.seeds)
        curve = {"steps": [e["step"] for e in evals],
                 "overall": [float(np.mean(np.asarray(e["acc"])[sl])) for e in evals],
                 "per_level": [np.asarray(e["acc"])[sl].mean(0).tolist() for e in evals]}
        hist = meta["history"]
        trace = {k: [float(np.mean(h[k][sl])) for h in hist] for k in (hist[0] if hist else {}) if k != "step"}
        trace["steps"] = [h["step"] for h in hist]
        arms[a] = {"heldout_accuracy_start": start[a], "heldout_accuracy_final": final[a],
                   "gain": final[a]["overall"] - start[a]["overall"],
                   "curriculum": bool(_ARM_FLAGS[a][0]), "maxent": bool(_ARM_FLAGS[a][1]),
                   "heldout_curve": curve, "trace": trace}
    train = meta["train_seconds"]
    return {
        "wall_seconds": wall, "train_seconds": train, "compile_seconds": meta.get("compile_seconds", 0.0),
        "warm_start_seconds": meta.get("warm_start_seconds", 0.0),
        "seconds_per_step": train / max(steps_done, 1),
        "tokens_per_second": meta["tokens"] / max(train, 1e-9),
        "steps": steps_done, "runs": cfg.runs, "config": meta["config"],
        "sample_budget_per_arm_and_seed": steps_done * cfg.prompts * cfg.generations,
        "target_entropy": cfg.target_entropy_frac * math.log(cfg.generations),
        "sft_loss_final": meta.get("sft_loss_final"), "arms": arms,
    }


# ===================================================================== report
def summary_table(res: dict) -> str:
    """Held-out accuracy per arm: start -> final (mean over seeds), per level and per seed."""
    head = ["arm", "start", "final", "gain", "L1", "L2", "L3", "L4", "per seed final"]
    rows = [head]
    for a, r in res["arms"].items():
        s, f = r["heldout_accuracy_start"], r["heldout_accuracy_final"]
        rows.append([a, f"{s['overall']:.3f}", f"{f['overall']:.3f}", f"{r['gain']:+.3f}"]
                    + [f"{x:.2f}" for x in f["per_level"]] + [" ".join(f"{x:.3f}" for x in f["per_seed"])])
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i in (0, len(head) - 1) else c.rjust(w[i])  # noqa: E731
                              for i, c in enumerate(r))
    return "\n".join([fmt(rows[0]), fmt(["-" * x for x in w])] + [fmt(r) for r in rows[1:]])


def plot(plt, res: dict):
    """The figure: held-out accuracy, hardest level, weight entropy vs target, tau, beta / KL, staleness."""
    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    colors = dict(zip(ARMS, ("tab:red", "tab:blue", "tab:green", "tab:orange")))
    for a, r in res["arms"].items():
        c = r["heldout_curve"]
        t = r["trace"]
        ax[0, 0].plot(c["steps"], c["overall"], "-o", ms=3, color=colors[a], label=a)
        ax[0, 1].plot(c["steps"], [x[-1] for x in c["per_level"]], "-o", ms=3, color=colors[a], label=a)
        if r["maxent"]:
            ax[0, 2].plot(t["steps"], t["weight_entropy"], color=colors[a], label=f"{a} weight entropy")
            ax[1, 0].plot(t["steps"], t["tau"], color=colors[a], label=f"{a} tau")
            ax[1, 1].plot(t["steps"], t["beta"], color=colors[a], label=f"{a} beta")
        ax[1, 1].plot(t["steps"], t["kl"], ":", color=colors[a], label=f"{a} KL")
        ax[1, 2].plot(t["steps"], t["reward"], color=colors[a], label=f"{a} train reward")
    ax[0, 2].axhline(res["target_entropy"], color="k", ls=":", label="target")
    ax[1, 2].plot(res["arms"][next(iter(res["arms"]))]["trace"]["steps"],
                  res["arms"][next(iter(res["arms"]))]["trace"]["staleness"], "k--", label="actor staleness")
    titles = ["held-out accuracy (mean of levels)", "held-out accuracy, 4-digit level",
              "MaxEnt weight entropy (nats)", "tau", "beta (solid) and KL to reference (dotted)",
              "train reward; actor staleness (steps)"]
    for a_, tt in zip(ax.flat, titles):
        a_.set(title=tt, xlabel="step")
        a_.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxweight demo lm", description=__doc__.split("\n\n")[0])
    _common.add_common_args(p, "lm", quick_help="tiny model and task, a few steps (a smoke run, < 1 min)")
    g = p.add_argument_group("lm demo options")
    g.add_argument("--steps", type=_common.positive_int, default=None, help="RL steps (default 300)")
    g.add_argument("--seeds", type=_common.positive_int, default=None, help="seeds per arm (default 2)")
    g.add_argument("--arms", type=_common.comma_list(ARMS), default=None,
                   help=f"comma-separated arms (default all: {','.join(ARMS)})")
    g.add_argument("--prompts", type=_common.positive_int, default=None, help="prompts per step B (default 32)")
    g.add_argument("--generations", type=_common.int_range(2, None), default=None,
                   help="completions per prompt G (default 8)")
    g.add_argument("--lr", type=_common.positive_float, default=None, help="learner Adam learning rate")
    g.add_argument("--temperature", type=_common.positive_float, default=None, help="sampling temperature")
    g.add_argument("--sync-interval", type=_common.positive_int, default=None,
                   help="learner -> actor sync every k steps (default 2)")
    g.add_argument("--replay", type=_common.prob, default=None,
                   help="fraction of curriculum prompts replayed from the tracked pool (default 0.5)")
    g.add_argument("--eval-every", type=_common.positive_int, default=None, help="held-out evaluation period")
    g.add_argument("--sft-steps", type=_common.nonneg_int, default=None, help="warm-start steps (default 400)")
    g.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.jwc if present")
    g.add_argument("--no-checkpoint", action="store_true", help="do not write checkpoint.jwc")
    a = p.parse_args(argv)
    cfg = QUICK if a.quick else LMConfig()
    over = {"steps": a.steps, "seeds": a.seeds, "prompts": a.prompts, "generations": a.generations,
            "lr": a.lr, "temperature": a.temperature, "sync_interval": a.sync_interval, "replay": a.replay,
            "sft_steps": a.sft_steps}
    over = {k: v for k, v in over.items() if v is not None}
    if a.arms is not None:
        over["arms"] = tuple(a.arms)
    if a.eval_every is not None:
        over["eval_every"] = over["chunk"] = a.eval_every
    try:
        cfg = dataclasses.replace(cfg, **over)
    except ValueError as e:
        p.error(str(e))
    out = _common.out_dir(a)
    log = None if a.no_progress else (lambda s: print(s, flush=True))
    with _common.metrics_writer(a, append=a.resume) as w:
        res = run(cfg, seed=a.seed, out=out, checkpoint=None if a.no_checkpoint else out / "checkpoint.jwc",
                  resume=a.resume, writer=w, progress=log)
    res.pop("_state", None)
    png = _common.save_plot(lambda plt: plot(plt, res), out / "lm_grpo.png")
    print(f"demo lm: {cfg.runs} runs ({len(cfg.arms)} arms x {cfg.seeds} seeds), {res['steps']} steps of "
          f"{cfg.prompts} prompts x {cfg.generations} completions; wall {res['wall_seconds']:.1f} s "
          f"(warm start {res['warm_start_seconds']:.1f} s, compile {res['compile_seconds']:.1f} s, "
          f"{res['seconds_per_step']:.3f} s/step, {res['tokens_per_second']:.0f} tokens/s)")
    print(summary_table(res))
    print(f"wrote {out / 'results.json'}, {out / 'metrics.jsonl'}" + (f", {png}" if png is not None else ""))
    goals = []
    arms = res["arms"]
    if not a.quick:
        goals.append(("default run finishes within 10 minutes", res["wall_seconds"] <= 600))
        if "full" in arms:
            goals.append(("full pipeline: held-out gain >= 0.30 over the warm start", arms["full"]["gain"] >= 0.30))
            if "grpo_uniform" in arms:
                goals.append(("full pipeline gains more than plain GRPO with uniform sampling",
                              arms["full"]["gain"] > arms["grpo_uniform"]["gain"]))
            goals.append(("full pipeline: hardest level above 20%",
                          arms["full"]["heldout_accuracy_final"]["per_level"][-1] > 0.20))
    return _common.finish(goals, a.strict)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
