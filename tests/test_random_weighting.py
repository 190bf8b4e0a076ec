"""jaxweight.random_weighting: config, the two-level sampling law, the schedule key contract,
X-ray scale, combine, component weighting, contracts."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import random_weighting as rw
from tests.contracts import CompileCounter, assert_trees_close, check_state_contract

K10 = len(rw.TORCHREF_COMPONENTS)


def _loop_schedule(key, cfg, T, S, rows=None):
    """The documented key contract, as a plain Python loop over init/step (the reference)."""
    K = len(cfg.components)
    out = np.zeros((T, S, K), np.float32)
    base = np.zeros((T, K), np.float32)
    kt = jax.random.split(key, T)
    for j in range(T) if rows is None else rows:
        k_init, k_steps = jax.random.split(kt[j])
        s = rw.init(cfg, k_init)
        base[j] = s.base_log_weights
        ks = jax.random.split(k_steps, S)
        for t in range(S):
            out[j, t] = rw.step(s, ks[t], cfg).log_weights
    return out, base


# ------------------------------------------------------------------ config
def test_config_defaults_and_dtypes():
    cfg = rw.config()
    assert cfg.components == rw.TORCHREF_COMPONENTS
    for f, v in (("mu", 0.0), ("trajectory_sigma", 0.8), ("step_sigma", 0.1), ("lower", -3.0), ("upper", 3.0)):
        x = getattr(cfg, f)
        assert x.dtype == jnp.float32 and x.shape == (K10,) and not x.weak_type
        np.testing.assert_array_equal(x, np.full(K10, v, np.float32))
    code = rw.config(**rw.TORCHREF_CODE_DEFAULTS)
    np.testing.assert_array_equal(code.trajectory_sigma, np.full(K10, 1.5, np.float32))
    np.testing.assert_array_equal(code.step_sigma, np.full(K10, 0.3, np.float32))


def test_config_three_forms_and_merge_over_defaults():
    cfg = rw.config(default_log_weights={"bond": 1}, trajectory_sigmas={"xray": 1.5, "KL": 0},
                    step_sigmas=np.arange(K10), log_weight_bounds=(-2, np.linspace(2.0, 3.0, K10)))
    i = rw.TORCHREF_COMPONENTS.index
    mu = np.zeros(K10, np.float32)
    mu[i("bond")] = 1.0
    ts = np.full(K10, 0.8, np.float32)
    ts[i("xray")], ts[i("KL")] = 1.5, 0.0
    np.testing.assert_array_equal(cfg.mu, mu)
    np.testing.assert_array_equal(cfg.trajectory_sigma, ts)
    np.testing.assert_array_equal(cfg.step_sigma, np.arange(K10, dtype=np.float32))
    np.testing.assert_array_equal(cfg.lower, np.full(K10, -2.0, np.float32))
    np.testing.assert_array_equal(cfg.upper, np.linspace(2.0, 3.0, K10).astype(np.float32))
    assert all(getattr(cfg, f).dtype == jnp.float32 for f in ("mu", "trajectory_sigma", "step_sigma", "lower", "upper"))
    # custom components, bounds as mappings over (-3, 3)
    c2 = rw.config(("a", "b"), log_weight_bounds=({"a": -1.0}, 2.0))
    np.testing.assert_array_equal(c2.lower, [-1.0, -3.0])
    np.testing.assert_array_equal(c2.upper, [2.0, 2.0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(components=()), "at least one component"),
    (dict(components=("a", "b", "a")), "unique; duplicated: \\['a'\\]"),
    (dict(components="xray"), "sequence of names"),
    (dict(components=("a", 3)), "strings"),
    (dict(step_sigmas={"foo": 0.2}), "step_sigmas names unknown component 'foo'; components are \\('xray'"),
    (dict(default_log_weights={"xray": 0.0, "bar": 1.0}), "default_log_weights names unknown component 'bar'"),
    (dict(trajectory_sigmas=np.ones(3)),
     "trajectory_sigmas must be a scalar, a mapping or an array of shape \\(10,\\)"),
    (dict(step_sigmas=np.ones((10, 1))), "shape \\(10,\\), got shape \\(10, 1\\)"),
    (dict(trajectory_sigmas=-0.5), "^trajectory_sigmas\\['xray'\\] must be finite and >= 0.0, got -0.5$"),
    (dict(step_sigmas={"KL": -1.0}), "step_sigmas\\['KL'\\] must be finite and >= 0.0, got -1.0"),
    (dict(step_sigmas=float("nan")), "step_sigmas\\['xray'\\] must be finite and >= 0.0, got nan"),
    (dict(trajectory_sigmas=float("inf")), "trajectory_sigmas\\['xray'\\] must be finite"),
    (dict(default_log_weights={"bond": float("inf")}), "default_log_weights\\['bond'\\] must be finite, got inf"),
    (dict(log_weight_bounds=(1.0, -1.0)), "log_weight_bounds\\[0\\]\\['xray'\\] must be <= log_weight_bounds\\[1\\]\\['xray'\\], got .*=1.0 and .*=-1.0"),
    (dict(log_weight_bounds=(-1.0, {"angle": -2.0})), "log_weight_bounds\\[0\\]\\['angle'\\] must be <="),
    (dict(log_weight_bounds=(float("nan"), 1.0)), "log_weight_bounds\\[0\\]\\['xray'\\] must be a number, got nan"),
    (dict(log_weight_bounds=(-1.0, 0.0, 1.0)), "pair \\(lo, hi\\)"),
    (dict(log_weight_bounds=3.0), "pair \\(lo, hi\\)"),
    (dict(step_sigmas="big"), "step_sigmas must be a scalar"),
    (dict(step_sigmas={"xray": np.ones(2)}), "step_sigmas\\['xray'\\] must be a scalar"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rw.config(**kwargs)


def test_config_zero_width_and_infinite_bounds_allowed():
    cfg = rw.config(("a", "b"), default_log_weights=0.5, log_weight_bounds=((0.2, -np.inf), (0.2, np.inf)))
    s = rw.init(cfg, 0)
    assert float(s.base_log_weights[0]) == pytest.approx(0.2)


# -------------------------------------------------------- state functions
def test_init_step_resample_semantics(key):
    cfg = rw.config()
    s0 = rw.init(cfg, key)
    np.testing.assert_array_equal(s0.log_weights, s0.base_log_weights)
    assert s0.sample_count.dtype == jnp.int32 and int(s0.sample_count) == 0
    s1 = rw.step(s0, jax.random.key(1), cfg)
    s2 = rw.step(s1, jax.random.key(2), cfg)
    np.testing.assert_array_equal(s2.base_log_weights, s0.base_log_weights)
    assert int(s2.sample_count) == 2
    assert not np.array_equal(s1.log_weights, s2.log_weights)
    # each step starts from the base: step(s1, k) == step(s0, k) in log_weights
    np.testing.assert_array_equal(rw.step(s1, jax.random.key(7), cfg).log_weights,
                                  rw.step(s0, jax.random.key(7), cfg).log_weights)
    r = rw.resample_trajectory(s2, jax.random.key(3), cfg)
    assert int(r.sample_count) == 0
    assert_trees_close(r, rw.init(cfg, jax.random.key(3)))
    # int seeds and legacy keys are accepted and mean jax.random.key(seed)
    assert_trees_close(rw.init(cfg, 5), rw.init(cfg, jax.random.key(5)))
    assert_trees_close(rw.init(cfg, jax.random.PRNGKey(5)), rw.init(cfg, jax.random.key(5)))
    w = rw.weights(s2)
    np.testing.assert_allclose(w, np.exp(np.asarray(s2.log_weights)), rtol=1e-6)


def test_zero_sigma_gives_clipped_mean_and_base():
    cfg = rw.config(("a", "b", "c"), default_log_weights=[0.5, -4.0, 4.0], trajectory_sigmas=0.0, step_sigmas=0.0)
    s = rw.init(cfg, 1)
    np.testing.assert_array_equal(s.base_log_weights, np.array([0.5, -3.0, 3.0], np.float32))
    np.testing.assert_array_equal(rw.step(s, 2, cfg).log_weights, s.base_log_weights)
    cfg2 = rw.config(("a", "b"), trajectory_sigmas=1.0, step_sigmas=0.0)
    s2 = rw.init(cfg2, 3)
    np.testing.assert_array_equal(rw.step(s2, 4, cfg2).log_weights, s2.base_log_weights)


def test_worked_example_float32_exp():
    lw = jnp.array([0.60604590, -0.34711537, 2.06496978, 0.39014897], jnp.float32)
    s = rw.RandomWeightingState(lw, lw, jnp.zeros((), jnp.int32))
    w = rw.weights(s)
    assert w.dtype == jnp.float32
    np.testing.assert_allclose(w, [1.8331685, 0.7067238, 7.8850594, 1.4772009], rtol=1e-6)


def test_state_function_errors(key):
    cfg = rw.config()
    s = rw.init(cfg, key)
    with pytest.raises(ValueError, match="single key"):
        rw.init(cfg, jax.random.split(key, 3))
    with pytest.raises(ValueError, match="key"):
        rw.init(cfg, 1.5)
    with pytest.raises(ValueError, match="cfg must be a RandomWeightingConfig"):
        rw.init({"xray": 1.0}, key)
    with pytest.raises(ValueError, match="state.base_log_weights must have shape \\(3,\\), got \\(10,\\)"):
        rw.step(s, key, rw.config(("a", "b", "c")))
    with pytest.raises(ValueError, match="cfg.mu must have shape \\(10,\\)"):
        rw.init(rw.stack_configs(cfg, cfg), key)


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
    lw, base = (np.asarray(x, np.float64) for x in rw.sample_schedule_with_base(7, cfg, T, S))
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
    lw, base = (np.asarray(x) for x in rw.sample_schedule_with_base(11, cfg, T, S))
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
    lw, base = rw.sample_schedule_with_base(seed, cfg, 64, 8)
    # the fused path and the vmapped key contract agree bit for bit for any values
    lv, bv = rw.sample_schedule_with_base(seed, cfg, 64, 8, method="vmap")
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
    out, base = rw.sample_schedule_with_base(key, cfg, T, S)
    assert out.shape == (T, S, K10) and out.dtype == jnp.float32 and base.shape == (T, K10)
    rows = [0, T // 2, T - 1]
    ref, rbase = _loop_schedule(key, cfg, T, S, rows)
    np.testing.assert_array_equal(np.asarray(out)[rows], ref[rows])
    np.testing.assert_array_equal(np.asarray(base)[rows], rbase[rows])
    # the other formulations give the same bits (the sequential "map" only at the small size: slow to compile)
    for method in ("vmap", "map") if T * S < 100 else ("vmap",):
        o2, b2 = rw.sample_schedule_with_base(key, cfg, T, S, method=method)
        np.testing.assert_array_equal(o2, out)
        np.testing.assert_array_equal(b2, base)
    if T * S < 100:   # inside an outer jit, and from an int seed
        np.testing.assert_array_equal(jax.jit(lambda k, c: rw.sample_schedule(k, c, T, S))(key, cfg), out)
        np.testing.assert_array_equal(rw.sample_schedule(42, cfg, T, S), out)


def test_schedule_key_contract_other_generators():
    """With a non-threefry key or jax_threefry_partitionable off, 'auto' takes the vmap path; same contract."""
    cfg = rw.config(("a", "b", "c"), trajectory_sigmas=1.0, step_sigmas=0.4)
    T, S = 4, 6
    rbg = jax.random.key(3, impl="rbg")
    out = rw.sample_schedule(rbg, cfg, T, S)
    np.testing.assert_array_equal(out, _loop_schedule(rbg, cfg, T, S)[0])
    with pytest.raises(ValueError, match="needs a threefry2x32 key"):
        rw.sample_schedule(rbg, cfg, T, S, method="fused")
    with jax.threefry_partitionable(False):
        key = jax.random.key(3)
        out = rw.sample_schedule(key, cfg, T, S)
        np.testing.assert_array_equal(out, _loop_schedule(key, cfg, T, S)[0])
        with pytest.raises(ValueError, match="partitionable"):
            rw.sample_schedule(key, cfg, T, S, method="fused")


def test_schedule_sizes_and_errors():
    cfg = rw.config(("a", "b"))
    for method in ("fused", "vmap", "map"):
        out, base = rw.sample_schedule_with_base(0, cfg, 0, 5, method=method)
        assert out.shape == (0, 5, 2) and base.shape == (0, 2)
        out, base = rw.sample_schedule_with_base(0, cfg, 3, 0, method=method)
        assert out.shape == (3, 0, 2) and base.shape == (3, 2)
    # the bases do not depend on the number of steps
    np.testing.assert_array_equal(base, rw.sample_schedule_with_base(0, cfg, 3, 4)[1])
    for bad, match in ((dict(num_trajectories=-1), "num_trajectories must be >= 0"),
                       (dict(num_steps=-2), "num_steps must be >= 0"),
                       (dict(num_steps=2.0), "num_steps must be a static Python int"),
                       (dict(method="loop"), "method must be"),
                       (dict(return_base=1), "return_base must be a bool")):
        kw = dict(num_trajectories=2, num_steps=3) | bad
        with pytest.raises(ValueError, match=match):
            rw.sample_schedule(0, cfg, **kw)


def test_vmap_over_1e4_trajectories_equals_schedule():
    """vmapped init/step over 10^4 trajectories with the contract's keys = sample_schedule, bit for bit."""
    cfg = rw.config()
    T, S = 10_000, 2
    key = jax.random.key(9)
    pairs = jax.vmap(jax.random.split)(jax.random.split(key, T))
    states = jax.vmap(rw.init, in_axes=(None, 0))(cfg, pairs[:, 0])
    step_keys = jax.vmap(lambda k: jax.random.split(k, S))(pairs[:, 1])        # [T, S]
    vstep = jax.jit(jax.vmap(rw.step, in_axes=(0, 0, None)))
    sched, base = rw.sample_schedule_with_base(key, cfg, T, S)
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
    out = f(sweep)
    for i, c in enumerate(cfgs):
        np.testing.assert_array_equal(out[i], rw.sample_schedule(key, c, 16, 4))
    # the spread grows with sigma: the sweep really uses the per-config values
    assert float(out[0].std()) < float(out[1].std()) < float(out[2].std())
    # new sigma values (and keys): nothing is compiled again, neither the sweep nor a single schedule
    sweep2 = rw.stack_configs(*(rw.config(trajectory_sigmas=s + 0.1, step_sigmas=0.05) for s in sig))
    with CompileCounter() as cc:
        jax.block_until_ready(f(sweep2))
        jax.block_until_ready(rw.sample_schedule(jax.random.key(2), rw.config(trajectory_sigmas=2.0), 16, 4))
    assert cc.count == 0, cc.messages
    with pytest.raises(ValueError, match="same components"):
        rw.stack_configs(rw.config(), rw.config(("a",)))


