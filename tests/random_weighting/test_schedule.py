"""jaxweight.random_weighting.schedule: the key contract, the sampling law in distribution, sweeps."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import random_weighting as rw
from tests.contracts import CompileCounter

K10 = len(rw.TORCHREF_COMPONENTS)


SCHEDULE = jax.jit(rw.sample_schedule_with_base, static_argnums=(2, 3))
INIT = jax.jit(rw.init)
STEP = jax.jit(rw.step)


def _loop_schedule(key, cfg, T, S, rows=None):
    """The documented key contract, as a plain Python loop over jitted init/step (the reference)."""
    K = len(cfg.components)
    out = np.zeros((T, S, K), np.float32)
    base = np.zeros((T, K), np.float32)
    kt = jax.random.split(key, T)
    for j in range(T) if rows is None else rows:
        k_init, k_steps = jax.random.split(kt[j])
        s = INIT(cfg, k_init)
        base[j] = s.base_log_weights
        ks = jax.random.split(k_steps, S)
        for t in range(S):
            out[j, t] = STEP(s, ks[t], cfg).log_weights
    return out, base


@jax.jit
def _vmapped_contract(key, cfg):
    """The key contract written with vmap over init/step (64 trajectories x 8 steps)."""
    def trajectory(k):
        k_init, k_steps = jax.random.split(k)
        s = rw.init(cfg, k_init)
        return jax.vmap(lambda ks: rw.step(s, ks, cfg).log_weights)(jax.random.split(k_steps, 8)), s.base_log_weights

    return jax.vmap(trajectory)(jax.random.split(key, 64))


# ------------------------------------------------------------ distribution
def _np_law(rs, mu, ts, ss, lo, hi, T, S):
    """The same law in NumPy (legacy RandomState normals, as torchref draws them)."""
    base = np.clip(mu + ts * rs.standard_normal((T, len(mu))), lo, hi)
    lw = np.clip(base[:, None] + ss * rs.standard_normal((T, S, len(mu))), lo, hi)
    return base.astype(np.float32), lw.astype(np.float32)


def _within(x, ref, se, nse=6.0, what=""):
    x, ref, se = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(ref, np.float64), np.asarray(se, np.float64))
    bad = np.abs(x - ref) > nse * se
    assert not bad.any(), f"{what}: {x[bad]} vs {ref[bad]} (> {nse} s.e. = {nse * se[bad]})"


def test_two_level_moments_unclipped():
    """Base mean/std per component, step std, no accumulation; tolerances = 6 standard errors."""
    T, S = 8000, 16
    mu = np.array([0.0, 0.5, -1.0, 1.0], np.float32)
    ts = np.array([0.8, 0.3, 1.0, 0.5], np.float32)
    ss = np.array([0.1, 0.3, 0.05, 0.2], np.float32)
    cfg = rw.config(("a", "b", "c", "d"), mu, ts, ss, log_weight_bounds=(-20.0, 20.0))
    lw, base = (np.asarray(x, np.float64) for x in SCHEDULE(7, cfg, T, S))
    _within(base.mean(0), mu, ts / math.sqrt(T), what="base mean")
    _within(base.std(0), ts, ts / math.sqrt(2 * T), what="base std")
    d = lw - base[:, None]                         # perturbation around the base
    _within(d.mean((0, 1)), 0.0, ss / math.sqrt(T * S), what="step mean")
    _within(d.std((0, 1)), ss, ss / math.sqrt(2 * T * S), what="step std")
    # not a random walk: the spread around the base is the same at the first and the last step
    for t in (0, S - 1):
        _within(d[:, t].std(0), ss, ss / math.sqrt(2 * T), what=f"step std at t={t}")
    # steps are independent draws around the base: no correlation between consecutive steps
    c = np.array([np.corrcoef(d[:, t, k], d[:, t + 1, k])[0, 1] for t in range(S - 1) for k in range(4)])
    _within(c.mean(), 0.0, 1 / math.sqrt(T * (S - 1) * 4), what="lag-1 correlation")
    # components are independent
    cc = np.corrcoef(base.T)[np.triu_indices(4, 1)]
    _within(cc, 0.0, 1 / math.sqrt(T), what="cross-component correlation")
    # total variance of a step's log-weight = ts^2 + ss^2
    _within(lw[:, S // 2].var(0), ts**2 + ss**2, (ts**2 + ss**2) * math.sqrt(2 / T), what="total variance")


def test_clipping_matches_numpy_law():
    """Clip fractions at both bounds and clipped means vs a NumPy implementation of the same law."""
    T, S = 6000, 8
    mu = np.array([0.5, -0.5, 0.0], np.float32)
    ts = np.array([1.0, 0.6, 1.5], np.float32)
    ss = np.array([0.3, 0.5, 0.2], np.float32)
    lo = np.array([-0.5, -1.0, -1.0], np.float32)
    hi = np.array([1.0, 0.0, 1.0], np.float32)
    cfg = rw.config(("a", "b", "c"), mu, ts, ss, log_weight_bounds=(lo, hi))
    lw, base = (np.asarray(x) for x in SCHEDULE(11, cfg, T, S))
    assert (lw >= lo).all() and (lw <= hi).all() and (base >= lo).all() and (base <= hi).all()
    w = np.exp(lw)
    assert (w >= np.exp(lo) * (1 - 1e-6)).all() and (w <= np.exp(hi) * (1 + 1e-6)).all()
    n_ref = 200_000
    rbase, rlw = _np_law(np.random.RandomState(0), mu, ts, ss, lo, hi, n_ref, 1)
    for name, a, b in (("base", base, rbase), ("first step", lw[:, 0], rlw[:, 0])):
        for bound, side in ((lo, "lower"), (hi, "upper")):
            p, q = (a == bound).mean(0), (b == bound).mean(0)
            pool = (p * T + q * n_ref) / (T + n_ref)
            se = np.sqrt(pool * (1 - pool) * (1 / T + 1 / n_ref))
            assert (pool > 0.05).all(), "the test config must clip noticeably"
            _within(p, q, se, what=f"{name} clip fraction at the {side} bound")
        se = np.sqrt(a.var(0) / T + b.var(0) / n_ref)
        _within(a.mean(0), b.mean(0), se, what=f"{name} clipped mean")
    # analytic clip fraction of the base: P(mu + ts z <= lo) = Phi((lo - mu) / ts)
    phi = 0.5 * (1 + np.vectorize(math.erf)((lo - mu) / ts / math.sqrt(2)))
    _within((base == lo).mean(0), phi, np.sqrt(phi * (1 - phi) / T), what="analytic lower clip fraction")


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1),
       st.lists(st.floats(-4, 4), min_size=3, max_size=3),
       st.lists(st.floats(0, 3), min_size=3, max_size=3),
       st.floats(0, 2), st.floats(-5, 0), st.floats(0, 5))
def test_property_inside_bounds_and_exact(seed, mu, ts, ss, lo, hi):
    cfg = rw.config(("a", "b", "c"), mu, ts, ss, log_weight_bounds=(lo, hi))
    lw, base = SCHEDULE(seed, cfg, 64, 8)
    # the fused hash and the key contract written with vmapped init/step agree bit for bit for any values
    lv, bv = _vmapped_contract(jax.random.key(seed), cfg)
    np.testing.assert_array_equal(lw, lv)
    np.testing.assert_array_equal(base, bv)
    lw, base = np.asarray(lw), np.asarray(base)
    assert np.isfinite(lw).all()
    lo32, hi32 = np.float32(lo), np.float32(hi)
    assert (lw >= lo32).all() and (lw <= hi32).all() and (base >= lo32).all() and (base <= hi32).all()
    w = np.exp(lw.astype(np.float64))
    assert (w >= math.exp(lo32) * (1 - 1e-6)).all() and (w <= math.exp(hi32) * (1 + 1e-6)).all()


# -------------------------------------------------------------- key contract
@pytest.mark.parametrize("T, S", [(5, 7), (50, 100)])   # fused single kernel / per-component scan
def test_schedule_equals_loop_bit_for_bit(T, S):
    cfg = rw.config(default_log_weights={"xray": 0.7, "KL": -0.4}, trajectory_sigmas={"bond": 1.3},
                    step_sigmas={"angle": 0.45}, log_weight_bounds=(-1.5, 2.5))
    key = jax.random.key(42)
    out, base = SCHEDULE(key, cfg, T, S)
    assert out.shape == (T, S, K10) and out.dtype == jnp.float32 and base.shape == (T, K10)
    rows = [0, T // 2, T - 1]
    ref, rbase = _loop_schedule(key, cfg, T, S, rows)
    np.testing.assert_array_equal(np.asarray(out)[rows], ref[rows])
    np.testing.assert_array_equal(np.asarray(base)[rows], rbase[rows])
    if T * S < 100:   # inside an outer jit with the config as an argument, and from an int seed
        np.testing.assert_array_equal(jax.jit(lambda k, c: rw.sample_schedule(k, c, T, S))(key, cfg), out)
        np.testing.assert_array_equal(SCHEDULE(42, cfg, T, S).log_weights, out)


def test_schedule_key_contract_other_generators():
    """With a non-threefry key or jax_threefry_partitionable off, the schedule runs the contract itself."""
    cfg = rw.config(("a", "b", "c"), trajectory_sigmas=1.0, step_sigmas=0.4)
    T, S = 4, 6
    rbg = jax.random.key(3, impl="rbg")
    out = SCHEDULE(rbg, cfg, T, S).log_weights
    np.testing.assert_array_equal(out, _loop_schedule(rbg, cfg, T, S)[0])
    with jax.threefry_partitionable(False):
        key = jax.random.key(3)
        out = jax.jit(rw.sample_schedule, static_argnums=(2, 3))(key, cfg, T, S)
        np.testing.assert_array_equal(out, _loop_schedule(key, cfg, T, S)[0])


def test_schedule_sizes_and_errors():
    cfg = rw.config(("a", "b"))
    for partitionable in (True, False):   # the fused hash and the contract by definition
        with jax.threefry_partitionable(partitionable):
            out, base = rw.sample_schedule_with_base(0, cfg, 0, 5)
            assert out.shape == (0, 5, 2) and base.shape == (0, 2)
            out, base = rw.sample_schedule_with_base(0, cfg, 3, 0)
            assert out.shape == (3, 0, 2) and base.shape == (3, 2)
            # the bases do not depend on the number of steps
            np.testing.assert_array_equal(base, rw.sample_schedule_with_base(0, cfg, 3, 4).base)
    for bad, match in ((dict(num_trajectories=-1), "num_trajectories must be >= 0"),
                       (dict(num_steps=-2), "num_steps must be >= 0"),
                       (dict(num_steps=2.0), "num_steps must be a static Python int")):
        kw = dict(num_trajectories=2, num_steps=3) | bad
        with pytest.raises(ValueError, match=match):
            rw.sample_schedule(0, cfg, **kw)
    with pytest.raises(ValueError, match="single key"):
        rw.sample_schedule(jax.random.split(jax.random.key(0), 2), cfg, 2, 3)


def test_vmap_over_1e4_trajectories_equals_schedule():
    """vmapped init/step over 10^4 trajectories with the contract's keys = sample_schedule, bit for bit."""
    cfg = rw.config()
    T, S = 10_000, 2
    key = jax.random.key(9)
    pairs = jax.vmap(jax.random.split)(jax.random.split(key, T))
    states = jax.jit(jax.vmap(rw.init, in_axes=(None, 0)))(cfg, pairs[:, 0])
    step_keys = jax.vmap(lambda k: jax.random.split(k, S))(pairs[:, 1])        # [T, S]
    vstep = jax.jit(jax.vmap(rw.step, in_axes=(0, 0, None)))
    sched, base = SCHEDULE(key, cfg, T, S)
    np.testing.assert_array_equal(states.base_log_weights, base)
    for t in range(S):
        st_t = vstep(states, step_keys[:, t], cfg)
        np.testing.assert_array_equal(st_t.log_weights, sched[:, t])
        assert st_t.sample_count.shape == (T,) and int(st_t.sample_count[0]) == 1


