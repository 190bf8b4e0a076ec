"""Synthetic preferences: worked examples, sampling, B-Pref teachers, contracts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import preference as pf
from tests.contracts import assert_no_retrace


def _example_pairs():
    # ([1,1] vs [0,0]), ([1,0] vs [0,1]), ([0,0] vs [5,5])
    rews = np.array([[[1, 1], [0, 0]], [[1, 0], [0, 1]], [[0, 0], [5, 5]]], np.float32)
    return pf.fragment_pairs_from_arrays(np.zeros((3, 2, 3, 1)), np.zeros((3, 2, 2)), rews)


def _h(p):
    p = np.asarray(p, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num(-(p * np.log(p) + (1 - p) * np.log(1 - p)))


def test_spec_example_4(jit_or_eager):
    pairs = _example_pairs()
    run = jit_or_eager(lambda t, d: pf.synthetic_preferences(0, pairs, temperature=t, discount=d, sample=False))
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    p0, e0 = run(f32(0.0), f32(1.0))
    np.testing.assert_array_equal(p0, [1.0, 0.5, 0.0])
    np.testing.assert_allclose(e0, _h([1, 0.5, 0]).mean(), rtol=1e-6)
    p1, e1 = run(f32(1.0), f32(1.0))
    np.testing.assert_allclose(p1[:2], [0.880797, 0.5], atol=5e-7)  # spec values, to their printed precision
    np.testing.assert_allclose(p1[2], 4.54e-5, atol=5e-8)
    np.testing.assert_allclose(p1, 1 / (1 + np.exp([-2.0, 0.0, 10.0])), rtol=1e-6)
    np.testing.assert_allclose(e1, _h(np.asarray(p1)).mean(), rtol=1e-5)
    p2, _ = run(f32(2.0), f32(0.5))
    np.testing.assert_allclose(p2, [0.679179, 0.562177, 0.022977], atol=5e-7)
    np.testing.assert_allclose(p2, 1 / (1 + np.exp([-0.75, -0.25, 3.75])), rtol=1e-6)
    assert p0.dtype == jnp.float32


def test_temperature_zero_is_deterministic_and_never_sampled():
    pairs = _example_pairs()
    a, _ = pf.synthetic_preferences(0, pairs, temperature=0.0, sample=True)
    b, _ = pf.synthetic_preferences(1, pairs, temperature=0.0, sample=True)
    np.testing.assert_array_equal(a, [1.0, 0.5, 0.0])
    np.testing.assert_array_equal(a, b)


def test_sampling_frequencies_and_clipping():
    rews = np.zeros((4000, 2, 1), np.float32)
    rews[:, 0, 0] = 1.0  # p = sigmoid(1) = 0.731
    pairs = pf.fragment_pairs_from_arrays(np.zeros((4000, 2, 2, 1)), np.zeros((4000, 2, 1)), rews)
    prefs, ent = pf.synthetic_preferences(3, pairs, temperature=1.0)
    assert set(np.unique(np.asarray(prefs))) <= {0.0, 1.0} and prefs.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(prefs).mean(), 1 / (1 + np.exp(-1)), atol=0.03)
    np.testing.assert_allclose(ent, _h(1 / (1 + np.exp(-1))), rtol=1e-5)
    # clipping after dividing by T: probabilities never go below 1 / (1 + e^threshold)
    big = pf.fragment_pairs_from_arrays(np.zeros((1, 2, 2, 1)), np.zeros((1, 2, 1)), [[[0.0], [1e6]]])
    p, _ = pf.synthetic_preferences(0, big, temperature=0.01, sample=False, threshold=5.0)
    np.testing.assert_allclose(p, 1 / (1 + np.exp(5.0)), rtol=1e-6)


def test_bpref_teachers():
    pairs = _example_pairs()
    flipped, _ = pf.synthetic_preferences(0, pairs, temperature=0.0, mistake_prob=1.0)
    np.testing.assert_array_equal(flipped, [0.0, 0.5, 1.0])
    p, _ = pf.synthetic_preferences(0, pairs, temperature=1.0, sample=False, mistake_prob=1.0)
    np.testing.assert_allclose(p[0], 1 - 0.880797, rtol=1e-5)
    eq, _ = pf.synthetic_preferences(0, pairs, temperature=0.0, equal_threshold=2.5)
    np.testing.assert_array_equal(eq, [0.5, 0.5, 0.0])  # |R1 - R2| = 2, 0, 10
    out = pf.synthetic_teacher(0, pairs, temperature=0.0, skip_threshold=1.0)
    np.testing.assert_array_equal(out.valid, [True, False, True])  # max(R1, R2) = 2, 1, 10
    np.testing.assert_allclose(out.entropy, 0.0)  # mean over answered pairs only
    assert int(out.n_invalid) == 0
    with pytest.raises(ValueError, match="use synthetic_teacher"):
        pf.synthetic_preferences(0, pairs, skip_threshold=1.0)
    prefs, _ = pf.synthetic_preferences(0, pairs, temperature=0.0)
    np.testing.assert_array_equal(prefs, out.prefs)  # the same answers; only the validity differs
    # mistakes at rate 0.3 on deterministic labels
    many = pf.fragment_pairs_from_arrays(np.zeros((3000, 2, 2, 1)), np.zeros((3000, 2, 1)),
                                         np.tile([[[1.0], [0.0]]], (3000, 1, 1)))
    noisy, _ = pf.synthetic_preferences(5, many, temperature=0.0, mistake_prob=0.3)
    np.testing.assert_allclose(1 - np.asarray(noisy).mean(), 0.3, atol=0.03)


def test_errors_and_no_retrace_on_new_temperature():
    pairs = _example_pairs()
    empty = pf.fragment_pairs_from_arrays(np.zeros((0, 2, 3, 1)), np.zeros((0, 2, 2)))
    with pytest.raises(ValueError, match="P == 0"):
        pf.synthetic_preferences(0, empty)
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    fn = lambda k, t, d, m: pf.synthetic_preferences(k, pairs, temperature=t, discount=d, mistake_prob=m)  # noqa: E731
    assert_no_retrace(fn, (jax.random.key(0), f32(1.0), f32(1.0), f32(0.0)),
                      (jax.random.key(1), f32(0.0), f32(0.5), f32(0.2)))
    sweep = jax.vmap(lambda t: pf.synthetic_preferences(0, pairs, temperature=t, sample=False)[0])(
        jnp.array([0.0, 1.0]))
    np.testing.assert_array_equal(sweep[0], [1.0, 0.5, 0.0])
    np.testing.assert_allclose(sweep[1, 0], 0.880797, rtol=1e-5)
