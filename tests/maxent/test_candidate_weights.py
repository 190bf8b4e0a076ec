"""xDr.GRPO: maxent.candidate_weights against the paper's closed form, its tau limits, the weighted
policy_loss (uniform weights = Dr.GRPO bit for bit) and aggregation_diagnostics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxweight
from jaxweight import maxent as M


# ------------------------------------------------------------------ references (float64 NumPy)
def _closed_form(U, mask, tau, lam, ref=None):
    """The paper's w_i ~ exp(U_i / (tau + lam)) * pi_ref_i^(lam / (tau + lam)), one group at a time."""
    U = np.asarray(U, np.float64)
    out = np.zeros_like(U)
    for p in range(U.shape[0]):
        v = mask[p]
        if not v.any():
            continue
        u = U[p, v]
        if tau + lam == 0:
            top = u == u.max()
            out[p, v] = top / top.sum()
            continue
        logits = u / (tau + lam)
        if ref is not None and lam > 0:
            logits = logits + lam / (tau + lam) * np.asarray(ref, np.float64)[p, v]
        e = np.exp(logits - logits.max())
        out[p, v] = e / e.sum()
    return out


def _diagnostics(w, rewards, mask):
    """maxent-grpo's aggregation_group_diagnostics, in float64 NumPy, per group."""
    w = np.where(mask, np.asarray(w, np.float64), 0.0)
    tot = w.sum(1)
    has = tot > 0
    p = w[has] / tot[has, None]
    eff = np.exp(-(p * np.log(np.maximum(p, 1e-12))).sum(1))
    bad = (p * (np.asarray(rewards)[has] <= 0)).sum(1)
    return eff, bad, has


def _utilities(seed=0, P=6, G=5):
    rng = np.random.default_rng(seed)
    adv = rng.normal(0, 1, (P, G))
    tok = rng.integers(1, 512, (P, G))
    U = (adv * tok / 512).astype(np.float32)                       # U_i = A_i T_i / T_max
    ref = -rng.uniform(0.1, 3.0, (P, G)).astype(np.float32)
    mask = np.ones((P, G), bool)
    mask[1, 3:] = False
    mask[4] = False                                                 # an empty group
    U[~mask] = 50.0                                                 # masked entries are ignored, even huge ones
    return U, ref, mask


# ------------------------------------------------------------------ candidate_weights
@pytest.mark.parametrize("tau", [0.0, 1e-3, 0.05, 0.5, 3.0, 1e4])
@pytest.mark.parametrize("lam", [0.0, 0.3])
def test_matches_the_closed_form(tau, lam, jit_or_eager):
    U, ref, mask = _utilities()
    w = jit_or_eager(lambda u, r, m: M.candidate_weights(u, m, tau=tau, lam=lam, ref_logp=r))(U, ref, mask)
    want = _closed_form(U, mask, tau, lam, ref)
    np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(w)[~mask], 0.0)
    np.testing.assert_allclose(np.asarray(w).sum(1), mask.any(1).astype(float), rtol=1e-6)


def test_is_weight_matrix_on_utilities():
    # log q := U, beta := lam, denom := tau + lam: the same formula as weight_matrix
    U, ref, mask = _utilities(1)
    U = np.where(mask, U, 0.0)
    for tau, lam in [(0.5, 0.0), (0.2, 0.3), (2.0, 1.0)]:
        got = M.candidate_weights(U, mask, tau=tau, lam=lam, ref_logp=ref)
        via = M.weight_matrix(np.exp(U), ref, None, mask, tau=tau, beta=lam, denom=tau + lam,
                              normalize_by_tokens=False)
        np.testing.assert_allclose(np.asarray(got), np.asarray(via), rtol=1e-5, atol=1e-7)


def test_tau_zero_is_uniform_on_the_argmax_set():
    U = np.array([[1.0, 3.0, 3.0, 2.0],         # a tie: the two winners share
                  [0.0, 0.0, 0.0, 0.0],         # all tied: uniform (Dr.GRPO)
                  [1.0, 1.0 + 1e-6, 9.0, 0.5],  # a masked larger entry does not win; a 1e-6 lead does
                  [-2.0, -1.0, -3.0, -1.0]], np.float32)
    mask = np.ones_like(U, bool)
    mask[2, 2] = False
    w = np.asarray(M.candidate_weights(U, mask, tau=0.0))
    want = np.array([[0, .5, .5, 0], [.25, .25, .25, .25], [0, 1, 0, 0], [0, .5, 0, .5]])
    np.testing.assert_array_equal(w, want)
    # lam > 0 keeps tau = 0 smooth: softmax(U / lam) tilted by the reference
    ref = np.log(np.full_like(U, 0.25))
    np.testing.assert_allclose(np.asarray(M.candidate_weights(U, mask, tau=0.0, lam=0.5, ref_logp=ref)),
                               _closed_form(U, mask, 0.0, 0.5, ref), rtol=1e-5, atol=1e-7)


