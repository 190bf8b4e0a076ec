"""A fixed-capacity FIFO ring buffer of fragment pairs and preferences (imitation ``PreferenceDataset``).

imitation keeps Python lists and slices off the oldest entries when
``max_size`` is exceeded; here the buffer is a pytree of ``[capacity, ...]``
arrays written as a ring, so pushing is jittable, the buffer can live inside a
compiled training loop and it saves / loads with :mod:`jaxweight.checkpoint`
(never pickle). Preferences are stored as float32 (imitation concatenates
them into a float64 array).

Example::

    buf = buffer_init(1000, example_pairs)          # example_pairs: any FragmentPairs of the right shapes
    buf = buffer_push(buf, pairs, prefs)            # prefs: f32[P]
    buf = buffer_push(buf, pairs, prefs, count=n)   # only the first n pairs (n may be traced)
    buffer_size(buf)                                # i32[]: min(total pushed, 1000)
    checkpoint.save("prefs.ckpt", buf); buf = checkpoint.load("prefs.ckpt", buffer_init(1000, example_pairs))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import check_static_int, check_value
from .data import FragmentPairs

Array = jax.Array

__all__ = ["PreferenceBuffer", "buffer_init", "buffer_push", "buffer_size", "buffer_mask", "buffer_ordered"]


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


def buffer_init(capacity: int, example_pairs: FragmentPairs) -> PreferenceBuffer:
    """An empty buffer for ``capacity`` pairs shaped like ``example_pairs`` (only shapes/dtypes are used).

    Raises:
      ValueError: ``capacity`` is not a static int >= 1.
    """
    capacity = check_static_int(capacity, "capacity", 1)
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


def buffer_push(buf: PreferenceBuffer, pairs: FragmentPairs, prefs: Array, count: Any = None) -> PreferenceBuffer:
    """Append the first ``count`` of ``P`` pairs in order, evicting the oldest when full (jittable).

    ``count > capacity`` keeps the newest ``capacity`` of them.
    ``size = min(size + count, capacity)``. The pairs' ``valid`` flags are
    stored and later used as a training mask. Pairs are stored as given: the
    reward trainer leaves out (and counts as ``n_invalid``) stored pairs with
    non-finite inputs or preferences outside ``[0, 1]``.

    Args:
      buf: the buffer.
      pairs: ``P`` pairs with the per-pair shapes / dtypes of the buffer.
      prefs: ``f32[P]`` preferences.
      count: how many of the pairs to write, ``None`` (all ``P``) or an int /
        ``i32[]`` in ``[0, P]``; may be traced (one compiled push for every count).

    Raises:
      ValueError: "Unexpected preferences shape {s}, expected ({P},)";
        "preferences should have dtype float32" (imitation's messages); pairs
        whose shapes or dtypes differ from the buffer's; a concrete ``count``
        outside ``[0, P]`` (a traced one is clipped to it).
    """
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
    if p == 0:
        return buf
    return _push(buf, pairs, jnp.asarray(prefs, jnp.float32), jnp.asarray(count, jnp.int32))


@jax.jit
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


def buffer_size(buf: PreferenceBuffer) -> Array:
    """``i32[]``: number of stored pairs."""
    return buf.size


def buffer_mask(buf: PreferenceBuffer) -> Array:
    """``bool[capacity]``: filled slots whose pair is valid (the items training uses)."""
    return (jnp.arange(buf.capacity) < buf.size) & buf.pairs.valid


def buffer_ordered(buf: PreferenceBuffer) -> tuple[FragmentPairs, Array, Array]:
    """The contents oldest first: ``(pairs [capacity, ...], prefs f32[capacity], filled bool[capacity])``.

    Jittable (a roll by the traced ring offset); filled entries come first.
    """
    cap = buf.capacity
    # once full, the oldest pair sits at `next`; before that at slot 0
    shift = jnp.where(buf.size == cap, buf.next, 0)
    roll = lambda x: jnp.roll(x, -shift, axis=0)  # noqa: E731
    filled = jnp.arange(cap) < buf.size
    return jax.tree.map(roll, buf.pairs), roll(buf.prefs), filled
