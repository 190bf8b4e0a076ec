"""The countdown evaluation's statistics: the run-level primary analysis, per-arm summaries and the
paper's effect regression.

The **primary analysis** (:func:`paired_runs`, :func:`tost`, :func:`takeoff`) takes the training
run as the unit of replication: per training seed, the paired difference of two arms' run means
(the same warm start and sampling keys), then over runs the mean, Student's t interval, a
Wilcoxon signed-rank p, the minimum detectable effect at 80% power and, for a metric that should
stay flat, the two one-sided tests (TOST). It was fixed in code before the 32-run study ran.

:func:`summarise` turns the per-(training seed, evaluation seed, prompt) outcomes of one arm
into means (overall, per training seed, per seed pair). :func:`effect` is the paper's paired
linear probability model, fitted by statsmodels (the ``stats`` extra):
``Y = a + gamma 1{arm} + eta_train_seed + zeta_eval_seed + e``, OLS with standard errors
clustered by evaluation prompt; ``gamma`` is the arm's effect against the baseline in the
metric's units (a share: x 100 for points). :func:`effect_across_runs` is the robustness check
with the training run as the unit: when runs disagree, the prompt-clustered interval (which
treats the training seeds as fixed effects) is too narrow, and only more runs tell.
"""

from __future__ import annotations

import numpy as np

__all__ = ["summarise", "effect", "effect_across_runs", "effect_run_clustered", "design", "paired_runs", "tost",
           "takeoff", "fisher", "TOST_MARGIN", "TAKEOFF_GAIN"]

# mean@8 is "flat" when the 90% t interval of the run-level difference lies inside +-3 points
TOST_MARGIN = 0.03
# a run "takes off" when its eval pass@8 ends >= 10 points above its own warm start's
# (fixed before the 32-run study from the earlier runs: take-offs gained >= 20 points, the rest <= 9)
TAKEOFF_GAIN = 0.10


def summarise(x: np.ndarray) -> dict:
    """``{"mean", "per_seed" [S], "per_seed_pair" [S][E]}`` of outcomes ``x f32[S, E, P]``."""
    x = np.asarray(x, np.float64)
    return {"mean": float(x.mean()), "per_seed": x.mean((1, 2)).tolist(), "per_seed_pair": x.mean(2).tolist()}


def design(arm: np.ndarray, base: np.ndarray) -> tuple:
    """``(y, X, clusters)`` of the paired regression of ``arm`` against ``base`` (both ``[S, E, P]``).

    ``X`` columns: intercept, the arm indicator, training-seed dummies (seeds 1..S-1), evaluation-seed
    dummies (1..E-1); ``clusters``: the prompt index of each row.
    """
    arm, base = np.asarray(arm, np.float64), np.asarray(base, np.float64)
    if arm.shape != base.shape or arm.ndim != 3:
        raise ValueError(f"arm and base must both be [S, E, P], got {arm.shape} and {base.shape}")
    s, e, p = arm.shape
    idx = np.indices((2, s, e, p)).reshape(4, -1)
    treat, ts, es, pr = idx
    y = np.stack([base, arm]).reshape(-1)
    cols = [np.ones_like(y), treat.astype(np.float64)]
    cols += [(ts == k).astype(np.float64) for k in range(1, s)]
    cols += [(es == k).astype(np.float64) for k in range(1, e)]
    return y, np.stack(cols, axis=1), pr


def effect(arm: np.ndarray, base: np.ndarray) -> dict:
    """The arm's effect against the baseline: OLS with seed fixed effects, prompt-clustered SEs.

    Args:
      arm, base: f32[S, E, P] one outcome (e.g. coverage@8) per training seed, evaluation seed and
        prompt, the same prompts and seeds in both.

    Returns:
      ``{"estimate", "se", "ci95": [lo, hi], "p_value", "n", "clusters"}`` (``ci95`` from the
      normal approximation with the clustered covariance, statsmodels' default). A constant
      outcome gives estimate 0 with ``se`` 0.

    Raises:
      ImportError: statsmodels is missing (``pip install 'jaxweight[stats]'``).
    """
    import statsmodels.api as sm

    y, x, groups = design(arm, base)
    if np.ptp(y) == 0:
        return {"estimate": 0.0, "se": 0.0, "ci95": [0.0, 0.0], "p_value": 1.0, "n": int(y.size),
                "clusters": int(np.unique(groups).size)}
    # (a nuisance column can have a clustered variance of -0 up to rounding, e.g. the evaluation-seed
    # dummies of pass@1, which no evaluation seed changes: its sqrt is NaN; the arm's column is unaffected)
    with np.errstate(invalid="ignore"):
        fit = sm.OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": groups})
        lo, hi = np.asarray(fit.conf_int(0.05))[1]
        se, p = float(fit.bse[1]), float(fit.pvalues[1])
    return {"estimate": float(fit.params[1]), "se": se, "ci95": [float(lo), float(hi)],
            "p_value": p, "n": int(y.size), "clusters": int(np.unique(groups).size)}


