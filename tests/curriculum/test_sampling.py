"""jaxweight.curriculum: bin probabilities, bin sampling and item sampling.

Distribution checks compare empirical counts with the exact probabilities
(recomputed here in NumPy from the spec) by a chi-square statistic; the
threshold is a Wilson-Hilferty z-score of 5, so a correct sampler fails with
probability < 1e-6 (and the seeds are fixed, so the tests are deterministic).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import curriculum as cur
from tests.contracts import assert_jit_matches_eager, assert_no_retrace, assert_vmap_matches_loop

F32 = np.float32
N = 64  # pool size of the sampling tests (one compilation per strategy)
NUM = 20_000  # draws of the distribution tests (static: one compilation)
ALL = jnp.ones(N, bool)


def assert_chisq(counts, probs, num, z_max=5.0):
    counts = np.asarray(counts, np.float64)
    probs = np.asarray(probs, np.float64)
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)
    exp = num * probs
    pos = exp > 0
    assert counts[~pos].sum() == 0, f"draws where the probability is 0: {np.flatnonzero(counts * ~pos)}"
    dof = int(pos.sum()) - 1
    if dof <= 0:
        assert counts[pos].sum() == num
        return
    stat = float(np.sum((counts[pos] - exp[pos]) ** 2 / exp[pos]))
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    assert z < z_max, f"chi-square {stat:.1f} with {dof} dof (z = {z:.2f})"


# ========================================================= bin probabilities
@pytest.mark.parametrize(
    "strategy, progress, temperature, expected",
    [
        ("easy_first", 0.0, 1.0, [0.428656, 0.259993, 0.157694, 0.095646, 0.058012]),
        ("easy_first", 0.5, 1.0, [0.360049, 0.241992, 0.170387, 0.126956, 0.100614]),
        ("easy_first", 1.0, 1.0, [0.2] * 5),
        ("competence_based", 0.5, 1.0, [0.054489, 0.244201, 0.40262, 0.244201, 0.054489]),
        ("easy_first", 0.0, 0.5, [0.636409, 0.234122, 0.086129, 0.031685, 0.011656]),
    ],
)
def test_spec_examples_bin_probabilities(strategy, progress, temperature, expected, jit_or_eager):
    cfg = cur.config(strategy, 5, capacity=N, temperature=temperature)
    fn = jit_or_eager(lambda c, s: cur.bin_probabilities(c, step=s, total_steps=1000))
    np.testing.assert_allclose(fn(cfg, jnp.float32(progress * 1000)), expected, rtol=0, atol=1e-6)


def _competence_sqrt_ref(t, total, c0, n):
    c = min(1.0, math.sqrt(max(t, 0) * (1 - c0 * c0) / max(1, total) + c0 * c0))
    w = np.clip(c * n - np.arange(n), 0.0, 1.0)
    return w / w.sum()


@pytest.mark.parametrize("t", [0, 37, 250, 500, 999, 1000, 5000])
def test_competence_sqrt_probabilities(t):
    cfg = cur.config("competence_sqrt", 5, capacity=N, competence_c0=0.1)
    np.testing.assert_allclose(cur.bin_probabilities(cfg, step=t, total_steps=1000, tempered=False),
                               _competence_sqrt_ref(t, 1000, 0.1, 5), rtol=1e-5, atol=1e-7)
    if t == 0:  # c(0) = c0: all mass on the easiest bin
        np.testing.assert_allclose(cur.bin_probabilities(cfg, step=t, total_steps=1000), [1, 0, 0, 0, 0], atol=1e-7)
    if t >= 1000:  # c(T) = 1: uniform
        np.testing.assert_allclose(cur.bin_probabilities(cfg, step=t, total_steps=1000), [0.2] * 5, rtol=1e-6)


def test_uniform_ignores_temperature_and_prioritized_raises():
    cfg = cur.config("uniform", 4, capacity=N, temperature=0.05)
    np.testing.assert_array_equal(cur.bin_probabilities(cfg, step=3, total_steps=10), [0.25] * 4)
    with pytest.raises(ValueError, match="prioritized"):
        cur.bin_probabilities(cur.config("prioritized", capacity=N), step=0, total_steps=10)


def test_temperature_one_is_untempered_and_lower_is_sharper():
    cfg = cur.config("easy_first", 5, capacity=N)
    np.testing.assert_array_equal(cur.bin_probabilities(cfg, step=100, total_steps=1000),
                                  cur.bin_probabilities(cfg, step=100, total_steps=1000, tempered=False))
    first = [float(cur.bin_probabilities(cur.config("easy_first", 5, capacity=N, temperature=t), step=100, total_steps=1000)[0])
             for t in (2.0, 1.0, 0.5, 0.1)]
    assert first == sorted(first) and first[-1] > 0.99


@settings(max_examples=30, deadline=None)
@given(strategy=st.sampled_from(["uniform", "easy_first", "competence_based", "competence_sqrt"]),
       n_bins=st.sampled_from([1, 2, 5]), step=st.integers(-50, 2000), total=st.integers(-5, 1500),
       temperature=st.floats(1e-4, 5.0), c0=st.floats(1e-3, 1.0))
def test_bin_probabilities_are_a_distribution(strategy, n_bins, step, total, temperature, c0):
    cfg = cur.config(strategy, n_bins, capacity=N, temperature=temperature, competence_c0=c0)
    p = np.asarray(cur.bin_probabilities(cfg, step=step, total_steps=total))
    assert p.shape == (n_bins,) and np.all(np.isfinite(p)) and np.all(p >= 0)
    np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-5)


def test_hyperparameter_sweep_under_vmap():
    cfg = cur.config("easy_first", 5, capacity=N)
    temps = jnp.array([0.3, 1.0, 2.0], jnp.float32)
    out = jax.vmap(lambda t: cur.bin_probabilities(cfg.replace(temperature=t), step=0, total_steps=10))(temps)
    for row, t in zip(out, [0.3, 1.0, 2.0]):
        want = cur.bin_probabilities(cur.config("easy_first", 5, capacity=N, temperature=t), step=0, total_steps=10)
        np.testing.assert_allclose(row, want, rtol=1e-6)


# ================================================================= sample_bin
def test_sample_bin_uniform_and_categorical():
    num = 20_000
    cfg = cur.config("uniform", 5, capacity=N, temperature=0.2)
    b = cur.sample_bin(0, cfg, step=0, total_steps=10, shape=(num,))
    assert b.dtype == jnp.int32 and b.shape == (num,)
    assert_chisq(np.bincount(np.asarray(b), minlength=5), [0.2] * 5, num)
    cfg = cur.config("easy_first", 5, capacity=N, temperature=0.7)
    b = jax.jit(cur.sample_bin, static_argnames="shape")(jax.random.key(3), cfg, step=200, total_steps=1000, shape=(num,))
    assert_chisq(np.bincount(np.asarray(b), minlength=5), cur.bin_probabilities(cfg, step=200, total_steps=1000), num)
    assert cur.sample_bin(1, cfg, step=0, total_steps=10).shape == ()


# ===================================================================== sample
def make_pool(seed=0, n_tracked=40):
    """A pool of N items: the first ``n_tracked`` tracked with varied EMAs (and ties)."""
    rng = np.random.default_rng(seed)
    ema = np.zeros(N, F32)
    ema[:n_tracked] = np.round(rng.random(n_tracked), 1 if seed % 2 else 3).astype(F32)
    count = np.zeros(N, np.int32)
    count[:n_tracked] = rng.integers(1, 4, n_tracked)
    total = int(count.sum())
    last = np.where(count > 0, rng.integers(1, total + 1, N), 0).astype(np.int32)
    return ema, count, last, total


def state_from(cfg, ema, count, last, total, stored=True):
    s = cur.init(cfg).replace(ema=jnp.asarray(ema), count=jnp.asarray(count),
                              last_update=jnp.asarray(last), total_updates=jnp.asarray(total, jnp.int32))
    return cur.recompute_bins(s, cfg) if stored else s


def expected_bin_item_probs(state, cfg, step, total_steps, eligible):
    """Spec semantics of sample for bin strategies, in NumPy."""
    nb = cfg.n_bins
    bins = np.asarray(cur.item_bin(state, jnp.arange(N), cfg))
    elig = np.asarray(eligible, bool)
    counts = np.bincount(bins[elig], minlength=nb)
    p = np.asarray(cur.bin_probabilities(cfg, step=step, total_steps=total_steps), np.float64)
    pr = np.where(counts > 0, p, 0.0)
    if pr.sum() > 0:
        pr = pr / pr.sum()
    else:  # mass to the nearest non-empty bin (ties: the easier one)
        ne = np.flatnonzero(counts > 0)
        pr = np.zeros(nb)
        for i in range(nb):
            pr[ne[np.argmin(np.abs(ne - i))]] += p[i]
        pr /= pr.sum()
    out = np.zeros(N)
    out[elig] = pr[bins[elig]] / counts[bins[elig]]
    return out


@pytest.mark.parametrize(
    "strategy, step, temperature, elig_kind",
    [
        ("easy_first", 300, 0.7, "some"),
        ("competence_based", 600, 1.0, "all"),
        ("uniform", 0, 1.0, "some"),
        ("competence_sqrt", 450, 1.5, "all"),
        ("easy_first", 0, 1.0, "no_bin0"),  # an empty bin is excluded, the rest renormalised
        ("competence_sqrt", 0, 1.0, "no_bin0"),  # only bin 0 has mass: it moves to bin 1
    ],
)
def test_sample_bin_strategies_distribution(strategy, step, temperature, elig_kind):
    cfg = cur.config(strategy, 5, capacity=N, temperature=temperature)
    s = state_from(cfg, *make_pool(1))
    bins = np.asarray(cur.item_bin(s, jnp.arange(N), cfg))
    elig = np.ones(N, bool)
    if elig_kind == "some":
        elig[::3] = False
    elif elig_kind == "no_bin0":
        elig[bins == 0] = False
    num = NUM
    draws = np.asarray(cur.sample(s, jax.random.key(7), cfg, step=step, total_steps=1000, num=num, eligible=jnp.asarray(elig)))
    assert draws.dtype == np.int32 and draws.shape == (num,)
    probs = expected_bin_item_probs(s, cfg, step, 1000, elig)
    assert_chisq(np.bincount(draws, minlength=N), probs, num)
    if elig_kind == "no_bin0" and strategy == "competence_sqrt":
        assert set(bins[draws]) == {1}


def test_sample_uses_lazy_boundaries():
    cfg = cur.config("easy_first", 5, capacity=N)
    s = state_from(cfg, *make_pool(2), stored=False)
    assert not bool(s.has_boundaries)
    num = NUM
    draws = np.asarray(cur.sample(s, 3, cfg, step=100, total_steps=1000, num=num, eligible=ALL))
    assert_chisq(np.bincount(draws, minlength=N), expected_bin_item_probs(s, cfg, 100, 1000, np.ones(N, bool)), num)


def test_sample_untracked_live_in_the_middle_bin():
    cfg = cur.config("competence_based", 5, capacity=N)
    s = cur.init(cfg)  # nothing tracked: all eligible items in the middle bin -> uniform
    elig = np.arange(N) % 4 == 1
    num = NUM
    draws = np.asarray(cur.sample(s, 0, cfg, step=0, total_steps=1000, num=num, eligible=jnp.asarray(elig)))
    assert_chisq(np.bincount(draws, minlength=N), elig / elig.sum(), num)


@pytest.mark.parametrize("strategy", ["easy_first", "prioritized"])
def test_sample_nothing_eligible(strategy):
    cfg = cur.config(strategy, 5, capacity=N)
    s = state_from(cfg, *make_pool(0))
    out = cur.sample(s, 0, cfg, step=0, total_steps=10, num=NUM, eligible=jnp.zeros(N, bool))
    np.testing.assert_array_equal(out, np.full(NUM, -1))
    assert cur.sample(s, 0, cfg, step=0, total_steps=10, num=0).shape == (0,)


def test_sample_bad_arguments():
    cfg = cur.config("easy_first", 5, capacity=N)
    s = cur.init(cfg)
    with pytest.raises(ValueError, match="eligible"):
        cur.sample(s, 0, cfg, step=0, total_steps=10, num=4, eligible=jnp.ones(N + 1, bool))
    with pytest.raises(ValueError, match="num"):
        cur.sample(s, 0, cfg, step=0, total_steps=10, num=4.0)
    with pytest.raises(ValueError, match="key"):
        cur.sample(s, 0.5, cfg, step=0, total_steps=10, num=4)


def test_sample_multi_level_tree_and_partial_last_block():
    """N > 128^2 (three tree levels), not a multiple of 128: bins and in-bin uniformity hold."""
    n = 128 * 128 + 77
    cfg = cur.config("easy_first", 5, capacity=n)
    rng = np.random.default_rng(5)
    ema = rng.random(n).astype(F32)
    s = cur.init(cfg).replace(ema=jnp.asarray(ema), count=jnp.ones(n, jnp.int32),
                              total_updates=jnp.asarray(n, jnp.int32))
    s = cur.recompute_bins(s, cfg)
    num = NUM
    draws = np.asarray(cur.sample(s, 1, cfg, step=0, total_steps=10, num=num, eligible=jnp.ones(n, bool)))
    bins = np.asarray(cur.item_bin(s, jnp.arange(n), cfg))
    p = np.asarray(cur.bin_probabilities(cfg, step=0, total_steps=10), np.float64)
    assert_chisq(np.bincount(bins[draws], minlength=5), p, num)
    # uniform inside bin 1 (bin 0 holds only the top item): deciles of its members by id
    members = np.flatnonzero(bins == 1)
    got = draws[bins[draws] == 1]
    dec = np.searchsorted(members, got) * 10 // len(members)
    assert_chisq(np.bincount(dec, minlength=10), [0.1] * 10, len(got))
    # only the last three items (the partial last block) eligible
    elig = np.zeros(n, bool)
    elig[-3:] = True
    draws = np.asarray(cur.sample(s, 2, cfg, step=0, total_steps=10, num=num, eligible=jnp.asarray(elig)))
    assert set(draws.tolist()) <= {n - 3, n - 2, n - 1}
    p3 = np.zeros(n)
    p3[-3:] = expected_bin_item_probs_small(bins[-3:], p)
    assert_chisq(np.bincount(draws, minlength=n)[-3:], p3[-3:], num)


def expected_bin_item_probs_small(bins, p):
    counts = np.bincount(bins, minlength=len(p))
    pr = np.where(counts > 0, p, 0.0)
    pr = pr / pr.sum()
    return pr[bins] / counts[bins]


# ================================================================= prioritized
def plr_probs(ema, count, last, total, elig, cfg):
    """Spec semantics of ``prioritized`` in NumPy (float32 scores, ties by lower id)."""
    ema = np.asarray(ema, F32)
    thr = F32(cfg.competence_threshold)
    key = {"frontier": np.abs(ema - thr), "hard": ema, "easy": -ema}[cfg.priority]  # -score
    cand = np.asarray(elig, bool) & (np.asarray(count) > 0)
    ids = np.flatnonzero(cand)
    out = np.zeros(len(ema))
    if len(ids) == 0:
        e = np.asarray(elig, float)
        return e / e.sum()
    order = ids[np.lexsort((ids, key[ids]))]
    ps = np.zeros(len(ema))
    ps[order] = (1.0 / np.arange(1, len(order) + 1)) ** (1.0 / float(cfg.temperature))
    ps /= ps.sum()
    stale = np.where(cand, total - np.asarray(last), 0).astype(float)
    pc = stale / stale.sum() if stale.sum() > 0 else ps
    c = float(cfg.staleness_coeff)
    out = (1 - c) * ps + c * pc
    return out


@pytest.mark.parametrize(
    "priority, temperature, coeff, stale_kind",
    [("frontier", 0.5, 0.3, "mixed"), ("hard", 1.0, 0.5, "mixed"), ("easy", 2.0, 0.0, "mixed"),
     ("frontier", 1.0, 0.3, "fresh")],
)
def test_prioritized_distribution(priority, temperature, coeff, stale_kind):
    cfg = cur.config("prioritized", 5, capacity=N, temperature=temperature, staleness_coeff=coeff,
                     priority=priority, competence_threshold=0.4)
    ema, count, last, total = make_pool(3)  # rounded EMAs: many ties
    if stale_kind == "fresh":  # all staleness 0: P_C = P_S
        last = np.where(count > 0, total, 0).astype(np.int32)
    elig = np.ones(N, bool)
    elig[5:9] = False
    s = state_from(cfg, ema, count, last, total, stored=False)
    num = NUM
    draws = np.asarray(cur.sample(s, 11, cfg, step=0, total_steps=10, num=num, eligible=jnp.asarray(elig)))
    assert_chisq(np.bincount(draws, minlength=N), plr_probs(ema, count, last, total, elig, cfg), num)


def test_prioritized_without_tracked_items_is_uniform_over_eligible():
    cfg = cur.config("prioritized", 5, capacity=N)
    elig = np.arange(N) < 10
    num = NUM
    draws = np.asarray(cur.sample(cur.init(cfg), 4, cfg, step=0, total_steps=10, num=num, eligible=jnp.asarray(elig)))
    assert_chisq(np.bincount(draws, minlength=N), elig / elig.sum(), num)


# ================================================================== contracts
def test_sampling_contracts():
    cfg = cur.config("competence_sqrt", 5, capacity=N, temperature=0.8, competence_c0=0.2)
    cfg2 = cur.config("competence_sqrt", 5, capacity=N, temperature=1.7, competence_c0=0.05)
    s = state_from(cfg, *make_pool(4))
    key = jax.random.key(0)

    def draw(k, st_, c, step):
        return cur.sample(st_, k, c, step=step, total_steps=100, num=32)

    assert_jit_matches_eager(draw, key, s, cfg, jnp.float32(30))
    assert_no_retrace(draw, (key, s, cfg, jnp.float32(30)), (jax.random.key(1), s, cfg2, jnp.float32(70)))
    # independent pools under vmap
    pools = [state_from(cfg, *make_pool(i)) for i in range(3)]
    batched = jax.tree.map(lambda *x: jnp.stack(x), *pools)
    keys = jax.random.split(key, 3)
    assert_vmap_matches_loop(lambda k, p: draw(k, p, cfg, jnp.float32(30)), (0, 0), keys, batched)


def test_prioritized_contracts():
    cfg = cur.config("prioritized", 5, capacity=N, temperature=0.5, staleness_coeff=0.2)
    cfg2 = cur.config("prioritized", 5, capacity=N, temperature=1.5, staleness_coeff=0.7,
                      competence_threshold=0.8)
    s = state_from(cfg, *make_pool(5), stored=False)
    key = jax.random.key(0)

    def draw(k, st_, c):
        return cur.sample(st_, k, c, step=0, total_steps=100, num=32)

    assert_jit_matches_eager(draw, key, s, cfg)
    assert_no_retrace(draw, (key, s, cfg), (key, s, cfg2))
    pools = jax.tree.map(lambda *x: jnp.stack(x), *[state_from(cfg, *make_pool(i), stored=False) for i in range(3)])
    # vmap over pools and over temperatures at once
    cfgs = jax.tree.map(lambda *x: jnp.stack(x), cfg, cfg2, cfg)
    assert_vmap_matches_loop(lambda k, p, c: draw(k, p, c), (0, 0, 0), jax.random.split(key, 3), pools, cfgs)
