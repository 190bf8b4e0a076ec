"""Bradley-Terry probability, preference probabilities and the cross-entropy loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import preference as pf
from tests.contracts import assert_jit_matches_eager, assert_no_retrace

floats = st.floats(-20, 20, allow_nan=False, width=32)


def _np_probability(r1, r2, noise=0.0, discount=1.0, threshold=50.0):
    r1 = np.asarray(r1, np.float64)
    r2 = np.asarray(r2, np.float64)
    w = discount ** np.arange(len(r1))
    w = w.reshape((-1,) + (1,) * (r1.ndim - 1))
    d = np.clip((w * (r2 - r1)).sum(0), -threshold, threshold)
    return noise * 0.5 + (1 - noise) / (1 + np.exp(d))


def test_spec_example_1_two_fragments(jit_or_eager):
    p = jit_or_eager(lambda a, b: pf.probability(a, b))(jnp.array([1.0, 2.0, 3.0]), jnp.array([0.0, 1.0, 1.0]))
    assert p.shape == ()
    np.testing.assert_allclose(p, 0.9820138, rtol=1e-6)


def test_spec_example_2_ensemble_columns(jit_or_eager):
    r1 = jnp.array([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]])
    r2 = jnp.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    p = jit_or_eager(lambda a, b: pf.probability(a, b))(r1, r2)
    assert p.shape == (3,)
    np.testing.assert_allclose(p, [0.880797, 0.268941, 0.982014], rtol=1e-5)


def test_spec_example_5_loss():
    loss, metrics = pf.cross_entropy_loss(jnp.array([0.5, 0.7, 0.2, 0.9]), jnp.array([0.5, 1.0, 0.0, 0.0]))
    np.testing.assert_allclose(loss, 0.8938876, rtol=1e-6)
    np.testing.assert_allclose(metrics["accuracy"], 0.75)


def test_probability_matches_numpy_with_all_options():
    rng = np.random.default_rng(0)
    r1, r2 = rng.normal(size=(7, 4)) * 5, rng.normal(size=(7, 4)) * 5
    got = pf.probability(jnp.asarray(r1), jnp.asarray(r2), noise_prob=0.1, discount=0.9, threshold=3.0)
    np.testing.assert_allclose(got, _np_probability(r1, r2, 0.1, 0.9, 3.0), rtol=1e-5)
    # per member == column by column
    cols = [pf.probability(jnp.asarray(r1[:, m]), jnp.asarray(r2[:, m]), noise_prob=0.1, discount=0.9) for m in range(4)]
    np.testing.assert_allclose(pf.probability(jnp.asarray(r1), jnp.asarray(r2), noise_prob=0.1, discount=0.9), cols,
                               rtol=1e-6)


def test_ties_and_empty_fragments_give_half():
    np.testing.assert_allclose(pf.probability(jnp.ones(5), jnp.ones(5)), 0.5)
    np.testing.assert_allclose(pf.probability(jnp.zeros((0,)), jnp.zeros((0,))), 0.5)
    np.testing.assert_allclose(pf.probability(jnp.zeros((0, 3)), jnp.zeros((0, 3))), [0.5] * 3)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(floats, floats), min_size=1, max_size=6), st.floats(0, 1), st.floats(0.5, 1))
def test_symmetry_and_bounds(rows, noise, discount):
    r1 = jnp.array([a for a, _ in rows], jnp.float32)
    r2 = jnp.array([b for _, b in rows], jnp.float32)
    p12 = pf.probability(r1, r2, discount=discount)
    p21 = pf.probability(r2, r1, discount=discount)
    np.testing.assert_allclose(p12 + p21, 1.0, atol=1e-6)  # p(a, b) = 1 - p(b, a) without noise
    q12 = pf.probability(r1, r2, noise_prob=noise, discount=discount)
    q21 = pf.probability(r2, r1, noise_prob=noise, discount=discount)
    np.testing.assert_allclose(q12 + q21, 1.0, atol=1e-6)  # and with noise
    # noise bounds: the teacher is uniformly random with probability noise
    assert noise / 2 - 1e-6 <= float(q12) <= 1 - noise / 2 + 1e-6


@settings(max_examples=30, deadline=None)
@given(st.lists(floats, min_size=1, max_size=5), st.floats(0.5, 20))
def test_clipping_bounds(vals, threshold):
    r1 = jnp.array(vals, jnp.float32) * 100
    p = float(pf.probability(r1, -r1, threshold=threshold))
    lo = 1 / (1 + np.exp(threshold))
    assert lo * (1 - 1e-5) <= p <= (1 - lo) * (1 + 1e-5)


def test_gradient_is_finite_and_clipped():
    g = jax.grad(lambda a: pf.probability(a, jnp.zeros(3)))(jnp.array([1e4, 0.0, 0.0]))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, 0.0)  # beyond the clip threshold the difference gets no gradient
    g = jax.grad(lambda a: pf.probability(a, jnp.zeros(3)))(jnp.array([0.1, 0.0, 0.0]))
    assert np.all(g > 0)


def test_vmap_over_pairs_and_noise_no_retrace():
    rng = np.random.default_rng(1)
    r1, r2 = jnp.asarray(rng.normal(size=(6, 5))), jnp.asarray(rng.normal(size=(6, 5)))
    batched = jax.vmap(pf.probability)(r1, r2)  # [P, L] -> [P]
    np.testing.assert_allclose(batched, [_np_probability(a, b) for a, b in zip(np.asarray(r1), np.asarray(r2))],
                               rtol=1e-5)
    sweep = jax.vmap(lambda n: pf.probability(r1[0], r2[0], noise_prob=n))(jnp.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(sweep[2], 0.5)
    fn = lambda a, b, n, d, t: pf.probability(a, b, noise_prob=n, discount=d, threshold=t)  # noqa: E731
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    assert_no_retrace(fn, (r1[0], r2[0], f32(0.0), f32(1.0), f32(50.0)), (r1[1], r2[1], f32(0.2), f32(0.9), f32(5.0)))


def test_probability_shape_errors():
    with pytest.raises(ValueError, match="rews1 must have rank"):
        pf.probability(jnp.zeros((2, 2, 2)), jnp.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="rews2 must have the same shape"):
        pf.probability(jnp.zeros(3), jnp.zeros(4))


def test_cross_entropy_details():
    # log clamped at -100 like torch's BCE
    loss, _ = pf.cross_entropy_loss(jnp.array([0.0, 1.0]), jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(loss, 100.0)
    # accuracy is strict on both sides: 0.5 vs 0.5 counts as correct, 0.5 vs 1 does not
    _, m = pf.cross_entropy_loss(jnp.array([0.5, 0.5, 0.51]), jnp.array([0.5, 1.0, 0.6]))
    np.testing.assert_allclose(m["accuracy"], 2 / 3, rtol=1e-6)
    # mask and gt loss
    probs = jnp.array([0.9, 0.2, jnp.nan])
    loss, m = pf.cross_entropy_loss(probs, jnp.array([1.0, 0.0, 1.0]), mask=jnp.array([True, True, False]),
                                    gt_probs=jnp.array([0.5, 0.5, 0.5]))
    np.testing.assert_allclose(loss, -(np.log(0.9) + np.log(0.8)) / 2, rtol=1e-6)
    np.testing.assert_allclose(m["gt_reward_loss"], np.log(2), rtol=1e-6)
    np.testing.assert_allclose(m["accuracy"], 1.0)
    # nothing masked in: zero, not NaN
    loss, m = pf.cross_entropy_loss(probs, jnp.ones(3), mask=jnp.zeros(3, bool))
    assert float(loss) == 0.0 and float(m["accuracy"]) == 0.0


def test_preference_probabilities_single_and_ensemble():
    net = pf.RewardMLP(hidden_sizes=(8,), observation_space=pf.Box((3,)), action_space=pf.Discrete(2))
    rng = np.random.default_rng(2)
    pairs = pf.fragment_pairs_from_arrays(rng.normal(size=(5, 2, 5, 3)), rng.integers(0, 2, (5, 2, 4)),
                                          rng.normal(size=(5, 2, 4)))
    ex = tuple(x[:1] for x in pairs.transitions())
    params = pf.ensemble_init(0, net, ex, 3)
    probs, gt = assert_jit_matches_eager(
        lambda p: pf.preference_probabilities(net, p, pairs, noise_prob=0.1, discount=0.9, ensemble=True), params,
        rtol=1e-6, atol=1e-7)
    assert probs.shape == (5, 3) and gt.shape == (5,)
    single_fn = jax.jit(lambda pm: pf.preference_probabilities(net, pm, pairs, noise_prob=0.1, discount=0.9))
    for m in range(3):
        single, gt1 = single_fn(jax.tree.map(lambda x: x[m], params))
        np.testing.assert_allclose(probs[:, m], single, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gt, gt1, rtol=1e-6)
    rews = np.asarray(pairs.rews)
    np.testing.assert_allclose(gt, [_np_probability(r[0], r[1], 0.1, 0.9) for r in rews], rtol=1e-5)
    # ensemble forward is differentiable (imitation's PreferenceModel.forward raises for ensembles)
    g = jax.jit(jax.grad(lambda p: jnp.sum(pf.preference_probabilities(net, p, pairs, ensemble=True)[0])))(params)
    norms = jax.vmap(lambda t: sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(t)))(g)
    assert np.all(np.asarray(norms) > 0)
