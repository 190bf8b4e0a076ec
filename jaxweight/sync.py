"""Learner -> actor weight sync (torchrl ``UpdateWeights``) as a pure, jittable tick.

The data collector (the *actor*) acts with a copy of the policy that may live on
other devices; every ``interval`` collected batches the learner's current weights
are pushed to that copy. :func:`tick` is the functional core (jittable,
vmappable over several :class:`SyncState`), :class:`WeightSync` the host hook
for Python training loops.

Two modes:

* **Same device** (``placement`` is ``None``, or outside jit equals where the
  learner leaves already are, and ``copy_on_same_device=False``): the actor
  reads the learner params directly. The returned actor params *are* the
  learner params on every tick, fired or not; nothing is copied (torchrl: the
  collector shares the trainer's module). The counters still advance.
* **Copy** (a ``placement`` elsewhere, or ``copy_on_same_device=True``): on a
  fire the whole tree (parameters *and* buffers such as batch statistics) is
  transferred with one ``jax.device_put``; between fires the actor keeps its
  stale copy.

Example::

    from jaxweight import sync

    state = sync.init_sync()
    actor = jax.device_put(learner, actor_device)          # initial actor
    for step in range(num_steps):
        learner = train_step(learner, batch)
        state, actor, fired = sync.tick(state, learner, actor, interval=4,
                                        placement=actor_device)

    # or, in a Python loop, the host hook:
    hook = sync.WeightSync(4, placement=actor_device)
    actor = hook(learner, actor)        # once per collected batch
    hook.state_dict()                   # {"counter": .., "version": .., "last_sync": ..}

References:
  torchrl, ``torchrl/trainers/trainers.py``, class ``UpdateWeights``
  (https://github.com/pytorch/rl).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

Array = jax.Array
Placement = Any  # jax.Device | jax.sharding.Sharding | pytree of Shardings
UpdateMap = Mapping[str, str] | Iterable[tuple[str, str]]

__all__ = [
    "DEFAULT_INTERVAL",
    "SyncState",
    "init_sync",
    "tick",
    "make_tick",
    "place",
    "staleness",
    "resolve_path",
    "apply_update_map",
    "parse_path",
    "freeze_update_map",
    "WeightSync",
]


# torchrl's ``make_trainer`` registers ``UpdateWeights(collector, 1)``: sync after every batch.
DEFAULT_INTERVAL = 1

# ===================================================================== state
@struct.dataclass
class SyncState:
    """Counters of a weight sync.

    Attributes:
      counter: i32[] ticks so far (collected batches).
      version: i32[] number of syncs that fired.
      last_sync: i32[] ``counter`` at the last fire (0 if none).
    """

    counter: Array
    version: Array
    last_sync: Array

    @property
    def staleness(self) -> Array:
        """i32[] ticks since the actor's weights were last synced (``counter - last_sync``)."""
        return self.counter - self.last_sync


def init_sync() -> SyncState:
    """A fresh :class:`SyncState` with all counters at 0 (int32 scalars)."""
    z = lambda: jnp.zeros((), jnp.int32)  # noqa: E731
    return SyncState(counter=z(), version=z(), last_sync=z())


def staleness(state: SyncState) -> Array:
    """i32[...] ``state.counter - state.last_sync``: ticks since the actor was last synced."""
    return state.counter - state.last_sync


def _check_interval(interval: Any) -> int:
    if isinstance(interval, bool) or not isinstance(interval, int | np.integer):
        raise ValueError(f"interval must be a static Python int >= 1, got {type(interval).__name__}")
    interval = int(interval)
    if interval < 1:
        raise ValueError(f"interval must be >= 1, got {interval}")
    return interval


def _advance_impl(state: SyncState, interval: int) -> tuple[SyncState, Array]:
    counter = state.counter + 1
    fired = counter % interval == 0
    new = SyncState(
        counter=counter,
        version=jnp.where(fired, state.version + 1, state.version),
        last_sync=jnp.where(fired, counter, state.last_sync),
    )
    return new, fired


