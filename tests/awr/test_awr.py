"""jaxweight.awr: weights and loss vs NumPy, the policy fit (exact WLS limit, recovery of a known
best action), prediction, the step API."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import awr, checkpoint
from tests.contracts import assert_trees_close


def _np_weights(adv, temperature=1.0, max_weight=20.0, normalize=True, mask=None):
    adv = np.asarray(adv, np.float64)
    valid = np.isfinite(adv) & (np.ones_like(adv, bool) if mask is None else np.asarray(mask, bool))
    a = np.where(valid, adv, 0.0)
    if normalize:
        mu = a[valid].mean() if valid.any() else 0.0
        sd = a[valid].std() if valid.any() else 0.0
        a = (a - mu) / (sd + 1e-8)
    with np.errstate(over="ignore"):
        return np.where(valid, np.minimum(np.exp(a / temperature), max_weight), 0.0)


# ----------------------------------------------------------------- weights
def test_awr_weights_formula(jit_or_eager):
    adv = jnp.array([-2.0, -0.5, 0.0, 0.3, 1.0, 2.5], jnp.float32)
    f = jit_or_eager(lambda a, t, m: awr.awr_weights(a, t, m, normalize=False))
    np.testing.assert_allclose(f(adv, 1.0, 20.0), _np_weights(adv, normalize=False), rtol=1e-6)
    # clipping at max_weight: exp(2.5 / 0.5) = 148 -> 20, exp(1 / 0.5) = 7.39 stays
    w = f(adv, 0.5, 20.0)
    np.testing.assert_allclose(w, _np_weights(adv, 0.5, normalize=False), rtol=1e-6)
    assert float(w[-1]) == 20.0 and float(w[-2]) == pytest.approx(math.exp(2.0), rel=1e-6)
    # huge advantages never overflow to inf
    assert float(awr.awr_weights(jnp.float32(1e30), normalize=False)) == 20.0
    g = jit_or_eager(lambda a: awr.awr_weights(a, 2.0, 5.0, normalize=True))
    np.testing.assert_allclose(g(adv), _np_weights(adv, 2.0, 5.0, True), rtol=1e-5)
    np.testing.assert_allclose(awr.awr_weights([0.0, 1.0, 2.0], normalize=False), [1.0, math.e, math.e**2], rtol=1e-6)


def test_awr_weights_mask_and_nonfinite():
    adv = jnp.array([[1.0, jnp.nan, 3.0], [100.0, -1.0, jnp.inf]], jnp.float32)
    mask = jnp.array([[True, True, True], [False, True, True]])
    w = awr.awr_weights(adv, mask=mask)
    assert w.shape == (2, 3)
    np.testing.assert_allclose(w, _np_weights(adv, mask=mask), rtol=1e-5)
    # excluded entries are 0 and do not enter the normalisation (the masked 100 would dominate it)
    assert float(w[0, 1]) == 0.0 and float(w[1, 0]) == 0.0 and float(w[1, 2]) == 0.0
    np.testing.assert_allclose(w, awr.awr_weights(jnp.where(mask, adv, -1e9), mask=mask), rtol=1e-6)
    # nothing valid: zeros, never NaN
    z = awr.awr_weights(jnp.full((4,), jnp.nan))
    np.testing.assert_array_equal(z, np.zeros(4, np.float32))
    # a constant group normalises to 0 -> weight 1
    np.testing.assert_allclose(awr.awr_weights(jnp.full((3,), 5.0)), np.ones(3), rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=20), st.floats(0.05, 5.0), st.floats(0.5, 50.0),
       st.booleans())
def test_property_weights_in_range_and_match_numpy(adv, temperature, max_weight, normalize):
    adv = np.asarray(adv, np.float32)
    w = np.asarray(awr.awr_weights(adv, temperature, max_weight, normalize))
    assert np.isfinite(w).all() and (w >= 0).all() and (w <= np.float32(max_weight)).all()
    np.testing.assert_allclose(w, _np_weights(adv, temperature, np.float32(max_weight), normalize),
                               rtol=2e-4, atol=1e-30)


def test_awr_loss_and_gradient(jit_or_eager):
    lp = jnp.array([-1.0, -2.0, -0.5, jnp.nan, -3.0], jnp.float32)
    adv = jnp.array([0.5, -1.0, 2.0, 1.0, jnp.nan], jnp.float32)
    mask = jnp.array([True, True, True, True, True])
    f = jit_or_eager(lambda lp, adv: awr.awr_loss(lp, adv, temperature=0.7, normalize=True, mask=mask))
    loss = f(lp, adv)
    valid = np.array([True, True, True, False, False])
    # entry 3 (NaN log-prob) is invalid: it is left out of the advantage normalisation too
    w = _np_weights(np.where(valid, np.asarray(adv), np.nan), 0.7, 20.0, True)
    expect = -np.sum(w[valid] * np.asarray(lp)[valid]) / valid.sum()
    np.testing.assert_allclose(float(loss), expect, rtol=1e-5)
    # gradient flows only into log_probs: d loss / d lp_i = -w_i / n_valid; none into the advantages
    # (with lp[3] finite, entry 3 counts: 4 valid entries)
    g_lp, g_adv = jax.grad(lambda a, b: awr.awr_loss(a, b, temperature=0.7, mask=mask), argnums=(0, 1))(
        jnp.where(jnp.isfinite(lp), lp, -1.0), adv)
    w4 = _np_weights(adv, 0.7, 20.0, True)
    np.testing.assert_allclose(g_lp[:4], -w4[:4] / 4, rtol=1e-5)
    assert float(g_lp[4]) == 0.0
    np.testing.assert_array_equal(np.nan_to_num(g_adv), 0.0)
    assert float(awr.awr_loss(jnp.ones(3), jnp.full(3, jnp.nan))) == 0.0


def test_awr_errors():
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        awr.awr_weights(jnp.ones(3), temperature=0.0)
    with pytest.raises(ValueError, match="max_weight must be finite and > 0"):
        awr.awr_weights(jnp.ones(3), max_weight=-1.0)
    with pytest.raises(ValueError, match="mask must have the same shape as advantages"):
        awr.awr_weights(jnp.ones(3), mask=jnp.ones(4, bool))
    with pytest.raises(ValueError, match="normalize must be a static bool"):
        awr.awr_weights(jnp.ones(3), normalize=jnp.array(True))
    with pytest.raises(ValueError, match="log_probs must have the same shape as advantages"):
        awr.awr_loss(jnp.ones(2), jnp.ones(3))


# ------------------------------------------------------------------ policy
def test_fit_linear_policy_equals_weighted_least_squares():
    """A linear policy's AWR optimum is the weighted least-squares fit (any shared std)."""
    rng = np.random.default_rng(1)
    N, F, K = 400, 3, 2
    x = (rng.normal(size=(N, F)) * [1.0, 2.0, 0.5] + [0.0, 1.0, -1.0]).astype(np.float32)
    a = (x @ rng.normal(size=(F, K)) + 0.3 * rng.normal(size=(N, K))).astype(np.float32)
    adv = rng.normal(size=N).astype(np.float32)
    w = np.asarray(awr.awr_weights(adv), np.float64)
    X = np.c_[x, np.ones(N)]
    ref = X @ np.linalg.solve(X.T @ (w[:, None] * X), X.T @ (w[:, None] * a))
    cfg = awr.config(K, hidden_sizes=(), mean_bounds=None, learning_rate=1e-2)
    params, m = awr.fit_weight_policy(0, x, a, adv, cfg, batch_size=N, num_epochs=600)
    pred = np.asarray(awr.predict_log_weights(params, x))
    np.testing.assert_allclose(pred, ref, atol=1e-3)
    assert m["loss"].shape == (600,) and float(m["num_valid"]) == N
    np.testing.assert_allclose(float(m["weight_ess"]), w.sum() ** 2 / (w**2).sum() / N, rtol=1e-4)