# --------------------------------------------------------------- reporting
def test_stats_and_to_dict(key):
    cfg = rw.config()
    s = rw.step(rw.init(cfg, key), 1, cfg)
    d = rw.stats(s, cfg)
    assert len(d) == 31 == 1 + 3 * K10
    assert list(d)[0] == "sample_count"
    for i, c in enumerate(cfg.components):
        assert float(d[f"weight_{c}"]) == pytest.approx(math.exp(float(s.log_weights[i])), rel=1e-6)
        assert float(d[f"log_weight_{c}"]) == float(s.log_weights[i])
        assert float(d[f"base_log_weight_{c}"]) == float(s.base_log_weights[i])
    dj = jax.jit(rw.stats)(s, cfg)
    assert_trees_close(dj, d, rtol=1e-6)
    td = rw.to_dict(rw.weights(s), cfg)
    assert list(td) == list(cfg.components) and all(isinstance(v, float) for v in td.values())
    with pytest.raises(ValueError, match="values must have shape \\(10,\\)"):
        rw.to_dict(jnp.ones(3), cfg)
    # batched states give batched stats
    b = jax.vmap(rw.init, in_axes=(None, 0))(cfg, jax.random.split(key, 4))
    assert rw.stats(b, cfg)["weight_xray"].shape == (4,)


