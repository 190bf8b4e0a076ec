"""Placement and transfer of :mod:`jaxweight.sync`: where the actor lives and how weights get there.

A placement is None (same device), a ``jax.Device``, a ``jax.sharding.Sharding``
(e.g. a ``NamedSharding`` over an actor mesh) or a pytree of Shardings. A
fired sync moves the whole tree with one ``jax.device_put`` (small trees on one
device as one packed buffer per dtype); the old actor buffers can be freed
first (donation), as torchrl's in-place ``param.data.copy_`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .paths import (
    _check_same_tree,
    _checked_entries,
    _comps_str,
    _replace,
    parse_path,
    resolve_path,
)

Placement = Any  # jax.Device | jax.sharding.Sharding | pytree of Shardings

__all__ = ["place", "Placement"]


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)

def _is_placement_leaf(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding | jax.Device)


def _check_placement(placement: Placement) -> None:
    if placement is None or _is_placement_leaf(placement):
        return
    leaves = jax.tree_util.tree_leaves(placement, is_leaf=_is_placement_leaf)
    if not leaves or not all(_is_placement_leaf(x) for x in leaves):
        raise ValueError(
            "placement must be None, a jax.Device, a jax.sharding.Sharding or a pytree of "
            f"Shardings matching the actor tree, got {type(placement).__name__}"
        )


def _placement_for(placement: Placement, comps: tuple, dest: str) -> Placement:
    """The part of ``placement`` that applies to the actor subtree at ``comps``."""
    if placement is None or _is_placement_leaf(placement):
        return placement
    try:
        return resolve_path(placement, _comps_str(comps))
    except KeyError:
        raise ValueError(
            f"placement must be a pytree of Shardings matching the actor tree; it has no "
            f"entry for update_map destination {dest!r}"
        ) from None


def _as_sharding(p: Any) -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(p) if isinstance(p, jax.Device) else p


def _already_placed(tree: Any, placement: Placement) -> bool:
    """True when every leaf of ``tree`` is a committed jax.Array already laid out as ``placement``."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves or not all(isinstance(x, jax.Array) and not _is_tracer(x) for x in leaves):
        return False
    if _is_placement_leaf(placement):
        s = _as_sharding(placement)
        return all(x.sharding.is_equivalent_to(s, x.ndim) for x in leaves)
    try:
        same = jax.tree.map(lambda x, p: x.sharding.is_equivalent_to(_as_sharding(p), x.ndim),
                            tree, placement)
    except (ValueError, TypeError, AttributeError):
        return False
    return all(jax.tree_util.tree_leaves(same))


# Small trees move as one buffer per dtype: on CPU and GPU every transferred array
# costs a fixed overhead (tens of microseconds), which dominates for small nets;
# packing costs one extra copy, which dominates for big trees.
_BUCKET_MAX_BYTES = 4 << 20


@functools.lru_cache(maxsize=128)
def _bucket_fns(sig: tuple[tuple[tuple[int, ...], str], ...]):
    """Jitted (pack, unpack) for leaves with shapes/dtypes ``sig``: one flat buffer per dtype."""
    groups: dict[str, list[int]] = {}
    for i, (_, dt) in enumerate(sig):
        groups.setdefault(dt, []).append(i)
    order = tuple(tuple(ix) for ix in groups.values())

    def pack(leaves):
        return tuple(jnp.concatenate([jnp.ravel(leaves[i]) for i in ix]) for ix in order)

    def unpack(flats):
        out = [None] * len(sig)
        for ix, flat in zip(order, flats):
            start = 0
            for i in ix:
                shape = sig[i][0]
                n = int(np.prod(shape, dtype=np.int64))
                out[i] = jax.lax.slice_in_dim(flat, start, start + n).reshape(shape)
                start += n
        return out

    return jax.jit(pack), jax.jit(unpack)


def _bucketable(leaves: list, placement: Placement) -> jax.Device | None:
    """The destination device if ``leaves`` should move as packed buffers, else None."""
    if isinstance(placement, jax.sharding.SingleDeviceSharding):
        placement = next(iter(placement.device_set))
    if not isinstance(placement, jax.Device) or len(leaves) < 2:
        return None
    nbytes = 0
    for x in leaves:  # the size first: it rules out big trees at little cost
        if not isinstance(x, jax.Array) or _is_tracer(x):
            return None
        nbytes += x.nbytes
        if nbytes > _BUCKET_MAX_BYTES:
            return None
    src = None
    for x in leaves:
        if _is_key(x):
            return None
        devs = x.sharding.device_set
        if len(devs) != 1:
            return None
        d = next(iter(devs))
        if src is None:
            src = d
        elif d != src:
            return None
    return placement if src != placement else None


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _transfer(tree: Any, placement: Placement) -> Any:
    """Move the whole tree with one ``jax.device_put``; a fresh copy when ``placement`` is None."""
    if placement is None:
        return jax.device_put(tree, may_alias=False)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    dst = _bucketable(leaves, placement)
    if dst is None:
        return jax.device_put(tree, placement)
    pack, unpack = _bucket_fns(tuple((tuple(x.shape), str(x.dtype)) for x in leaves))
    moved = jax.device_put(pack(leaves), dst)
    return jax.tree_util.tree_unflatten(treedef, unpack(moved))


