"""The countdown evaluation's statistics: per-arm summaries and the paper's effect regression.

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

__all__ = ["summarise", "effect", "effect_across_runs", "design"]


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
