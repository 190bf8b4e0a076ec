"""Bad inputs for the shared pieces: the one validation helper and checkpoint files.

Every case asserts the specific outcome: the error type and a fragment of its message.
"""

import hashlib
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

import jaxweight
from jaxweight import _util as U
from jaxweight import checkpoint

# (value, kwargs, message fragment)
BAD_VALUES = [
    (-1.0, dict(gt=0.0), "temperature must be finite and > 0.0, got -1.0"),
    (0.0, dict(gt=0.0), "> 0.0, got 0.0"),
    (math.nan, dict(gt=0.0), "got nan"),
    (math.inf, dict(gt=0.0), "got inf"),
    (1.5, dict(ge=0.0, le=1.0), "in [0.0, 1.0], got 1.5"),
    (-0.1, dict(ge=0.0, le=1.0), "in [0.0, 1.0], got -0.1"),
    (2.5, dict(ge=1, integer=True), "an integer"),
    (np.array([0.5, -2.0], np.float32), dict(ge=0.0), ">= 0.0"),
]


def _check(v, kw):
    U.check_value(v, "temperature", **kw)
    return jnp.asarray(v)


@pytest.mark.parametrize("value,kw,frag", BAD_VALUES)
def test_check_value_eager_and_checked_jit_agree(value, kw, frag):
    with pytest.raises(ValueError) as eager:
        _check(value, kw)
    assert frag in str(eager.value)
    with pytest.raises(ValueError) as jitted:
        jaxweight.checked(jax.jit(lambda v: _check(v, kw)))(jnp.asarray(value, jnp.float32))
    # same message text; checkify appends "(`check` failed)"
    assert str(jitted.value).startswith(str(eager.value).split(", got")[0])


@pytest.mark.parametrize("value", [0.5, 1.0, np.float32(0.25), jnp.asarray([0.1, 0.9])])
def test_check_value_accepts_good_values_both_ways(value):
    assert _check(value, dict(ge=0.0, le=1.0)) is not None
    out = jaxweight.checked(jax.jit(lambda v: _check(v, dict(ge=0.0, le=1.0))))(jnp.asarray(value))
    np.testing.assert_allclose(np.asarray(out), np.asarray(value), rtol=1e-6)


@pytest.mark.parametrize("bad", ["x", None, True, [1, "a"]])
def test_check_value_refuses_non_numbers(bad):
    with pytest.raises(ValueError, match="temperature must be a number"):
        U.check_value(bad, "temperature", gt=0.0)


def test_check_value_static_refuses_traced_values_with_a_value_error():
    """``static=True``: a host setting gives the eager message, and a traced value a ValueError naming it."""
    U.check_value(2.0, "sample_factor", ge=1.0, static=True)
    with pytest.raises(ValueError, match=re.escape("sample_factor must be finite and >= 1.0, got 0.5")):
        U.check_value(0.5, "sample_factor", ge=1.0, static=True)
    msg = "sample_factor must be static (a concrete number, not traced under jax.jit) and finite and >= 1.0, " \
          "got a traced float32[]"
    for v in (0.5, 2.0):  # good or bad, a traced value cannot be used on the host
        with pytest.raises(ValueError, match=re.escape(msg)):
            jaxweight.checked(jax.jit(lambda x: U.check_value(x, "sample_factor", ge=1.0, static=True)))(
                jnp.float32(v))


def test_check_order_both_ways():
    with pytest.raises(ValueError, match="tau_min must be <= tau_max, got tau_min=2.0 and tau_max=1.0"):
        U.check_order(2.0, 1.0, "tau_min", "tau_max")
    with pytest.raises(ValueError, match="tau_min must be <= tau_max"):
        jaxweight.checked(jax.jit(lambda a, b: U.check_order(a, b, "tau_min", "tau_max")))(2.0, 1.0)
    with pytest.raises(ValueError, match="lo must be < hi"):
        U.check_order(1.0, 1.0, "lo", "hi", strict=True)
    U.check_order(1.0, 1.0, "lo", "hi")