def effect_across_runs(arm: np.ndarray, base: np.ndarray) -> dict:
    """The arm's effect with the training run as the unit of replication.

    Per training seed ``s`` the paired difference ``d_s`` of the run means (over evaluation seeds
    and prompts; runs of the same seed index share the warm start), regressed on a constant by
    statsmodels OLS: the estimate is the mean of ``d`` (the same as :func:`effect`'s, since the
    design is balanced) and the interval Student's t with ``S - 1`` degrees of freedom, so it widens
    with the disagreement between training runs, which :func:`effect` holds fixed.

    Args:
      arm, base: f32[S, E, P] as in :func:`effect`.

    Returns:
      ``{"estimate", "se", "ci95": [lo, hi], "p_value", "runs", "per_run": [S]}``; with one
      training seed ``se``, ``ci95`` and ``p_value`` are ``None``; identical differences give
      ``se`` 0 and a zero-width interval.

    Raises:
      ValueError: shapes that differ or are not ``[S, E, P]``.
      ImportError: statsmodels is missing (``pip install 'jaxweight[stats]'``).
    """
    import statsmodels.api as sm

    arm, base = np.asarray(arm, np.float64), np.asarray(base, np.float64)
    if arm.shape != base.shape or arm.ndim != 3:
        raise ValueError(f"arm and base must both be [S, E, P], got {arm.shape} and {base.shape}")
    d = (arm - base).mean((1, 2))
    out = {"estimate": float(d.mean()), "se": None, "ci95": None, "p_value": None, "runs": int(d.size),
           "per_run": d.tolist()}
    if d.size < 2:
        return out
    if np.ptp(d) == 0:
        return out | {"se": 0.0, "ci95": [float(d[0]), float(d[0])], "p_value": 0.0 if d[0] else 1.0}
    fit = sm.OLS(d, np.ones((d.size, 1))).fit()
    lo, hi = np.asarray(fit.conf_int(0.05))[0]
    return out | {"se": float(fit.bse[0]), "ci95": [float(lo), float(hi)], "p_value": float(fit.pvalues[0])}


def _run_differences(arm: np.ndarray, base: np.ndarray) -> np.ndarray:
    arm, base = np.asarray(arm, np.float64), np.asarray(base, np.float64)
    if arm.shape != base.shape or arm.ndim != 3:
        raise ValueError(f"arm and base must both be [S, E, P], got {arm.shape} and {base.shape}")
    return (arm - base).mean((1, 2))


def paired_runs(arm: np.ndarray, base: np.ndarray) -> dict:
    """The primary analysis of one metric: the paired run-level difference ``arm - base``.

    Args:
      arm, base: f32[S, E, P] outcomes per training seed (run pair), evaluation seed and prompt.

    Returns:
      ``{"estimate", "ci95", "p_t", "p_wilcoxon", "sd", "runs", "per_run", "mde80"}``: the mean
      of the per-run differences ``d`` (run means over evaluation seeds and prompts), Student's t
      CI95 with ``S - 1`` df and its two-sided p, the two-sided Wilcoxon signed-rank p (scipy;
      exact for small S without ties, zero differences dropped), the run-to-run SD of ``d`` and
      the minimum detectable effect of a two-sided paired t test at alpha 0.05 with 80% power
      given that SD and ``S`` (statsmodels). With one run only the estimate; with identical
      differences a zero-width interval (and no Wilcoxon p).

    Raises:
      ValueError: shapes that differ or are not ``[S, E, P]``.
      ImportError: statsmodels / scipy missing (``pip install 'jaxweight[stats]'``).
    """
    from scipy import stats as sps
    from statsmodels.stats.power import TTestPower

    d = _run_differences(arm, base)
    n = int(d.size)
    out = {"estimate": float(d.mean()), "ci95": None, "p_t": None, "p_wilcoxon": None, "sd": None, "runs": n,
           "per_run": d.tolist(), "mde80": None}
    if n < 2:
        return out
    sd = float(d.std(ddof=1))
    out["sd"] = sd
    if sd == 0:
        return out | {"ci95": [float(d[0])] * 2, "p_t": 0.0 if d[0] else 1.0}
    se = sd / np.sqrt(n)
    q = sps.t.ppf(0.975, n - 1)
    out["ci95"] = [float(d.mean() - q * se), float(d.mean() + q * se)]
    out["p_t"] = float(2 * sps.t.sf(abs(d.mean()) / se, n - 1))
    if np.any(d != 0):
        out["p_wilcoxon"] = float(sps.wilcoxon(d, zero_method="wilcox").pvalue)
    out["mde80"] = float(TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8) * sd)
    return out


