"""Checkpoints for any jaxweight state pytree: msgpack, atomic, checksummed, no pickle.

File layout (all integers little-endian)::

    b"JAXWCKPT"            8-byte magic
    u32 format version     currently 1
    u64 payload length     bytes that follow the header
    32 bytes sha256        of the payload
    payload                msgpack (flax.serialization) of
                           {"leaves": {path: array}, "kinds": {path: str},
                            "metadata": json string}

Leaves are stored by their key path (``jax.tree_util.keystr``), so loading
checks every path, shape and dtype against the ``target`` tree and names the
first mismatch. Typed PRNG keys are stored as their key data plus the key
implementation name and come back as typed keys.

Example::

    import jax.numpy as jnp
    from jaxweight import checkpoint

    state = {"ema": jnp.zeros(8), "count": jnp.asarray(3, jnp.int32)}
    checkpoint.save("run/state.ckpt", state, metadata={"step": 10})
    back = checkpoint.load("run/state.ckpt", state)       # checks paths, shapes, dtypes
    assert int(back["count"]) == 3
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from ._util import StateFileError, atomic_write_bytes, atomic_write_json, is_key

__all__ = ["save", "load", "load_with_metadata", "load_metadata", "save_json", "save_bytes", "CheckpointError",
           "StateFileError", "FORMAT_VERSION"]

MAGIC = b"JAXWCKPT"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIQ32s")


class CheckpointError(StateFileError):
    """A checkpoint file is truncated, corrupted, of another format or does not match the target.

    A subclass of :class:`jaxweight.StateFileError`, the one error every malformed
    state file raises (checkpoints, atropos and maxent_grpo JSON)."""


def _leaf_records(tree: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    leaves, kinds = {}, {}
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in flat:
        p = jax.tree_util.keystr(path)
        if p in leaves:  # pragma: no cover - keystr is injective for real trees
            raise CheckpointError(f"duplicate leaf path {p!r}")
        if is_key(leaf):
            leaves[p] = np.asarray(jax.device_get(jax.random.key_data(leaf)))
            kinds[p] = "key:" + str(jax.random.key_impl(leaf))
        else:
            leaves[p] = np.asarray(jax.device_get(leaf))
            kinds[p] = "array"
    return leaves, kinds


def save(path: str | os.PathLike, tree: Any, metadata: dict | None = None) -> Path:
    """Save a state pytree atomically.

    Args:
      path: file to write; parent folders are created. Until the final rename the
        previous file (if any) is left untouched, so a crash never loses it.
      tree: any pytree of arrays (jax or numpy, typed PRNG keys included).
        Static fields of ``flax.struct`` dataclasses are not stored; they come
        from the ``target`` given to :func:`load`.
      metadata: optional JSON-serialisable dict stored alongside
        (read back with :func:`load_metadata`).

    Returns:
      The path written.
    """
    leaves, kinds = _leaf_records(tree)
    try:
        meta = json.dumps(metadata if metadata is not None else {})
    except TypeError as e:
        raise ValueError(f"metadata must be JSON-serialisable: {e}") from None
    payload = serialization.msgpack_serialize({"leaves": leaves, "kinds": kinds, "metadata": meta})
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest())
    return atomic_write_bytes(path, header + payload)


def _read_payload(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} is not a regular file")
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is truncated: {len(data)} bytes, shorter than the "
            f"{_HEADER.size}-byte header"
        )
    magic, version, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"{str(path)!r} is not a jaxweight checkpoint (bad magic {magic!r})")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format version {version}; this jaxweight reads "
            f"version {FORMAT_VERSION}"
        )
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is truncated: payload has {len(payload)} of {length} bytes"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: checksum mismatch")
    try:
        rec = serialization.msgpack_restore(payload)
    except Exception as e:  # noqa: BLE001 - any decoding failure means corruption
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: {e}") from None
    # A file with our header but another writer's payload: say so instead of a KeyError.
    if not isinstance(rec, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} holds a {type(rec).__name__}, not a jaxweight record")
    for k, typ in (("leaves", dict), ("kinds", dict), ("metadata", str)):
        if k not in rec:
            raise CheckpointError(f"checkpoint {str(path)!r} misses the {k!r} entry (written by something else?)")
        if not isinstance(rec[k], typ):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: entry {k!r} is a {type(rec[k]).__name__}, expected {typ.__name__}"
            )
    try:
        json.loads(rec["metadata"])
    except ValueError as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: metadata is not valid JSON ({e})") from None
    return rec


def load_metadata(path: str | os.PathLike) -> dict:
    """The ``metadata`` dict stored by :func:`save` (``{}`` if none)."""
    return json.loads(_read_payload(path)["metadata"])


def load(path: str | os.PathLike, target: Any) -> Any:
    """Load a checkpoint into the structure of ``target`` (:func:`load_with_metadata` adds the metadata).

    Args:
      path: a file written by :func:`save`.
      target: a pytree with the expected structure, e.g. a freshly ``init``-ed
        state or ``jax.eval_shape(init, ...)`` (leaves may be arrays or
        ``jax.ShapeDtypeStruct``). Its static fields are kept.

    Returns:
      The restored tree (jax arrays with exactly the stored dtypes and shapes;
      typed PRNG keys restored as typed keys).

    Raises:
      FileNotFoundError: ``path`` does not exist.
      CheckpointError (a ``ValueError``): truncated, corrupted, other format,
        or a leaf path / shape / dtype that does not match ``target``.
    """
    return _restore(path, _read_payload(path), target)


def load_with_metadata(path: str | os.PathLike, target: Any) -> tuple[Any, dict]:
    """:func:`load` and :func:`load_metadata` from one read: ``(tree, metadata)``."""
    rec = _read_payload(path)
    return _restore(path, rec, target), json.loads(rec["metadata"])


def _restore(path: str | os.PathLike, rec: dict, target: Any) -> Any:
    leaves, kinds = rec["leaves"], rec["kinds"]
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    want = [jax.tree_util.keystr(p) for p, _ in flat]
    missing = [p for p in want if p not in leaves]
    extra = [p for p in leaves if p not in set(want)]
    if missing or extra:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not match the target structure: "
            + (f"missing leaves {missing[:5]}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected leaves {extra[:5]}" if extra else "")
        )
    out = []
    for (p, tleaf), name in zip(flat, want):
        try:
            arr = np.asarray(leaves[name])
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"checkpoint {str(path)!r}, leaf {name}: not an array ({e})") from None
        kind = kinds.get(name, "array")
        if is_key(tleaf):
            if not kind.startswith("key:"):
                raise CheckpointError(f"checkpoint {str(path)!r}, leaf {name}: target is a PRNG key, checkpoint holds an array")
            key = jax.random.wrap_key_data(jnp.asarray(arr), impl=kind[4:])
            if key.shape != tuple(tleaf.shape):
                raise CheckpointError(
                    f"leaf {name}: key shape {key.shape} does not match target {tuple(tleaf.shape)}"
                )
            out.append(key)
            continue
        if kind != "array":
            raise CheckpointError(f"checkpoint {str(path)!r}, leaf {name}: checkpoint holds a PRNG key, target is an array")
        tshape = tuple(np.shape(tleaf))
        tdtype = np.dtype(getattr(tleaf, "dtype", np.asarray(tleaf).dtype))
        if arr.shape != tshape:
            raise CheckpointError(f"checkpoint {str(path)!r}, leaf {name}: shape {arr.shape} does not match target {tshape}")
        if arr.dtype != tdtype:
            raise CheckpointError(f"checkpoint {str(path)!r}, leaf {name}: dtype {arr.dtype} does not match target {tdtype}")
        if isinstance(tleaf, np.ndarray | np.generic):
            out.append(arr)  # numpy stays numpy (and float64 stays float64)
        elif isinstance(tleaf, bool | int | float | complex):
            out.append(type(tleaf)(arr.item()))
        else:
            out.append(jnp.asarray(arr))
    return jax.tree_util.tree_unflatten(treedef, out)


def save_json(path: str | os.PathLike, obj: Any, **dump_kwargs: Any) -> Path:
    """Write ``obj`` as JSON atomically (temp file, fsync, rename): results, configs, state dicts."""
    return atomic_write_json(path, obj, **dump_kwargs)


def save_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` atomically (temp file in the same folder, fsync, rename): plots, CSV files.

    A crash at any point leaves the old file or the new one, never a mix; parent
    folders are created.
    """
    return atomic_write_bytes(path, data)
