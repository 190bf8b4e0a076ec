"""maxent.policy_loss: the clipped token-level loss against a NumPy reference, its gradient, bad data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import maxent as M


def _reference(lp, old, adv, mask, ref, kl_coef, eps, eps_hi, norm, max_tokens=None):
    """The loss written the way the GRPO / DAPO / Dr.GRPO papers write it, in float64 NumPy."""
    lp, old, ref = (np.asarray(x, np.float64) for x in (lp, old, ref))
    m = np.asarray(mask, np.float64)
    r = np.exp(lp - old)
    a = np.asarray(adv, np.float64)[:, None]
    pg = -np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps_hi) * a)
    d = ref - lp
    tok = (pg + kl_coef * (np.exp(d) - d - 1)) * m
    if norm == "sequence_mean":
        rows = m.sum(1) > 0
        return np.mean((tok.sum(1) / np.maximum(m.sum(1), 1))[rows])
    if norm == "token_mean":
        return tok.sum() / m.sum()
    return tok.sum() / (m.shape[0] * (max_tokens or m.shape[1]))


def _batch(seed=0, n=6, L=5):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 0.9, (n, L))).astype(np.float32)
    lp = (old + rng.normal(0, 0.3, (n, L))).astype(np.float32)       # ratios well outside [0.8, 1.2] too
    ref = (old + rng.normal(0, 0.2, (n, L))).astype(np.float32)
    adv = rng.normal(0, 1, n).astype(np.float32)
    lens = rng.integers(1, L + 1, n)
    lens[2] = 0                                                       # an empty row
    mask = np.arange(L)[None] < lens[:, None]
    return lp, old, adv, mask, ref


@pytest.mark.parametrize("norm", M.NORMALIZATIONS)
def test_matches_reference(norm, jit_or_eager):
    lp, old, adv, mask, ref = _batch()
    f = jit_or_eager(lambda *a: M.policy_loss(*a[:4], ref_logp=a[4], kl_coef=0.1, clip_eps=0.2,
                                              clip_eps_high=0.28, normalization=norm))
    loss, m = f(lp, old, adv, mask, ref)
    want = _reference(lp, old, adv, mask, ref, 0.1, 0.2, 0.28, norm)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    r = np.exp(lp.astype(np.float64) - old)[mask]
    a = np.broadcast_to(adv[:, None], mask.shape)[mask]
    clipped = ((r > 1.28) & (a > 0)) | ((r < 0.8) & (a < 0))
    assert 0 < clipped.mean() < 1
    np.testing.assert_allclose(float(m["policy/clip_fraction"]), clipped.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["policy/ratio_mean"]), r.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["policy/ratio_max"]), r.max(), rtol=1e-5)
    d = (ref.astype(np.float64) - lp)[mask]
    np.testing.assert_allclose(float(m["policy/kl"]), np.mean(np.exp(d) - d - 1), rtol=1e-5)
    np.testing.assert_allclose(float(m["policy/entropy"]), -old[mask].mean(), rtol=1e-5)
    assert float(m["policy/tokens"]) == mask.sum() and float(m["policy/invalid_tokens"]) == 0


def test_gradient_on_policy_is_the_signal_per_token():
    # on policy (ratio 1, no KL) d loss / d logp_t = -A_i / n_i on every valid token (sequence mean)
    lp, _, adv, mask, _ = _batch(1)
    g = jax.grad(lambda x: M.policy_loss(x, lp, adv, mask)[0])(jnp.asarray(lp))
    n_i = mask.sum(1)
    rows = (n_i > 0).sum()
    want = np.where(mask, -adv[:, None] / np.maximum(n_i, 1)[:, None] / rows, 0.0)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-7)


def test_clipped_tokens_get_no_gradient():
    old = jnp.zeros((2, 2))
    lp = jnp.log(jnp.array([[1.5, 1.0], [0.5, 1.0]]))   # ratio 1.5 (A > 0) and 0.5 (A < 0): both clipped
    g = jax.grad(lambda x: M.policy_loss(x, old, jnp.array([1.0, -1.0]), jnp.ones((2, 2), bool))[0])(lp)
    assert float(g[0, 0]) == 0.0 and float(g[1, 0]) == 0.0
    assert float(g[0, 1]) < 0.0 and float(g[1, 1]) > 0.0
    _, m = M.policy_loss(lp, old, jnp.array([1.0, -1.0]), jnp.ones((2, 2), bool))
    assert float(m["policy/clip_fraction"]) == 0.5


def test_kl_term_pulls_toward_the_reference():
    lp = jnp.log(jnp.full((1, 3), 0.5))
    ref = jnp.log(jnp.full((1, 3), 0.8))
    g = jax.grad(lambda x: M.policy_loss(x, lp, jnp.zeros(1), jnp.ones((1, 3), bool), ref_logp=ref,
                                         kl_coef=1.0)[0])(lp)
    assert np.all(np.asarray(g) < 0)          # lowering the loss raises logp toward the reference's
    np.testing.assert_allclose(M.k3_kl(ref, ref), 0.0, atol=1e-7)


def test_non_finite_tokens_are_masked_and_counted():
    lp, old, adv, mask, ref = _batch(2)
    bad_old = old.copy()
    i, j = np.argwhere(mask)[0]
    bad_old[i, j] = np.nan
    loss, m = M.policy_loss(lp, bad_old, adv, mask, ref_logp=ref, kl_coef=0.1)
    m2 = mask.copy()
    m2[i, j] = False
    want, _ = M.policy_loss(lp, old, adv, m2, ref_logp=ref, kl_coef=0.1)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    assert float(m["policy/invalid_tokens"]) == 1
    g = jax.grad(lambda x: M.policy_loss(x, bad_old, adv, mask, ref_logp=ref, kl_coef=0.1)[0])(jnp.asarray(lp))
    assert np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize("kw, match", [
    ({"normalization": "mean"}, "normalization"),
    ({"kl_coef": -0.1}, "kl_coef"),
    ({"clip_eps": 0.0}, "clip_eps"),
    ({"max_tokens": 0, "normalization": "constant"}, "max_tokens"),
])
def test_bad_settings(kw, match):
    lp, old, adv, mask, _ = _batch()
    with pytest.raises(ValueError, match=match):
        M.policy_loss(lp, old, adv, mask, **kw)


def test_bad_shapes():
    lp, old, adv, mask, _ = _batch()
    with pytest.raises(ValueError, match="signal"):
        M.policy_loss(lp, old, adv[:-1], mask)
    with pytest.raises(ValueError, match="behaviour_logp"):
        M.policy_loss(lp, old[:, :-1], adv, mask)


def test_traced_bad_setting_is_caught_by_checked():
    import jaxweight

    lp, old, adv, mask, _ = _batch()
    f = jaxweight.checked(jax.jit(lambda c: M.policy_loss(lp, old, adv, mask, kl_coef=c)[0]))
    assert np.isfinite(float(f(jnp.float32(0.1))))
    with pytest.raises(ValueError, match="kl_coef"):
        f(jnp.float32(-1.0))
