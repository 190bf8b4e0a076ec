"""Path maps of :mod:`jaxweight.sync`: ``"policy.layers[0].kernel"`` paths into pytrees.

Parsing (:func:`parse_path`), lookup (:func:`resolve_path`), the
``{dest_path: src_path}`` update maps of torchrl's ``weight_update_map``
(:func:`apply_update_map`, :func:`freeze_update_map`) and the tree checks that
name the first mismatching path.
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
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

UpdateMap = Mapping[str, str] | Iterable[tuple[str, str]]

__all__ = ["parse_path", "resolve_path", "apply_update_map", "freeze_update_map", "UpdateMap"]

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

        from jaxweight.sync import parse_path

        assert parse_path("policy.layers[0].kernel") == ("policy", "layers", 0, "kernel")
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

        import jax.numpy as jnp
        from jaxweight.sync import resolve_path

        w = jnp.ones(2)
        assert resolve_path({"policy": {"layers": [{"kernel": w}]}}, "policy.layers[0].kernel") is w
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
        # .shape / .dtype properties, which matters on every same-device step
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

    :func:`jaxweight.sync.config` stores maps in this form, so a config is hashable
    and its map is static under ``jax.jit``.
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

        import jax.numpy as jnp
        from jaxweight.sync import apply_update_map

        learner = {"loss_module": {"actor_network": {"w": jnp.ones(2)}, "critic": {"w": jnp.ones(3)}}}
        actor = {"policy": {"w": jnp.zeros(2)}, "step": jnp.zeros(())}
        actor = apply_update_map(actor, learner, {"policy": "loss_module.actor_network"})
        assert float(actor["policy"]["w"][0]) == 1.0 and float(actor["step"]) == 0.0
    """
    entries = _checked_entries(actor_tree, learner_tree, update_map)
    out = actor_tree
    for d, _, dc, src in entries:
        out = _replace(out, dc, src, d)
    return out



def _checked_overlap(pairs: tuple[tuple[str, str], ...]) -> None:
    parsed = [(d, parse_path(d)) for d, _ in pairs]
    for i, (d1, c1) in enumerate(parsed):
        for d2, c2 in parsed[i + 1 :]:
            if _prefix(c1, c2) or _prefix(c2, c1):
                raise ValueError(f"update_map destinations {d1!r} and {d2!r} overlap")
