"""The countdown demo's effect regression (statsmodels, the ``stats`` extra) against known answers.

Needs ``pip install -e '.[stats]'``: CI runs this file in a step of its own and leaves it out of
the main suite (``--ignore=tests/demos/test_countdown_stats.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api  # noqa: F401  (the extra this file tests; no skip: CI fails on a missing extra)

from jaxweight.demos import _countdown_stats as ST


def _data(rng, s=3, e=3, p=40, effect=0.1):
    prompt = rng.normal(0, 0.3, p)
    ts, es = rng.normal(0, 0.05, s), rng.normal(0, 0.05, e)
    base = 0.3 + prompt + ts[:, None, None] + es[None, :, None] + rng.normal(0, 0.1, (s, e, p))
    arm = base + effect + rng.normal(0, 0.1, (s, e, p))
    return arm, base


def test_balanced_design_estimate_is_the_difference_of_means():
    arm, base = _data(np.random.default_rng(0))
    e = ST.effect(arm, base)
    np.testing.assert_allclose(e["estimate"], arm.mean() - base.mean(), rtol=0, atol=1e-12)
    assert e["n"] == 2 * arm.size and e["clusters"] == arm.shape[-1]
    assert e["ci95"][0] < 0.1 < e["ci95"][1]


def test_clustered_standard_error_is_the_cr1_sandwich():
    """A NumPy transcription of the prompt-clustered (Liang-Zeger, CR1) covariance gives the same SE and CI."""
    arm, base = _data(np.random.default_rng(1), p=25)
    y, x, g = ST.design(arm, base)
    n, k = x.shape
    bread = np.linalg.inv(x.T @ x)
    beta = bread @ x.T @ y
    u = y - x @ beta
    clusters = np.unique(g)
    meat = sum(np.outer(x[g == c].T @ u[g == c], x[g == c].T @ u[g == c]) for c in clusters)
    m = len(clusters)
    cov = m / (m - 1) * (n - 1) / (n - k) * bread @ meat @ bread
    se = np.sqrt(cov[1, 1])
    e = ST.effect(arm, base)
    np.testing.assert_allclose(e["estimate"], beta[1], rtol=1e-10)
    np.testing.assert_allclose(e["se"], se, rtol=1e-8)
    np.testing.assert_allclose(e["ci95"], [beta[1] - 1.959963984540054 * se, beta[1] + 1.959963984540054 * se],
                               rtol=1e-8)


def test_design_has_seed_fixed_effects_and_prompt_clusters():
    y, x, g = ST.design(np.ones((3, 2, 4)), np.zeros((3, 2, 4)))
    assert x.shape == (48, 1 + 1 + 2 + 1)              # intercept, arm, 2 training-seed and 1 eval-seed dummies
    np.testing.assert_array_equal(x[:24, 1], 0)
    np.testing.assert_array_equal(x[24:, 1], 1)
    np.testing.assert_array_equal(np.bincount(g), [12] * 4)
    e = ST.effect(np.full((3, 2, 4), 0.5), np.full((3, 2, 4), 0.5))   # constant outcome: no effect
    assert e["estimate"] == 0.0 and e["se"] == 0.0


def test_outcome_constant_across_evaluation_seeds_warns_nothing():
    """Greedy pass@1 is the same for every evaluation seed: the regression still runs warning-free
    (the suite turns warnings into errors)."""
    rng = np.random.default_rng(2)
    base = np.broadcast_to((rng.random((3, 1, 30)) < 0.3).astype(float), (3, 3, 30))
    arm = np.broadcast_to((rng.random((3, 1, 30)) < 0.5).astype(float), (3, 3, 30))
    e = ST.effect(arm, base)
    np.testing.assert_allclose(e["estimate"], arm.mean() - base.mean(), atol=1e-12)
    assert np.isfinite(e["se"]) and e["se"] > 0


def test_effect_across_runs_is_the_t_interval_of_paired_run_differences():
    """The training run as the unit: the mean of the per-seed differences of run means with Student's t
    (S - 1 df), a NumPy/SciPy transcription; wider than the prompt-clustered interval when runs disagree."""
    from scipy import stats

    rng = np.random.default_rng(3)
    arm, base = _data(rng, s=6, e=3, p=40)
    arm = arm + rng.normal(0, 0.15, 6)[:, None, None]     # run-to-run variation of the arm's effect
    r = ST.effect_across_runs(arm, base)
    d = (arm - base).mean((1, 2))
    se = d.std(ddof=1) / np.sqrt(d.size)
    q = stats.t.ppf(0.975, d.size - 1)
    np.testing.assert_allclose(r["estimate"], d.mean(), atol=1e-12)
    np.testing.assert_allclose(r["estimate"], ST.effect(arm, base)["estimate"], atol=1e-12)  # balanced design
    np.testing.assert_allclose(r["se"], se, rtol=1e-10)
    np.testing.assert_allclose(r["ci95"], [d.mean() - q * se, d.mean() + q * se], rtol=1e-10)
    np.testing.assert_allclose(r["per_run"], d, atol=1e-12)
    assert r["runs"] == 6
    c = ST.effect(arm, base)["ci95"]
    assert r["ci95"][1] - r["ci95"][0] > c[1] - c[0]


def test_effect_across_runs_edge_cases():
    arm, base = _data(np.random.default_rng(4), s=1)
    one = ST.effect_across_runs(arm, base)
    assert one["runs"] == 1 and one["se"] is None and one["ci95"] is None
    zero = np.zeros((3, 2, 5))
    same = ST.effect_across_runs(zero + 0.25, zero)      # every run differs by exactly the same amount
    np.testing.assert_allclose(same["ci95"], [0.25, 0.25])
    assert same["se"] == 0.0
    with pytest.raises(ValueError, match=r"\[S, E, P\]"):
        ST.effect_across_runs(arm[0], base[0])


def test_runs_table_shows_the_run_clustered_regression_in_points():
    from jaxweight.demos import _countdown_demo as D

    arm, base = _data(np.random.default_rng(5), s=4)
    e = {k: ST.effect_run_clustered(arm, base) for k in ("pass_at_8", "coverage_at_8", "mean_at_8")}
    table = D.runs_table({"arms": {"drgrpo": {"effect_vs_drgrpo_run_clustered": None},
                                   "xdr_tau0.05": {"effect_vs_drgrpo_run_clustered": e}}})
    lines = table.splitlines()
    assert len(lines) == 3 and lines[2].startswith("xdr_tau0.05")
    lo, hi = (100 * x for x in e["pass_at_8"]["ci95"])
    assert f"{100 * e['pass_at_8']['estimate']:+.1f} [{lo:+.1f}, {hi:+.1f}]" in lines[2]
    assert lines[2].split()[-1] == "4"
    assert D.runs_table({"arms": {"drgrpo": {"effect_vs_drgrpo_run_clustered": None}}}) == ""
