"""Benchmarks of jaxweight.maxent: the fused MaxEnt-GRPO weighting step.

Rows (P x G = 1024 x 64 prompts x generations, CPU):

1. ``fused_step``: one jitted :func:`jaxweight.maxent.step` (advantages,
   q, weights, entropy stats, ESS, max weight, zero-std fraction, tau and beta
   controller updates); goal <= 0.5 ms median; compile time reported separately.
2. ``vs_per_group_loop``: the same quantities computed the way maxent_grpo's
   ``compute_weight_stats`` does, a Python loop over groups building per-group
   lists / small arrays; goal >= 50x.
3. ``vs_numpy_vectorised``: a straightforward vectorised NumPy float32 version
   of the same math on the dense masked arrays; goal >= 2x.
4. ``sweep_vmap_64``: ``jax.vmap`` of the fused step over 64 (tau, beta,
   q temperature) settings in one call; goal: cost per setting <= one step.
5. ``vs_floor``: the same math written as one minimal jitted function
   (:func:`floor_step`: no checks, no overflow-safe scaling, no diagnostics
   beyond the step's main outputs), timed alternately with the step returning
   the same outputs in the same run; goal: step <= 1.3x its floor.

Both baselines are written here (not copied from maxent_grpo) and checked
against jaxweight's outputs before timing.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import main, record, time_call, time_jax  # noqa: E402

from jaxweight import maxent as M  # noqa: E402

MODULE = "maxent"
TAU, BETA, DENOM = 0.5, 0.04, 0.5
Q_T, Q_EPS, EPS = 0.7, 1e-6, 1e-4
SCHED = M.TauSchedule(target_entropy=3.0, learning_rate=0.1, minimum_value=0.05, maximum_value=2.0,
                      warmup_steps=0)
KL = M.KLController(target=0.05, horizon=10, step_size=0.2)
CFG = M.config(TAU, BETA, q_temperature=Q_T, q_epsilon=Q_EPS, eps=EPS, schedule=SCHED, kl=KL)


def make_batch(p: int, g: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    u = (rng.integers(0, 2, (p, g)) + rng.normal(0, 0.1, (p, g))).astype(np.float32)
    u[rng.uniform(size=(p, g)) < 0.002] = np.nan  # a few failed reward calls
    u[: p // 8] = 1.0  # some zero-std groups
    ref = (-rng.uniform(0.1, 3.0, (p, g))).astype(np.float32)
    tok = rng.integers(1, 512, (p, g)).astype(np.float32)
    mask = rng.uniform(size=(p, g)) > 0.05  # ragged groups
    return u, ref, tok, mask


# ---------------------------------------------------------------- baselines
def per_group_loop(u, ref, tok, mask):
    """maxent_grpo style: Python lists per group, small arrays per group, a loop over groups."""
    groups, refs, toks = [], [], []
    for i in range(u.shape[0]):  # regroup the flat batch into per-prompt lists
        keep = [j for j in range(u.shape[1]) if mask[i, j] and math.isfinite(float(u[i, j]))]
        groups.append([float(u[i, j]) for j in keep])
        refs.append([float(ref[i, j]) for j in keep])
        toks.append([float(tok[i, j]) for j in keep])
    flat = [x for grp in groups for x in grp]
    mean_all = sum(flat) / max(len(flat), 1)
    std_all = math.sqrt(sum((x - mean_all) ** 2 for x in flat) / max(len(flat), 1))
    adv, weights, ents, ess, zero = [], [], [], [], 0
    max_w = 0.0
    for grp, lp, tk in zip(groups, refs, toks):
        n = len(grp)
        if n == 0:
            adv.append([])
            weights.append([])
            continue
        r = np.asarray(grp, np.float32)
        mu = r.mean()
        sd = r.std(ddof=1) if n > 1 else 0.0
        adv.append(((r - mu) / (sd + EPS)).tolist() if n > 1 else [0.0] * n)
        zero += int(r.std() <= 1e-8)
        z = r / max(Q_T, 1e-8)
        e = np.exp(z - z.max())
        q = e / e.sum()
        eps = min(max(Q_EPS, 0.0), 1.0 / n - 1e-8)
        q = q * (1 - eps * n) + eps
        q = q / max(q.sum(), 1e-12)
        s = (np.log(np.clip(q, 1e-12, None)) + BETA * np.asarray(lp, np.float32)) / DENOM
        w = np.exp(s - s.max())
        w = w / w.sum()
        w = w * np.clip(np.asarray(tk, np.float32), 1.0, None)
        w = w / w.sum()
        weights.append(w.tolist())
        ents.append(float(-(w * np.log(np.clip(w, 1e-12, None))).sum()))
        ess.append(float(w.sum() ** 2 / (w * w).sum()))
        max_w = max(max_w, float(w.max()))
    h = sum(ents) / max(len(ents), 1)
    return adv, weights, h, min(ents), max(ents), ess, max_w, zero / max(len(ents), 1), mean_all, std_all


def numpy_vectorised(u, ref, tok, mask):
    """The same math on dense masked float32 arrays with NumPy."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        valid = mask & np.isfinite(u)
        n = valid.sum(1, dtype=np.float32)
        u0 = np.where(valid, u, np.float32(0))
        mean = u0.sum(1) / np.maximum(n, 1)
        c = np.where(valid, u0 - mean[:, None], np.float32(0))
        ss = (c * c).sum(1)
        std = np.where(n > 1, np.sqrt(ss / np.maximum(n - 1, 1)), 0).astype(np.float32)
        adv = np.where(valid & (n > 1)[:, None], c / (std + np.float32(EPS))[:, None], np.float32(0))
        pop = np.sqrt(ss / np.maximum(n, 1))
        nonempty = n > 0
        frac_zero = ((pop <= 1e-8) & nonempty).sum() / max(nonempty.sum(), 1)
        N = n.sum()
        mean_all = u0.sum() / max(N, 1)
        std_all = np.sqrt(np.where(valid, (u0 - mean_all) ** 2, 0).sum() / max(N, 1))
        umax = np.where(valid, u0, -np.inf).max(1, keepdims=True)
        umax = np.where(np.isfinite(umax), umax, 0)
        e = np.where(valid, np.exp((u0 - umax) / np.float32(max(Q_T, 1e-8))), np.float32(0))
        eps = np.clip(Q_EPS, 0, np.where(n > 0, 1 / np.maximum(n, 1) - 1e-8, 0))[:, None]
        q = np.where(valid, e / e.sum(1, keepdims=True) * (1 - eps * n[:, None]) + eps, np.float32(0))
        q = q / np.maximum(q.sum(1, keepdims=True), 1e-12)
        s = np.where(valid, (np.log(np.maximum(q, 1e-12)) + BETA * ref) / DENOM, -np.inf)
        w = np.where(valid, np.exp(s - s.max(1, keepdims=True)), np.float32(0))
        w = w / np.maximum(w.sum(1, keepdims=True), 1e-12)
        w = w * np.maximum(tok, 1)
        w = np.where(nonempty[:, None], w / np.maximum(w.sum(1, keepdims=True), 1e-12), 0).astype(np.float32)
        ent = -(w * np.log(np.maximum(w, 1e-12))).sum(1)
        ess = np.where(nonempty, w.sum(1) ** 2 / (w * w).sum(1), 0)
        h = ent[nonempty].mean()
        return adv, q, w, h, ent[nonempty].min(), ent[nonempty].max(), ess, w.max(), frac_zero, mean_all, std_all