def test_sigma_sweep_vmap_and_no_recompile():
    sig = (0.2, 0.8, 1.5)
    cfgs = [rw.config(trajectory_sigmas=s, step_sigmas=s / 4) for s in sig]
    sweep = rw.stack_configs(*cfgs)
    key = jax.random.key(1)
    f = jax.jit(jax.vmap(lambda c: rw.sample_schedule(key, c, 16, 4), in_axes=0))
    one = jax.jit(rw.sample_schedule, static_argnums=(2, 3))
    out = f(sweep)
    for i, c in enumerate(cfgs):
        np.testing.assert_array_equal(out[i], one(key, c, 16, 4))
    # the spread grows with sigma: the sweep really uses the per-config values
    assert float(out[0].std()) < float(out[1].std()) < float(out[2].std())
    # new sigma values (and keys): nothing is compiled again, neither the sweep nor a single schedule
    sweep2 = rw.stack_configs(*(rw.config(trajectory_sigmas=s + 0.1, step_sigmas=0.05) for s in sig))
    with CompileCounter() as cc:
        jax.block_until_ready(f(sweep2))
        jax.block_until_ready(one(jax.random.key(2), rw.config(trajectory_sigmas=2.0), 16, 4))
    assert cc.count == 0, cc.messages
    with pytest.raises(ValueError, match="same components"):
        rw.stack_configs(rw.config(), rw.config(("a",)))


