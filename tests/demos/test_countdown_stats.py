"""The countdown demo's effect regression (statsmodels, the ``stats`` extra) against known answers.

Needs ``pip install -e '.[stats]'``: CI runs this file in a step of its own and leaves it out of
the main suite (``--ignore=tests/demos/test_countdown_stats.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api  # noqa: F401  (the extra this file tests; no skip: CI fails on a missing extra)

from jaxweight.demos.lm import _stats as ST


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
    from jaxweight.demos.lm import _countdown as D

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


# ---------------------------------------------------------------- the primary (run-level) analysis
def test_paired_runs_is_the_paired_t_test_and_wilcoxon_of_run_means():
    from scipy import stats as sps

    arm, base = _data(np.random.default_rng(7), s=9, effect=0.03)
    arm = arm + np.random.default_rng(8).normal(0, 0.05, (9, 1, 1))       # run-to-run spread of the effect
    r = ST.paired_runs(arm, base)
    a, b = arm.mean((1, 2)), base.mean((1, 2))
    t = sps.ttest_rel(a, b)
    np.testing.assert_allclose(r["estimate"], (a - b).mean(), rtol=1e-12)
    np.testing.assert_allclose(r["p_t"], t.pvalue, rtol=1e-9)
    np.testing.assert_allclose(r["ci95"], t.confidence_interval(0.95), rtol=1e-9)
    np.testing.assert_allclose(r["p_wilcoxon"], sps.wilcoxon(a, b).pvalue, rtol=1e-12)
    np.testing.assert_allclose(r["sd"], np.std(a - b, ddof=1), rtol=1e-12)
    # the minimum detectable effect: a two-sided paired t test at that effect has 80% power (noncentral t)
    n, q = 9, sps.t.ppf(0.975, 8)
    nc = r["mde80"] / r["sd"] * np.sqrt(n)
    np.testing.assert_allclose(sps.nct.sf(q, n - 1, nc) + sps.nct.cdf(-q, n - 1, nc), 0.8, atol=1e-6)
    assert r["runs"] == 9 and len(r["per_run"]) == 9


def test_paired_runs_edge_cases():
    z = np.zeros((1, 2, 3))
    one = ST.paired_runs(z + 0.1, z)
    assert one["ci95"] is None and one["p_wilcoxon"] is None and np.isclose(one["estimate"], 0.1)
    same = ST.paired_runs(np.zeros((4, 2, 3)) + 0.2, np.zeros((4, 2, 3)))
    np.testing.assert_allclose(same["ci95"], [0.2, 0.2])
    with pytest.raises(ValueError, match=r"\[S, E, P\]"):
        ST.paired_runs(np.zeros((2, 3)), np.zeros((2, 3)))


def test_primary_holds_its_level_where_the_prompt_clustered_regression_does_not():
    """A null with bimodal runs (each run takes off or not, both arms drawn alike): the run-level t test
    rejects at about its 5% level; the paper's seed-FE prompt-clustered regression rejects far more."""
    rng = np.random.default_rng(11)
    s, e, p, trials = 8, 2, 24, 60
    rej_primary = rej_prompt = 0
    for _ in range(trials):
        prompt = rng.normal(0, 0.2, p)
        lvl = np.where(rng.random((2, s)) < 0.5, 0.45, 0.15)             # per arm and run: took off or not
        y = lvl[:, :, None, None] + prompt + rng.normal(0, 0.1, (2, s, e, p))
        rej_primary += ST.paired_runs(y[1], y[0])["p_t"] < 0.05
        rej_prompt += ST.effect(y[1], y[0])["p_value"] < 0.05
    assert rej_primary / trials <= 0.15
    assert rej_prompt / trials >= 0.5


def test_tost_matches_statsmodels_ttost_paired():
    from statsmodels.stats.weightstats import ttost_paired

    arm, base = _data(np.random.default_rng(12), s=10, effect=0.005)
    arm = arm + np.random.default_rng(13).normal(0, 0.01, (10, 1, 1))
    r = ST.tost(arm, base, margin=0.03)
    p, _, _ = ttost_paired(arm.mean((1, 2)), base.mean((1, 2)), -0.03, 0.03)
    np.testing.assert_allclose(r["p"], p, rtol=1e-9)
    assert r["flat"] == (r["ci90"][0] > -0.03 and r["ci90"][1] < 0.03) == (r["p"] < 0.05)
    wide = ST.tost(arm + np.random.default_rng(14).normal(0, 0.2, (10, 1, 1)), base, margin=0.03)
    assert not wide["flat"] and wide["p"] > 0.05
    with pytest.raises(ValueError, match="margin"):
        ST.tost(arm, base, margin=0.0)


def test_takeoff_and_fisher():
    from scipy import stats as sps

    final = np.array([0.5, 0.2, 0.45, 0.1])[:, None, None] * np.ones((4, 2, 3))
    t = ST.takeoff(final, np.array([0.15, 0.15, 0.2, 0.1]))
    assert t["per_run"] == [True, False, True, False] and t["took_off"] == 2 and t["share"] == 0.5
    u = ST.takeoff(final * 0, np.zeros(4))
    f = ST.fisher(t, u)
    assert f["table"] == [[2, 2], [0, 4]]
    np.testing.assert_allclose(f["p"], sps.fisher_exact([[2, 2], [0, 4]]).pvalue)


def test_run_clustered_regression_widens_with_run_disagreement():
    arm, base = _data(np.random.default_rng(15), s=6, p=30, effect=0.05)
    het = arm + np.random.default_rng(16).normal(0, 0.1, (6, 1, 1))      # the effect differs by run
    a, b = ST.effect_run_clustered(het, base), ST.effect(het, base)
    np.testing.assert_allclose(a["estimate"], b["estimate"], rtol=1e-10)
    assert a["se"] > 2 * b["se"] and a["runs"] == 6 and a["clusters"] == 30
    c = ST.effect_run_clustered(np.full((3, 2, 4), 0.5), np.full((3, 2, 4), 0.5))
    assert c["estimate"] == 0.0 and c["se"] == 0.0