def test_large_tau_approaches_dr_grpo():
    U, _, mask = _utilities(2)
    n = mask.sum(1, keepdims=True)
    uniform = np.where(mask, 1.0 / np.maximum(n, 1), 0.0)
    gaps = [np.abs(np.asarray(M.candidate_weights(U, mask, tau=t)) - uniform).max() for t in (1.0, 10.0, 100.0, 1e4)]
    assert all(a > b for a, b in zip(gaps, gaps[1:])) and gaps[0] > 0.01
    assert gaps[-1] < 1e-4
    np.testing.assert_array_equal(np.asarray(M.candidate_weights(U, mask, tau=1e30)), uniform.astype(np.float32))


def test_vmap_over_tau_is_one_program():
    U, ref, mask = _utilities(3)
    taus = jnp.array([0.0, 1e-3, 0.5, 1e9])
    f = jax.jit(jax.vmap(lambda t: M.candidate_weights(U, mask, tau=t, lam=0.0, ref_logp=ref)))
    got = np.asarray(f(taus))
    for k, t in enumerate(np.asarray(taus)):
        np.testing.assert_allclose(got[k], _closed_form(U, mask, float(t), 0.0), rtol=1e-5, atol=1e-7)
    # also over lam, tau = 0 included: no NaN from 0 / 0
    g = jax.vmap(lambda lam: M.candidate_weights(U, mask, tau=0.0, lam=lam, ref_logp=ref))(jnp.array([0.0, 0.4]))
    np.testing.assert_allclose(np.asarray(g[1]), _closed_form(U, mask, 0.0, 0.4, ref), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(g[0]), _closed_form(U, mask, 0.0, 0.0).astype(np.float32))


def test_reference_handling():
    U, ref, mask = _utilities(4)
    bad_ref = ref.copy()
    bad_ref[0, 1] = np.nan
    # lam = 0 ignores the reference, its NaNs included
    np.testing.assert_array_equal(np.asarray(M.candidate_weights(U, mask, tau=0.5, ref_logp=bad_ref)),
                                  np.asarray(M.candidate_weights(U, mask, tau=0.5)))
    # lam > 0: a non-finite reference masks the entry
    m2 = mask.copy()
    m2[0, 1] = False
    np.testing.assert_allclose(np.asarray(M.candidate_weights(U, mask, tau=0.5, lam=0.2, ref_logp=bad_ref)),
                               _closed_form(U, m2, 0.5, 0.2, ref), rtol=1e-5, atol=1e-7)
    # no reference is the uniform one: softmax(U / (tau + lam)); a per-group constant in ref_logp cancels
    np.testing.assert_allclose(np.asarray(M.candidate_weights(U, mask, tau=0.5, lam=0.2)),
                               _closed_form(U, mask, 0.7, 0.0), rtol=1e-5, atol=1e-7)
    shifted = ref + np.arange(ref.shape[0], dtype=np.float32)[:, None]
    np.testing.assert_allclose(np.asarray(M.candidate_weights(U, mask, tau=0.5, lam=0.2, ref_logp=shifted)),
                               np.asarray(M.candidate_weights(U, mask, tau=0.5, lam=0.2, ref_logp=ref)), rtol=1e-5)


def test_non_finite_utilities_are_masked():
    U, _, mask = _utilities(5)
    bad = U.copy()
    bad[0, 0], bad[2, 4] = np.nan, np.inf
    m2 = mask.copy()
    m2[0, 0] = m2[2, 4] = False
    np.testing.assert_allclose(np.asarray(M.candidate_weights(bad, mask, tau=0.3)),
                               _closed_form(U, m2, 0.3, 0.0), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kw, match", [
    ({"tau": -0.1}, "tau"), ({"tau": float("nan")}, "tau"), ({"tau": float("inf")}, "tau"),
    ({"tau": 0.5, "lam": -0.1}, "lam"), ({"tau": 0.5, "lam": float("inf")}, "lam"),
])
def test_bad_settings(kw, match):
    U, _, mask = _utilities()
    with pytest.raises(ValueError, match=match):
        M.candidate_weights(U, mask, **kw)


def test_bad_shapes_and_traced_settings():
    U, ref, mask = _utilities()
    with pytest.raises(ValueError, match="utilities"):
        M.candidate_weights(U[0], tau=0.5)
    with pytest.raises(ValueError, match="ref_logp"):
        M.candidate_weights(U, mask, tau=0.5, lam=0.1, ref_logp=ref[:, :-1])
    with pytest.raises(ValueError, match="mask"):
        M.candidate_weights(U, mask[:, :-1], tau=0.5)
    f = jaxweight.checked(jax.jit(lambda t: M.candidate_weights(U, mask, tau=t)))
    np.testing.assert_allclose(np.asarray(f(jnp.float32(0.5))), _closed_form(U, mask, 0.5, 0.0), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="tau"):
        f(jnp.float32(-1.0))