# ---------------------------------------------------------------- X-ray scale
def _run_xray(state, losses, **kw):
    ws = []
    for L in losses:
        state, w = rw.xray_scale_update(state, L, **kw)
        ws.append(float(w))
    return state, ws


def test_xray_scale_worked_examples():
    _, ws = _run_xray(rw.xray_scale_init(), [100.0, 100.0, 100.0])
    np.testing.assert_allclose(ws, [0.75, 0.625, 0.5625], rtol=1e-6)
    _, ws = _run_xray(rw.xray_scale_init(), [100.0, 3.0, 1e9])          # later losses are ignored
    np.testing.assert_allclose(ws, [0.75, 0.625, 0.5625], rtol=1e-6)
    st2, ws = _run_xray(rw.xray_scale_init(initial_loss=2.0), [123.0, 0.5, 7.0])
    np.testing.assert_allclose(ws, [5.5, 7.75, 8.875], rtol=1e-6)
    assert float(st2.initial_loss) == 2.0
    _, ws = _run_xray(rw.xray_scale_init(), [1.0])
    np.testing.assert_allclose(ws, [5.5], rtol=1e-6)


def test_xray_scale_init_and_edge_cases():
    s = rw.xray_scale_init()
    assert s.weight.dtype == jnp.float32 and float(s.weight) == 1.0
    assert float(s.initial_loss) == 0.0 and not bool(s.initialized)
    z = rw.xray_scale_init(0.0)                                          # explicit 0 counts as set
    assert bool(z.initialized)
    # L0 + 1e-6 == 0 -> t = +inf -> max_weight
    _, ws = _run_xray(z, [5.0])
    np.testing.assert_allclose(ws, [0.5 * 1.0 + 0.5 * 10.0], rtol=1e-6)
    _, ws = _run_xray(rw.xray_scale_init(np.float32(-1e-6)), [5.0])
    np.testing.assert_allclose(ws, [5.5], rtol=1e-6)
    # a non-finite first loss leaves the state alone; the next finite loss sets the scale
    for bad in (float("nan"), float("inf")):
        s1, w = rw.xray_scale_update(s, bad)
        assert_trees_close(s1, s)
        assert float(w) == 1.0
        _, ws = _run_xray(s1, [100.0])
        np.testing.assert_allclose(ws, [0.75], rtol=1e-6)
    # once initialised, a NaN loss is bad data too: the state stays exactly as it was
    s2, w2 = rw.xray_scale_update(s, 100.0)
    s3, w = rw.xray_scale_update(s2, float("nan"))
    assert_trees_close(s3, s2)
    np.testing.assert_allclose(float(w), float(w2), rtol=0)
    # custom hyperparameters: t = clip(10 / 100, 0.2, 5) = 0.2; w = 0.9 * 1 + 0.1 * 0.2
    _, ws = _run_xray(s, [100.0], target_scale=10.0, min_weight=0.2, max_weight=5.0, smoothing=0.9)
    np.testing.assert_allclose(ws, [0.92], rtol=1e-6)


