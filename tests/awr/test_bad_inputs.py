"""Bad inputs of jaxweight.awr.

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
from tests.contracts import BAD_INPUT_MODES, run_eager_or_checked

MODES = BAD_INPUT_MODES
NAN, INF = float("nan"), float("inf")
_run = run_eager_or_checked


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


def test_config_class_checks_concrete_values_like_config():
    cfg = awr.config(3)
    with pytest.raises(ValueError, match="temperature must be finite and > 0.0, got -1.0"):
        cfg.replace(temperature=jnp.float32(-1.0))
    with pytest.raises(ValueError, match="weight_decay must be finite and >= 0.0, got -0.5"):
        cfg.replace(weight_decay=jnp.float32(-0.5))
    with pytest.raises(ValueError, match="temperature must be a scalar"):
        awr.config(3, temperature=jnp.ones(2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,value,frag", [
    ("temperature", -1.0, "temperature must be finite and > 0.0, got -1.0"),
    ("learning_rate", -1.0, "learning_rate must be finite and > 0.0, got -1.0"),
    ("learning_rate", NAN, "learning_rate must be finite and > 0.0, got nan"),
    ("weight_decay", -0.5, "weight_decay must be finite and >= 0.0, got -0.5"),
    ("max_grad_norm", 0.0, "max_grad_norm must be finite and > 0.0, got 0.0"),
])
def test_config_hyperparameters_same_message_eager_and_jit(mode, name, value, frag):
    """The optimiser settings are f32[] leaves (sweepable): checked eagerly and under checked(jit)."""
    with pytest.raises(ValueError, match=re.escape(frag)):
        _run(mode, lambda v: awr.config(3, **{name: v}).temperature, value)


_STATIC_MSG = "must be static (a concrete number, not traced under jax.jit) and "


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


@pytest.mark.parametrize("huge", [1e30, -1e30, 3e38, -3e38])
@pytest.mark.parametrize("where", ["features", "log_weights"])
def test_step_with_huge_finite_inputs_keeps_the_policy_finite(huge, where):
    rng = np.random.RandomState(1)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    a = rng.normal(size=(8, 2)).astype(np.float32)
    adv = rng.normal(size=8).astype(np.float32)
    cfg = awr.config(2, hidden_sizes=(4,))
    state = awr.init(cfg, 0, x)
    if where == "features":
        x[2, 1] = huge
    else:
        a[2, 0] = huge
    new, out = jax.jit(awr.step)(state, x, a, adv, cfg)
    assert np.isfinite(float(out["loss"])) and int(out["n_invalid"]) == 0
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves((new.policy, new.opt_state)))
    # the saturated log-density: finite, below that of any nearer point, and with a finite gradient
    lp = awr.gaussian_log_prob(jnp.asarray([[huge]]), jnp.zeros((1, 1)), jnp.zeros((1, 1)))
    near = awr.gaussian_log_prob(jnp.asarray([[1e3]]), jnp.zeros((1, 1)), jnp.zeros((1, 1)))
    assert np.isfinite(float(lp[0])) and float(lp[0]) < float(near[0])
    g = jax.grad(lambda m: awr.gaussian_log_prob(jnp.asarray([[huge]]), m, jnp.zeros((1, 1)))[0])(jnp.zeros((1, 1)))
    assert np.all(np.isfinite(np.asarray(g)))


def test_step_on_an_empty_or_all_invalid_batch_leaves_the_policy_unchanged():
    rng = np.random.RandomState(2)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    cfg = awr.config(2, hidden_sizes=(4,))
    state = awr.init(cfg, 0, x)
    same = lambda a, b: all(np.array_equal(np.asarray(u), np.asarray(v))  # noqa: E731
                            for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    new, out = awr.step(state, np.zeros((0, 3), np.float32), np.zeros((0, 2), np.float32), np.zeros((0,), np.float32),
                        cfg)
    assert same(new.policy, state.policy) and int(out["n_invalid"]) == 0 and np.isfinite(float(out["loss"]))
    new, out = awr.step(state, x, np.full((8, 2), NAN, np.float32), np.ones(8, np.float32), cfg)
    assert same(new.policy, state.policy) and same(new.opt_state, state.opt_state) and int(out["n_invalid"]) == 8