# One dispatch per eager tick instead of a handful of op-by-op calls.
_advance_jit = jax.jit(_advance_impl, static_argnums=1)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _check_state(state: Any) -> None:
    if not isinstance(state, SyncState):
        raise ValueError(f"state must be a SyncState (from init_sync()), got {type(state).__name__}")
    for name in ("counter", "version", "last_sync"):
        v = getattr(state, name)
        if np.ndim(v) != 0:
            raise ValueError(
                f"state.{name} must be a scalar i32[], got shape {np.shape(v)}; "
                "use jax.vmap(tick, ...) for a batch of SyncStates"
            )


# ================================================================ path maps
_NAME = re.compile(r"[^.\[\]\s]+")
_INDEX = re.compile(r"\[(\d+)\]")


@functools.lru_cache(maxsize=1024)
def parse_path(path: str) -> tuple[str | int, ...]:
    """Split a path ``name(.name | [int])*`` into its components.

    ``""`` is the whole tree (no components). A leading ``[i]`` is also
    accepted, for trees whose root is a list or tuple.

    Args:
      path: e.g. ``"params.actor"``, ``"policy.layers[0].kernel"``.

    Returns:
      A tuple of names (str) and indices (int).

    Raises:
      ValueError: bad syntax (empty component, unclosed or non-integer index).

    Example::

        parse_path("policy.layers[0].kernel") == ("policy", "layers", 0, "kernel")
    """
    if not isinstance(path, str):
        raise ValueError(f"path must be a str, got {type(path).__name__}")
    comps: list[str | int] = []
    pos, n = 0, len(path)
    while pos < n:
        if path[pos] == "[":
            m = _INDEX.match(path, pos)
            if m is None:
                raise ValueError(
                    f"bad path {path!r}: expected '[<non-negative int>]' at position {pos}"
                )
            comps.append(int(m.group(1)))
            pos = m.end()
            continue
        if comps:  # a name after the first component needs a dot
            if path[pos] != ".":
                raise ValueError(f"bad path {path!r}: expected '.' or '[' at position {pos}")
            pos += 1
        m = _NAME.match(path, pos)
        if m is None:
            raise ValueError(f"bad path {path!r}: expected a name at position {pos}")
        comps.append(m.group(0))
        pos = m.end()
    return tuple(comps)


def _comp_str(c: str | int) -> str:
    return f"[{c}]" if isinstance(c, int) else c


def _comps_str(comps: tuple) -> str:
    out = ""
    for c in comps:
        out += f"[{c}]" if isinstance(c, int) else (("." if out else "") + c)
    return out