def test_xray_scale_traced_hyperparameters_and_errors():
    f = jax.jit(rw.xray_scale_update)
    s, w = f(rw.xray_scale_init(), 100.0, 10.0, 0.2, 5.0, 0.9)
    np.testing.assert_allclose(float(w), 0.92, rtol=1e-6)
    with pytest.raises(ValueError, match="min_weight must be <= max_weight"):
        rw.xray_scale_update(rw.xray_scale_init(), 1.0, min_weight=2.0, max_weight=1.0)
    with pytest.raises(ValueError, match="smoothing must be finite and in \\[0.0, 1.0\\], got 1.5"):
        rw.xray_scale_update(rw.xray_scale_init(), 1.0, smoothing=1.5)
    with pytest.raises(ValueError, match="xray_loss must be a scalar"):
        rw.xray_scale_update(rw.xray_scale_init(), jnp.ones(2))
    with pytest.raises(ValueError, match="initial_loss must be finite"):
        rw.xray_scale_init(float("nan"))
    with pytest.raises(ValueError, match="XrayScaleState"):
        rw.xray_scale_update(rw.init(rw.config(), 0), 1.0)


# ------------------------------------------------------------------ combine
def test_combine_semantics():
    out = rw.combine({"xray": 0.75}, {"xray": 1.8331685, "bond": 0.7067238})
    assert list(out) == ["xray", "bond"]
    np.testing.assert_allclose(float(out["xray"]), 1.3748764, rtol=1e-6)
    np.testing.assert_allclose(float(out["bond"]), 0.7067238, rtol=1e-6)
    assert out["xray"].dtype == jnp.float32
    out = rw.combine({"b": 2.0}, {"a": 3.0, "b": jnp.array([1.0, 2.0])}, {"c": 1.0, "a": 0.5, "b": 10.0})
    assert list(out) == ["b", "a", "c"]                       # order of first appearance
    np.testing.assert_allclose(out["b"], [20.0, 40.0])        # broadcasts
    np.testing.assert_allclose(float(out["a"]), 1.5)
    assert rw.combine() == {}
    with pytest.raises(ValueError, match="argument 1 must be a mapping"):
        rw.combine({"a": 1.0}, [("a", 2.0)])
    with pytest.raises(ValueError, match="non-string key"):
        rw.combine({1: 1.0})