def tost(arm: np.ndarray, base: np.ndarray, margin: float = TOST_MARGIN) -> dict:
    """Equivalence of ``arm`` and ``base`` within ``+-margin`` by two one-sided t tests over runs.

    Returns:
      ``{"margin", "estimate", "ci90", "p", "flat"}``: ``ci90`` the 90% t interval of the mean
      paired run difference; ``p`` the larger one-sided p; ``flat`` iff ``ci90`` lies inside
      ``(-margin, margin)`` (the same as ``p < 0.05``). Fewer than 2 runs: ``flat`` False.
    """
    from scipy import stats as sps

    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    d = _run_differences(arm, base)
    n, m = int(d.size), float(d.mean())
    out = {"margin": float(margin), "estimate": m, "ci90": None, "p": None, "flat": False, "runs": n}
    if n < 2:
        return out
    se = float(d.std(ddof=1) / np.sqrt(n))
    if se == 0:
        return out | {"ci90": [m, m], "p": 0.0 if abs(m) < margin else 1.0, "flat": abs(m) < margin}
    q = sps.t.ppf(0.95, n - 1)
    p = max(sps.t.sf((m + margin) / se, n - 1), sps.t.cdf((m - margin) / se, n - 1))
    lo, hi = m - q * se, m + q * se
    return out | {"ci90": [float(lo), float(hi)], "p": float(p), "flat": bool(-margin < lo and hi < margin)}


def takeoff(final: np.ndarray, warm: np.ndarray, gain: float = TAKEOFF_GAIN) -> dict:
    """Which runs take off: final eval pass@8 at least ``gain`` above the run's warm start's.

    Args:
      final: f32[S, E, P] a run's final eval pass@8 outcomes; warm: f32[S] or [S, E, P] its warm
        start's on the same problems.

    Returns:
      ``{"runs", "took_off", "share", "per_run": [bool], "gain": [S]}``.
    """
    f = np.asarray(final, np.float64).reshape(np.shape(final)[0], -1).mean(1)
    w = np.asarray(warm, np.float64).reshape(np.shape(warm)[0], -1).mean(1)
    g = f - w
    up = g >= gain
    return {"runs": int(up.size), "took_off": int(up.sum()), "share": float(up.mean()), "threshold": float(gain),
            "per_run": up.tolist(), "gain": g.tolist()}


def fisher(a: dict, b: dict) -> dict:
    """Fisher's exact test (two-sided, scipy) of two arms' take-off counts (:func:`takeoff` dicts)."""
    from scipy import stats as sps

    table = [[a["took_off"], a["runs"] - a["took_off"]], [b["took_off"], b["runs"] - b["took_off"]]]
    res = sps.fisher_exact(table)
    odds = float(res.statistic)
    return {"table": table, "odds_ratio": odds if np.isfinite(odds) else None, "p": float(res.pvalue)}


def effect_run_clustered(arm: np.ndarray, base: np.ndarray) -> dict:
    """The paper's regression with standard errors clustered two ways: by prompt and by training run.

    Same design as :func:`effect` (training- and evaluation-seed fixed effects); the covariance
    is statsmodels' two-way cluster-robust one over (prompt, training seed), so the spread of the
    arm's effect between training runs enters the interval (the seed fixed effects alone
    remove only the runs' levels). Returns :func:`effect`'s dict plus ``"runs"``.
    """
    import statsmodels.api as sm

    y, x, prompts = design(arm, base)
    s = np.shape(arm)[0]
    seeds = np.indices((2,) + tuple(np.shape(arm))).reshape(4, -1)[1]
    out = {"n": int(y.size), "clusters": int(np.unique(prompts).size), "runs": int(s)}
    if np.ptp(y) == 0:
        return out | {"estimate": 0.0, "se": 0.0, "ci95": [0.0, 0.0], "p_value": 1.0}
    with np.errstate(invalid="ignore"):
        fit = sm.OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": np.column_stack([prompts, seeds])})
        lo, hi = np.asarray(fit.conf_int(0.05))[1]
        se, p = float(fit.bse[1]), float(fit.pvalues[1])
    return out | {"estimate": float(fit.params[1]), "se": se, "ci95": [float(lo), float(hi)], "p_value": p}