def _one_level(node: Any) -> tuple[list, list, Any, Callable[[list], Any]] | None:
    """(keys, children, kind, rebuild) of a tree node, or None for a leaf.

    Registered pytree nodes use jax's own flattening (``kind`` is the one-level
    treedef). A dataclass that is not registered as a pytree is a leaf to jax;
    it is still walked through its fields here (``kind`` is its type).
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if not (len(flat) == 1 and len(flat[0][0]) == 0):
        return ([p[0] for p, _ in flat], [c for _, c in flat], treedef,
                lambda children: jax.tree_util.tree_unflatten(treedef, children))
    if _is_plain_dataclass(node):
        names = [f.name for f in dataclasses.fields(node) if f.init]
        return ([GetAttrKey(n) for n in names], [getattr(node, n) for n in names], type(node),
                lambda children: dataclasses.replace(node, **dict(zip(names, children))))
    return None


def _key_matches(k: Any, comp: str | int) -> bool:
    if isinstance(comp, int):
        if isinstance(k, SequenceKey):
            return k.idx == comp
        if isinstance(k, FlattenedIndexKey):
            return k.key == comp
        return isinstance(k, DictKey) and type(k.key) is int and k.key == comp
    if isinstance(k, DictKey):
        return isinstance(k.key, str) and k.key == comp
    return isinstance(k, GetAttrKey) and k.name == comp


def _is_plain_dataclass(node: Any) -> bool:
    return dataclasses.is_dataclass(node) and not isinstance(node, type)


def _child(node: Any, comp: str | int) -> tuple[bool, Any]:
    lvl = _one_level(node)
    if lvl is not None:
        keys, children, _, _ = lvl
        for k, c in zip(keys, children):
            if _key_matches(k, comp):
                return True, c
    return False, None


def _missing(path: str, comp: str | int) -> KeyError:
    return KeyError(f"path {path!r}: no entry {_comp_str(comp)!r}")


def resolve_path(tree: Any, path: str) -> Any:
    """The subtree of ``tree`` at ``path``.

    Args:
      tree: any pytree (dicts, lists, tuples, NamedTuples, flax structs, dataclasses).
      path: ``name(.name | [int])*``; a name is a dict key or a field, ``[i]``
        indexes a list or tuple; ``""`` is the whole tree.

    Returns:
      The subtree (the same objects, not copies).

    Raises:
      KeyError: ``"path 'a.b[0].c': no entry 'b'"``, naming the first missing part.
      ValueError: bad path syntax.

    Example::

        resolve_path({"policy": {"layers": [{"kernel": w}]}}, "policy.layers[0].kernel") is w
    """
    node = tree
    for comp in parse_path(path):
        ok, node = _child(node, comp)
        if not ok:
            raise _missing(path, comp)
    return node


def _replace(node: Any, comps: tuple, new: Any, path: str) -> Any:
    if not comps:
        return new
    comp, rest = comps[0], comps[1:]
    lvl = _one_level(node)
    if lvl is not None:
        keys, children, _, rebuild = lvl
        for i, k in enumerate(keys):
            if _key_matches(k, comp):
                children = list(children)
                children[i] = _replace(children[i], rest, new, path)
                return rebuild(children)
    raise _missing(path, comp)


def _shape_dtype(x: Any) -> tuple[tuple[int, ...], Any]:
    shape = tuple(x.shape) if hasattr(x, "shape") else tuple(np.shape(x))
    dtype = x.dtype if hasattr(x, "dtype") else jnp.result_type(x)
    return shape, dtype


def _first_mismatch(a: Any, b: Any, comps: tuple = ()) -> tuple[tuple, str] | None:
    """Walk two trees together; (path, reason) of the first difference, else None."""
    la, lb = _one_level(a), _one_level(b)
    if la is None and lb is None:
        sa, sb = _shape_dtype(a), _shape_dtype(b)
        if sa[0] != sb[0]:
            return comps, f"shape {sa[0]} in {{A}} vs {sb[0]} in {{B}}"
        if sa[1] != sb[1]:
            return comps, f"dtype {sa[1]} in {{A}} vs {sb[1]} in {{B}}"
        return None
    if la is None or lb is None:
        return comps, ("a leaf in {A} but a subtree in {B}" if la is None else "a subtree in {A} but a leaf in {B}")
    ka, ca, ta, _ = la
    kb, cb, tb, _ = lb
    names_a = [_key_comp(k) for k in ka]
    names_b = [_key_comp(k) for k in kb]
    if names_a != names_b:
        sb_, sa_ = set(names_b), set(names_a)
        for x, y in zip(names_a + [None] * len(names_b), names_b + [None] * len(names_a)):
            if x == y:
                continue
            if x is not None and x not in sb_:
                return comps + (x,), "present in {A} only"
            if y is not None and y not in sa_:
                return comps + (y,), "present in {B} only"
        return comps, f"children {names_a} in {{A}} vs {names_b} in {{B}}"
    if ta != tb:
        return comps, f"container {type(a).__name__} in {{A}} vs {type(b).__name__} in {{B}}"
    for name, x, y in zip(names_a, ca, cb):
        found = _first_mismatch(x, y, comps + (name,))
        if found is not None:
            return found
    return None


def _key_comp(k: Any) -> str | int:
    if isinstance(k, SequenceKey):
        return k.idx
    if isinstance(k, DictKey):
        return k.key if isinstance(k.key, int | str) else str(k.key)
    if isinstance(k, GetAttrKey):
        return k.name
    if isinstance(k, FlattenedIndexKey):
        return k.key
    return str(k)


def _same_tree_fast(a: Any, b: Any) -> bool:
    """Cheap exact check on jax's flattening; False means "walk the trees to find out"."""
    fa, ta = jax.tree_util.tree_flatten(a)
    fb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    for x, y in zip(fa, fb):
        if x is y:
            continue
        # jax arrays and tracers carry their aval as a plain attribute: cheaper than the
        # .shape / .dtype properties, which matters on every same-device tick
        ax, ay = getattr(x, "aval", x), getattr(y, "aval", y)
        try:
            if ax.shape != ay.shape or ax.dtype != ay.dtype:
                return False
        except AttributeError:  # Python scalars, unregistered dataclasses: let the walk decide
            return False
    return True