def test_component_weights(key):
    cfg = rw.config()
    s = rw.component_init(cfg, key)
    s1, out = rw.component_weights(s, jax.random.key(1), cfg, 100.0)
    assert list(out) == list(cfg.components)                  # exactly the K keys ("xray" first)
    w = rw.weights(s1.random)
    np.testing.assert_allclose(float(out["xray"]), 0.75 * float(w[0]), rtol=1e-6)
    for i, c in enumerate(cfg.components[1:], 1):
        assert float(out[c]) == float(w[i])
    assert int(s1.random.sample_count) == 1
    # without resampling the random weights stay, the X-ray EMA still advances, key may be None
    s2, out2 = rw.component_weights(s1, None, cfg, 100.0, resample_each_step=False)
    assert_trees_close(s2.random, s1.random)
    np.testing.assert_allclose(float(s2.xray.weight), 0.625, rtol=1e-6)
    np.testing.assert_allclose(float(out2["xray"]), 0.625 * float(w[0]), rtol=1e-6)
    # initial_xray_loss and extra X-ray kwargs are passed through
    s3, out3 = rw.component_weights(rw.component_init(cfg, key, initial_xray_loss=2.0), 1, cfg, 7.0,
                                    max_weight=4.0)
    np.testing.assert_allclose(float(s3.xray.weight), 2.5, rtol=1e-6)
    # components without "xray": the scale is an extra key
    c2 = rw.config(("bond", "angle"))
    _, o = rw.component_weights(rw.component_init(c2, 0), 1, c2, 100.0)
    assert list(o) == ["xray", "bond", "angle"] and float(o["xray"]) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="resample_each_step must be a static bool"):
        rw.component_weights(s, key, cfg, 1.0, resample_each_step=jnp.array(True))