def floor_step(state, u, ref, tok, mask):
    """The step's math written minimally: advantages, q, weights, entropy, ESS, the two controllers.

    Only the masks the math needs (masked-out and NaN rewards); the settings are
    Python constants; no shape checks, no power-of-two scaling of the moments,
    no normalised entropy, no weight advantages, no counts of bad entries.
    """
    valid = mask & jnp.isfinite(u)
    n = jnp.sum(valid, axis=1, dtype=jnp.float32)
    u0 = jnp.where(valid, u, 0.0)
    mean = jnp.sum(u0, axis=1) / jnp.maximum(n, 1.0)
    c = jnp.where(valid, u0 - mean[:, None], 0.0)
    ss = jnp.sum(c * c, axis=1)
    std = jnp.sqrt(ss / jnp.maximum(n - 1.0, 1.0))
    adv = jnp.where(valid & (n > 1)[:, None], c / (std + EPS)[:, None], 0.0)
    nonempty = n > 0
    zero = nonempty & (jnp.sqrt(ss / jnp.maximum(n, 1.0)) <= 1e-8)
    umax = jnp.max(jnp.where(valid, u, -jnp.inf), axis=1, keepdims=True)
    e = jnp.where(valid, jnp.exp((u0 - umax) / Q_T), 0.0)
    eps = jnp.minimum(Q_EPS, 1.0 / jnp.maximum(n, 1.0) - 1e-8)[:, None]
    q = jnp.where(valid, e / jnp.sum(e, axis=1, keepdims=True) * (1.0 - eps * n[:, None]) + eps, 0.0)
    q = q / jnp.maximum(jnp.sum(q, axis=1, keepdims=True), 1e-12)
    s = jnp.where(valid, (jnp.log(jnp.maximum(q, 1e-12)) + state.beta * ref) / state.denom, -jnp.inf)
    z = s - jnp.max(s, axis=1, keepdims=True)
    tk = jnp.maximum(tok, 1.0)
    ew = jnp.where(valid, jnp.exp(z) * tk, 0.0)
    tot = jnp.sum(ew, axis=1, keepdims=True)
    w = ew / tot
    lw = jnp.where(valid, z + jnp.log(tk) - jnp.log(tot), 0.0)
    ent = -jnp.sum(w * jnp.maximum(lw, math.log(1e-12)), axis=1)
    ess = jnp.sum(w, axis=1) ** 2 / jnp.sum(w * w, axis=1)
    rows = jnp.sum(nonempty)
    h = jnp.sum(jnp.where(nonempty, ent, 0.0)) / rows
    # tau controller (target 3.0, lr 0.1, bounds [0.05, 2], past warmup), then the KL rule at KL = 0.07
    ema0 = jnp.where(state.has_entropy_ema, state.entropy_ema, h)
    ema = 0.9 * ema0 + 0.1 * h
    tau = jnp.clip(jnp.exp(state.log_tau + 0.1 * (3.0 - ema)), 0.05, 2.0)
    f = 1.0 + jnp.clip(0.07 / 0.05 - 1.0, -0.2, 0.2) / 10.0
    new = state.replace(tau=tau, denom=tau, log_tau=jnp.log(tau), beta=state.beta * f, entropy_ema=ema,
                        current_target=jnp.float32(3.0), has_entropy_ema=jnp.bool_(True),
                        has_target=jnp.bool_(True))
    stats = (jnp.min(jnp.where(nonempty, ent, jnp.inf)), jnp.max(jnp.where(nonempty, ent, -jnp.inf)),
             jnp.sum(jnp.where(nonempty, ess, 0.0)) / rows, jnp.max(w), jnp.sum(zero) / rows,
             jnp.sum(u0) / jnp.sum(n))
    return new, (adv, q, w, ent, ess, h, stats)


