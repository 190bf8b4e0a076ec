"""``python -m jaxweight demo lm --task countdown``: does candidate-level exploration (xDr.GRPO) find more answers?

ModeBench Countdown (:mod:`._countdown_task`): 384 train and 128 eval problems, each with 2 to 8
distinct canonical solutions ("modes"), from the paper's pool (targets 1..36, none equal to one
of the numbers; ``--pool full``: targets up to 99). The demo's ``TinyLM`` gets a supervised warm
start on the pool's single-mode problems (disjoint from both splits: it learns the format and
some arithmetic, not these problems' modes), then every arm x training seed trains in ONE
vmapped, jitted program (:mod:`._countdown_pipeline`) with the same rollout budget, on the train
split only; the arms of one training seed share its warm start and sampling keys. Evaluation is
the paper's: the final checkpoint, per eval prompt K = 8 samples at temperature 1 plus one
greedy completion, for each of the evaluation seeds: greedy pass@1, pass@8, mean@8, distinct@8
(distinct correct modes) and coverage@8 (distinct@8 / the prompt's modes).

The primary analysis (:mod:`._stats`, statsmodels and scipy: the ``stats`` extra) takes
the training run as the unit: per training seed the paired difference of two arms, then the
mean, a t interval and a Wilcoxon p over runs; mean@8 is judged flat by TOST at +-3 points;
take-off shares by Fisher's exact test. The paper's regression (seed fixed effects,
prompt-clustered errors) and the same regression clustered by prompt and run are secondary.

Default: Dr.GRPO, xDr.GRPO tau = 0.05 and its class-mean control (xDr.GRPO's weights averaged
within each reward class: the same update magnitude without the concentration), 3 training x 3
evaluation seeds; the study runs ``--train-seeds 32``. ``--sweep``: the arms of ``_args.COUNTDOWN_SWEEP_ARMS``
(xDr.GRPO at every tau of :data:`SWEEP_TAUS`, SEED-Dr.GRPO, a token-entropy bonus, the
control). Outputs under ``--out`` (default ``jaxweight-out/lm-countdown/``): ``results.json``,
``metrics.jsonl`` (every run's training diagnostics per step, the evaluation at the end) and
``countdown.png``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..._install import install_hint
from .. import _args, _common
from . import _countdown_task as C
from . import _stats as ST
from ._countdown_pipeline import (ARM_SETTINGS, METRICS, QUICK, SWEEP_TAUS, CountdownConfig,
                                  make_pipeline, make_task, warm_start)

__all__ = ["run", "main", "plot", "summary_table", "runs_table", "primary_table", "goals", "COMPARISONS"]

# the paper's signature at this scale: xDr.GRPO tau = 0.05 against Dr.GRPO (shares, not points)
BUDGET_SECONDS = 900


def _stats_available() -> bool:
    return not _common.missing_modules("statsmodels")


def _means(out: dict) -> dict:
    return {k: float(np.mean(out[k])) for k in METRICS}


def _warm_start_key(cfg: CountdownConfig, seed: int) -> dict:
    """What a warm start depends on (a kept warm start is used only where all of it is equal)."""
    return {"seed": seed, "jax": jax.__version__, **{k: getattr(cfg, k) for k in (
        "pool", "n_train", "n_eval", "split_seed", "sft_steps", "sft_batch", "sft_lr", "d_model", "n_layers", "n_heads",
        "d_ff", "train_seeds")}}


def _warm_start(cfg, task, k_sft, seed, path):
    """``(params [S, ...], final losses f32[S])``: from ``path`` where it holds this warm start, else
    trained (and kept at ``path`` when given)."""
    from ... import checkpoint

    key = _warm_start_key(cfg, seed)
    keys = jax.random.split(k_sft, cfg.train_seeds)
    if path is not None and Path(path).exists():
        try:
            if checkpoint.load_metadata(path).get("warm_start") == key:
                target = jax.eval_shape(lambda k: warm_start(cfg, task, k), keys)
                loss = jax.ShapeDtypeStruct(target[1].shape[:1], target[1].dtype)
                tree = checkpoint.load(path, {"params": target[0], "loss": loss})
                return tree["params"], np.asarray(tree["loss"])
        except checkpoint.CheckpointError:
            pass                                   # unreadable: trained again and rewritten
    ref, losses = warm_start(cfg, task, keys)
    ref = jax.block_until_ready(ref)
    if path is not None:
        checkpoint.save(path, {"params": ref, "loss": losses[:, -1]}, metadata={"warm_start": key})
    return ref, np.asarray(losses[:, -1])


def run(cfg: CountdownConfig | None = None, *, quick: bool = False, seed: int = 0, out: str | Path | None = None,
        writer: Any = None, progress: Any = None, warm_start_file: str | Path | None = None) -> dict:
    """Warm start, train every arm x training seed, evaluate; returns the results dict (``results.json``).

    Args:
      cfg: settings (default :class:`CountdownConfig`, or :data:`QUICK` with ``quick=True``).
      seed: the warm-start, training and evaluation keys derive from it (the task split from
        ``cfg.split_seed``).
      out: if given, ``results.json`` is written there.
      writer: a metrics writer (``write(step, flat_dict)``).
      progress: callable ``progress(str)`` for one line per chunk.
      warm_start_file: if given, the warm start is read from it where it holds this one (same
        settings, seed and jax), else trained and written there (runs that share it: a study's parts).
    """
    cfg = cfg or (QUICK if quick else CountdownConfig())
    t_wall = time.perf_counter()
    timer = _common.Timer()
    task = make_task(cfg)
    pipe = make_pipeline(cfg, task)
    k_sft, k_rl, k_eval = jax.random.split(jax.random.key(seed), 3)
    names = [f"{a}/s{s}" for a in cfg.arms for s in range(cfg.train_seeds)]
    with timer.section("warm_start"):
        ref, sft_loss = _warm_start(cfg, task, k_sft, seed, warm_start_file)
    with timer.section("eval"):
        # the warm-start model of each training seed, once (not tiled to the runs: with 3 arms that
        # tripled this evaluation, which costs more than compiling it for [S] models)
        base = {sp: pipe.evaluate(ref, k_eval, sp) for sp in ("train", "eval")}
    if progress:
        progress(f"warm start ({timer['warm_start']:.0f} s): base policy on the train split " + ", ".join(
            f"{k} {v:.3f}" for k, v in _means(base["train"]).items()))
    state = pipe.init(ref, k_rl)
    history: list = []
    step = 0
    while step < cfg.steps:
        n = min(cfg.chunk, cfg.steps - step)
        if n not in pipe.fns.compiled:
            with timer.section("compile"):
                pipe.fns.compiled[n] = pipe.fns.chunk_jit.lower(state, pipe.arms, pipe.train, n).compile()
        with timer.section("train"):
            state, m = pipe.chunk(state, n)
            m = jax.device_get(m)
        if writer is not None:
            for i in range(n):
                writer.write(step + i + 1, {f"{nm}/{k}": float(v[i, r]) for k, v in m.items()
                                            for r, nm in enumerate(names)})
        for j in range(0, n, max(1, cfg.chunk // 5)):
            sl = slice(j, j + max(1, cfg.chunk // 5))
            history.append({"step": step + min(j + max(1, cfg.chunk // 5), n),
                            **{k: np.asarray(v)[sl].mean(0).tolist() for k, v in m.items()}})
        step += n
        if progress:
            progress(f"step {step}/{cfg.steps}: " + ", ".join(
                f"{a} reward {np.mean(m['reward'][:, i * cfg.train_seeds:(i + 1) * cfg.train_seeds]):.3f}"
                for i, a in enumerate(cfg.arms)))
    with timer.section("eval"):
        final = pipe.evaluate(state.params, k_eval, "eval")
    if writer is not None:
        writer.write(cfg.steps, {f"{nm}/eval/{k}": float(np.mean(final[k][r])) for k in METRICS
                                 for r, nm in enumerate(names)})
    res = _results(cfg, task, base, final, history, timer, sft_loss)
    res["wall_seconds"] = time.perf_counter() - t_wall
    for arm in res["arms"].values():  # every arm ran in the one program: each arm's wall is the program's
        arm["wall_seconds"] = res["wall_seconds"]
    if out is not None:
        _common.write_results(out, res)
    res["_state"] = state
    return res


# the primary comparisons (treatment, reference), each where both arms ran
COMPARISONS = (("xdr_tau0.05", "drgrpo"), ("xdr_tau0.05", "xdr_classmean_tau0.05"), ("xdr_classmean_tau0.05", "drgrpo"))
PRIMARY_HOW = ("the training run is the unit: per training seed the paired difference of two arms' run means "
               "(same warm start, same sampling keys) over evaluation seeds and prompts; over runs the mean, "
               "Student-t CI95 (S - 1 df), two-sided t and Wilcoxon signed-rank p (scipy) and the minimum "
               "detectable effect at 80% power (statsmodels); mean@8 is flat when the 90% t interval lies inside "
               f"+-{100 * ST.TOST_MARGIN:.0f} points (TOST); a run takes off when its eval pass@8 ends >= "
               f"{100 * ST.TAKEOFF_GAIN:.0f} points above its warm start's; take-off shares compared by Fisher's "
               "exact test; all fixed in code before the 32-run study")


def _primary(cfg, per_arm: dict, arms: dict) -> dict:
    """Every comparison of :data:`COMPARISONS` whose arms ran: the run-level analysis per metric."""
    out = {}
    for t, r in COMPARISONS:
        if t in cfg.arms and r in cfg.arms:
            i, j = cfg.arms.index(t), cfg.arms.index(r)
            c = {k: ST.paired_runs(per_arm[k][i], per_arm[k][j]) for k in METRICS}
            c["mean_at_8"]["tost"] = ST.tost(per_arm["mean_at_8"][i], per_arm["mean_at_8"][j])
            c["takeoff_fisher"] = ST.fisher(arms[t]["takeoff"], arms[r]["takeoff"])
            out[f"{t} - {r}"] = c
    return out


def _results(cfg, task, base, final, history, timer, sft_loss) -> dict:
    a_n, s_n = len(cfg.arms), cfg.train_seeds
    per_arm = {k: np.asarray(final[k], np.float64).reshape(a_n, s_n, cfg.eval_seeds, -1) for k in METRICS}
    stats = _stats_available()
    arms = {}
    for i, a in enumerate(cfg.arms):
        st = ARM_SETTINGS[a]
        r = {k: ST.summarise(per_arm[k][i]) for k in METRICS}
        arm = {k: v["mean"] for k, v in r.items()}
        arm["per_seed"] = {k: v["per_seed"] for k, v in r.items()}
        arm["per_seed_pair"] = {k: v["per_seed_pair"] for k, v in r.items()}
        arm["settings"] = {"xdr": st.xdr, "tau": st.tau if st.xdr else None, "seed_grpo": st.seed,
                           "entropy_coef": cfg.entropy_coef if st.entropy else 0.0, "class_mean": st.classmean,
                           "positive_class": st.positive, "maxent_step": st.maxent, "lr_scale": st.lr_scale,
                           "graded_reward": st.graded}
        arm["effect_vs_drgrpo"] = arm["effect_vs_drgrpo_across_runs"] = arm["effect_vs_drgrpo_run_clustered"] = None
        if a != "drgrpo" and "drgrpo" in cfg.arms and stats:
            b = cfg.arms.index("drgrpo")
            arm["effect_vs_drgrpo"] = {k: ST.effect(per_arm[k][i], per_arm[k][b]) for k in METRICS}
            arm["effect_vs_drgrpo_across_runs"] = {k: ST.effect_across_runs(per_arm[k][i], per_arm[k][b])
                                                   for k in METRICS}
            arm["effect_vs_drgrpo_run_clustered"] = {k: ST.effect_run_clustered(per_arm[k][i], per_arm[k][b])
                                                     for k in METRICS}
        if stats:
            arm["takeoff"] = ST.takeoff(per_arm["pass_at_8"][i], np.asarray(base["eval"]["pass_at_8"]))
        sl = slice(i * s_n, (i + 1) * s_n)
        trace = {k: [float(np.mean(h[k][sl])) for h in history] for k in (history[0] if history else {})
                 if k != "step"}
        trace["steps"] = [h["step"] for h in history]
        arm["trace"] = trace
        arms[a] = arm
    base_summary = {sp: {k: float(np.mean(v[k])) for k in METRICS} | {
        "per_seed": {k: np.asarray(v[k]).mean((1, 2)).tolist() for k in METRICS}} for sp, v in base.items()}
    return {
        "task": "countdown", "config": {**dataclasses.asdict(cfg), "arms": list(cfg.arms)},
        "primary": _primary(cfg, per_arm, arms) if stats else None,
        "split": {"train": C.summary(task.train), "eval": C.summary(task.eval), "warm_start": C.summary(task.sft),
                  "how": "train and eval are disjoint draws (by numbers and target) from the problems with 2-8 "
                         "modes; the warm start uses the single-mode problems, disjoint from both"},
        "warm_start": {"base_policy": base_summary, "sft_loss_final": sft_loss.tolist(),
                       "note": "the warm-start model of each training seed, evaluated like the final checkpoints "
                               "(mean_at_8 is its success rate, coverage_at_8 the share of modes it finds)"},
        "arms": arms,
        "primary_how": PRIMARY_HOW,
        "effects": ("secondary: regression per metric: Y = a + gamma 1{arm} + training-seed FE + evaluation-seed FE, "
                    "OLS, standard errors clustered by eval prompt (statsmodels); estimates are shares "
                    "(x 100 = points); effect_vs_drgrpo_across_runs: the robustness check with the training "
                    "run as the unit, the paired run-mean differences per training seed, mean and Student-t "
                    "CI95 with S - 1 df (statsmodels OLS on a constant); effect_vs_drgrpo_run_clustered: the same "
                    "regression with standard errors clustered two ways, by prompt and by training run")
        if stats else f"statsmodels missing: {install_hint('stats')}",
        "rollouts_per_run": cfg.steps * cfg.prompts * cfg.generations,
        "runs": cfg.runs, "steps": cfg.steps,
        "warm_start_seconds": timer["warm_start"], "compile_seconds": timer["compile"],
        "train_seconds": timer["train"], "eval_seconds": timer["eval"],
        "seconds_per_step": timer["train"] / max(cfg.steps, 1),
        "device": str(jax.devices()[0].platform), "jax": jax.__version__,
    }


# ===================================================================== report
def _fmt_effect(e: dict | None, k: str) -> str:
    if not e:
        return ""
    x = e[k]
    if x["ci95"] is None:
        return f"{100 * x['estimate']:+.1f}"
    return f"{100 * x['estimate']:+.1f} [{100 * x['ci95'][0]:+.1f}, {100 * x['ci95'][1]:+.1f}]"


def _table(rows: list) -> str:
    """Rows of strings as aligned text: the first column left, the rest right; a rule under the head."""
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([fmt(rows[0]), fmt(["-" * x for x in w])] + [fmt(r) for r in rows[1:]])


def runs_table(res: dict) -> str:
    """Per arm: the paper's regression vs Dr.GRPO with standard errors clustered by prompt and by
    training run (two-way), in points: the secondary analysis beside the prompt-clustered one."""
    rows = [["arm (regression, prompt x run clusters)", "d pass@8 (pts)", "d coverage@8", "d mean@8", "runs"]]
    for a, r in res["arms"].items():
        e = r.get("effect_vs_drgrpo_run_clustered")
        if e:
            rows.append([a] + [_fmt_effect(e, k) for k in ("pass_at_8", "coverage_at_8", "mean_at_8")]
                        + [str(e["pass_at_8"]["runs"])])
    if len(rows) == 1:
        return ""
    return _table(rows)


def summary_table(res: dict) -> str:
    """Per arm: the five metrics (means over seeds) and the effects vs Dr.GRPO in points [CI95]."""
    head = ["arm", "pass@1", "pass@8", "mean@8", "distinct@8", "coverage@8", "d pass@8 (pts)", "d coverage@8",
            "d mean@8"]
    rows = [head]
    for a, r in res["arms"].items():
        e = r["effect_vs_drgrpo"]
        rows.append([a] + [f"{r[k]:.3f}" for k in METRICS] + [_fmt_effect(e, k) for k in
                                                               ("pass_at_8", "coverage_at_8", "mean_at_8")])
    return _table(rows)


def _fmt_primary(c: dict | None) -> str:
    if not c:
        return ""
    if c["ci95"] is None:
        return f"{100 * c['estimate']:+.1f}"
    w = f"{c['p_wilcoxon']:.3f}" if c["p_wilcoxon"] is not None else "-"
    return (f"{100 * c['estimate']:+.1f} [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}] "
            f"p {c['p_t']:.3f}/W {w}")


def primary_table(res: dict) -> str:
    """The primary analysis: per comparison the run-level paired effects in points, mean@8's TOST,
    the take-off shares and Fisher's p."""
    pr = res.get("primary") or {}
    if not pr:
        return ""
    rows = [["comparison (runs as the unit)", "d pass@8 [CI95] p t/Wilcoxon", "d coverage@8", "d mean@8 TOST 90% CI",
             "take-off", "Fisher p", "MDE80 pass@8/cov@8", "runs"]]
    for name, c in pr.items():
        t, r = name.split(" - ")
        m8 = c["mean_at_8"]["tost"]
        ci = (f"[{100 * m8['ci90'][0]:+.1f}, {100 * m8['ci90'][1]:+.1f}] " if m8["ci90"] else "") + (
            "flat" if m8["flat"] else "not flat")
        to = (f"{res['arms'][t]['takeoff']['took_off']}/{res['arms'][t]['takeoff']['runs']} vs "
              f"{res['arms'][r]['takeoff']['took_off']}/{res['arms'][r]['takeoff']['runs']}")
        mde = "/".join(f"{100 * c[k]['mde80']:.1f}" if c[k]["mde80"] is not None else "-"
                       for k in ("pass_at_8", "coverage_at_8"))
        rows.append([name, _fmt_primary(c["pass_at_8"]), _fmt_primary(c["coverage_at_8"]), ci, to,
                     f"{c['takeoff_fisher']['p']:.3f}", mde, str(c["pass_at_8"]["runs"])])
    return _table(rows)


def _above_zero(c: dict) -> bool:
    return c["ci95"] is not None and c["ci95"][0] > 0


def goals(res: dict) -> list:
    """The study's goals, on the primary (run-level) analysis: xDr.GRPO tau = 0.05 against Dr.GRPO
    with CI95 above 0 on coverage@8 and pass@8, mean@8 flat by TOST, and the gain surviving the
    class-mean control (xDr.GRPO against its class-mean control, CI95 above 0); only the
    comparisons that ran."""
    pr = res.get("primary") or {}
    out = []
    c = pr.get("xdr_tau0.05 - drgrpo")
    if c:
        for k, name in (("coverage_at_8", "coverage@8"), ("pass_at_8", "pass@8")):
            out.append((f"xDr.GRPO - Dr.GRPO {name}: run-level CI95 above 0 (measured {_fmt_primary(c[k])} over "
                        f"{c[k]['runs']} runs)", _above_zero(c[k])))
        m8 = c["mean_at_8"]["tost"]
        out.append((f"mean@8 flat: TOST 90% interval inside +-{100 * m8['margin']:.0f} points (measured "
                    f"{_fmt_primary(c['mean_at_8'])})", m8["flat"]))
    c = pr.get("xdr_tau0.05 - xdr_classmean_tau0.05")
    if c:
        out.append(("the gain survives the class-mean control: xDr.GRPO - class-mean control, pass@8 and "
                    f"coverage@8 run-level CI95 above 0 (measured {_fmt_primary(c['pass_at_8'])}; "
                    f"{_fmt_primary(c['coverage_at_8'])})", _above_zero(c["pass_at_8"]) and
                    _above_zero(c["coverage_at_8"])))
    return out


def plot(plt, res: dict):
    """Coverage@8, pass@8 and mean@8 against tau (intervals: Dr.GRPO's mean + the effect's CI95), and the
    training diagnostics against steps."""
    fig, ax = plt.subplots(3, 3, figsize=(17, 12.5))
    arms = res["arms"]
    labels = [f"{t:g}" for t in SWEEP_TAUS] + ["inf\n(Dr.GRPO)", "SEED", "token\nentropy", "0.05\nclass-mean"]
    pos = {**{f"xdr_tau{t:g}": i for i, t in enumerate(SWEEP_TAUS)}, "drgrpo": len(SWEEP_TAUS),
           "seed_drgrpo": len(SWEEP_TAUS) + 1, "entropy_bonus": len(SWEEP_TAUS) + 2,
           "xdr_classmean_tau0.05": len(SWEEP_TAUS) + 3}
    for name in arms:  # the other arms after these, in their order
        if name not in pos:
            pos[name] = len(labels)
            labels.append(name.replace("_", "\n", 1))
    base = arms.get("drgrpo")
    for j, k in enumerate(("coverage_at_8", "pass_at_8", "mean_at_8")):
        a_ = ax[0, j]
        if base is not None:
            a_.axhline(base[k], color="k", ls=":", lw=1, label="Dr.GRPO")
        for name, r in arms.items():
            e = r["effect_vs_drgrpo"]
            col = "tab:blue" if ARM_SETTINGS[name][0] else "tab:gray"
            if e and base is not None:
                lo, hi = base[k] + e[k]["ci95"][0], base[k] + e[k]["ci95"][1]
                a_.errorbar(pos[name], r[k], yerr=[[r[k] - lo], [hi - r[k]]], fmt="o", color=col, capsize=4)
            else:
                a_.plot(pos[name], r[k], "o", color=col)
            er = (r.get("effect_vs_drgrpo_across_runs") or {}).get(k)
            if er and er["ci95"] is not None and base is not None:  # the training run as the unit: wider
                lo, hi = base[k] + er["ci95"][0], base[k] + er["ci95"][1]
                a_.errorbar(pos[name] + 0.25, r[k], yerr=[[r[k] - lo], [hi - r[k]]], fmt="o", mfc="none",
                            color=col, capsize=3, ls="none", lw=1)
            a_.plot([pos[name]] * len(r["per_seed"][k]), r["per_seed"][k], ".", color=col, alpha=0.4)
        a_.set_xticks(range(len(labels)), labels, fontsize=8)
        a_.set(title=f"eval {k.replace('_at_', '@')}", xlabel="xDr.GRPO tau")
        a_.legend(fontsize=7)
    for i, (name, r) in enumerate(arms.items()):
        t, col = r["trace"], f"C{i}"
        for a_, k in zip(ax[1], ("effective_candidates", "incorrect_mass", "token_entropy")):
            a_.plot(t["steps"], t[k], color=col, label=name)
        ax[1, 2].plot(t["steps"], t["distinct_at_G"], "--", color=col, alpha=0.7, label=f"{name} distinct@G")
    for a_, tt in zip(ax[1], ("effective candidates exp H(w) (informative groups)", "incorrect-mass share of w",
                              "token entropy (solid); distinct correct modes per group of G (dashed)")):
        a_.set(title=tt, xlabel="step")
        a_.legend(fontsize=6)
    pr = res.get("primary") or {}
    for j, k in enumerate(("pass_at_8", "coverage_at_8", "mean_at_8")):
        a_ = ax[2, j]
        a_.axhline(0, color="k", lw=0.8)
        if k == "mean_at_8":
            a_.axhspan(-100 * ST.TOST_MARGIN, 100 * ST.TOST_MARGIN, color="tab:green", alpha=0.1,
                       label="TOST band")
        for i, (name, c) in enumerate(pr.items()):
            d = 100 * np.asarray(c[k]["per_run"])
            jitter = (np.arange(d.size) % 7 - 3) * 0.03
            a_.plot(i + jitter, d, ".", alpha=0.5)
            if c[k]["ci95"] is not None:
                a_.errorbar(i + 0.3, 100 * c[k]["estimate"], yerr=[[100 * (c[k]["estimate"] - c[k]["ci95"][0])],
                                                                   [100 * (c[k]["ci95"][1] - c[k]["estimate"])]],
                            fmt="s", color="k", capsize=4)
        a_.set_xticks(range(len(pr)), [n.replace("xdr_classmean_tau0.05", "control").replace(" - ", "\n- ")
                                       for n in pr], fontsize=7)
        a_.set(title=f"eval {k.replace('_at_', '@')}: paired run differences", ylabel="points")
        if k == "mean_at_8":
            a_.legend(fontsize=7)
    fig.suptitle("final checkpoints; top: bars Dr.GRPO's mean + the arm's effect CI95 (filled: seed FE, prompt-clustered; "
                 "hollow, right: across training runs, t with S - 1 df), small dots: training seeds; bottom: the primary "
                 "analysis, one dot per training seed, squares the mean and its t CI95", fontsize=9)
    fig.tight_layout()
    return fig


def _study(a, cfg, out: Path, log) -> int:
    from . import _countdown_study as S

    ref = Path(a.reference or S.REFERENCE)
    if not ref.exists():
        print(f"demo lm --task countdown --study: the recorded study {ref} is not there: run from the repository "
              "root or pass --reference FILE", file=sys.stderr)
        return 2
    parts = None if a.study_parts is None else [int(q) for q in a.study_parts]
    study = S.run_study(cfg, seed=a.seed, out=out, reference=ref, run=run, log=log, parts=parts)
    an = study["analysis"]
    print(f"demo lm --task countdown --study: parts {an['finished_parts']} of {an['planned_parts']} finished; "
          f"pairing checks {an['pairing_checks']}")
    for name, c in an["comparisons"].items():
        print(f"  {name} ({c['role']}): pass@8 {_fmt_primary(c['pass_at_8'])}; coverage@8 "
              f"{_fmt_primary(c['coverage_at_8'])}; mean@8 {_fmt_primary(c['mean_at_8'])}")
    for q, v in an["answers"].items():
        print(f"  {q}: {v}")
    print(f"wrote {out / 'study.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _args.parser("lm-countdown")
    a = _args.parse("lm-countdown", argv)  # bad values: one line, exit 2
    _common.require_extra("statsmodels", "stats", "demo lm --task countdown")
    cfg = QUICK if a.quick else CountdownConfig()
    over = {"pool": a.pool, "steps": a.steps, "train_seeds": a.train_seeds, "eval_seeds": a.eval_seeds, "prompts": a.prompts,
            "generations": a.generations, "lr": a.lr, "sft_steps": a.sft_steps, "entropy_coef": a.entropy_coef}
    over = {k: v for k, v in over.items() if v is not None}
    if a.sweep:
        over["arms"] = _args.COUNTDOWN_SWEEP_ARMS
    if a.arms is not None:
        over["arms"] = tuple(a.arms)
    cfg = _common.replace_config(p, cfg, over)
    out = _common.out_dir(a)
    log = _common.line_logger(a)
    if a.study:
        return _study(a, cfg, out, log)
    with _common.metrics_writer(a) as w:
        res = run(cfg, seed=a.seed, out=out, writer=w, progress=log)
    res.pop("_state", None)
    png = _common.save_plot(lambda plt: plot(plt, res), out / "countdown.png")
    b = res["warm_start"]["base_policy"]
    print(f"demo lm --task countdown: {cfg.runs} runs ({len(cfg.arms)} arms x {cfg.train_seeds} training seeds) "
          f"in one program, {cfg.steps} steps of {cfg.prompts} prompts x {cfg.generations} completions; "
          f"{cfg.eval_seeds} evaluation seeds; wall {res['wall_seconds']:.0f} s (warm start "
          f"{res['warm_start_seconds']:.0f} s, compile {res['compile_seconds']:.0f} s, training "
          f"{res['train_seconds']:.0f} s, evaluation {res['eval_seconds']:.0f} s)")
    print(f"warm-start policy (train split): success (mean@8) {b['train']['mean_at_8']:.3f}, pass@8 "
          f"{b['train']['pass_at_8']:.3f}, coverage@8 {b['train']['coverage_at_8']:.3f}; eval split: mean@8 "
          f"{b['eval']['mean_at_8']:.3f}, coverage@8 {b['eval']['coverage_at_8']:.3f}")
    pt = primary_table(res)
    if pt:
        print("primary analysis (the training run as the unit; effects in points):")
        print(pt)
    print("per arm (means over runs) and the paper's prompt-clustered regression (secondary):")
    print(summary_table(res))
    rt = runs_table(res)
    if rt:
        print(rt)
    if a.sweep:
        print(f"--sweep: {len(cfg.arms)} arms x {cfg.train_seeds} training seeds ran in {res['wall_seconds']:.0f} s "
              f"({res['wall_seconds'] / 60:.1f} minutes) on {res['device']}")
    print(f"wrote {out / 'results.json'}, {out / 'metrics.jsonl'}" + (f", {png}" if png is not None else ""))
    gl = goals(res) if not a.quick else []
    if not a.quick and cfg == CountdownConfig():        # the budget is the default run's
        gl.append((f"the default run finishes within {BUDGET_SECONDS // 60} minutes (measured "
                   f"{res['wall_seconds']:.0f} s)", res["wall_seconds"] <= BUDGET_SECONDS))
    return _common.finish(gl, a.strict)