# ------------------------------------------------------------------ contracts
def test_contract_random_weighting_state(tmp_path):
    cfg = rw.config()
    cfg2 = rw.config(default_log_weights=0.3, trajectory_sigmas=1.2, step_sigmas=0.4, log_weight_bounds=(-2.0, 2.0))
    keys = jax.random.split(jax.random.key(0), 6)
    check_state_contract(
        init=lambda: rw.init(cfg, jax.random.key(1)),
        update=lambda s, k, c: rw.step(s, k, c),
        update_args=(jax.random.key(2), cfg),
        update_args_alt=(jax.random.key(3), cfg2),
        batched_init=lambda: jax.vmap(rw.init, in_axes=(None, 0))(cfg, keys),
        batched_update_in_axes=(0, None),
        batched_update_args=(jax.random.split(jax.random.key(4), 6), cfg),
        tmp_path=tmp_path,
    )
    check_state_contract(   # resample_trajectory too
        init=lambda: rw.init(cfg, jax.random.key(1)),
        update=lambda s, k, c: rw.resample_trajectory(s, k, c),
        update_args=(jax.random.key(2), cfg),
        update_args_alt=(jax.random.key(3), cfg2),
    )


def test_contract_xray_scale_state(tmp_path):
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    hp = tuple(map(f32, (50.0, 0.01, 10.0, 0.5)))
    hp2 = tuple(map(f32, (10.0, 0.2, 5.0, 0.9)))
    check_state_contract(
        init=lambda: rw.xray_scale_init(),
        update=lambda s, loss, *h: rw.xray_scale_update(s, loss, *h),
        update_args=(f32(100.0), *hp),
        update_args_alt=(f32(3.0), *hp2),
        batched_init=lambda: jax.vmap(lambda L: rw.xray_scale_init(L))(f32([1.0, 2.0, 0.0])),
        batched_update_in_axes=(0, None, None, None, None),
        batched_update_args=(f32([100.0, float("nan"), 1.0]), *hp),
        tmp_path=tmp_path,
    )


