import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxweight import checkpoint
from jaxweight.checkpoint import CheckpointError
from tests.contracts import assert_trees_close

pytestmark = pytest.mark.fast  # the base modules in the fast tier


@struct.dataclass
class _State:
    x: jax.Array
    n: jax.Array
    flag: jax.Array
    key: jax.Array
    nested: dict
    name: str = struct.field(pytree_node=False, default="s")


def _state(seed=0):
    k = jax.random.key(seed)
    return _State(
        x=jax.random.normal(k, (3, 4), jnp.float32),
        n=jnp.asarray(7, jnp.int32),
        flag=jnp.asarray([True, False]),
        key=jax.random.split(k, 3),
        nested={"a": jnp.arange(5, dtype=jnp.uint8), "b": [jnp.zeros((0, 2), jnp.bfloat16)]},
    )


def test_round_trip_exact_dtypes_shapes_and_keys(tmp_path):
    s = _state(1)
    p = checkpoint.save(tmp_path / "sub" / "s.ckpt", s, metadata={"step": 3})
    back, meta = checkpoint.load_with_metadata(p, _state(0))
    assert meta == {"step": 3}
    assert_trees_close(back, s)
    assert jax.dtypes.issubdtype(back.key.dtype, jax.dtypes.prng_key)
    # restored keys draw the same numbers
    np.testing.assert_array_equal(jax.random.normal(back.key[1], (4,)), jax.random.normal(s.key[1], (4,)))
    assert back.name == "s"


def test_load_against_eval_shape_target(tmp_path):
    s = _state(2)
    checkpoint.save(tmp_path / "s.ckpt", s)
    target = jax.eval_shape(lambda: _state(0))
    assert_trees_close(checkpoint.load(tmp_path / "s.ckpt", target), s)


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "s.ckpt"
    checkpoint.save(path, _state(1))
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(path, _state(2))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.ckpt"]  # no temp file left behind


def test_truncated_file(tmp_path):
    path = tmp_path / "s.ckpt"
    checkpoint.save(path, _state(1))
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        checkpoint.load(path, _state(0))
    path.write_bytes(data[:20])
    with pytest.raises(CheckpointError, match="truncated"):
        checkpoint.load(path, _state(0))


def test_corrupted_file(tmp_path):
    path = tmp_path / "s.ckpt"
    checkpoint.save(path, _state(1))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        checkpoint.load(path, _state(0))


def test_not_a_checkpoint_and_missing(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"a": 1}) * 10)
    with pytest.raises(CheckpointError, match="not a jaxweight checkpoint"):
        checkpoint.load(path, _state(0))
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "nope.ckpt", _state(0))


def test_mismatched_target(tmp_path):
    path = tmp_path / "s.ckpt"
    checkpoint.save(path, _state(1))
    bad_shape = _state(0).replace(x=jnp.zeros((4, 3), jnp.float32))
    with pytest.raises(CheckpointError, match=r"\.x: shape \(3, 4\)"):
        checkpoint.load(path, bad_shape)
    bad_dtype = _state(0).replace(n=jnp.asarray(7, jnp.int16))
    with pytest.raises(CheckpointError, match=r"\.n: dtype int32"):
        checkpoint.load(path, bad_dtype)
    with pytest.raises(CheckpointError, match="missing leaves"):
        checkpoint.load(path, {"other": jnp.zeros(3)})


def test_metadata_must_be_json(tmp_path):
    with pytest.raises(ValueError, match="JSON"):
        checkpoint.save(tmp_path / "s.ckpt", _state(0), metadata={"a": object()})
    assert not (tmp_path / "s.ckpt").exists()


def test_numpy_leaves_stay_numpy(tmp_path):
    tree = {"a": np.arange(3, dtype=np.float64), "b": jnp.ones(2)}
    checkpoint.save(tmp_path / "t.ckpt", tree)
    back = checkpoint.load(tmp_path / "t.ckpt", tree)
    assert isinstance(back["a"], np.ndarray) and back["a"].dtype == np.float64
    np.testing.assert_array_equal(back["a"], tree["a"])


def test_a_killed_writers_temp_file_is_removed_by_the_next_write(tmp_path):
    """A write killed between its temp file and the rename strands ``.name.<pid>.*.tmp``; the next write of the
    same file removes it (its process is gone), and leaves a live writer's temp file alone."""
    import os
    import subprocess
    import sys

    from jaxweight import checkpoint

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    target = tmp_path / "loop_state.ckpt"
    stranded = tmp_path / f".loop_state.ckpt.{dead}.k2j4.tmp"
    live = tmp_path / f".loop_state.ckpt.{os.getpid()}.a8x1.tmp"
    other = tmp_path / f".other.ckpt.{dead}.zz.tmp"
    for f in (stranded, live, other):
        f.write_bytes(b"partial")
    checkpoint.save(target, {"x": np.arange(3, dtype=np.float32)})
    assert not stranded.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name, other.name])
    back = checkpoint.load(target, {"x": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(back["x"], np.arange(3, dtype=np.float32))
