"""atropos ``CurriculumScheduler`` JSON state <-> :mod:`jaxweight.curriculum` state.

atropos keys items by strings and saves ``state_dict()`` as JSON;
:class:`jaxweight.curriculum.KeyIndex` maps those keys to pool ids on the host, :func:`state_dict`
writes atropos's layout (plus a ``jaxweight`` block with what atropos does not
keep), :func:`load_state_dict` reads plain atropos dicts as well as ours.
Files are written atomically (temp file + rename); no pickle. Every malformed
file (not JSON, binary, truncated, not an object, a missing key, a value of
the wrong type) raises :class:`jaxweight._util.StateFileError` (a
``ValueError``) naming the file and what is wrong.

Example::

    import jax.numpy as jnp
    from jaxweight import curriculum as cur
    from jaxweight.interop import atropos

    cfg = cur.config("easy_first", capacity=100)
    keys = cur.KeyIndex(capacity=100)
    state = cur.update(cur.init(cfg), keys.ids(["q17", "q3"]), jnp.array([1.0, 0.5]), cfg)
    d = atropos.state_dict(state, cfg, keys)     # atropos's layout, JSON-ready
    cfg2, state2, keys2 = atropos.load_state_dict(d, capacity=100)
    assert d["item_scores"] == {"q17": [1.0, 1], "q3": [0.5, 1]} and keys2.keys() == ["q17", "q3"]
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._util import StateFileError, atomic_write_json, check_static_int
from ..curriculum import CurriculumConfig, CurriculumState, KeyIndex, config
from ..curriculum._config import _check_strategy

__all__ = ["state_dict", "load_state_dict", "save_json", "load_json"]


# ================================================================ persistence
def _scalar(x: Any, name: str) -> float:
    a = np.asarray(jax.device_get(x))
    if a.shape != ():
        raise ValueError(f"{name} must be a scalar to be saved, got shape {a.shape} (a vmapped sweep?)")
    return a.item()


def state_dict(state: CurriculumState, cfg: CurriculumConfig, keys: KeyIndex | None = None) -> dict:
    """JSON-ready dict in atropos's ``state_dict`` layout, plus a ``jaxweight`` block.

    Args:
      state: a single (unbatched) scheduler state.
      cfg: its config.
      keys: the :class:`KeyIndex` naming the ids, or None to use ``str(id)``.

    Returns:
      ``{"strategy", "n_bins", "temperature", "ema_alpha",
      "competence_threshold", "item_scores": {key: [ema, count]},
      "bin_boundaries": [...] or [], "last_rebin_count", "jaxweight": {...}}``.
      atropos can load it (unless the strategy is one of the two new ones).

    Raises:
      ValueError: a batched state or config, a state whose capacity is not
        the config's, or a tracked id without a key.
    """
    ema, count, last, b, has, lrc, tot = jax.device_get(
        (state.ema, state.count, state.last_update, state.boundaries, state.has_boundaries,
         state.last_rebin_count, state.total_updates))
    if np.ndim(count) != 1:
        raise ValueError(f"state must be a single scheduler (count of rank 1), got shape {np.shape(count)}")
    if np.shape(count)[0] != cfg.capacity:
        raise ValueError(f"state capacity {np.shape(count)[0]} differs from cfg.capacity={cfg.capacity}")
    ids = np.flatnonzero(np.asarray(count) > 0)
    if keys is None:
        names = [str(int(i)) for i in ids]
    else:
        if len(ids) and ids[-1] >= len(keys):
            raise ValueError(f"state tracks id {int(ids[-1])}, which has no key in keys ({len(keys)} keys)")
        names = [keys.key(int(i)) for i in ids]
    item_scores = {k: [float(ema[i]), int(count[i])] for k, i in zip(names, ids)}
    block = {
        "version": 1,
        "capacity": cfg.capacity,
        "rebin_interval": int(_scalar(cfg.rebin_interval, "rebin_interval")),
        "total_updates": int(tot),
        "last_update": {k: int(last[i]) for k, i in zip(names, ids)},
        "competence_c0": float(_scalar(cfg.competence_c0, "competence_c0")),
        "staleness_coeff": float(_scalar(cfg.staleness_coeff, "staleness_coeff")),
        "priority": cfg.priority,
        "id_keys": keys is None,
    }
    if keys is not None:
        block["keys"] = keys.keys()
    return {
        "strategy": cfg.strategy,
        "n_bins": cfg.n_bins,
        "temperature": float(_scalar(cfg.temperature, "temperature")),
        "ema_alpha": float(_scalar(cfg.ema_alpha, "ema_alpha")),
        "competence_threshold": float(_scalar(cfg.competence_threshold, "competence_threshold")),
        "item_scores": item_scores,
        "bin_boundaries": [float(x) for x in b] if bool(has) else [],
        "last_rebin_count": int(lrc),
        "jaxweight": block,
    }


_MISSING = object()


class _Reader:
    """Typed access to a loaded dict; every problem is a StateFileError naming the source."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, what: str) -> StateFileError:
        return StateFileError(f"{self.source}: {what}")

    def get(self, d: Mapping, key: str, kind: str, default: Any = _MISSING, where: str = "") -> Any:
        name = f"{where}{key}"
        if key not in d:
            if default is _MISSING:
                raise self.fail(f"missing key {name!r}")
            return default
        v = d[key]
        if kind == "number":
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise self.fail(f"{name!r} must be a number, got {type(v).__name__} {v!r:.60}")
            return float(v)
        if kind == "int":
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.fail(f"{name!r} must be an integer, got {type(v).__name__} {v!r:.60}")
            return v
        if kind == "str":
            if not isinstance(v, str):
                raise self.fail(f"{name!r} must be a string, got {type(v).__name__} {v!r:.60}")
            return v
        if kind == "dict":
            if v is None:
                return {}
            if not isinstance(v, Mapping):
                raise self.fail(f"{name!r} must be an object, got {type(v).__name__}")
            return v
        if kind == "list":
            if v is None:
                return []
            if not isinstance(v, list | tuple):
                raise self.fail(f"{name!r} must be a list, got {type(v).__name__}")
            return list(v)
        raise AssertionError(kind)