def _floor_outputs(*a):
    """The step returning what :func:`floor_step` returns (XLA drops the outputs nobody reads,
    as in a training step that uses only these)."""
    new, o = _fused(*a)
    return new, (o.advantages, o.q, o.weights, o.entropy.per_group, o.ess, o.entropy.mean,
                 (o.entropy.min, o.entropy.max, o.ess_mean, o.max_weight, o.frac_zero_std, o.mean, o.std))


def _fused(state, u, ref, tok, mask, temp, normalize_by_tokens=True):
    """``maxent.step`` with the q temperature swept (an array leaf of the config)."""
    cfg = CFG.replace(q_temperature=temp, normalize_by_tokens=normalize_by_tokens)
    return M.step(state, u, ref, cfg, token_counts=tok, mask=mask, global_step=5, measured_kl=0.07)


def _interleaved(fns: dict, n: int) -> dict:
    """Median seconds of each compiled call, alternating between them so load changes hit all alike."""
    times = {k: [] for k in fns}
    for _ in range(n):
        for k, (f, args) in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _check(u, ref, tok, mask, out):
    """The baselines compute the same numbers as the fused step (before timing them)."""
    np_out = numpy_vectorised(u, ref, tok, mask)
    np.testing.assert_allclose(np_out[0], out.advantages, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np_out[2], out.weights, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np_out[3], out.entropy.mean, rtol=1e-4)
    loop = per_group_loop(u[:64], ref[:64], tok[:64], mask[:64])
    _, sub = jax.jit(_fused)(M.init(CFG), u[:64], ref[:64], tok[:64], mask[:64], Q_T)
    np.testing.assert_allclose(loop[2], sub.entropy.mean, rtol=1e-4)
    got = np.asarray(sub.weights)[0][np.asarray(sub.valid)[0]]
    np.testing.assert_allclose(loop[1][0], got, rtol=1e-4, atol=1e-7)