def test_check_choice():
    with pytest.raises(ValueError, match=r"mode must be one of \['a', 'b'\], got 'c'"):
        U.check_choice("c", "mode", ("a", "b"))


def test_count_invalid_and_finite_mask():
    x = jnp.array([1.0, jnp.nan, jnp.inf, -jnp.inf, 2.0])
    assert int(U.count_invalid(x)) == 3
    assert int(U.count_invalid(x, jnp.array([1, 1, 0, 0, 1], bool))) == 1
    np.testing.assert_array_equal(np.asarray(U.finite_mask(x)), [1, 0, 0, 0, 1])


# ------------------------------------------------------------- checkpoint files
def _state():
    return {"w": jnp.arange(3.0), "k": jax.random.key(0), "n": jnp.asarray(2, jnp.int32)}


def _framed(payload: bytes) -> bytes:
    return checkpoint._HEADER.pack(
        checkpoint.MAGIC, checkpoint.FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest()
    ) + payload


@pytest.mark.parametrize(
    "make,frag",
    [
        (lambda good: good[:10], "truncated"),
        (lambda good: good[:-5], "truncated"),
        (lambda good: good[:-1] + bytes([good[-1] ^ 1]), "checksum mismatch"),
        (lambda good: b"PK\x03\x04" + b"\0" * 100, "not a jaxweight checkpoint"),
        (lambda good: b"\xff\xfe" * 40, "not a jaxweight checkpoint"),
        (lambda good: _framed(serialization.msgpack_serialize({"params": {"a": np.zeros(2)}})), "misses the 'leaves' entry"),
        (lambda good: _framed(serialization.msgpack_serialize([1, 2, 3])), "not a jaxweight record"),
        (lambda good: _framed(b"\xc1\xc1\xc1"), "corrupted"),
        (lambda good: _framed(serialization.msgpack_serialize({"leaves": [], "kinds": {}, "metadata": "{}"})),
         "entry 'leaves' is a list"),
        (lambda good: _framed(serialization.msgpack_serialize({"leaves": {}, "kinds": {}, "metadata": "{"})),
         "metadata is not valid JSON"),
    ],
)
def test_malformed_checkpoint_is_one_error_naming_the_file(tmp_path, make, frag):
    good_path = checkpoint.save(tmp_path / "good.ckpt", _state())
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(make(good_path.read_bytes()))
    with pytest.raises(jaxweight.StateFileError, match=frag) as e:
        checkpoint.load(bad, _state())
    assert "bad.ckpt" in str(e.value)
    assert isinstance(e.value, checkpoint.CheckpointError) and isinstance(e.value, ValueError)


def test_checkpoint_directory_and_mismatched_target(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(jaxweight.StateFileError, match="not a regular file"):
        checkpoint.load(tmp_path / "d", _state())
    p = checkpoint.save(tmp_path / "s.ckpt", _state())
    with pytest.raises(jaxweight.StateFileError, match=r"s.ckpt.*shape \(3,\) does not match target \(4,\)"):
        checkpoint.load(p, {**_state(), "w": jnp.zeros(4)})
    with pytest.raises(jaxweight.StateFileError, match="dtype"):
        checkpoint.load(p, {**_state(), "n": jnp.asarray(2.0, jnp.float32)})
    with pytest.raises(jaxweight.StateFileError, match="missing leaves"):
        checkpoint.load(p, {**_state(), "extra": jnp.zeros(1)})


def test_load_with_metadata(tmp_path):
    p = checkpoint.save(tmp_path / "m.ckpt", _state(), metadata={"round": 3})
    tree, meta = checkpoint.load_with_metadata(p, _state())
    assert meta == {"round": 3}
    np.testing.assert_array_equal(np.asarray(tree["w"]), [0.0, 1.0, 2.0])
