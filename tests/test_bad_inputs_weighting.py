"""Bad inputs of jaxweight.random_weighting and jaxweight.awr.

Each case asserts the specific outcome: the error type and a fragment of its message (the
same eagerly and under ``jaxweight.checked(jax.jit(...))``), or finite outputs, the
invalid count and an unchanged state.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxweight
from jaxweight import awr
from jaxweight import random_weighting as rw
from tests.contracts import assert_trees_close

MODES = ["eager", "checked_jit"]
NAN, INF = float("nan"), float("inf")


def _run(mode, fn, value):
    """``fn(value)`` eagerly (a Python number) or under checked(jit) (a traced f32)."""
    if mode == "eager":
        return fn(value)
    return jaxweight.checked(jax.jit(fn))(jnp.float32(value))


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


# ------------------------------------------------------- xray_scale_update
_HP = dict(target_scale=50.0, min_weight=0.01, max_weight=10.0, smoothing=0.5)


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
        return rw.xray_scale_update(rw.xray_scale_init(), 100.0, **{**_HP, name: v})[1]

    with pytest.raises(ValueError, match=re.escape(frag)):
        _run(mode, f, value)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("initialised", [False, True])
@pytest.mark.parametrize("loss", [NAN, INF, -INF])
def test_xray_scale_bad_loss_leaves_state_unchanged(jit, initialised, loss):
    s = rw.xray_scale_init(2.0 if initialised else None)
    s, _ = rw.xray_scale_update(s, 100.0)
    f = jax.jit(rw.xray_scale_update) if jit else rw.xray_scale_update
    s2, w = f(s, loss)
    assert_trees_close(s2, s)
    assert np.isfinite(float(w)) and float(w) == float(s.weight)


def test_initial_loss_nan_refused():
    with pytest.raises(ValueError, match="initial_loss must be finite, got nan"):
        rw.xray_scale_init(NAN)


def test_component_weights_with_nan_loss_stay_finite_and_keep_the_scale():
    cfg = rw.config()
    s = rw.component_init(cfg, 0)
    s, out = rw.component_weights(s, 1, cfg, 100.0)
    s2, out2 = rw.component_weights(s, 2, cfg, NAN)
    assert all(np.isfinite(float(v)) for v in out2.values())
    assert_trees_close(s2.xray, s.xray)


def test_combine_propagates_nan_to_its_key_only():
    """Documented: combine is a plain product; a NaN entry reaches its own key and no other."""
    out = rw.combine({"xray": NAN, "bond": 2.0}, {"xray": 3.0, "angle": 4.0})
    assert np.isnan(float(out["xray"]))
    assert float(out["bond"]) == 2.0 and float(out["angle"]) == 4.0


# ------------------------------------------------------- awr hyperparameters
_ADV = jnp.asarray([0.0, 1.0, -1.0, 2.0], jnp.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,value,frag", [
    ("temperature", 0.0, "temperature must be finite and > 0.0, got 0.0"),
    ("temperature", -1.0, "temperature must be finite and > 0.0, got -1.0"),
    ("temperature", NAN, "temperature must be finite and > 0.0, got nan"),
    ("max_weight", 0.0, "max_weight must be finite and > 0.0, got 0.0"),
    ("max_weight", -2.0, "max_weight must be finite and > 0.0, got -2.0"),
])
@pytest.mark.parametrize("fn", ["awr_weights", "awr_loss"])
def test_awr_hyperparameters_same_message_eager_and_jit(mode, name, value, frag, fn):
    if fn == "awr_weights":
        def f(v):
            return awr.awr_weights(_ADV, **{name: v})
    else:
        def f(v):
            return awr.awr_loss(-jnp.ones(4), _ADV, **{name: v})

    with pytest.raises(ValueError, match=re.escape(frag)):
        _run(mode, f, value)


def test_fit_refuses_bad_temperature_and_weight_decay():
    x, a, adv = jnp.ones((8, 2)), jnp.zeros((8, 3)), jnp.arange(8.0)
    with pytest.raises(ValueError, match="temperature must be finite and > 0.0, got -1.0"):
        awr.fit_weight_policy(0, x, a, adv, temperature=-1.0, num_epochs=1)
    with pytest.raises(ValueError, match="weight_decay must be finite and >= 0.0, got -0.5"):
        awr.fit_weight_policy(0, x, a, adv, weight_decay=-0.5, num_epochs=1)


_STATIC_MSG = "must be static (a concrete number, not traced under jax.jit) and "


@pytest.mark.parametrize("name,value,frag,rng", [
    ("learning_rate", -1.0, "learning_rate must be finite and > 0.0, got -1.0", "finite and > 0.0"),
    ("learning_rate", NAN, "learning_rate must be finite and > 0.0, got nan", "finite and > 0.0"),
    ("weight_decay", -0.5, "weight_decay must be finite and >= 0.0, got -0.5", "finite and >= 0.0"),
    ("max_grad_norm", 0.0, "max_grad_norm must be finite and > 0.0, got 0.0", "finite and > 0.0"),
])
def test_fit_optimiser_settings_eager_and_traced(name, value, frag, rng):
    """Optimiser settings are static (the compiled trainer is cached on them): a traced one is a ValueError."""
    x, a, adv = jnp.ones((8, 2)), jnp.zeros((8, 3)), jnp.arange(8.0)

    def f(v):
        return awr.fit_weight_policy(0, x, a, adv, num_epochs=1, **{name: v})[1]["loss"]

    with pytest.raises(ValueError, match=re.escape(frag)):
        f(value)
    with pytest.raises(ValueError, match=re.escape(f"{name} {_STATIC_MSG}{rng}, got a traced float32[]")):
        jaxweight.checked(jax.jit(f))(jnp.float32(value))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kw,frag", [
    (dict(log_std_init=NAN), "log_std_init must be finite, got nan"),
    (dict(log_std_max=INF), "log_std_max must be finite, got inf"),
    (dict(log_std_min=3.0), "log_std_min must be <= log_std_max, got log_std_min=3.0 and log_std_max=2.0"),
    (dict(mean_bounds=(-3.0, NAN)), "mean_bounds[1] must be finite, got nan"),
    (dict(mean_bounds=(1.0, 1.0)), "mean_bounds[0] must be < mean_bounds[1], got mean_bounds[0]=1.0 and "
                                   "mean_bounds[1]=1.0"),
], ids=["log_std_init-nan", "log_std_max-inf", "log_std-reversed", "mean_bounds-nan", "mean_bounds-empty"])
def test_weight_policy_settings_refused(mode, kw, frag):
    """Module settings are static: checked when the module is built; a traced one names the field."""
    name, value = next(iter(kw.items()))
    if mode == "eager":
        with pytest.raises(ValueError, match=re.escape(frag)):
            awr.WeightPolicy(3, **kw)
        return
    traced_name = "mean_bounds[1]" if name == "mean_bounds" else name

    def f(v):
        bad = (value[0], v) if name == "mean_bounds" else v
        return awr.WeightPolicy(3, **{name: bad}).init(jax.random.key(0), jnp.ones((1, 2)))["params"]["log_std"]

    traced = jnp.float32(value[1] if name == "mean_bounds" else value)
    with pytest.raises(ValueError, match=re.escape(f"{traced_name} {_STATIC_MSG}")):
        jaxweight.checked(jax.jit(f))(traced)


# ------------------------------------------------------- awr bad data
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_awr_weights_mask_nonfinite_advantages(normalize, bad):
    adv = jnp.asarray([0.0, bad, 1.0, -1.0], jnp.float32)
    w = awr.awr_weights(adv, normalize=normalize)
    assert np.all(np.isfinite(np.asarray(w)))
    assert float(w[1]) == 0.0
    # the valid entries get the weights they get without the bad one
    ref = awr.awr_weights(adv, normalize=normalize, mask=jnp.asarray([True, False, True, True]))
    np.testing.assert_allclose(np.asarray(w), np.asarray(ref), rtol=1e-6)


@pytest.mark.parametrize("huge", [3e38, -3e38])
def test_awr_weights_huge_finite_advantages_are_finite(huge):
    adv = jnp.asarray([0.0, huge, 1.0, -1.0], jnp.float32)
    for normalize in (True, False):
        w = np.asarray(awr.awr_weights(adv, normalize=normalize))
        assert np.all(np.isfinite(w)) and np.all(w >= 0) and np.all(w <= 20.0)


def test_awr_loss_nan_log_probs_and_advantages_are_excluded():
    lp = jnp.asarray([-1.0, NAN, -2.0, -0.5], jnp.float32)
    adv = jnp.asarray([0.5, 1.0, NAN, -0.5], jnp.float32)
    loss = awr.awr_loss(lp, adv)
    valid = jnp.asarray([True, False, False, True])
    ref = awr.awr_loss(jnp.where(valid, lp, 0.0), jnp.where(valid, adv, 0.0), mask=valid)
    assert np.isfinite(float(loss))
    np.testing.assert_allclose(float(loss), float(ref), rtol=1e-6)
    g = jax.grad(lambda p: awr.awr_loss(p, adv))(lp)
    assert np.all(np.isfinite(np.asarray(g)))


def test_awr_loss_all_invalid_is_zero():
    assert float(awr.awr_loss(jnp.full((3,), NAN), jnp.ones(3))) == 0.0


def test_fit_counts_invalid_rows_and_stays_finite():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    a = rng.normal(size=(32, 2)).astype(np.float32)
    adv = rng.normal(size=32).astype(np.float32)
    x[0, 1], a[1, 0], adv[2] = np.nan, np.inf, np.nan
    mask = np.ones(32, bool)
    mask[3] = False
    x[3, 0] = np.nan  # masked out: excluded, not counted as invalid
    params, m = awr.fit_weight_policy(0, x, a, adv, mask=mask, num_epochs=2, batch_size=8)
    assert int(m["n_invalid"]) == 3 and float(m["num_valid"]) == 28.0
    assert np.all(np.isfinite(np.asarray(m["loss"])))
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(params.variables))
