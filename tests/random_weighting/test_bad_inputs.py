"""Bad inputs of jaxweight.random_weighting.

Each case asserts the specific outcome: the error type and a fragment of its message (the
same eagerly and under ``jaxweight.checked(jax.jit(...))``), or finite outputs, the
invalid count and an unchanged state.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import random_weighting as rw
from tests.contracts import BAD_INPUT_MODES, assert_trees_close, run_eager_or_checked

MODES = BAD_INPUT_MODES
NAN, INF = float("nan"), float("inf")
_run = run_eager_or_checked


# ------------------------------------------------------- random_weighting.config
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn,value,frag", [
    (lambda v: rw.config(trajectory_sigmas=v), -0.5, "trajectory_sigmas['xray'] must be finite and >= 0.0, got -0.5"),
    (lambda v: rw.config(step_sigmas=v), -2.0, "step_sigmas['xray'] must be finite and >= 0.0, got -2.0"),
    (lambda v: rw.config(step_sigmas=v), NAN, "step_sigmas['xray'] must be finite and >= 0.0, got nan"),
    (lambda v: rw.config(trajectory_sigmas=v), INF, "trajectory_sigmas['xray'] must be finite and >= 0.0, got inf"),
    (lambda v: rw.config(default_log_weights=v), NAN, "default_log_weights['xray'] must be finite, got nan"),
    (lambda v: rw.config(log_weight_bounds=(v, -1.0)), 1.0,
     "log_weight_bounds[0]['xray'] must be <= log_weight_bounds[1]['xray'], got "),
    (lambda v: rw.config(log_weight_bounds=(-1.0, v)), NAN, "log_weight_bounds[1]['xray'] must be a number, got nan"),
    (lambda v: rw.config(step_sigmas={"KL": v}), -1.0, "step_sigmas['KL'] must be finite and >= 0.0, got -1.0"),
], ids=["traj-neg", "step-neg", "step-nan", "traj-inf", "mu-nan", "bounds-reversed", "hi-nan", "KL-neg"])
def test_config_values_same_message_eager_and_jit(mode, fn, value, frag):
    with pytest.raises(ValueError, match=re.escape(frag)):
        _run(mode, fn, value)


# ------------------------------------------------------- xray_scale_step
_HP = dict(target_scale=50.0, min_weight=0.01, max_weight=10.0, smoothing=0.5)
XC = rw.xray_scale_config()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,value,frag", [
    ("target_scale", 0.0, "target_scale must be finite and > 0.0, got 0.0"),
    ("target_scale", -1.0, "target_scale must be finite and > 0.0, got -1.0"),
    ("target_scale", NAN, "target_scale must be finite and > 0.0, got nan"),
    ("smoothing", 1.5, "smoothing must be finite and in [0.0, 1.0], got 1.5"),
    ("smoothing", -0.25, "smoothing must be finite and in [0.0, 1.0], got -0.25"),
    ("min_weight", 20.0, "min_weight must be <= max_weight, got min_weight=20.0 and max_weight=10.0"),
    ("max_weight", 0.0, "max_weight must be finite and > 0.0, got 0.0"),
    ("min_weight", -1.0, "min_weight must be finite and >= 0.0, got -1.0"),
])
def test_xray_scale_hyperparameters_same_message_eager_and_jit(mode, name, value, frag):
    def f(v):
        return rw.xray_scale_step(rw.xray_scale_init(XC), 100.0, rw.xray_scale_config(**{**_HP, name: v}))[1]

    with pytest.raises(ValueError, match=re.escape(frag)):
        _run(mode, f, value)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("initialised", [False, True])
@pytest.mark.parametrize("loss", [NAN, INF, -INF])
def test_xray_scale_bad_loss_leaves_state_unchanged(jit, initialised, loss):
    s = rw.xray_scale_init(XC, 2.0 if initialised else None)
    s, _ = rw.xray_scale_step(s, 100.0, XC)
    f = jax.jit(rw.xray_scale_step) if jit else rw.xray_scale_step
    s2, w = f(s, loss, XC)
    assert_trees_close(s2, s)
    assert np.isfinite(float(w)) and float(w) == float(s.weight)


def test_initial_loss_nan_refused():
    with pytest.raises(ValueError, match="initial_loss must be finite, got nan"):
        rw.xray_scale_init(XC, NAN)


def test_component_step_with_nan_loss_stays_finite_and_keeps_the_scale():
    cfg = rw.component_config()
    s = rw.component_init(cfg, 0)
    s, out = rw.component_step(s, 1, 100.0, cfg)
    s2, out2 = rw.component_step(s, 2, NAN, cfg)
    assert all(np.isfinite(float(v)) for v in out2.values())
    assert_trees_close(s2.xray, s.xray)


def test_combine_propagates_nan_to_its_key_only():
    """Documented: combine is a plain product; a NaN entry reaches its own key and no other."""
    out = rw.combine({"xray": NAN, "bond": 2.0}, {"xray": 3.0, "angle": 4.0})
    assert np.isnan(float(out["xray"]))
    assert float(out["bond"]) == 2.0 and float(out["angle"]) == 4.0




def test_config_class_checks_concrete_values_like_config():
    """The public class validates in its constructor: a config cannot be built around config()."""
    good = rw.config(("a", "b"))
    with pytest.raises(ValueError, match=re.escape("step_sigmas['b'] must be finite and >= 0.0, got -1.0")):
        good.replace(step_sigma=jnp.asarray([0.1, -1.0], jnp.float32))
    with pytest.raises(ValueError, match=re.escape("log_weight_bounds[0]['a'] must be <= log_weight_bounds[1]['a']")):
        rw.RandomWeightingConfig(*(jnp.zeros(2, jnp.float32),) * 3, jnp.ones(2, jnp.float32), jnp.zeros(2, jnp.float32),
                                 components=("a", "b"))
    with pytest.raises(ValueError, match=re.escape("mu must have shape (..., 2) (one per component), got (3,)")):
        good.replace(mu=jnp.zeros(3, jnp.float32))
    # stacked sweeps and traced values (vmap, jit) are fine
    sweep = rw.stack_configs(good, rw.config(("a", "b"), step_sigmas=0.5))
    assert jax.jit(lambda c: c.step_sigma * 2)(sweep).shape == (2, 2)


@pytest.mark.parametrize("kw,match", [
    (dict(random="cfg"), re.escape("random must be a RandomWeightingConfig (from config()), got str")),
    (dict(xray={"target_scale": 50.0}), re.escape("xray must be an XrayScaleConfig (from xray_scale_config()), got dict")),
    (dict(resample_each_step=1), "resample_each_step must be a static bool, got int"),
], ids=["random", "xray", "resample"])
def test_component_config_class_checks_like_component_config(kw, match):
    """Built directly, ``ComponentWeightingConfig`` refuses what ``component_config`` refuses."""
    args = dict(random=rw.config(), xray=rw.xray_scale_config(), resample_each_step=True)
    with pytest.raises(ValueError, match=match):
        rw.ComponentWeightingConfig(**{**args, **kw})
    with pytest.raises(ValueError, match=match):
        rw.component_config(**{**args, **kw})
