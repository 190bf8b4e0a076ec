"""The host hook of :mod:`jaxweight.sync`: :class:`WeightSync` over :func:`~jaxweight.sync.step`,
and :func:`broadcast_weight_sync`, its multi-host form."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from .. import _util
from .core import SyncState, _actor_update, _check_state, _count, _host_counters, _host_state, _placement, config, metrics_dict
from .core import staleness as _staleness
from .paths import UpdateMap
from .placement import Placement

__all__ = ["WeightSync", "broadcast_weight_sync"]


class WeightSync:
    """Host hook for Python training loops (torchrl ``UpdateWeights``).

    Holds a :class:`~jaxweight.sync.SyncConfig` and the counters of a
    :class:`~jaxweight.sync.SyncState` as host ints, and applies the counting
    and copying rules of :func:`~jaxweight.sync.step` (the same functions) once
    per call, without building a state object on the hot path. Call it once per collected batch
    (torchrl's ``post_steps``), including batches on which optimisation was
    skipped during warm-up; to count optimiser steps instead, call it after
    each optimiser step.

    Args:
      interval: int >= 1, calls between syncs.
      placement: where the actor lives (None, a Device, a Sharding or a pytree
        of Shardings); see :func:`~jaxweight.sync.config`.
      update_map: ``{dest_path: src_path}``; see :func:`~jaxweight.sync.apply_update_map`.
      copy_on_same_device: keep a delayed copy even on the learner's device.
      donate: on a fire, delete the replaced actor buffers that nothing else
        uses before the transfer, so the actor's devices never hold two copies
        (torchrl overwrites the actor's tensors in place); the ``actor_params``
        passed in become invalid. Default True.
      transport: optional ``(tree, placement) -> tree`` replacing
        ``jax.device_put`` for fired copies, e.g. a broadcast from process 0
        (:func:`broadcast_weight_sync`). With a transport every call is in copy mode.

    Attributes:
      config: the :class:`~jaxweight.sync.SyncConfig`.
      state: the :class:`~jaxweight.sync.SyncState` (settable, e.g. after loading a checkpoint).
      fired: whether the last call synced.

    Example::

        import jax.numpy as jnp
        from jaxweight import sync

        hook = sync.WeightSync(2, copy_on_same_device=True)
        learner = {"w": jnp.zeros(3)}
        actor = sync.place(learner, copy=True)
        for t in range(3):
            learner = {"w": learner["w"] + 1}
            actor = hook(learner, actor)          # once per collected batch
        assert hook.state_dict() == {"counter": 3, "version": 1, "last_sync": 2}
        assert float(actor["w"][0]) == 2.0        # synced at call 2, stale since
    """

    def __init__(self, interval: int, placement: Placement = None, update_map: UpdateMap | None = None,
                 copy_on_same_device: bool = False, *, donate: bool = True,
                 transport: Callable[[Any, Any], Any] | None = None):
        # a host object: its interval is a Python int (a traced one is refused here)
        _util.check_value(interval, "interval", ge=1, finite=False, static=True)
        self.config = config(interval, placement, update_map, copy_on_same_device=copy_on_same_device,
                             donate=donate, transport=transport)
        self.fired = False
        self._counts = (0, 0, 0)
        self._interval, self._placement = int(self.config.interval), _placement(self.config)

    # -- settings, read-only views of the config
    @property
    def interval(self) -> int:
        return int(self.config.interval)

    @property
    def placement(self) -> Placement:
        return _placement(self.config)

    @property
    def update_map(self) -> tuple[tuple[str, str], ...] | None:
        return self.config.update_map

    @property
    def copy_on_same_device(self) -> bool:
        return self.config.copy_on_same_device

    @property
    def donate(self) -> bool:
        return self.config.donate

    @property
    def transport(self) -> Callable[[Any, Any], Any] | None:
        return self.config.transport

    # -- state
    @property
    def state(self) -> SyncState:
        return _host_state(*self._counts)

    @state.setter
    def state(self, value: SyncState) -> None:
        _check_state(value)
        self._counts = _host_counters(value)

    @property
    def counter(self) -> int:
        return self._counts[0]

    @property
    def version(self) -> int:
        return self._counts[1]

    @property
    def staleness(self) -> int:
        """Calls since the actor's weights were last synced (:func:`jaxweight.sync.staleness`)."""
        return int(_staleness(self.state))

    # -- the hook
    def __call__(self, learner_params: Any, actor_params: Any) -> Any:
        """Count one batch; return the actor params (synced if this call fires)."""
        c, v, s, fired = _count(*self._counts, self._interval)
        new_actor = _actor_update(learner_params, actor_params, self.config, self._placement, fired,
                                  counters_traced=False)
        self._counts, self.fired = (c, v, s), fired  # only once the actor update went through
        return new_actor

    # -- logging and checkpoints
    def metrics(self) -> dict[str, float]:
        """:func:`jaxweight.sync.metrics_dict` plus ``"sync/last_sync"`` and ``"sync/fired"``."""
        return {**metrics_dict(self.state), "sync/last_sync": float(self._counts[2]),
                "sync/fired": float(self.fired)}

    def state_dict(self) -> dict[str, int]:
        """``{"counter": int, "version": int, "last_sync": int}`` (plain JSON)."""
        c, v, s = self._counts
        return {"counter": c, "version": v, "last_sync": s}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore the counters.

        Accepts this class's dicts and torchrl-style ones: ``{"counter": n}``
        (missing fields become 0) and ``"last_update_count"`` read as
        ``last_sync``.

        Raises:
          jaxweight.StateFileError: malformed input (not a mapping, a value that
            is not a non-negative int, ``last_sync > counter``); a missing
            ``"counter"`` is also a ``KeyError``.
        """
        self._counts = _check_load(d)
        self.fired = False

    def __repr__(self) -> str:
        c, v, s = self._counts
        return f"WeightSync(interval={self.interval}, counter={c}, version={v}, last_sync={s})"


def broadcast_weight_sync(interval: int, placement: Placement = None, update_map: UpdateMap | None = None,
                          *, is_source: bool | None = None, donate: bool = True) -> WeightSync:
    """A :class:`WeightSync` whose fired copies come from process 0.

    Every process calls the hook in lockstep once per collected batch with
    ``(learner_params, actor_params)``; process 0 passes its live learner
    weights, the others pass any tree of the same shape (e.g. their actor
    params). On a fire the learner tree of process 0 is broadcast to all
    processes (``multihost_utils.broadcast_one_to_all``, a collective) and
    placed on ``placement`` (default: this process's first local device);
    between fires each process keeps its actor copy. Counters are identical on
    all processes, so ``state_dict()`` may be saved from any.

    Args:
      interval, placement, update_map, donate: as for :class:`WeightSync`.
      is_source: whether this process provides the weights (default: process 0).

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import sync

        hook = sync.broadcast_weight_sync(2)
        learner = actor = {"w": jnp.ones(2)}
        for t in range(2):
            actor = hook(learner if jax.process_index() == 0 else actor, actor)
        assert hook.version == 1
    """
    dest = placement if placement is not None else jax.local_devices()[0]

    def transport(tree, where):
        from jax.experimental import multihost_utils

        host = multihost_utils.broadcast_one_to_all(tree, is_source=is_source)
        return jax.device_put(host, where if where is not None else dest)

    return WeightSync(interval, placement=dest, update_map=update_map, donate=donate, transport=transport)


def _check_load(d: Any) -> tuple[int, int, int]:
    """Counters from a ``state_dict`` (this class's or torchrl's), refusing malformed input."""
    if not isinstance(d, Mapping):
        raise _util.StateFileError(
            f"WeightSync.load_state_dict: expected a mapping like {{'counter': int, 'version': int, "
            f"'last_sync': int}}, got {type(d).__name__}")
    if "counter" not in d:
        raise _MissingCounter(f"WeightSync.load_state_dict: state dict has no 'counter' entry "
                              f"(keys: {sorted(map(str, d))})")
    last = d.get("last_sync", d.get("last_update_count", 0))
    vals = []
    for name, v in (("counter", d["counter"]), ("version", d.get("version", 0)), ("last_sync", last)):
        try:
            a = np.asarray(jax.device_get(v))
        except Exception:  # noqa: BLE001 - anything unreadable is malformed
            a = np.asarray(None, object)
        if (isinstance(v, bool | np.bool_) or a.ndim != 0 or not np.issubdtype(a.dtype, np.integer)
                or a < 0 or a > 2**31 - 1):
            raise _util.StateFileError(
                f"WeightSync.load_state_dict: entry {name!r} must be a non-negative int < 2**31, got {v!r}")
        vals.append(int(a))
    if vals[2] > vals[0]:
        raise _util.StateFileError(
            f"WeightSync.load_state_dict: last_sync ({vals[2]}) must be <= counter ({vals[0]})")
    return vals[0], vals[1], vals[2]


class _MissingCounter(_util.StateFileError, KeyError):
    """A state dict without ``"counter"``: a ``StateFileError`` and, as the spec says, a ``KeyError``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