def _check_same_tree(a: Any, b: Any, name_a: str, name_b: str, what: str = "") -> None:
    """ValueError naming the first path where ``a`` and ``b`` differ in structure, shape or dtype."""
    if _same_tree_fast(a, b):
        return
    found = _first_mismatch(a, b)
    if found is None:  # pragma: no cover - the fast check and the walk agree on real trees
        raise ValueError(f"{what}{name_a} and {name_b} have different tree structures")
    comps, reason = found
    where = _comps_str(comps) or "<root>"
    reason = reason.replace("{A}", name_a).replace("{B}", name_b)
    raise ValueError(
        f"{what}{name_a} and {name_b} must match in structure, shapes and dtypes; "
        f"first mismatch at {where!r}: {reason}"
    )


def freeze_update_map(update_map: UpdateMap | None) -> tuple[tuple[str, str], ...] | None:
    """``{dest: src}`` (or ``[(dest, src), ...]``) as a hashable tuple of pairs.

    Useful as a static jit argument: ``jax.jit(tick, static_argnames=(...,
    "update_map"))`` needs hashable static values and a dict is not.
    """
    if update_map is None:
        return None
    items = update_map.items() if isinstance(update_map, Mapping) else update_map
    try:
        pairs = tuple((d, s) for d, s in items)
    except (TypeError, ValueError):
        raise ValueError(
            "update_map must be a mapping {dest_path: src_path} or a sequence of (dest, src) pairs"
        ) from None
    for d, s in pairs:
        if not isinstance(d, str) or not isinstance(s, str):
            raise ValueError(f"update_map paths must be str, got {d!r}: {s!r}")
    return pairs


def _prefix(a: tuple, b: tuple) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


def _checked_entries(actor_tree: Any, learner_tree: Any, update_map: UpdateMap) -> list:
    """[(dest, src, dest_comps, src_subtree)] after every check of :func:`apply_update_map`."""
    pairs = freeze_update_map(update_map)
    parsed = [(d, s, parse_path(d), parse_path(s)) for d, s in pairs]
    _checked_overlap(pairs)
    out = []
    for d, s, dc, _ in parsed:
        src = resolve_path(learner_tree, s)
        dst = resolve_path(actor_tree, d)
        found = _first_mismatch(src, dst) if not _same_tree_fast(src, dst) else None
        if found is not None:
            comps, reason = found
            where = _comps_str(comps) or "<root>"
            reason = reason.replace("{A}", "the source").replace("{B}", "the destination")
            raise ValueError(
                f"update_map entry {d!r} <- {s!r}: source (learner {s!r}) and destination "
                f"(actor {d!r}) must match in structure, shapes and dtypes; first mismatch at "
                f"{where!r}: {reason}"
            )
        out.append((d, s, dc, src))
    return out