# ------------------------------------------------------------------ policy_loss(weights=)
def _loss_batch(seed=0, P=4, G=3, L=6):
    rng = np.random.default_rng(seed)
    n = P * G
    old = np.log(rng.uniform(0.05, 0.9, (n, L))).astype(np.float32)
    lp = (old + rng.normal(0, 0.3, (n, L))).astype(np.float32)
    ref = (old + rng.normal(0, 0.2, (n, L))).astype(np.float32)
    adv = rng.normal(0, 1, n).astype(np.float32)
    lens = rng.integers(1, L + 1, n)
    lens[4] = 0                                                       # a completion without tokens
    mask = np.arange(L)[None] < lens[:, None]
    return lp, old, adv, mask, ref


def _weighted_reference(lp, old, adv, mask, ref, w, kl_coef, eps, norm, G):
    """Each completion's pg scaled by n_g w_i / sum_g w (candidates with tokens), float64."""
    lp, old, ref = (np.asarray(x, np.float64) for x in (lp, old, ref))
    m = np.asarray(mask, np.float64)
    cand = (m.sum(1) > 0).reshape(-1, G)
    wg = np.where(cand, np.asarray(w, np.float64), 0.0)
    scale = (cand.sum(1, keepdims=True) * wg / wg.sum(1, keepdims=True)).reshape(-1)
    r = np.exp(lp - old)
    a = np.asarray(adv, np.float64)[:, None]
    pg = -np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps) * a) * scale[:, None]
    d = ref - lp
    tok = (pg + kl_coef * (np.exp(d) - d - 1)) * m
    if norm == "sequence_mean":
        rows = m.sum(1) > 0
        return np.mean((tok.sum(1) / np.maximum(m.sum(1), 1))[rows])
    if norm == "token_mean":
        return tok.sum() / m.sum()
    return tok.sum() / (m.shape[0] * m.shape[1])


@pytest.mark.parametrize("norm", M.NORMALIZATIONS)
def test_uniform_weights_are_the_unweighted_loss_bit_for_bit(norm, jit_or_eager):
    lp, old, adv, mask, ref = _loss_batch()
    P, G = 4, 3
    # the data are arguments: closed-over constants would be folded by XLA's own evaluator at compile time
    f = jit_or_eager(lambda data, w: M.policy_loss(*data[:4], ref_logp=data[4], kl_coef=0.1,
                                                   normalization=norm, weights=w))
    base_loss, base_m = f((lp, old, adv, mask, ref), None)
    cand = mask.any(1).reshape(P, G)
    for w in (np.full((P, G), 1 / G, np.float32), np.ones((P, G), np.float32), np.full((P, G), 0.37, np.float32),
              M.uniform_weights(cand), M.candidate_weights(np.zeros((P, G)), cand, tau=0.5),
              M.candidate_weights(np.random.default_rng(0).normal(size=(P, G)), tau=1e30)):
        loss, m = f((lp, old, adv, mask, ref), jnp.asarray(w))
        assert np.asarray(loss).tobytes() == np.asarray(base_loss).tobytes()
        assert {k: float(v) for k, v in m.items()} == {k: float(v) for k, v in base_m.items()}


@pytest.mark.parametrize("norm", M.NORMALIZATIONS)
def test_weighted_loss_matches_reference(norm, jit_or_eager):
    lp, old, adv, mask, ref = _loss_batch(1)
    U = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    w = M.candidate_weights(U, tau=0.3)
    loss, m = jit_or_eager(lambda w: M.policy_loss(lp, old, adv, mask, ref_logp=ref, kl_coef=0.1,
                                                   normalization=norm, weights=w))(w)
    want = _weighted_reference(lp, old, adv, mask, ref, np.asarray(w), 0.1, 0.2, norm, 3)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    unweighted, _ = M.policy_loss(lp, old, adv, mask, ref_logp=ref, kl_coef=0.1, normalization=norm)
    assert abs(float(loss) - float(unweighted)) > 1e-3


def test_gradient_is_the_reweighted_dr_grpo_gradient():
    # on policy, constant normalisation, no KL: d loss / d logp_t = -G w_i A_i / (N L) on valid tokens
    P, G, L = 4, 3, 6
    lp, _, adv, mask, _ = _loss_batch(2)
    mask[4] = True                                                    # every completion has tokens
    w = M.candidate_weights(np.random.default_rng(2).normal(size=(P, G)), tau=0.5)
    loss_fn = lambda x, w: M.policy_loss(x, lp, adv, mask, normalization="constant", weights=w)[0]  # noqa: E731
    g = jax.grad(loss_fn)(jnp.asarray(lp), w)
    want = np.where(mask, -(G * np.asarray(w, np.float64).reshape(-1) * adv)[:, None] / (P * G * L), 0.0)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-8)
    # the weights are data: no gradient flows into them
    np.testing.assert_array_equal(np.asarray(jax.grad(loss_fn, argnums=1)(jnp.asarray(lp), w)), 0.0)


