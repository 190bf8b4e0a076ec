"""Shared helpers: keys, shape checks, NaN-safe masked reductions, atomic file writes.

Every module of jaxweight uses these instead of its own copy. The checks run at
trace time (they look at static shapes only), so they cost nothing inside jit.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

__all__ = [
    "as_key",
    "is_key",
    "check_rank",
    "check_shape",
    "check_same_shape",
    "check_static_int",
    "as_f32",
    "masked_sum",
    "masked_count",
    "masked_mean",
    "masked_std",
    "masked_softmax",
    "masked_log_softmax",
    "atomic_write_bytes",
    "atomic_write_json",
]


# --------------------------------------------------------------------- keys
def is_key(x: Any) -> bool:
    """True for a typed PRNG key array (``jax.random.key``)."""
    return isinstance(x, jax.Array | jax.ShapeDtypeStruct) and jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key
    )


def as_key(key: Any, name: str = "key") -> Array:
    """Canonicalise ``key`` to a typed PRNG key.

    Accepts a typed key (returned as is), an int seed (Python or NumPy integer,
    converted with ``jax.random.key``) or a legacy ``uint32[..., 2]`` raw key
    (``jax.random.PRNGKey``), which is wrapped.

    Args:
      key: the key or seed.
      name: argument name used in the error message.

    Returns:
      A typed key array of the same batch shape.

    Raises:
      ValueError: for anything else (floats, strings, wrongly shaped arrays).
    """
    if is_key(key):
        return key
    if isinstance(key, bool):
        raise ValueError(f"{name} must be a jax.random.key or an int seed, got bool")
    if isinstance(key, int | np.integer):
        return jax.random.key(int(key))
    if isinstance(key, jax.Array | np.ndarray):
        if key.dtype == jnp.uint32 and key.ndim >= 1 and key.shape[-1] == 2:
            return jax.random.wrap_key_data(key)
        if key.ndim == 0 and jnp.issubdtype(key.dtype, jnp.integer):
            return jax.random.key(key)
    raise ValueError(
        f"{name} must be a jax.random.key, a legacy uint32[2] PRNGKey or an int seed, "
        f"got {type(key).__name__}"
        + (f" with dtype {key.dtype} and shape {key.shape}" if hasattr(key, "shape") else "")
    )


# ------------------------------------------------------------ shape checks
def _shape(x: Any) -> tuple[int, ...]:
    return tuple(np.shape(x))


def check_rank(x: Any, rank: int | Sequence[int], name: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``x.ndim`` is ``rank`` (or one of them)."""
    ranks = (rank,) if isinstance(rank, int) else tuple(rank)
    nd = len(_shape(x))
    if nd not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must have rank {want}, got shape {_shape(x)}")


