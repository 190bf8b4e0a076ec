"""jaxweight.random_weighting.law: config, init/step/resample, the two-level law, reporting."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import random_weighting as rw
from tests.contracts import assert_trees_close

K10 = len(rw.TORCHREF_COMPONENTS)


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


def test_init_needs_a_key():
    with pytest.raises(ValueError, match="needs a key"):
        rw.init(rw.config())


def test_metrics_dict_flat_floats():
    cfg = rw.config(("a", "b"))
    s = rw.step(rw.init(cfg, 0), 1, cfg)
    m = rw.metrics_dict(s, cfg)
    assert len(m) == 7 and m["random_weighting/sample_count"] == 1.0
    np.testing.assert_allclose(m["random_weighting/weight_b"], float(rw.weights(s)[1]), rtol=1e-6)
    assert all(isinstance(v, float) for v in m.values())
