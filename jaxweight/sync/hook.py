"""The host hook of :mod:`jaxweight.sync`: :class:`WeightSync`, a thin wrapper over :func:`~jaxweight.sync.tick`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .. import _util
from .core import (
    SyncState,
    _actor_update,
    _check_load,
    _check_state,
    _count,
    _host_counters,
    _host_state,
    _placement,
    config,
    metrics_dict,
)
from .core import staleness as _staleness
from .paths import UpdateMap
from .placement import Placement

__all__ = ["WeightSync"]


class WeightSync:
    """Host hook for Python training loops (torchrl ``UpdateWeights``).

    Holds a :class:`~jaxweight.sync.SyncConfig` and the counters, and runs the
    two halves of :func:`~jaxweight.sync.tick` (the counting rule and the copying
    rule, the same functions) once per call; the counters stay Python ints
    between calls (no device round trip), :attr:`state` is the
    :class:`~jaxweight.sync.SyncState` view of them. Call it
    once per collected batch (torchrl's ``post_steps``), including batches on
    which optimisation was skipped during warm-up; to count optimiser steps
    instead, call it after each optimiser step.

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
        (:func:`jaxweight.distributed.broadcast_weight_sync`). With a transport
        every call is in copy mode.

    Attributes:
      config: the :class:`~jaxweight.sync.SyncConfig`.
      state: the :class:`~jaxweight.sync.SyncState` (settable, e.g. after loading a checkpoint).
      fired: whether the last call synced.

    Example::

        hook = WeightSync(4, placement=jax.devices()[1])
        actor = sync.place(learner, jax.devices()[1])
        for batch in collector:
            ...
            actor = hook(learner, actor)
        checkpoint.save_json("sync.json", hook.state_dict())
    """

    def __init__(self, interval: int, placement: Placement = None, update_map: UpdateMap | None = None,
                 copy_on_same_device: bool = False, *, donate: bool = True,
                 transport: Callable[[Any, Any], Any] | None = None):
        self.config = config(interval, placement, update_map, copy_on_same_device=bool(copy_on_same_device),
                             donate=bool(donate))
        # a host object: its interval is a Python int (a traced one is refused here, not by int() below)
        _util.check_value(self.config.interval, "interval", ge=1, finite=False, static=True)
        if transport is not None and not callable(transport):
            raise ValueError(f"transport must be a callable (tree, placement) -> tree, got {transport!r}")
        self.transport = transport
        self.fired = False
        self._interval = int(self.config.interval)
        self._placement = _placement(self.config)
        self._set(0, 0, 0)

    def _set(self, counter: int, version: int, last_sync: int) -> None:
        self._counts = (counter, version, last_sync)
        self._state_cache: SyncState | None = None

    # -- settings, read-only views of the config
    @property
    def interval(self) -> int:
        return self._interval

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def update_map(self) -> tuple[tuple[str, str], ...] | None:
        return self.config.update_map

    @property
    def copy_on_same_device(self) -> bool:
        return self.config.copy_on_same_device

    @property
    def donate(self) -> bool:
        return self.config.donate

    # -- state
    @property
    def state(self) -> SyncState:
        if self._state_cache is None:
            self._state_cache = _host_state(*self._counts)
        return self._state_cache

    @state.setter
    def state(self, value: SyncState) -> None:
        _check_state(value)
        self._set(*_host_counters(value))

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
                                  counters_traced=False, transport=self.transport)
        self._set(c, v, s)  # only once the actor update went through
        self.fired = fired
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
        self._set(*_check_load(d))
        self.fired = False

    def __repr__(self) -> str:
        c, v, s = self._counts
        return f"WeightSync(interval={self.interval}, counter={c}, version={v}, last_sync={s})"

