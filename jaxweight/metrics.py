"""Metrics a logger takes as they come: flat ``dict[str, float]`` and writers.

Every step output and state of jaxweight that carries metrics has a ``to_dict``
(or a module-level ``metrics_dict``) built on :func:`flatten`: one host call that
returns ``{"module/name": float}`` with ``/``-separated keys (atropos style), ready
for ``SummaryWriter.add_scalar``, wandb or a JSON line. Array metrics of more than
one entry are reduced to their mean (``.../mean``) unless ``reduce=False`` asks for
one key per entry (``.../0``, ``.../1``, ...).

Writers share one protocol (:class:`MetricsWriter`): ``write(step, metrics)`` and
``close()``. :class:`JsonlWriter` is always available; :class:`TensorBoardWriter`
needs the ``tensorboard`` extra (tensorboardX).

Example::

    import jax.numpy as jnp
    from jaxweight import metrics

    logs = metrics.flatten({"loss": jnp.float32(0.5), "acc": jnp.ones(3)}, prefix="preference")
    assert logs == {"preference/loss": 0.5, "preference/acc/mean": 1.0}
    with metrics.JsonlWriter("out/metrics.jsonl") as w:
        w.write(0, logs)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from ._install import install_hint
from ._util import atomic_write_bytes

__all__ = ["flatten", "MetricsWriter", "JsonlWriter", "TensorBoardWriter", "MultiWriter", "open_writers"]


def _items(obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        return [(str(k), v) for k, v in obj.items()]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    if hasattr(obj, "_asdict"):  # NamedTuple
        return list(obj._asdict().items())
    return []


def _is_leafish(v: Any) -> bool:
    return isinstance(v, (int, float, np.number, np.ndarray, jax.Array, bool, np.bool_))


def flatten(obj: Any, prefix: str = "", *, reduce: bool = True, skip: tuple[str, ...] = ()) -> dict[str, float]:
    """A flat ``{"prefix/a/b": float}`` of a (nested) mapping, dataclass or NamedTuple.

    Host side: one ``jax.device_get`` for the whole tree. Numbers become Python
    floats; arrays of one entry become that entry; larger arrays become their mean
    (key ``.../mean``, NaN-aware: non-finite entries are left out) or, with
    ``reduce=False``, one key per entry. Strings, ``None``, PRNG keys and other
    non-numbers are dropped.

    Args:
      obj: the metrics (dict, ``flax.struct`` dataclass, NamedTuple, nested).
      prefix: key prefix, e.g. ``"maxent"``.
      reduce: average array metrics (True) or spell out every entry (False).
      skip: field names to leave out (e.g. large per-item arrays).

    Returns:
      ``dict[str, float]``.
    """
    host = jax.device_get(_strip_keys(obj))
    out: dict[str, float] = {}
    _walk(host, prefix.rstrip("/"), out, reduce, set(skip))
    return out


def _strip_keys(obj: Any) -> Any:
    def f(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return None
        return x

    return jax.tree_util.tree_map(f, obj)


def _walk(v: Any, key: str, out: dict, reduce: bool, skip: set) -> None:
    if v is None or isinstance(v, str):
        return
    if _is_leafish(v):
        a = np.asarray(v)
        if a.dtype.kind not in "biuf":
            return
        a = a.astype(np.float64)
        if a.size == 1:
            out[key or "value"] = float(a.reshape(()))
        elif a.size > 1:
            if reduce:
                fin = a[np.isfinite(a)]
                out[f"{key}/mean" if key else "mean"] = float(fin.mean()) if fin.size else math.nan
            else:
                for i, x in enumerate(a.reshape(-1)):
                    out[f"{key}/{i}" if key else str(i)] = float(x)
        return
    items = _items(v)
    if not items and isinstance(v, (list, tuple)):
        items = [(str(i), x) for i, x in enumerate(v)]
    for k, x in items:
        if k in skip:
            continue
        _walk(x, f"{key}/{k}" if key else k, out, reduce, skip)


@runtime_checkable
class MetricsWriter(Protocol):
    """What every metrics backend does: ``write(step, metrics)`` then ``close()``."""

    def write(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class _Base:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class JsonlWriter(_Base):
    """One JSON object per line: ``{"step": 3, "curriculum/items_tracked": 12.0, ...}``.

    Lines are flushed as written, so a crash loses at most the line being written.
    Non-finite values are written as ``null`` (JSON has no NaN).
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        rec = {"step": int(step)}
        for k, v in metrics.items():
            fv = float(v)
            rec[k] = fv if math.isfinite(fv) else None
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def keep_through(self, step: int) -> int:
        """Drop the lines past ``step`` (and a torn last line): a run resumed from a checkpoint at
        ``step`` writes the later steps again, so each step stays in the file as often as in an
        uninterrupted run. Returns how many lines were dropped."""
        self._f.close()
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                ok = int(json.loads(line)["step"]) <= int(step)
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                kept.append(line + "\n")
            else:
                dropped += 1
        if dropped:
            atomic_write_bytes(self.path, "".join(kept).encode("utf-8"))
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        return dropped

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class TensorBoardWriter(_Base):
    """TensorBoard event files through tensorboardX (``pip install 'jaxweight[tensorboard]'``)."""

    def __init__(self, logdir: str | os.PathLike):
        try:
            from tensorboardX import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise ImportError(
                f"TensorBoardWriter needs tensorboardX: {install_hint('tensorboard')}"
            ) from e
        self.logdir = Path(logdir)
        self._w = SummaryWriter(str(self.logdir))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self._w.add_scalar(k, float(v), int(step))
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class MultiWriter(_Base):
    """Fan one ``write`` out to several writers."""

    def __init__(self, *writers: MetricsWriter):
        self.writers = list(writers)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for w in self.writers:
            w.write(step, metrics)

    def keep_through(self, step: int) -> int:
        """:meth:`JsonlWriter.keep_through` on each writer that can (TensorBoard files are left as they are)."""
        return sum(w.keep_through(step) for w in self.writers if hasattr(w, "keep_through"))

    def close(self) -> None:
        for w in self.writers:
            w.close()


def open_writers(out_dir: str | os.PathLike, tensorboard: str | os.PathLike | None = None,
                 *, append: bool = False) -> MultiWriter:
    """``metrics.jsonl`` in ``out_dir``, plus TensorBoard event files in ``tensorboard`` if given."""
    ws: list[MetricsWriter] = [JsonlWriter(Path(out_dir) / "metrics.jsonl", append=append)]
    if tensorboard is not None:
        ws.append(TensorBoardWriter(tensorboard))
    return MultiWriter(*ws)