def check_shape(x: Any, shape: Sequence[int | None], name: str) -> None:
    """Raise ``ValueError`` unless ``x.shape`` matches ``shape`` (``None`` = any size)."""
    s = _shape(x)
    if len(s) != len(shape) or any(w is not None and w != d for w, d in zip(shape, s)):
        want = "(" + ", ".join("?" if w is None else str(w) for w in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{name} must have shape {want}, got {s}")


def check_same_shape(a: Any, b: Any, name_a: str, name_b: str) -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` have the same shape."""
    if _shape(a) != _shape(b):
        raise ValueError(
            f"{name_b} must have the same shape as {name_a} {_shape(a)}, got {_shape(b)}"
        )


def check_static_int(x: Any, name: str, minimum: int | None = None) -> int:
    """Return ``x`` as a Python int, raising ``ValueError`` if it is not a static int >= minimum."""
    if isinstance(x, bool) or not isinstance(x, int | np.integer):
        raise ValueError(f"{name} must be a static Python int, got {type(x).__name__}")
    x = int(x)
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return x


def as_f32(x: Any) -> Array:
    """``jnp.asarray(x, float32)``: the dtype every continuous state leaf uses."""
    return jnp.asarray(x, jnp.float32)


# ---------------------------------------------------- masked reductions
def _mask_like(x: Array, mask: Array | None) -> Array:
    if mask is None:
        return jnp.ones(jnp.shape(x), bool)
    return jnp.broadcast_to(jnp.asarray(mask, bool), jnp.shape(x))


def masked_count(x: Array, mask: Array | None, axis=None, keepdims: bool = False) -> Array:
    """Number of entries where ``mask`` holds (float32)."""
    m = _mask_like(x, mask)
    return jnp.sum(m, axis=axis, keepdims=keepdims, dtype=jnp.float32)


def masked_sum(x: Array, mask: Array | None, axis=None, keepdims: bool = False) -> Array:
    """Sum over entries where ``mask`` holds; masked entries may be NaN/inf."""
    m = _mask_like(x, mask)
    return jnp.sum(jnp.where(m, x, 0), axis=axis, keepdims=keepdims)


def masked_mean(x: Array, mask: Array | None, axis=None, keepdims: bool = False) -> Array:
    """Mean over entries where ``mask`` holds; 0 where nothing is masked in (never NaN)."""
    n = masked_count(x, mask, axis=axis, keepdims=keepdims)
    s = masked_sum(x, mask, axis=axis, keepdims=keepdims)
    return jnp.where(n > 0, s / jnp.maximum(n, 1), 0.0)


def masked_std(
    x: Array, mask: Array | None, axis=None, keepdims: bool = False, ddof: int = 0
) -> Array:
    """Standard deviation over masked-in entries with ``ddof``; 0 when ``n - ddof <= 0``."""
    m = _mask_like(x, mask)
    n = masked_count(x, m, axis=axis, keepdims=True)
    mu = masked_mean(x, m, axis=axis, keepdims=True)
    sq = masked_sum(jnp.square(jnp.where(m, x, 0) - mu), m, axis=axis, keepdims=True)
    dof = n - ddof
    out = jnp.where(dof > 0, jnp.sqrt(sq / jnp.maximum(dof, 1)), 0.0)
    if not keepdims:
        out = jnp.squeeze(out, axis=axis) if axis is not None else jnp.reshape(out, ())
    return out


def masked_log_softmax(logits: Array, mask: Array | None, axis: int = -1) -> Array:
    """log-softmax over masked-in entries; masked entries get ``-inf``.

    A row with nothing masked in gives all ``-inf`` (its softmax is all zeros).
    Entries that are masked in but ``-inf`` stay ``-inf``; NaN inputs under the
    mask never leak into other entries.
    """
    m = _mask_like(logits, mask)
    z = jnp.where(m, logits, -jnp.inf)
    mx = jnp.max(z, axis=axis, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    e = jnp.where(m, jnp.exp(z - mx), 0.0)
    s = jnp.sum(e, axis=axis, keepdims=True)
    lse = jnp.log(jnp.where(s > 0, s, 1.0)) + mx
    return jnp.where(m & (s > 0), z - lse, -jnp.inf)


def masked_softmax(logits: Array, mask: Array | None, axis: int = -1) -> Array:
    """softmax over masked-in entries; masked entries and empty rows give 0 (never NaN)."""
    m = _mask_like(logits, mask)
    z = jnp.where(m, logits, -jnp.inf)
    mx = jnp.max(z, axis=axis, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    e = jnp.where(m, jnp.exp(z - mx), 0.0)
    s = jnp.sum(e, axis=axis, keepdims=True)
    return jnp.where(s > 0, e / jnp.where(s > 0, s, 1.0), 0.0)


# --------------------------------------------------------- file helpers
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, rename.

    A crash at any point leaves either the old file or the new one, never a mix.
    Parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            # mkstemp creates the file 0600; give it the permissions open() would (0666 less the umask)
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any, **dump_kwargs: Any) -> Path:
    """``json.dumps(obj)`` written with :func:`atomic_write_bytes`."""
    dump_kwargs.setdefault("indent", 2)
    return atomic_write_bytes(path, (json.dumps(obj, **dump_kwargs) + "\n").encode("utf-8"))