def apply_update_map(actor_tree: Any, learner_tree: Any, update_map: UpdateMap) -> Any:
    """A new actor tree whose destination subtrees are the learner's source subtrees.

    Args:
      actor_tree: the tree to update (not modified).
      learner_tree: the tree the sources are read from.
      update_map: ``{dest_path: src_path}`` (paths as in :func:`resolve_path`;
        ``""`` is the whole tree) or a sequence of ``(dest, src)`` pairs.

    Returns:
      The actor tree with each destination replaced by the learner's source
      subtree (the same leaves, not copies); everything else unchanged.

    Raises:
      KeyError: a path names a missing entry.
      ValueError: bad syntax; a source and its destination differ in structure,
        shapes or dtypes (both paths named); overlapping destinations.

    Example::

        actor = apply_update_map(actor, learner, {"policy": "loss_module.actor_network"})
    """
    entries = _checked_entries(actor_tree, learner_tree, update_map)
    out = actor_tree
    for d, _, dc, src in entries:
        out = _replace(out, dc, src, d)
    return out


# ================================================================ placement
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
        an actor that :func:`make_tick` may donate).

    Example::

        actor = place(learner, jax.devices()[1])
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


# ===================================================================== tick
def tick(
    state: SyncState,
    learner_params: Any,
    actor_params: Any,
    interval: int,
    placement: Placement = None,
    update_map: UpdateMap | None = None,
    copy_on_same_device: bool = False,
    *,
    donate_actor: bool = False,
) -> tuple[SyncState, Any, Array]:
    """Count one collected batch and sync the actor's weights when it fires.

    ``counter += 1``; the sync fires when the new counter is a multiple of
    ``interval``. On a fire the actor gets the learner tree (or, with
    ``update_map``, the actor tree with the mapped subtrees replaced), placed
    with one ``jax.device_put``; ``version += 1`` and ``last_sync = counter``.

    In same-device mode (``placement`` is None, or, outside jit, equal to where
    the learner leaves already are; and ``copy_on_same_device=False``) the
    returned actor params *are* ``learner_params`` on every tick (with a map:
    the mapped subtrees alias the learner's leaves), so nothing is copied and
    the actor sees each optimiser update at once. Under ``jax.jit`` the
    returned tree is still the same traced value (inside a jitted loop nothing
    is copied; only jit's own outputs are fresh buffers).

    Args:
      state: the :class:`SyncState` (scalar leaves; ``jax.vmap`` for several).
      learner_params: pytree of the learner's weights and buffers.
      actor_params: pytree of the actor's current weights (same structure,
        shapes and dtypes as ``learner_params`` unless ``update_map`` is given).
        Initialise it with :func:`place` ``(learner_params, placement)``.
      interval: static int >= 1, ticks between syncs.
      placement: None, a ``jax.Device``, a ``jax.sharding.Sharding`` or a
        pytree of Shardings matching the actor tree. Inside jit it acts as a
        sharding constraint (static; must be hashable to be a static jit
        argument, otherwise close over it, see :func:`make_tick`).
      update_map: ``{dest_path_in_actor: src_path_in_learner}`` or a tuple of
        ``(dest, src)`` pairs (hashable; see :func:`freeze_update_map`).
      copy_on_same_device: copy on fire even without a placement: the actor
        then holds a delayed copy that only changes on fires.
      donate_actor: eager calls only: on a fire, delete the old actor buffers
        that are replaced (and that the learner does not share) before the
        transfer, so the actor's devices never hold two copies; the passed-in
        ``actor_params`` become invalid. Under jit use :func:`make_tick` or
        ``jax.jit(..., donate_argnames="actor_params")``.

    Returns:
      ``(state, actor_params, fired)`` with ``fired: bool[]``.

    Raises:
      ValueError: ``interval < 1`` (``"interval must be >= 1, got 0"``); a
        learner/actor tree mismatch (naming the first mismatching path); a bad
        ``update_map`` or ``placement``. KeyError: a map path that does not exist.

    Example::

        state, actor, fired = tick(state, learner, actor, interval=3, placement=jax.devices()[1])
        # fires on ticks 3, 6, 9, ...; actor lives on device 1
    """
    interval = _check_interval(interval)
    _check_state(state)
    _check_placement(placement)
    update_map = freeze_update_map(update_map)
    traced = _is_tracer(state.counter)

    if _same_device_mode(learner_params, update_map, placement, copy_on_same_device, traced):
        if update_map is None:
            _check_same_tree(learner_params, actor_params, "learner_params", "actor_params")
            new_actor = learner_params
        else:
            new_actor = apply_update_map(actor_params, learner_params, update_map)
        new_state, fired = (_advance_impl if traced else _advance_jit)(state, interval)
        return new_state, new_actor, fired

    if traced or any(_is_tracer(x) for x in jax.tree_util.tree_leaves((learner_params, actor_params))):
        new_state, fired = _advance_impl(state, interval)
        # validate once, outside the branches, so errors surface at trace time
        _pull_sources(actor_params, learner_params, update_map, placement, lambda t, p: t)

        def fire(lp, ap):
            new = _pull_sources(ap, lp, update_map, None, lambda t, p: t)
            if placement is not None:
                # under explicit-sharding meshes the layout is part of the type: both
                # branches must return the actor's layout
                new = jax.device_put(new, placement)
            # a weakly typed learner leaf must not change the cond's output type
            return jax.tree.map(_like, new, ap)

        new_actor = jax.lax.cond(fired, fire, lambda lp, ap: ap, learner_params, actor_params)
        if placement is not None:
            new_actor = jax.device_put(new_actor, placement)
        return new_state, new_actor, fired

    # the counter was computed long ago: reading it does not wait, unlike reading `fired`
    fire_now = (int(state.counter) + 1) % interval == 0
    new_state, fired = _advance_jit(state, interval)
    if fire_now:
        new_actor = _pull_sources(actor_params, learner_params, update_map, placement, _transfer,
                                  free_old=donate_actor)
    else:
        # validate on every tick, not only on fires
        if update_map is None:
            _check_same_tree(learner_params, actor_params, "learner_params", "actor_params")
        else:
            _checked_entries(actor_params, learner_params, update_map)
        new_actor = actor_params
    return new_state, new_actor, fired