def _recovery_data(rng, N):
    x = rng.uniform(-1, 1, (N, 2)).astype(np.float32)
    a = rng.standard_normal((N, 2)).astype(np.float32)            # random actions, prior N(0, 1)
    return x, a


def _best_action(x):
    return np.stack([np.sin(2 * x[:, 0]), x[:, 1] ** 2 - 0.5], 1)


def test_fit_recovers_known_best_action():
    """Reward -|a - a*(x)|^2 with exponential weights exp(R / beta) tilts the N(0, 1) action prior
    to N(a* / (1 + v), v / (1 + v)), v = beta / 2: the policy must find that mean and std."""
    rng = np.random.default_rng(0)
    x, a = _recovery_data(rng, 20_000)
    reward = -np.sum((a - _best_action(x)) ** 2, axis=1)
    beta, v = 0.1, 0.05
    # garbage rows: masked out, or with non-finite entries; they must not move the fit
    xg, ag = _recovery_data(rng, 2000)
    x_all = np.concatenate([x, xg, xg[:10]])
    a_all = np.concatenate([a, ag + 50.0, ag[:10]])
    r_all = np.concatenate([reward, np.zeros(2000, np.float32), np.full(10, np.nan, np.float32)])
    x_all[-5:, 0] = np.nan
    mask = np.r_[np.ones(len(x), bool), np.zeros(2000, bool), np.ones(10, bool)]
    cfg = awr.config(2, temperature=beta, normalize=False, mean_bounds=None)
    params, m = awr.fit_weight_policy(1, x_all, a_all, r_all, cfg, mask=mask, num_epochs=20, batch_size=512)
    assert float(m["num_valid"]) == len(x) and float(m["clipped_fraction"]) == 0.0
    xt, _ = _recovery_data(rng, 2000)
    mean, log_std = (np.asarray(t) for t in awr.predict_distribution(params, xt))
    target = _best_action(xt) / (1 + v)
    rms = np.sqrt(np.mean((mean - target) ** 2, axis=0))
    assert (rms < 0.12).all(), rms
    signal = np.sqrt(np.mean(_best_action(xt) ** 2, axis=0))
    assert (np.sqrt(np.mean((mean - _best_action(xt)) ** 2, axis=0)) < 0.3 * signal).all()
    np.testing.assert_allclose(log_std[0], 0.5 * np.log(v / (1 + v)), atol=0.15)


