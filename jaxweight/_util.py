"""Shared helpers: keys, shape checks, NaN-safe masked reductions, atomic file writes.

Every module of jaxweight uses these instead of its own copy. The checks run at
trace time (they look at static shapes only), so they cost nothing inside jit.
"""

from __future__ import annotations

import contextlib
import contextvars
import glob
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
    """``x`` as a float32 jax array: the dtype every continuous state leaf uses.

    Jax arrays and tracers go through ``jnp.asarray``; host data (NumPy, lists, numbers) is
    converted on the host and placed with ``jax.device_put``, so the NaN / inf entries of a bad
    batch reach the device without a conversion op that ``jax_debug_nans`` would report.
    """
    if isinstance(x, jax.Array):
        return jnp.asarray(x, jnp.float32)
    with np.errstate(over="ignore", invalid="ignore"):   # 1e39 -> inf, as jnp.asarray gives
        return jax.device_put(np.asarray(x, np.float32))


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


# --------------------------------------------------------- file helpers

def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove_stranded_temps(path: Path) -> None:
    """Delete the temp files that killed writers of ``path`` left beside it (``.name.<pid>.*.tmp``
    whose process is gone); a live process's, this one's included, are left alone."""
    for t in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = t.name[len(path.name) + 2:].split(".", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                t.unlink()
        except (OverflowError, OSError):  # alive (another user's gives EPERM) or a pid out of range: leave it
            pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, rename.

    A crash at any point leaves either the old file or the new one, never a mix.
    Parent folders are created. ``mode``: the file's permissions (e.g. ``0o600`` for a secret);
    None: what ``open()`` would give (0666 less the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stranded_temps(path)
    # the writer's pid in the name: a later write can tell a killed writer's file from a live one's
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            # mkstemp creates the file 0600; give it the permissions open() would (0666 less the umask)
            os.fchmod(f.fileno(), 0o666 & ~_umask() if mode is None else mode)
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


# ------------------------------------------------------------- validation
# One helper for every value check of the library. A check gives the same answer
# eagerly and under ``jax.jit``: where the value is concrete (config/init time, Python
# numbers captured as constants) it raises ``ValueError`` at once; where it is traced
# it becomes a ``checkify`` check, reported as a ``ValueError`` with the same message
# by :func:`checked` (or any ``jax.experimental.checkify.checkify`` around the call).
# Under a bare ``jax.jit`` a traced check costs nothing and is not reported; values
# built from Python numbers are never traced, so that case needs a user who sweeps a
# hyperparameter as a jit argument.


_TRACED_CHECKS = contextvars.ContextVar("jaxweight_traced_checks", default=True)


@contextlib.contextmanager
def without_traced_checks():
    """Trace without emitting the ``checkify`` checks of traced values (for a program that is
    never run under ``checkify``, e.g. one serialized with ``jax.export``, which cannot hold them)."""
    token = _TRACED_CHECKS.set(False)
    try:
        yield
    finally:
        _TRACED_CHECKS.reset(token)


class StateFileError(ValueError):
    """A state or checkpoint file is malformed: missing key, wrong type, binary,
    truncated, corrupted or written by something else. The message names the file."""


def is_concrete(x: Any) -> bool:
    """True when ``x`` (and every leaf of it) has a value known now (not a tracer)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def concrete(x: Any) -> np.ndarray | None:
    """``x`` as a NumPy array when its value is known now, else ``None``."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        if is_key(x):
            return None
        return np.asarray(x)
    except Exception:  # noqa: BLE001 - anything not convertible is treated as traced
        return None


def array_module(*values: Any) -> Any:
    """``numpy`` when every value is known now, else ``jax.numpy``.

    A check that derives its condition from several settings (``where(max > 0, max, inf)``)
    computes it with this module, so concrete settings are checked eagerly even inside a
    trace (jnp ops there would stage a traced check, which costs dispatch time per call).
    """
    return np if all(concrete(v) is not None for v in values if v is not None) else jnp


def _fmt(v: Any) -> str:
    a = concrete(v)
    if a is None:
        return repr(v)
    if a.ndim == 0:
        return repr(a.item())
    return np.array2string(a, threshold=8, separator=", ")


def _range_text(ge, gt, le, lt) -> str:
    lo_b = ge if ge is not None else gt
    hi_b = le if le is not None else lt
    if lo_b is not None and hi_b is not None:
        return f"in {'[' if ge is not None else '('}{lo_b}, {hi_b}{']' if le is not None else ')'}"
    if lo_b is not None:
        return f"{'>=' if ge is not None else '>'} {lo_b}"
    return f"{'<=' if le is not None else '<'} {hi_b}"


def check_value(
    value: Any,
    name: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    finite: bool = True,
    integer: bool = False,
    static: bool = False,
) -> Any:
    """Check every entry of a hyperparameter; return ``value`` unchanged.

    Concrete values raise ``ValueError("NAME must be ... in [lo, hi], got VALUE")``
    at once; traced values become a ``checkify`` check with the same message (see
    :func:`checked`). NaN always fails a range (and ``finite=True`` refuses inf).

    Args:
      value: scalar or array (Python number, NumPy or jax array, tracer).
      name: the argument name used in the message.
      ge, gt, le, lt: bounds (``>=``, ``>``, ``<=``, ``<``); None for none.
      finite: refuse NaN and +-inf.
      integer: refuse non-integer values (``2.5``; integer dtypes pass).
      static: the value is a host setting (it sets a size, is stored on a Python
        object or goes through ``float()``): a traced value is refused at once
        with ``ValueError("NAME must be static (...) and <range>, got a traced f32[]")``
        instead of failing later with a JAX concretization error.

    Raises:
      ValueError: for a bad concrete value, or any traced one with ``static=True``.
    """
    parts = []
    if integer:
        parts.append("an integer")
    if finite:
        parts.append("finite")
    rng = _range_text(ge, gt, le, lt) if any(b is not None for b in (ge, gt, le, lt)) else ""
    want = " and ".join(parts + ([rng] if rng else [])) or "a number"

    def ok(x, xp):
        good = ~xp.isnan(x)
        if finite:
            good = good & xp.isfinite(x)
        if ge is not None:
            good = good & (x >= ge)
        if gt is not None:
            good = good & (x > gt)
        if le is not None:
            good = good & (x <= le)
        if lt is not None:
            good = good & (x < lt)
        if integer:
            good = good & (xp.floor(x) == x)
        return good

    c = concrete(value)
    if c is None and static:
        aval = getattr(value, "aval", None)
        what = aval.str_short() if aval is not None else type(value).__name__
        raise ValueError(f"{name} must be static (a concrete number, not traced under jax.jit) and {want}, "
                         f"got a traced {what}")
    if c is not None:
        if c.dtype == object or c.dtype.kind not in "biuf":
            raise ValueError(f"{name} must be a number, got {value!r}")
        if c.dtype.kind == "b":
            raise ValueError(f"{name} must be a number, got bool {value!r}")
        if not np.all(ok(c.astype(np.float64), np)):
            raise ValueError(f"{name} must be {want}, got {_fmt(value)}")
        return value
    x = jnp.asarray(value)
    if not _TRACED_CHECKS.get():
        return value
    from jax.experimental import checkify

    checkify.check(
        jnp.all(ok(x.astype(jnp.float32), jnp)), f"{name} must be {want}, got {{v}}", v=x, debug=True
    )
    return value


def check_order(lo: Any, hi: Any, name_lo: str, name_hi: str, *, strict: bool = False) -> None:
    """Refuse ``lo > hi`` (``lo >= hi`` with ``strict``), eagerly or through checkify."""
    rel = "<" if strict else "<="
    msg = f"{name_lo} must be {rel} {name_hi}"
    a, b = concrete(lo), concrete(hi)
    if a is not None and b is not None:
        bad = ~(a < b) if strict else ~(a <= b)
        if np.any(bad):
            raise ValueError(f"{msg}, got {name_lo}={_fmt(lo)} and {name_hi}={_fmt(hi)}")
        return
    if not _TRACED_CHECKS.get():
        return
    from jax.experimental import checkify

    la, hb = jnp.asarray(lo, jnp.float32), jnp.asarray(hi, jnp.float32)
    good = (la < hb) if strict else (la <= hb)
    checkify.check(jnp.all(good), f"{msg}, got {name_lo}={{a}} and {name_hi}={{b}}", a=la, b=hb, debug=True)


def check_choice(value: Any, name: str, choices: Sequence[Any]) -> Any:
    """Refuse a static setting (a name, a mode) outside ``choices``."""
    if value not in tuple(choices):
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def checked(fn):
    """Wrap ``fn`` so that its traced value checks raise like the eager ones.

    ``checked(jax.jit(f))(*args)`` runs ``f`` under ``jax.experimental.checkify``
    and raises ``ValueError`` (checkify's ``JaxRuntimeError``) with the same
    message an eager call gives for the same bad value, e.g. a temperature
    swept as a jit argument. Values that are concrete raise before that, as usual.

    Example::

        import jax
        import jax.numpy as jnp
        import jaxweight
        from jaxweight import maxent

        f = jaxweight.checked(jax.jit(maxent.weight_matrix))
        q, ref = jnp.full((2, 4), 0.25), jnp.zeros((2, 4))
        w = f(q, ref, tau=jnp.float32(0.5), beta=jnp.float32(0.04))   # a traced setting
        try:
            f(q, ref, tau=jnp.float32(float("nan")), beta=jnp.float32(0.04))
        except ValueError as e:                                      # same message as eager
            assert "tau" in str(e)
        else:
            raise AssertionError("a NaN tau passed")
    """
    import functools

    from jax.experimental import checkify

    cf = checkify.checkify(fn, errors=checkify.user_checks)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        err, out = cf(*args, **kwargs)
        err.throw()
        return out

    return wrapper


# ------------------------------------------------------------ bad data
def finite_mask(x: Array, mask: Array | None = None) -> Array:
    """``mask & isfinite(x)`` (``mask`` broadcast to ``x``); the valid entries of a batch."""
    return _mask_like(x, mask) & jnp.isfinite(x)


def count_invalid(x: Array, mask: Array | None = None) -> Array:
    """``i32[]`` number of masked-in entries of ``x`` that are NaN or +-inf."""
    m = _mask_like(x, mask)
    return jnp.sum(m & ~jnp.isfinite(x), dtype=jnp.int32)


__all__ += [
    "StateFileError",
    "is_concrete",
    "concrete",
    "array_module",
    "check_value",
    "check_order",
    "check_choice",
    "checked",
    "finite_mask",
    "count_invalid",
]


def progress_bar(total: int, desc: str, **kwargs: Any) -> Any:
    """A tqdm bar (host side): the one place a library module gets a progress bar from.

    Library code shows one only when the caller asked for it (``progress=True``);
    the CLI and the demos turn it on.
    """
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, **kwargs)


__all__ += ["progress_bar"]


def varying(tree: Any, axis_name: str | None) -> Any:
    """Mark replicated values as per-device inside ``shard_map`` (identity when ``axis_name`` is None).

    Under ``shard_map`` the gradient with respect to a replicated (device-invariant)
    input is implicitly summed over the axis; differentiating with respect to a
    per-device copy keeps the gradient local, so the explicit reduction that follows
    is the only one.
    """
    if axis_name is None:
        return tree

    def one(x):
        try:
            return jax.lax.pcast(x, (axis_name,), to="varying")
        except ValueError:  # already per-device
            return x

    return jax.tree.map(one, tree)


__all__ += ["varying"]


def all_concrete(*values: Any) -> bool:
    """True when every value is a number or array known now: a config class's constructor
    checks then, and skips tracers and the placeholders jax passes when unflattening."""
    return all(isinstance(v, jax.Array | np.ndarray | np.generic | int | float) and concrete(v) is not None
               for v in values)


__all__ += ["all_concrete"]