def load_state_dict(d: Mapping[str, Any], capacity: int, keys: KeyIndex | None = None, *,
                    source: str = "state dict"
                    ) -> tuple[CurriculumConfig, CurriculumState, KeyIndex | None]:
    """Rebuild a scheduler from an atropos (or jaxweight) ``state_dict``.

    Plain atropos dicts (``item_scores`` values as lists or tuples) load with
    ``rebin_interval`` 50, ``total_updates`` = sum of counts and
    ``last_update`` 0. Items whose stored EMA is not finite (atropos stores
    NaN scores as given) are dropped, as :func:`~jaxweight.curriculum.update`
    would have skipped them.

    Args:
      d: the dict (e.g. ``json.load``-ed).
      capacity: pool size N of the new state.
      keys: optional existing :class:`KeyIndex` to map the keys into (new
        keys are added); by default a new one in the saved order.
      source: how messages name the dict (:func:`load_json` passes the path).

    Returns:
      ``(cfg, state, keys)``; ``keys`` is None when the dict was saved with
      ``keys=None`` (keys are the ids themselves).

    Raises:
      StateFileError: (a ``ValueError``) a malformed dict: not a mapping, a
        missing key, a value of the wrong type or out of range (an unknown
        strategy keeps :func:`~jaxweight.curriculum.config`'s message).
      ValueError: more items than ``capacity``.
    """
    capacity = check_static_int(capacity, "capacity", minimum=1)
    r = _Reader(source)
    if not isinstance(d, Mapping):
        raise r.fail(f"expected a JSON object (atropos state_dict), got {type(d).__name__}")
    strategy = r.get(d, "strategy", "str")
    try:
        _check_strategy(strategy)
    except ValueError as e:
        raise r.fail(str(e)) from None
    jw = r.get(d, "jaxweight", "dict", default={})
    w = "jaxweight."
    n_bins = r.get(d, "n_bins", "int")
    try:
        cfg = config(
            strategy, n_bins, capacity=capacity,
            temperature=r.get(d, "temperature", "number", 1.0),
            ema_alpha=r.get(d, "ema_alpha", "number", 0.3),
            competence_threshold=r.get(d, "competence_threshold", "number", 0.5),
            rebin_interval=r.get(jw, "rebin_interval", "int", 50, w),
            competence_c0=r.get(jw, "competence_c0", "number", 0.01, w),
            staleness_coeff=r.get(jw, "staleness_coeff", "number", 0.3, w),
            priority=r.get(jw, "priority", "str", "frontier", w),
        )
    except StateFileError:
        raise
    except ValueError as e:
        raise r.fail(str(e)) from None
    scores = r.get(d, "item_scores", "dict", default={})
    if len(scores) > capacity:
        raise ValueError(f"{source}: state dict has {len(scores)} items, more than capacity {capacity}")
    names, emas, counts = [], [], []
    for k, v in scores.items():
        if not isinstance(v, list | tuple) or len(v) != 2:
            raise r.fail(f"item_scores[{k!r}] must be [ema, count], got {v!r:.60}")
        e, c = v
        if isinstance(e, bool) or not isinstance(e, int | float) or e is None:
            raise r.fail(f"item_scores[{k!r}] ema must be a number, got {e!r:.60}")
        if isinstance(c, float) and c.is_integer():
            c = int(c)
        if isinstance(c, bool) or not isinstance(c, int):
            raise r.fail(f"item_scores[{k!r}] count must be an integer, got {c!r:.60}")
        if c < 1:
            raise r.fail(f"item_scores[{k!r}] has count {c}; counts must be >= 1")
        if c > 2**31 - 1:
            raise r.fail(f"item_scores[{k!r}] has count {c}; counts must fit in int32")
        if not math.isfinite(e):
            continue
        names.append(str(k))
        emas.append(float(e))
        counts.append(c)
    id_keys = jw.get("id_keys", False)
    if not isinstance(id_keys, bool):
        raise r.fail(f"'jaxweight.id_keys' must be true or false, got {id_keys!r:.60}")
    if id_keys:
        try:
            ids = np.asarray([int(k) for k in names], np.int64)
        except ValueError:
            raise r.fail("item_scores keys must be integer ids when jaxweight.id_keys is true") from None
        if len(ids) and (ids.min() < 0 or ids.max() >= capacity):
            raise r.fail(f"item ids must be in [0, {capacity}), got {int(ids.min())}..{int(ids.max())}")
        out_keys = None
    else:
        saved = r.get(jw, "keys", "list", [], w)
        if not all(isinstance(k, str) for k in saved):
            raise r.fail("'jaxweight.keys' must be a list of strings")
        try:
            out_keys = keys if keys is not None else KeyIndex(capacity, saved)
            ids = out_keys.ids(names, add=True).astype(np.int64) if names else np.zeros((0,), np.int64)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
    last_map = r.get(jw, "last_update", "dict", {}, w)
    last = []
    for k in names:
        v = last_map.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int):
            raise r.fail(f"'jaxweight.last_update'[{k!r}] must be an integer, got {v!r:.60}")
        last.append(v)
    ema = np.zeros((capacity,), np.float32)
    cnt = np.zeros((capacity,), np.int32)
    lu = np.zeros((capacity,), np.int32)
    ema[ids] = np.asarray(emas, np.float32)
    cnt[ids] = np.asarray(counts, np.int32)
    lu[ids] = np.asarray(last, np.int64).clip(0, 2**31 - 1).astype(np.int32)
    bb = r.get(d, "bin_boundaries", "list", [])
    if len(bb) not in (0, n_bins):
        raise r.fail(f"bin_boundaries must have 0 or n_bins={n_bins} entries, got {len(bb)}")
    if not all(not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) for x in bb):
        raise r.fail("bin_boundaries must hold finite numbers")
    b = np.asarray(bb, np.float32) if bb else np.zeros((n_bins,), np.float32)
    lrc = r.get(d, "last_rebin_count", "int", 0)
    total = int(cnt.sum(dtype=np.int64))
    if total > 2**31 - 1:
        raise r.fail(f"the counts sum to {total}, more than int32 holds")
    state = CurriculumState(
        ema=jnp.asarray(ema), count=jnp.asarray(cnt), last_update=jnp.asarray(lu),
        boundaries=jnp.asarray(b), has_boundaries=jnp.asarray(bool(bb)),
        last_rebin_count=jnp.asarray(int(np.clip(lrc, 0, 2**31 - 1)), jnp.int32),
        total_updates=jnp.asarray(total, jnp.int32),
    )
    return cfg, state, out_keys


def save_json(path: str | os.PathLike, state: CurriculumState, cfg: CurriculumConfig,
              keys: KeyIndex | None = None) -> Path:
    """Write :func:`state_dict` as JSON atomically (temp file + rename)."""
    return atomic_write_json(path, state_dict(state, cfg, keys))


def load_json(path: str | os.PathLike, capacity: int, keys: KeyIndex | None = None
              ) -> tuple[CurriculumConfig, CurriculumState, KeyIndex | None]:
    """Read a JSON state dict (atropos's or ours) with :func:`load_state_dict`.

    Raises:
      FileNotFoundError: no such file.
      StateFileError: the file is not UTF-8 JSON (binary, truncated), not an
        object, or malformed (see :func:`load_state_dict`); the message names
        the file.
    """
    name = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StateFileError(f"{name}: not a UTF-8 JSON file (binary data at byte {e.start})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        what = "empty file" if not text.strip() else f"invalid or truncated JSON ({e.msg} at line {e.lineno} column {e.colno})"
        raise StateFileError(f"{name}: {what}") from None
    return load_state_dict(d, capacity, keys, source=name)