def place(tree: Any, placement: Placement = None, *, copy: bool = False) -> Any:
    """Put ``tree`` where the actor lives: the initial actor params are ``place(learner_params, placement)``.

    ``placement`` None returns ``tree`` itself (same-device mode: the actor
    reads the learner's arrays), and so does a placement equal to where the
    leaves already are. Otherwise one ``jax.device_put`` of the whole tree
    (small trees on one device travel as one packed buffer per dtype).

    Args:
      tree: the learner params.
      placement: None, a Device, a Sharding or a pytree of Shardings.
      copy: always return fresh buffers (for ``copy_on_same_device`` actors, or
        an actor that a jitted :func:`~jaxweight.sync.step` may donate).

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import sync

        actor = sync.place({"w": jnp.ones(3)}, jax.devices()[-1])   # one device_put of the whole tree
        assert actor["w"].devices() == {jax.devices()[-1]}
    """
    _check_placement(placement)
    if copy:
        return jax.device_put(tree, placement, may_alias=False)
    return tree if placement is None else _transfer(tree, placement)


def _pull_sources(actor: Any, learner: Any, update_map, placement: Placement,
                  transport: Callable[[Any, Any], Any], *, free_old: bool = False) -> Any:
    """The new actor tree: learner (or its mapped subtrees) moved by ``transport`` in one call.

    With ``free_old`` the actor buffers about to be replaced are deleted *before*
    the transfer (those that the learner or the rest of the actor still use are
    kept), so the actor's devices never hold the old and the new copy at once:
    the donation of torchrl's in-place ``param.data.copy_``.
    """
    if update_map is None:
        _check_same_tree(learner, actor, "learner_params", "actor_params")
        if free_old:
            _donate_old(actor, (learner,))
        return transport(learner, placement)
    entries = _checked_entries(actor, learner, update_map)
    if free_old:
        rest = actor
        for d, _, dc, _ in entries:
            rest = _replace(rest, dc, None, d)
        _donate_old([resolve_path(actor, d) for d, *_ in entries], (rest, learner))
    srcs = tuple(src for *_, src in entries)
    if placement is None or _is_placement_leaf(placement):
        moved = transport(srcs, placement)
    else:
        moved = transport(srcs, tuple(_placement_for(placement, dc, d) for d, _, dc, _ in entries))
    out = actor
    for (d, _, dc, _), m in zip(entries, moved):
        out = _replace(out, dc, m, d)
    return out


def _buffer_ids(x: Any) -> set[int]:
    try:
        if len(x.sharding.device_set) == 1:
            # ``addressable_shards`` builds index maps: ~10 us per array, too slow for every leaf
            return {x.unsafe_buffer_pointer()}
        return {s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
    except Exception:  # noqa: BLE001 - deleted or exotic arrays: treat as unknown
        return set()


def _donate_old(old_actor: Any, keep: Iterable[Any]) -> int:
    """Delete the buffers of ``old_actor`` leaves that nothing in ``keep`` still uses.

    Returns the number of leaves deleted. Leaves shared (same object or same
    device buffer) with a tree in ``keep`` are left alone.
    """
    kept_ids: set[int] = set()
    kept_objs: set[int] = set()
    for t in keep:
        for x in jax.tree_util.tree_leaves(t):
            if isinstance(x, jax.Array) and not _is_tracer(x):
                kept_objs.add(id(x))
                kept_ids |= _buffer_ids(x)
    n = 0
    for x in jax.tree_util.tree_leaves(old_actor):
        if not isinstance(x, jax.Array) or _is_tracer(x) or id(x) in kept_objs or x.is_deleted():
            continue
        ids = _buffer_ids(x)
        if not ids or ids & kept_ids:
            continue
        x.delete()
        n += 1
    return n


def _same_device_mode(learner: Any, update_map, placement: Placement, copy_on_same_device: bool,
                      traced: bool) -> bool:
    """Same-device mode: no copy needed because the learner leaves already sit where the actor wants them."""
    if copy_on_same_device:
        return False
    if placement is None:
        return True
    if traced:
        return False
    if update_map is None:
        return _already_placed(learner, placement)
    try:
        return all(
            _already_placed(resolve_path(learner, s), _placement_for(placement, parse_path(d), d))
            for d, s in update_map
        )
    except (KeyError, ValueError):
        return False  # the copy path reports the bad path or placement



def _shares_buffers(a: Any, b: Any) -> bool:
    """Whether any device buffer of a leaf of ``a`` is also one of ``b``'s."""
    ids: set[int] = set()
    for x in jax.tree_util.tree_leaves(b):
        if isinstance(x, jax.Array) and not _is_tracer(x):
            ids |= _buffer_ids(x)
    return any(isinstance(x, jax.Array) and _buffer_ids(x) & ids for x in jax.tree_util.tree_leaves(a))

