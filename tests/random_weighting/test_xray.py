"""jaxweight.random_weighting.xray: X-ray scale worked examples, combine, component weighting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import random_weighting as rw
from tests.contracts import assert_trees_close


# ---------------------------------------------------------------- X-ray scale
XC = rw.xray_scale_config()


def _run_xray(state, losses, **kw):
    cfg = rw.xray_scale_config(**kw)
    ws = []
    for L in losses:
        state, w = rw.xray_scale_step(state, L, cfg)
        ws.append(float(w))
    return state, ws


def test_xray_scale_worked_examples():
    _, ws = _run_xray(rw.xray_scale_init(XC), [100.0, 100.0, 100.0])
    np.testing.assert_allclose(ws, [0.75, 0.625, 0.5625], rtol=1e-6)
    _, ws = _run_xray(rw.xray_scale_init(XC), [100.0, 3.0, 1e9])          # later losses are ignored
    np.testing.assert_allclose(ws, [0.75, 0.625, 0.5625], rtol=1e-6)
    st2, ws = _run_xray(rw.xray_scale_init(XC, initial_loss=2.0), [123.0, 0.5, 7.0])
    np.testing.assert_allclose(ws, [5.5, 7.75, 8.875], rtol=1e-6)
    assert float(st2.initial_loss) == 2.0
    _, ws = _run_xray(rw.xray_scale_init(XC), [1.0])
    np.testing.assert_allclose(ws, [5.5], rtol=1e-6)


def test_xray_scale_init_and_edge_cases():
    s = rw.xray_scale_init(XC)
    assert s.weight.dtype == jnp.float32 and float(s.weight) == 1.0
    assert float(s.initial_loss) == 0.0 and not bool(s.initialized)
    z = rw.xray_scale_init(XC, 0.0)                                          # explicit 0 counts as set
    assert bool(z.initialized)
    # L0 + 1e-6 == 0 -> t = +inf -> max_weight
    _, ws = _run_xray(z, [5.0])
    np.testing.assert_allclose(ws, [0.5 * 1.0 + 0.5 * 10.0], rtol=1e-6)
    _, ws = _run_xray(rw.xray_scale_init(XC, np.float32(-1e-6)), [5.0])
    np.testing.assert_allclose(ws, [5.5], rtol=1e-6)
    # a non-finite first loss leaves the state alone; the next finite loss sets the scale
    for bad in (float("nan"), float("inf")):
        s1, w = rw.xray_scale_step(s, bad, XC)
        assert_trees_close(s1, s)
        assert float(w) == 1.0
        _, ws = _run_xray(s1, [100.0])
        np.testing.assert_allclose(ws, [0.75], rtol=1e-6)
    # once initialised, a NaN loss is bad data too: the state stays exactly as it was
    s2, w2 = rw.xray_scale_step(s, 100.0, XC)
    s3, w = rw.xray_scale_step(s2, float("nan"), XC)
    assert_trees_close(s3, s2)
    np.testing.assert_allclose(float(w), float(w2), rtol=0)
    # custom hyperparameters: t = clip(10 / 100, 0.2, 5) = 0.2; w = 0.9 * 1 + 0.1 * 0.2
    _, ws = _run_xray(s, [100.0], target_scale=10.0, min_weight=0.2, max_weight=5.0, smoothing=0.9)
    np.testing.assert_allclose(ws, [0.92], rtol=1e-6)


def test_xray_scale_traced_hyperparameters_and_errors():
    f = jax.jit(lambda s, loss, *hp: rw.xray_scale_step(s, loss, rw.xray_scale_config(*hp)))
    s, w = f(rw.xray_scale_init(XC), 100.0, 10.0, 0.2, 5.0, 0.9)
    np.testing.assert_allclose(float(w), 0.92, rtol=1e-6)
    # the config is a pytree of f32[] leaves: new values under jit compile nothing new
    g = jax.jit(rw.xray_scale_step)
    _, w1 = g(rw.xray_scale_init(XC), 100.0, rw.xray_scale_config(10.0, 0.2, 5.0, 0.9))
    np.testing.assert_allclose(float(w1), 0.92, rtol=1e-6)
    with pytest.raises(ValueError, match="min_weight must be <= max_weight"):
        rw.xray_scale_config(min_weight=2.0, max_weight=1.0)
    with pytest.raises(ValueError, match="smoothing must be finite and in \\[0.0, 1.0\\], got 1.5"):
        rw.xray_scale_config(smoothing=1.5)
    with pytest.raises(ValueError, match="smoothing must be finite and in \\[0.0, 1.0\\], got 1.5"):
        rw.XrayScaleConfig(*(jnp.float32(v) for v in (50.0, 0.01, 10.0, 1.5)))   # the class checks too
    with pytest.raises(ValueError, match="xray_loss must be a scalar"):
        rw.xray_scale_step(rw.xray_scale_init(XC), jnp.ones(2), XC)
    with pytest.raises(ValueError, match="initial_loss must be finite"):
        rw.xray_scale_init(XC, float("nan"))
    with pytest.raises(ValueError, match="XrayScaleState"):
        rw.xray_scale_step(rw.init(rw.config(), 0), 1.0, XC)
    with pytest.raises(ValueError, match="XrayScaleConfig"):
        rw.xray_scale_step(rw.xray_scale_init(XC), 1.0, rw.config())


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


def test_component_step(key):
    cfg = rw.component_config()
    s = rw.component_init(cfg, key)
    s1, out = rw.component_step(s, jax.random.key(1), 100.0, cfg)
    assert list(out) == list(cfg.random.components)           # exactly the K keys ("xray" first)
    w = rw.weights(s1.random)
    np.testing.assert_allclose(float(out["xray"]), 0.75 * float(w[0]), rtol=1e-6)
    for i, c in enumerate(cfg.random.components[1:], 1):
        assert float(out[c]) == float(w[i])
    assert int(s1.random.sample_count) == 1
    # without resampling the random weights stay, the X-ray EMA still advances, key may be None
    fixed = rw.component_config(resample_each_step=False)
    s2, out2 = rw.component_step(s1, None, 100.0, fixed)
    assert_trees_close(s2.random, s1.random)
    np.testing.assert_allclose(float(s2.xray.weight), 0.625, rtol=1e-6)
    np.testing.assert_allclose(float(out2["xray"]), 0.625 * float(w[0]), rtol=1e-6)
    # initial_xray_loss and the X-ray settings are used
    c4 = rw.component_config(xray=rw.xray_scale_config(max_weight=4.0))
    s3, out3 = rw.component_step(rw.component_init(c4, key, initial_xray_loss=2.0), 1, 7.0, c4)
    np.testing.assert_allclose(float(s3.xray.weight), 2.5, rtol=1e-6)
    # components without "xray": the scale is an extra key
    c2 = rw.component_config(rw.config(("bond", "angle")))
    _, o = rw.component_step(rw.component_init(c2, 0), 1, 100.0, c2)
    assert list(o) == ["xray", "bond", "angle"] and float(o["xray"]) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="resample_each_step must be a static bool"):
        rw.component_config(resample_each_step=jnp.array(True))
    with pytest.raises(ValueError, match="ComponentWeightingConfig"):
        rw.component_init(rw.config(), key)
