import os
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import _util as U

pytestmark = pytest.mark.fast  # the base modules in the fast tier


def test_as_key_forms():
    k = jax.random.key(3)
    assert U.as_key(k) is k
    np.testing.assert_array_equal(jax.random.key_data(U.as_key(3)), jax.random.key_data(k))
    np.testing.assert_array_equal(jax.random.key_data(U.as_key(np.int64(3))), jax.random.key_data(k))
    legacy = jax.random.PRNGKey(3)
    np.testing.assert_array_equal(jax.random.key_data(U.as_key(legacy)), jax.random.key_data(k))
    for bad in (1.5, "x", True, jnp.zeros((3,), jnp.float32)):
        with pytest.raises(ValueError, match="key"):
            U.as_key(bad)


def test_shape_checks_name_the_argument():
    with pytest.raises(ValueError, match="scores must have rank 2, got shape"):
        U.check_rank(jnp.zeros(3), 2, "scores")
    with pytest.raises(ValueError, match=r"ids must have shape \(\?, 3\), got \(2, 4\)"):
        U.check_shape(jnp.zeros((2, 4)), (None, 3), "ids")
    with pytest.raises(ValueError, match="mask must have the same shape as scores"):
        U.check_same_shape(jnp.zeros((2, 3)), jnp.zeros((3, 2)), "scores", "mask")
    with pytest.raises(ValueError, match="num must be >= 0"):
        U.check_static_int(-1, "num", 0)
    with pytest.raises(ValueError, match="static Python int"):
        U.check_static_int(jnp.int32(3), "num")
    U.check_rank(jnp.zeros((2, 3)), (1, 2), "x")


def test_masked_reductions_nan_safe():
    x = jnp.array([[1.0, 2.0, jnp.nan], [jnp.inf, 0.0, 0.0], [1.0, 1.0, 1.0]])
    m = jnp.array([[True, True, False], [False, False, False], [True, False, False]])
    np.testing.assert_allclose(U.masked_mean(x, m, axis=1), [1.5, 0.0, 1.0])
    np.testing.assert_allclose(U.masked_std(x, m, axis=1), [0.5, 0.0, 0.0])
    np.testing.assert_allclose(U.masked_std(x, m, axis=1, ddof=1), [np.sqrt(0.5), 0.0, 0.0])


def test_atomic_write_json(tmp_path):
    p = U.atomic_write_json(tmp_path / "a" / "b.json", {"x": 1})
    assert p.read_text().strip().startswith("{")
    assert sorted(q.name for q in (tmp_path / "a").iterdir()) == ["b.json"]


def test_atomic_write_gives_the_permissions_of_a_plain_write(tmp_path):
    """Results written atomically are as readable as files written with open() (not mkstemp's 0600)."""
    old = os.umask(0o022)
    try:
        p = U.atomic_write_bytes(tmp_path / "r.bin", b"x")
        q = tmp_path / "plain.bin"
        q.write_bytes(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == stat.S_IMODE(q.stat().st_mode) == 0o644