def _like(new: Any, old: Any) -> Any:
    if _is_key(old):
        return new
    return jnp.asarray(new, dtype=old.dtype)


def make_tick(
    interval: int,
    placement: Placement = None,
    update_map: UpdateMap | None = None,
    copy_on_same_device: bool = False,
    *,
    donate: bool = True,
) -> Callable[[SyncState, Any, Any], tuple[SyncState, Any, Array]]:
    """A jitted ``tick(state, learner_params, actor_params)`` with the settings closed over.

    Works with any ``placement`` (also unhashable pytrees of Shardings) and
    ``update_map``. In copy mode the old actor buffers are donated
    (``donate=True``), so between fires the actor is passed through in place and
    on a fire the new weights are written into the old actor's memory. Every
    argument must live on the jitted computation's devices (e.g. one mesh);
    to move weights to *other* devices use :func:`tick` eagerly or
    :class:`WeightSync`.

    Example::

        step = make_tick(4, placement=NamedSharding(mesh, P()))
        state, actor, fired = step(state, learner, actor)
    """
    interval = _check_interval(interval)
    _check_placement(placement)
    update_map = freeze_update_map(update_map)

    def _tick(state, learner_params, actor_params):
        return tick(state, learner_params, actor_params, interval, placement, update_map,
                    copy_on_same_device)

    plain = jax.jit(_tick)
    if not (donate and (copy_on_same_device or placement is not None)):
        return plain
    donating = jax.jit(_tick, donate_argnames=("actor_params",))

    @functools.wraps(_tick)
    def step(state, learner_params, actor_params):
        # XLA refuses (and may crash on) a donated buffer that is also passed as another
        # argument, e.g. an actor that still aliases the learner after place()
        leaves = jax.tree_util.tree_leaves(actor_params)
        if any(_is_tracer(x) or not isinstance(x, jax.Array) for x in leaves) or _shares_buffers(
                actor_params, learner_params):
            return plain(state, learner_params, actor_params)
        return donating(state, learner_params, actor_params)

    return step


