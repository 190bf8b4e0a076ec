"""The preference buffer: a fixed-capacity FIFO ring of fragment pairs and preferences (imitation ``PreferenceDataset``).

A pytree of ``[capacity, ...]`` arrays written as a ring, so a push is
jittable and the buffer lives inside a compiled loop and saves with
:mod:`jaxweight.checkpoint` (never pickle). Preferences are stored float32.

Example::

    import jax, numpy as np
    from jaxweight.preference import buffer, fragment_pairs_from_arrays
    pairs = fragment_pairs_from_arrays(np.zeros((3, 2, 5, 4)), np.zeros((3, 2, 4), np.int32))
    cfg = buffer.config(capacity=8)
    state = buffer.init(cfg, None, pairs)                 # only shapes / dtypes of pairs are used
    push = jax.jit(buffer.step, donate_argnums=0)
    state = push(state, pairs, np.ones(3, np.float32), cfg, count=2)   # the first 2 pairs (count may be traced)
    assert buffer.metrics_dict(state, cfg)["buffer/size"] == 2.0
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import check_static_int, check_value
from .data import FragmentPairs, check_preferences, preference_ok

Array = jax.Array

__all__ = ["BufferConfig", "PreferenceBuffer", "config", "init", "step", "mask", "ordered", "metrics_dict"]


@struct.dataclass
class BufferConfig:
    """Settings of the buffer (static: the capacity fixes the shapes).

    Attributes:
      capacity: number of pairs kept (>= 1); the oldest are evicted first.
    """

    capacity: int = struct.field(pytree_node=False, default=1000)

    def __post_init__(self):
        check_static_int(self.capacity, "capacity", 1)


def config(capacity: int) -> BufferConfig:
    """Validate and build a :class:`BufferConfig`.

    Raises:
      ValueError: ``capacity`` is not a static int >= 1.
    """
    return BufferConfig(capacity=check_static_int(capacity, "capacity", 1))


@struct.dataclass
class PreferenceBuffer:
    """Ring buffer state.

    Attributes:
      pairs: ``FragmentPairs`` with leading axis ``capacity`` (slot ``i`` holds one pair).
      prefs: ``f32[capacity]`` probability that fragment 1 is preferred.
      size: ``i32[]`` number of filled slots (``<= capacity``); slots ``[0, size)`` are filled.
      next: ``i32[]`` slot the next pair is written to (the oldest pair once full).
    """

    pairs: FragmentPairs
    prefs: Array
    size: Array
    next: Array

    @property
    def capacity(self) -> int:
        return int(self.prefs.shape[0])


def init(cfg: BufferConfig, key: Any = None, example_pairs: FragmentPairs | None = None) -> PreferenceBuffer:
    """An empty buffer of ``cfg.capacity`` pairs shaped like ``example_pairs`` (only shapes/dtypes are used).

    ``key`` is unused (the buffer draws nothing); it keeps the component shape.

    Raises:
      ValueError: ``cfg`` is not a :class:`BufferConfig`; ``example_pairs`` is not ``FragmentPairs``.
    """
    if not isinstance(cfg, BufferConfig):
        raise ValueError(f"cfg must be a BufferConfig (buffer.config(capacity)), got {type(cfg).__name__}")
    capacity = cfg.capacity
    if not isinstance(example_pairs, FragmentPairs):
        raise ValueError(f"example_pairs must be FragmentPairs, got {type(example_pairs).__name__}")
    example_pairs.check()

    def empty(x):
        x = jnp.asarray(x)
        return jnp.zeros((capacity, *x.shape[1:]), x.dtype)

    return PreferenceBuffer(
        pairs=jax.tree.map(empty, example_pairs),
        prefs=jnp.zeros((capacity,), jnp.float32),
        size=jnp.zeros((), jnp.int32),
        next=jnp.zeros((), jnp.int32),
    )


def step(buf: PreferenceBuffer, pairs: FragmentPairs, prefs: Array, cfg: BufferConfig, *,
         count: Any = None) -> PreferenceBuffer:
    """Append the first ``count`` of ``P`` pairs in order, evicting the oldest when full (jittable).

    ``count > capacity`` keeps the newest ``capacity`` of them.
    ``size = min(size + count, capacity)``. The pairs' ``valid`` flags are
    stored and later used as a training mask. Concrete preferences must lie in
    ``[0, 1]``; traced ones (under ``jax.jit``) are stored as given, and a pair
    whose preference is NaN or outside ``[0, 1]`` is left out by :func:`mask`
    (so by training, which counts it as ``n_invalid``, and by ``buffer/valid``).
    Pairs with non-finite or out-of-range inputs are left out by training likewise.

    Args:
      buf: the buffer.
      pairs: ``P`` pairs with the per-pair shapes / dtypes of the buffer.
      prefs: ``f32[P]`` preferences.
      cfg: the buffer's config.
      count: how many of the pairs to write, ``None`` (all ``P``) or an int /
        ``i32[]`` in ``[0, P]``; may be traced (one compiled push for every count).

    Raises:
      ValueError: "Unexpected preferences shape {s}, expected ({P},)";
        "preferences should have dtype float32" (imitation's messages); concrete
        preferences that are NaN or outside ``[0, 1]`` (among the first ``count``);
        pairs whose shapes or dtypes differ from the buffer's; a concrete ``count``
        outside ``[0, P]`` (a traced one is clipped to it).
    """
    if buf.capacity != cfg.capacity:
        raise ValueError(f"the buffer holds {buf.capacity} pairs but cfg.capacity is {cfg.capacity}")
    p = pairs.num_pairs if isinstance(pairs, FragmentPairs) else None
    if p is None:
        raise ValueError(f"pairs must be FragmentPairs, got {type(pairs).__name__}")
    pairs.check()
    if tuple(np.shape(prefs)) != (p,):
        raise ValueError(f"Unexpected preferences shape {tuple(np.shape(prefs))}, expected {(p,)}")
    if np.dtype(getattr(prefs, "dtype", None) or np.asarray(prefs).dtype) != np.float32:
        raise ValueError("preferences should have dtype float32")
    for path, a, b in zip(
        jax.tree_util.tree_flatten_with_path(buf.pairs)[0], jax.tree.leaves(buf.pairs), jax.tree.leaves(pairs)
    ):
        name = "pairs" + jax.tree_util.keystr(path[0])
        b_dtype = np.dtype(getattr(b, "dtype", None) or np.asarray(b).dtype)
        if tuple(jnp.shape(b))[1:] != tuple(a.shape[1:]) or b_dtype != a.dtype:
            raise ValueError(
                f"{name} must have per-pair shape {tuple(a.shape[1:])} and dtype {a.dtype} like the buffer, "
                f"got shape {tuple(jnp.shape(b))[1:]} and dtype {b_dtype}"
            )
    if count is None:
        count = p
    else:
        check_value(count, "count", ge=0, le=p, integer=True)
    check_preferences(prefs, "prefs", count)
    if p == 0:
        return buf
    return _push(buf, pairs, jnp.asarray(prefs, jnp.float32), jnp.asarray(count, jnp.int32))


def _push(buf: PreferenceBuffer, pairs: FragmentPairs, prefs: Array, count: Array) -> PreferenceBuffer:
    cap, p = buf.capacity, pairs.num_pairs
    count = jnp.clip(count, 0, p)
    i = jnp.arange(p, dtype=jnp.int32)
    # only the newest `cap` of the first `count` pairs survive; dropping the rest keeps scatter indices unique
    keep = (i < count) & (i >= count - cap)
    slots = jnp.where(keep, (buf.next + i) % cap, cap)  # `cap` is out of range: dropped

    def write(store, x):
        return store.at[slots].set(jnp.asarray(x, store.dtype), mode="drop")

    return PreferenceBuffer(
        pairs=jax.tree.map(write, buf.pairs, pairs),
        prefs=write(buf.prefs, prefs),
        size=jnp.minimum(buf.size + count, cap).astype(jnp.int32),
        next=((buf.next + count) % cap).astype(jnp.int32),
    )


def mask(buf: PreferenceBuffer) -> Array:
    """``bool[capacity]``: filled slots whose pair is valid and whose preference is in [0, 1]."""
    return (jnp.arange(buf.capacity) < buf.size) & buf.pairs.valid & preference_ok(buf.prefs)


def ordered(buf: PreferenceBuffer) -> tuple[FragmentPairs, Array, Array]:
    """The contents oldest first: ``(pairs [capacity, ...], prefs f32[capacity], filled bool[capacity])``.

    Jittable (a roll by the traced ring offset); filled entries come first.
    """
    cap = buf.capacity
    # once full, the oldest pair sits at `next`; before that at slot 0
    shift = jnp.where(buf.size == cap, buf.next, 0)
    roll = lambda x: jnp.roll(x, -shift, axis=0)  # noqa: E731
    filled = jnp.arange(cap) < buf.size
    return jax.tree.map(roll, buf.pairs), roll(buf.prefs), filled


def metrics_dict(buf: PreferenceBuffer, cfg: BufferConfig | None = None) -> dict[str, float]:
    """``{"buffer/size", "buffer/valid", "buffer/capacity"}`` as floats (host side; averaged over a seed axis).

    ``buffer/valid`` counts the filled slots :func:`mask` keeps (valid pair, preference in [0, 1]).
    """
    size, flags, prefs = jax.device_get((buf.size, buf.pairs.valid, buf.prefs))
    size, prefs = np.asarray(size), np.asarray(prefs, np.float32)
    flags = np.asarray(flags, bool) & np.isfinite(prefs) & (prefs >= 0.0) & (prefs <= 1.0)
    filled = np.arange(flags.shape[-1]) < size[..., None]
    return {"buffer/size": float(np.mean(size)), "buffer/valid": float(np.mean(np.sum(filled & flags, axis=-1))),
            "buffer/capacity": float(flags.shape[-1])}
