"""The LM demo's 95% interval over seeds: Student's t quantile at every number of seeds."""

import math

import numpy as np
import pytest
from scipy import stats

from jaxweight.demos.lm import _demo


@pytest.mark.parametrize("n", [2, 3, 5, 10, 11, 12, 30])
def test_interval_uses_the_student_t_quantile_at_every_size(n):
    """With ``n`` seeds the half-width is ``t_{0.975, n-1} * s / sqrt(n)``, also from 10 degrees of
    freedom up (where a table once fell back to the normal 1.96: too narrow, 2.228 at 10)."""
    x = np.linspace(0.1, 0.9, n) ** 2
    lo, hi = _demo._interval(x)
    h = stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)
    np.testing.assert_allclose([lo, hi], [x.mean() - h, x.mean() + h], rtol=1e-12)
    assert hi - lo > 2 * 1.96 * x.std(ddof=1) / math.sqrt(n)  # always wider than the normal interval


def test_interval_of_fewer_than_two_seeds_is_none():
    assert _demo._interval([0.5]) is None and _demo._interval([]) is None
    assert _demo._interval([0.5, 0.5]) == [0.5, 0.5]