def test_tau_zero_trains_only_the_winners():
    P, G = 4, 3
    lp, _, adv, mask, _ = _loss_batch(3)
    mask[4] = True
    U = adv.reshape(P, G)
    g = jax.grad(lambda x: M.policy_loss(x, lp, adv, mask, normalization="constant",
                                         weights=M.candidate_weights(U, tau=0.0))[0])(jnp.asarray(lp))
    winners = (U == U.max(1, keepdims=True)).reshape(-1)
    assert np.all(np.asarray(g)[~winners] == 0.0) and np.all(np.asarray(g)[winners][mask[winners]] != 0.0)


def test_bad_weights_leave_the_completion_out():
    lp, old, adv, mask, ref = _loss_batch(4)
    w = np.random.default_rng(4).uniform(0.1, 1.0, (4, 3)).astype(np.float32)
    for bad_value in (np.nan, np.inf, -0.5):
        bad = w.copy()
        bad[2, 1] = bad_value                                         # completion 7
        loss, m = M.policy_loss(lp, old, adv, mask, ref_logp=ref, kl_coef=0.1, normalization="constant",
                                weights=bad)
        m2 = mask.copy()
        m2[7] = False
        want, _ = M.policy_loss(lp, old, adv, m2, ref_logp=ref, kl_coef=0.1, normalization="constant", weights=w)
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
        assert float(m["policy/invalid_tokens"]) == mask[7].sum()
        g = jax.grad(lambda x: M.policy_loss(x, old, adv, mask, normalization="constant", weights=bad)[0])(
            jnp.asarray(lp))
        assert np.isfinite(np.asarray(g)).all() and np.all(np.asarray(g)[7] == 0.0)


def test_a_group_without_mass_gives_no_policy_gradient():
    lp, _, adv, mask, _ = _loss_batch(5)
    w = np.ones((4, 3), np.float32)
    w[1] = 0.0                                                        # completions 3, 4, 5
    g = jax.grad(lambda x: M.policy_loss(x, lp, adv, mask, normalization="constant", weights=w)[0])(jnp.asarray(lp))
    assert np.all(np.asarray(g)[3:6] == 0.0) and np.any(np.asarray(g)[:3] != 0.0)


def test_bad_weight_shapes():
    lp, old, adv, mask, _ = _loss_batch()
    with pytest.raises(ValueError, match="weights"):
        M.policy_loss(lp, old, adv, mask, weights=np.ones(12, np.float32))
    with pytest.raises(ValueError, match="weights"):
        M.policy_loss(lp, old, adv, mask, weights=np.ones((5, 3), np.float32))


# ------------------------------------------------------------------ aggregation_diagnostics
def test_diagnostics_match_the_original():
    U, _, mask = _utilities(6)
    rewards = (np.random.default_rng(6).uniform(size=U.shape) > 0.5).astype(np.float32)
    for w in (M.candidate_weights(U, mask, tau=0.2), M.candidate_weights(U, mask, tau=0.0), M.uniform_weights(mask)):
        d = M.aggregation_diagnostics(w, rewards, mask)
        eff, bad, has = _diagnostics(np.asarray(w), rewards, mask)
        np.testing.assert_allclose(np.asarray(d.effective_candidates)[has], eff, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(d.incorrect_mass)[has], bad, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(d.effective_candidates)[~has], 0.0)
        assert int(d.count) == has.sum() == 5
        np.testing.assert_allclose(float(d.mean_effective_candidates), eff.mean(), rtol=1e-5)
        np.testing.assert_allclose(float(d.mean_incorrect_mass), bad.mean(), rtol=1e-5, atol=1e-7)


def test_diagnostics_limits():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, -1.0]], np.float32)
    uniform = M.aggregation_diagnostics(np.full((2, 4), 0.25), rewards)
    np.testing.assert_allclose(np.asarray(uniform.effective_candidates), [4.0, 4.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(uniform.incorrect_mass), [0.5, 0.5], rtol=1e-6)
    hard = M.aggregation_diagnostics(M.candidate_weights(rewards, tau=0.0), rewards)
    np.testing.assert_allclose(np.asarray(hard.effective_candidates), [2.0, 2.0], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(hard.incorrect_mass), [0.0, 0.0])
    none = M.aggregation_diagnostics(np.zeros((2, 4)), rewards)
    assert int(none.count) == 0 and float(none.mean_effective_candidates) == 0.0