def run(quick: bool = False) -> list[dict]:
    p, g = 1024, 64
    size = f"P={p} G={g}"
    u, ref, tok, mask = make_batch(p, g)
    ju, jref, jtok, jmask = (jnp.asarray(x) for x in (u, ref, tok, mask))
    state = M.init(CFG)
    temp = jnp.float32(Q_T)
    new, out = jax.jit(_fused)(state, ju, jref, jtok, jmask, temp)
    _check(u, ref, tok, mask, out)
    floor = jax.jit(floor_step)
    f_new, f_out = floor(state, ju, jref, jtok, jmask)  # the floor computes the same numbers
    np.testing.assert_allclose(f_out[0], out.advantages, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(f_out[2], out.weights, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(f_out[5], out.entropy.mean, rtol=1e-5)
    np.testing.assert_allclose([f_new.tau, f_new.beta], [new.tau, new.beta], rtol=1e-5)

    # a fresh wrapper, so the compile time is really measured
    fused = jax.jit(lambda *a: _fused(*a))
    n_fast = 100 if quick else 400
    t_step = time_jax(fused, state, ju, jref, jtok, jmask, temp, n=n_fast, warmup=20)
    t_notok = time_jax(jax.jit(lambda *a: _fused(*a, normalize_by_tokens=False)), state, ju, jref, jtok, jmask,
                       temp, n=n_fast, warmup=20)
    t_loop = time_call(lambda: per_group_loop(u, ref, tok, mask), n=2 if quick else 5)
    t_np = time_call(lambda: numpy_vectorised(u, ref, tok, mask), n=30 if quick else 100, warmup=3)

    settings = 64
    rng = np.random.default_rng(1)
    taus = jnp.asarray(np.exp(rng.uniform(np.log(0.05), np.log(2.0), settings)), jnp.float32)
    betas = jnp.asarray(rng.uniform(0.0, 0.2, settings), jnp.float32)
    temps = jnp.asarray(rng.uniform(0.2, 2.0, settings), jnp.float32)
    states = jax.vmap(lambda t, b: M.init(CFG.replace(tau=t, beta=b)))(taus, betas)
    # outputs that do not depend on (tau, beta, temperature) are returned once, not 64 times
    out_axes = M.MaxEntStepOutput(advantages=None, q=0, weights=0, entropy=0, ess=0, ess_mean=0, max_weight=0,
                                  frac_zero_std=None, zero_std=None, mean=None, std=None, n_nonfinite=None,
                                  n_invalid=None, valid=None, kl=None, tau=0, beta=0, entropy_target=0,
                                  has_kl=None, has_entropy_target=0)
    sweep = jax.jit(jax.vmap(_fused, in_axes=(0, None, None, None, None, 0), out_axes=(0, out_axes)))
    t_sweep = time_jax(sweep, states, ju, jref, jtok, jmask, temps, n=3, warmup=1)  # compile time

    def summary(*a):
        new, o = _fused(*a)
        return o.entropy, o.ess_mean, o.max_weight, new

    sweep_summary = jax.jit(jax.vmap(summary, in_axes=(0, None, None, None, None, 0)))
    # the ratio is what counts: time the sweep and single steps alternately
    single_args = (state, ju, jref, jtok, jmask, temp)
    sweep_args = (states, ju, jref, jtok, jmask, temps)
    c_single = fused.lower(*single_args).compile()
    c_sweep = sweep.lower(*sweep_args).compile()
    c_summary = sweep_summary.lower(*sweep_args).compile()
    for f, a in ((c_single, single_args), (c_sweep, sweep_args), (c_summary, sweep_args)):
        jax.block_until_ready(f(*a))

    def singles():  # as many single steps as one sweep has settings would take too long: 8
        for _ in range(8):
            r = c_single(*single_args)
        return r

    med = _interleaved({"single": (singles, ()), "sweep": (c_sweep, sweep_args),
                        "summary": (c_summary, sweep_args)}, n=8 if quick else 25)
    single_il = med["single"] / 8
    per_setting = med["sweep"] / settings

    # step against its floor: alternate the compiled calls so load changes hit all alike
    f_args = (state, ju, jref, jtok, jmask)
    c_floor = floor.lower(*f_args).compile()
    c_same = jax.jit(_floor_outputs).lower(*single_args).compile()
    for f, a in ((c_floor, f_args), (c_same, single_args)):
        jax.block_until_ready(f(*a))
    fl = _interleaved({"all": (c_single, single_args), "step": (c_same, single_args), "floor": (c_floor, f_args)},
                      n=100 if quick else 400)

    return [
        record(MODULE, "fused_step", size, t_step.median, "target 0.5 ms", 0.5e-3,
               goal="<= 0.5 ms median", met=t_step.median <= 0.5e-3, compile_s=t_step["compile_s"],
               q25_s=t_step["q25_s"], q75_s=t_step["q75_s"], min_s=t_step["min_s"], n=t_step["n"],
               note=f"one jitted maxent.step incl. tau+KL controller updates; compile {t_step['compile_s']:.2f} s; "
                    f"q25..q75 {t_step['q25_s'] * 1e3:.3f}..{t_step['q75_s'] * 1e3:.3f} ms"),
        record(MODULE, "vs_per_group_loop", size, t_step.median, "python loop over groups", t_loop.median,
               goal=">= 50x", met=t_loop.median / t_step.median >= 50,
               note="maxent_grpo-style per-group lists and small NumPy arrays"),
        record(MODULE, "vs_numpy_vectorised", size, t_step.median, "numpy vectorised f32", t_np.median,
               goal=">= 2x", met=t_np.median / t_step.median >= 2),
        record(MODULE, "sweep_vmap_64", f"{size} x 64 settings", per_setting, "one fused step", single_il,
               goal="per setting <= one step", met=per_setting <= single_il,
               compile_s=t_sweep["compile_s"], sweep_total_s=med["sweep"],
               note=f"vmap over (tau, beta, q temperature), q/weights/entropy outputs [64, P, G]: "
                    f"{med['sweep'] * 1e3:.2f} ms for 64 settings ({per_setting * 1e3:.3f} ms each vs {single_il * 1e3:.3f} ms single, timed "
                    f"alternately); returning only the diagnostics: {med['summary'] / settings * 1e3:.3f} ms each"),
        record(MODULE, "vs_floor", size, fl["step"], "floor (same math, minimal)", fl["floor"],
               goal="step <= 1.3x floor", met=fl["step"] <= 1.3 * fl["floor"], step_all_outputs_s=fl["all"],
               note=f"step returning the floor's outputs {fl['step'] * 1e3:.3f} ms vs floor {fl['floor'] * 1e3:.3f} ms "
                    f"({fl['step'] / fl['floor']:.2f}x), timed alternately; the extra work: the overflow-safe "
                    "power-of-two moments, the non-finite ref_logp / token-count masks and their counts. Returning "
                    f"all 18 outputs {fl['all'] * 1e3:.3f} ms ({fl['all'] / fl['floor']:.2f}x): writing "
                    "entropy.advantage f32[P, G], valid bool[P, G] and the normalised entropy, which a jitted "
                    "training step that does not read them never computes"),
        record(MODULE, "fused_step_no_token_norm", size, t_notok.median, "fused step with tokens", t_step.median,
               compile_s=t_notok["compile_s"],
               note="normalize_by_tokens=False, as maxent_grpo's own call sites (information only)"),
    ]


if __name__ == "__main__":
    main(run)