def test_policy_module_prediction_shapes_and_checkpoint(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    a = rng.normal(size=(64, 3)).astype(np.float32)
    params, _ = awr.fit_weight_policy(0, x, a, rng.normal(size=64), num_epochs=2, batch_size=32)
    assert awr.predict_log_weights(params, x[0]).shape == (3,)
    out = awr.predict_log_weights(params, x.reshape(8, 8, 4))
    assert out.shape == (8, 8, 3) and out.dtype == jnp.float32
    # jittable, vmappable, and the mean stays inside mean_bounds
    pj = jax.jit(awr.predict_log_weights)
    np.testing.assert_allclose(pj(params, x), out.reshape(64, 3), rtol=1e-6, atol=1e-6)
    assert (np.abs(np.asarray(pj(params, np.full((64, 4), 1e3, np.float32)))) <= 3.0).all()
    per_row = jax.vmap(awr.predict_log_weights, in_axes=(None, 0))(params, x)
    np.testing.assert_allclose(per_row, out.reshape(64, 3), rtol=1e-6, atol=1e-6)
    # at initialisation a policy with symmetric bounds predicts log-weight ~0 (the default weights)
    pol = awr.WeightPolicy(num_components=3)
    variables = pol.init(jax.random.key(0), jnp.zeros((1, 4)))
    mean, log_std = pol.apply(variables, jnp.asarray(x))
    np.testing.assert_array_equal(mean, np.zeros((64, 3), np.float32))
    np.testing.assert_array_equal(log_std, np.full((64, 3), -0.5, np.float32))
    with pytest.raises(ValueError, match="features must have shape \\(\\.\\.\\., 4\\)"):
        awr.predict_log_weights(params, jnp.ones((2, 5)))
    checkpoint.save(tmp_path / "policy.ckpt", params)
    back = checkpoint.load(tmp_path / "policy.ckpt", params)
    assert_trees_close(back, params)
    np.testing.assert_array_equal(awr.predict_log_weights(back, x), awr.predict_log_weights(params, x))


def test_fit_errors():
    x, a, adv = np.zeros((8, 2)), np.zeros((8, 3)), np.zeros(8)
    with pytest.raises(ValueError, match="same number of rows"):
        awr.fit_weight_policy(0, x, a[:7], adv)
    with pytest.raises(ValueError, match="features must have rank 2"):
        awr.fit_weight_policy(0, x[0], a, adv)
    with pytest.raises(ValueError, match="mask must have shape \\(8,\\)"):
        awr.fit_weight_policy(0, x, a, adv, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="num_components \\(2\\) must equal log_weights.shape\\[1\\] \\(3\\)"):
        awr.fit_weight_policy(0, x, a, adv, awr.config(module=awr.WeightPolicy(num_components=2)))
    with pytest.raises(ValueError, match="at least one row"):
        awr.fit_weight_policy(0, x[:0], a[:0], adv[:0])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        awr.fit_weight_policy(0, x, a, adv, batch_size=0)
    with pytest.raises(ValueError, match="learning_rate must be finite and > 0"):
        awr.config(3, learning_rate=0.0)
    with pytest.raises(ValueError, match="config needs num_components"):
        awr.config()
    with pytest.raises(ValueError, match="num_components \\(3\\) must equal module.num_components \\(2\\)"):
        awr.config(3, module=awr.WeightPolicy(num_components=2))


def test_fit_progress_only_through_callback(capsys):
    rng = np.random.RandomState(0)
    x, a, adv = rng.normal(size=(16, 2)), rng.normal(size=(16, 3)), rng.normal(size=16)
    seen = []
    params, m = awr.fit_weight_policy(0, x, a, adv, num_epochs=3, batch_size=8,
                                      callback=lambda e, mm: seen.append((e, mm["loss"])))
    assert [e for e, _ in seen] == [0, 1, 2]
    np.testing.assert_allclose([v for _, v in seen], np.asarray(m["loss"]), rtol=1e-6)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # nothing printed, no progress bar
    with pytest.raises(ValueError, match="callback must be a callable"):
        awr.fit_weight_policy(0, x, a, adv, num_epochs=1, callback=True)


