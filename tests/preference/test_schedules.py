"""Query schedules, oric and allocate_comparisons."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import preference as pf


def test_spec_example_6_comparison_schedule():
    assert pf.allocate_comparisons(100, 5, 0.1, "hyperbolic") == [10, 25, 20, 17, 15, 13]


def test_query_schedules_values():
    t = np.linspace(0, 1, 5)
    np.testing.assert_allclose(np.vectorize(pf.QUERY_SCHEDULES["constant"])(t), 1.0)
    np.testing.assert_allclose(pf.QUERY_SCHEDULES["hyperbolic"](t), 1 / (1 + t))
    np.testing.assert_allclose(pf.QUERY_SCHEDULES["inverse_quadratic"](t), 1 / (1 + t**2))
    assert set(pf.QUERY_SCHEDULES) == {"constant", "hyperbolic", "inverse_quadratic"}


@pytest.mark.parametrize("schedule", ["constant", "hyperbolic", "inverse_quadratic", lambda t: 1 / (1 + t**3)])
def test_allocate_keeps_total(schedule):
    out = pf.allocate_comparisons(97, 4, 0.25, schedule)
    assert len(out) == 5 and sum(out) == 97 and out[0] == int(97 * 0.25)
    assert all(isinstance(v, int) for v in out)


def test_allocate_constant_and_callable():
    assert pf.allocate_comparisons(10, 3, 0.1, "constant") == [1, 3, 3, 3]
    assert pf.allocate_comparisons(10, 1, 0.0, lambda t: 2.0) == [0, 10]


def test_unknown_schedule_and_bad_arguments():
    with pytest.raises(ValueError, match="Unknown query schedule: nope"):
        pf.allocate_comparisons(10, 2, 0.1, "nope")
    with pytest.raises(ValueError, match="Unknown query schedule"):
        pf.get_schedule(3)
    with pytest.raises(ValueError, match="num_iterations"):
        pf.allocate_comparisons(10, 0)
    with pytest.raises(ValueError, match="total"):
        pf.allocate_comparisons(-1, 2)
    with pytest.raises(ValueError, match="initial_fraction"):
        pf.allocate_comparisons(10, 2, 1.5)
    with pytest.raises(ValueError, match="schedule must return"):
        pf.allocate_comparisons(10, 2, 0.1, lambda t: -1.0)


def test_oric_examples_and_tie_order():
    np.testing.assert_array_equal(pf.oric(np.array([1.5, 1.5, 2.0])), [2, 1, 2])
    np.testing.assert_array_equal(pf.oric(jnp.array([1.5, 1.5, 2.0])), [2, 1, 2])
    np.testing.assert_array_equal(pf.oric(np.array([0.2, 0.2, 0.2, 0.2, 0.2])), [1, 0, 0, 0, 0])
    assert pf.oric(jnp.array([0.5, 0.5])).dtype == jnp.int32
    jitted = jax.jit(pf.oric)(jnp.array([2.25, 0.75, 1.0]))
    np.testing.assert_array_equal(jitted, [2, 1, 1])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 50, allow_nan=False), min_size=1, max_size=12), st.integers(0, 200))
def test_oric_properties(weights, total):
    w = np.asarray(weights) + 1e-3
    x = w / w.sum() * total
    r = pf.oric(x)
    assert r.sum() == total
    assert np.all(np.abs(r - x) < 1 + 1e-9)
    assert np.all(r >= np.floor(x))