def _shares_buffers(a: Any, b: Any) -> bool:
    """Whether any device buffer of a leaf of ``a`` is also one of ``b``'s."""
    ids: set[int] = set()
    for x in jax.tree_util.tree_leaves(b):
        if isinstance(x, jax.Array) and not _is_tracer(x):
            ids |= _buffer_ids(x)
    return any(isinstance(x, jax.Array) and _buffer_ids(x) & ids for x in jax.tree_util.tree_leaves(a))


# ================================================================ host hook
class WeightSync:
    """Host hook for Python training loops (torchrl ``UpdateWeights``).

    Call it once per collected batch (torchrl's ``post_steps``), including
    batches on which optimisation was skipped during warm-up; to count
    optimiser steps instead, call it after each optimiser step.

    Args:
      interval: int >= 1, calls between syncs.
      placement: where the actor lives (None, a Device, a Sharding or a pytree
        of Shardings); see :func:`tick`.
      update_map: ``{dest_path: src_path}``; see :func:`apply_update_map`.
      copy_on_same_device: keep a delayed copy even on the learner's device.
      donate: on a fire, delete the replaced actor buffers that nothing else
        uses before the transfer, so the actor's devices never hold two copies
        (torchrl overwrites the actor's tensors in place); the ``actor_params``
        passed in become invalid. Default True.
      transport: optional ``(tree, placement) -> tree`` replacing
        ``jax.device_put`` for fired copies, e.g. a broadcast from process 0
        (:func:`jaxweight.distributed.broadcast_weight_sync`). With a transport
        every call is in copy mode.

    Attributes:
      state: the :class:`SyncState` (settable, e.g. after loading a checkpoint).
      fired: whether the last call synced.

    Example::

        hook = WeightSync(4, placement=jax.devices()[1])
        actor = jax.device_put(learner, jax.devices()[1])
        for batch in collector:
            ...
            actor = hook(learner, actor)
        json.dump(hook.state_dict(), f)
    """

    def __init__(self, interval: int, placement: Placement = None, update_map: UpdateMap | None = None,
                 copy_on_same_device: bool = False, *, donate: bool = True,
                 transport: Callable[[Any, Any], Any] | None = None):
        self.interval = _check_interval(interval)
        _check_placement(placement)
        self.placement = placement
        self.update_map = freeze_update_map(update_map)
        if self.update_map is not None:  # syntax and overlap checks up front
            for d, s in self.update_map:
                parse_path(d), parse_path(s)
            _checked_overlap(self.update_map)
        self.copy_on_same_device = bool(copy_on_same_device)
        self.donate = bool(donate)
        self.transport = transport
        self.fired = False
        # host-side counters are the truth: no device round trip per call
        self._counter = self._version = self._last_sync = 0
        self._state_cache: SyncState | None = None

    # -- state
    @property
    def state(self) -> SyncState:
        if self._state_cache is None:
            self._state_cache = SyncState(
                counter=jnp.asarray(self._counter, jnp.int32),
                version=jnp.asarray(self._version, jnp.int32),
                last_sync=jnp.asarray(self._last_sync, jnp.int32),
            )
        return self._state_cache

    @state.setter
    def state(self, value: SyncState) -> None:
        _check_state(value)
        c, v, s = (int(x) for x in jax.device_get((value.counter, value.version, value.last_sync)))
        self._set(c, v, s)

    def _set(self, counter: int, version: int, last_sync: int) -> None:
        self._counter, self._version, self._last_sync = counter, version, last_sync
        self._state_cache = None

    @property
    def counter(self) -> int:
        return self._counter

    @property
    def version(self) -> int:
        return self._version

    @property
    def staleness(self) -> int:
        """Calls since the actor's weights were last synced (``counter - last_sync``)."""
        return self._counter - self._last_sync

    # -- the hook
    def __call__(self, learner_params: Any, actor_params: Any) -> Any:
        """Count one batch; return the actor params (synced if this call fires)."""
        counter = self._counter + 1
        fired = counter % self.interval == 0
        same = self.transport is None and _same_device_mode(
            learner_params, self.update_map, self.placement, self.copy_on_same_device, traced=False)
        if same:
            if self.update_map is None:
                _check_same_tree(learner_params, actor_params, "learner_params", "actor_params")
                new_actor = learner_params
            else:
                new_actor = apply_update_map(actor_params, learner_params, self.update_map)
        elif fired:
            new_actor = _pull_sources(actor_params, learner_params, self.update_map, self.placement,
                                      self.transport or _transfer, free_old=self.donate)
        else:
            if self.update_map is None:
                _check_same_tree(learner_params, actor_params, "learner_params", "actor_params")
            else:
                _checked_entries(actor_params, learner_params, self.update_map)
            new_actor = actor_params
        if fired:
            self._set(counter, self._version + 1, counter)
        else:
            self._set(counter, self._version, self._last_sync)
        self.fired = fired
        return new_actor

    # -- logging and checkpoints
    def metrics(self) -> dict[str, float]:
        """``{"sync/counter", "sync/version", "sync/last_sync", "sync/staleness", "sync/fired"}``."""
        return {
            "sync/counter": float(self._counter),
            "sync/version": float(self._version),
            "sync/last_sync": float(self._last_sync),
            "sync/staleness": float(self.staleness),
            "sync/fired": float(self.fired),
        }

    def state_dict(self) -> dict[str, int]:
        """``{"counter": int, "version": int, "last_sync": int}`` (plain JSON)."""
        return {"counter": self._counter, "version": self._version, "last_sync": self._last_sync}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore the counters.

        Accepts this class's dicts and torchrl-style ones: ``{"counter": n}``
        (missing fields become 0) and ``"last_update_count"`` read as
        ``last_sync``.

        Raises:
          KeyError: ``"counter"`` is missing.
          ValueError: a value is not a non-negative integer.
        """
        if "counter" not in d:
            raise KeyError("state dict has no 'counter' entry")
        last = d.get("last_sync", d.get("last_update_count", 0))
        vals = []
        for name, v in (("counter", d["counter"]), ("version", d.get("version", 0)), ("last_sync", last)):
            a = np.asarray(jax.device_get(v))
            if isinstance(v, bool) or a.ndim != 0 or not np.issubdtype(a.dtype, np.integer) or a < 0:
                raise ValueError(f"state dict entry {name!r} must be a non-negative int, got {v!r}")
            vals.append(int(a))
        if vals[2] > vals[0]:
            raise ValueError(f"state dict last_sync ({vals[2]}) must be <= counter ({vals[0]})")
        self._set(*vals)
        self.fired = False

    def __repr__(self) -> str:
        return (f"WeightSync(interval={self.interval}, counter={self._counter}, "
                f"version={self._version}, last_sync={self._last_sync})")


def _checked_overlap(pairs: tuple[tuple[str, str], ...]) -> None:
    parsed = [(d, parse_path(d)) for d, _ in pairs]
    for i, (d1, c1) in enumerate(parsed):
        for d2, c2 in parsed[i + 1 :]:
            if _prefix(c1, c2) or _prefix(c2, c1):
                raise ValueError(f"update_map destinations {d1!r} and {d2!r} overlap")