def test_contract_component_weighting_state(tmp_path):
    cfg = rw.config()
    cfg2 = rw.config(trajectory_sigmas=0.3)
    check_state_contract(
        init=lambda: rw.component_init(cfg, jax.random.key(1)),
        update=lambda s, k, c, loss: rw.component_weights(s, k, c, loss),
        update_args=(jax.random.key(2), cfg, jnp.float32(100.0)),
        update_args_alt=(jax.random.key(3), cfg2, jnp.float32(5.0)),
        batched_init=lambda: jax.vmap(rw.component_init, in_axes=(None, 0))(
            cfg, jax.random.split(jax.random.key(5), 4)),
        batched_update_in_axes=(0, None, 0),
        batched_update_args=(jax.random.split(jax.random.key(6), 4), cfg, jnp.float32([1.0, 10.0, 100.0, 1e3])),
        tmp_path=tmp_path,
    )


# ------------------------------------------------------------ deprecated aliases
def test_deprecated_init_key_first_same_result():
    cfg = rw.config()
    with pytest.deprecated_call(match=r"init\(key, cfg\)"):
        old = rw.init(jax.random.key(3), cfg)
    assert_trees_close(old, rw.init(cfg, jax.random.key(3)))
    with pytest.deprecated_call():
        old = rw.init(7, cfg)
    assert_trees_close(old, rw.init(cfg, 7))


def test_deprecated_component_init_key_first_same_result():
    cfg = rw.config()
    with pytest.deprecated_call(match=r"component_init\(key, cfg"):
        old = rw.component_init(jax.random.key(3), cfg, initial_xray_loss=2.0)
    assert_trees_close(old, rw.component_init(cfg, jax.random.key(3), initial_xray_loss=2.0))


def test_init_needs_a_key():
    with pytest.raises(ValueError, match="needs a key"):
        rw.init(rw.config())


def test_deprecated_return_base_same_result():
    cfg = rw.config()
    with pytest.deprecated_call(match="return_base"):
        lw, base = rw.sample_schedule(3, cfg, 5, 4, return_base=True)
    new = rw.sample_schedule_with_base(3, cfg, 5, 4)
    np.testing.assert_array_equal(lw, new.log_weights)
    np.testing.assert_array_equal(base, new.base)
    np.testing.assert_array_equal(rw.sample_schedule(3, cfg, 5, 4), new.log_weights)


def test_metrics_dict_flat_floats():
    cfg = rw.config(("a", "b"))
    s = rw.step(rw.init(cfg, 0), 1, cfg)
    m = rw.metrics_dict(s, cfg)
    assert len(m) == 7 and m["random_weighting/sample_count"] == 1.0
    np.testing.assert_allclose(m["random_weighting/weight_b"], float(rw.weights(s)[1]), rtol=1e-6)
    assert all(isinstance(v, float) for v in m.values())
