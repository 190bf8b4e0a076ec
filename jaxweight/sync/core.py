"""The pure part of :mod:`jaxweight.sync`: ``config`` / ``init`` / ``step``.

One implementation of the torchrl ``UpdateWeights`` counting and copying rule;
the host hook :class:`~jaxweight.sync.WeightSync`, jitted loops and the
multi-device paths all call :func:`step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import _util
from ..metrics import flatten
from .paths import (
    UpdateMap,
    _check_same_tree,
    _checked_entries,
    _checked_overlap,
    apply_update_map,
    freeze_update_map,
    parse_path,
)
from .placement import (
    Placement,
    _check_placement,
    _is_placement_leaf,
    _is_tracer,
    _pull_sources,
    _same_device_mode,
    _transfer,
)

Array = jax.Array

__all__ = [
    "DEFAULT_INTERVAL",
    "SyncConfig",
    "SyncState",
    "config",
    "init",
    "step",
    "staleness",
    "metrics_dict",
]

# torchrl's ``make_trainer`` registers ``UpdateWeights(collector, 1)``: sync after every batch.
DEFAULT_INTERVAL = 1


# =================================================================== config
class _FrozenPlacement:
    """A pytree of Shardings made hashable, so a config holding it can be a static jit value."""

    __slots__ = ("treedef", "leaves")

    def __init__(self, tree: Any):
        leaves, self.treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_placement_leaf)
        self.leaves = tuple(leaves)

    def tree(self) -> Any:
        return jax.tree_util.tree_unflatten(self.treedef, self.leaves)

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, _FrozenPlacement) and self.treedef == other.treedef
                and self.leaves == other.leaves)

    def __hash__(self) -> int:
        return hash((self.treedef, self.leaves))

    def __repr__(self) -> str:
        return f"FrozenPlacement({self.tree()!r})"


def _freeze_placement(placement: Placement) -> Any:
    if isinstance(placement, _FrozenPlacement):
        return placement
    _check_placement(placement)
    if placement is None or _is_placement_leaf(placement):
        return placement
    return _FrozenPlacement(placement)


def _placement(cfg: SyncConfig) -> Placement:
    p = cfg.placement
    return p.tree() if isinstance(p, _FrozenPlacement) else p


@struct.dataclass
class SyncConfig:
    """Settings of a weight sync; build it with :func:`config`.

    The constructor (also through ``replace``) runs the checks of :func:`config`
    on concrete values and freezes the placement and the update map.

    Attributes:
      interval: i32[] steps between syncs (>= 1). An array leaf: sweep or vmap
        it, and a new value never recompiles a jitted step.
      placement: static; None, a ``jax.Device``, a ``jax.sharding.Sharding`` or
        (frozen, hashable) a pytree of Shardings matching the actor tree.
      update_map: static tuple of ``(dest_path, src_path)`` pairs, or None.
      copy_on_same_device: static; keep a delayed copy even without a placement.
      donate: static; eager steps free the replaced actor buffers before the
        transfer of a fire (the passed-in actor becomes invalid).
      transport: static; None or a host callable ``(tree, placement) -> tree``
        that replaces ``jax.device_put`` for fired copies (eager steps only).
    """

    interval: Array
    placement: Any = struct.field(pytree_node=False, default=None)
    update_map: tuple[tuple[str, str], ...] | None = struct.field(pytree_node=False, default=None)
    copy_on_same_device: bool = struct.field(pytree_node=False, default=False)
    donate: bool = struct.field(pytree_node=False, default=False)
    transport: Callable[[Any, Any], Any] | None = struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        # the checks of :func:`config`, also for a config built directly or by ``replace``;
        # a traced interval (and jax's unflattening placeholders) is left to ``config``/checkify
        iv = self.interval
        if isinstance(iv, int | np.integer | np.ndarray | jax.Array) and not _is_tracer(iv):
            if isinstance(iv, bool | np.bool_) or np.dtype(getattr(iv, "dtype", np.int64)).kind not in "iu":
                raise ValueError(f"interval must be an integer >= 1, got {iv!r}")
            _util.check_value(iv, "interval", ge=1, finite=False)
            if np.any(np.asarray(iv) > 2**31 - 1):
                raise ValueError(f"interval must be < 2**31 (an int32 counter), got {iv!r}")
        object.__setattr__(self, "placement", _freeze_placement(self.placement))
        umap = freeze_update_map(self.update_map)
        if umap is not None:  # syntax and overlap checks up front
            for d, s in umap:
                parse_path(d), parse_path(s)
            _checked_overlap(umap)
        object.__setattr__(self, "update_map", umap)
        for v, n in ((self.copy_on_same_device, "copy_on_same_device"), (self.donate, "donate")):
            if not isinstance(v, bool | np.bool_):
                raise ValueError(f"{n} must be a bool, got {v!r}")
        if self.transport is not None and not callable(self.transport):
            raise ValueError(f"transport must be a callable (tree, placement) -> tree, got {self.transport!r}")


def _check_interval(interval: Any) -> Any:
    """The interval as an i32[] leaf (NumPy when concrete: eager steps read it for free)."""
    if isinstance(interval, bool | np.bool_) or (
            hasattr(interval, "dtype") and np.dtype(interval.dtype).kind not in "iu"
    ) or not (hasattr(interval, "dtype") or isinstance(interval, int)):
        raise ValueError(f"interval must be an integer >= 1, got {interval!r}")
    if np.ndim(interval) != 0:
        raise ValueError(f"interval must be a scalar, got shape {np.shape(interval)}")
    _util.check_value(interval, "interval", ge=1, finite=False)
    c = _util.concrete(interval)
    if c is not None:
        if int(c) > 2**31 - 1:
            raise ValueError(f"interval must be < 2**31 (an int32 counter), got {int(c)}")
        return np.asarray(c, np.int32)
    return jnp.asarray(interval, jnp.int32)


def config(
    interval: int = DEFAULT_INTERVAL,
    placement: Placement = None,
    update_map: UpdateMap | None = None,
    *,
    copy_on_same_device: bool = False,
    donate: bool = False,
    transport: Callable[[Any, Any], Any] | None = None,
) -> SyncConfig:
    """Build a :class:`SyncConfig`; every check runs here.

    Args:
      interval: int >= 1 (or an integer array / traced value): steps between syncs.
      placement: where the actor lives: None (the learner's devices: the actor
        reads the learner params, no copy), a ``jax.Device``, a
        ``jax.sharding.Sharding`` (e.g. ``NamedSharding(actor_mesh, P())``) or a
        pytree of Shardings matching the actor tree.
      update_map: ``{dest_path_in_actor: src_path_in_learner}`` or ``(dest, src)``
        pairs (paths as in :func:`~jaxweight.sync.resolve_path`).
      copy_on_same_device: copy on fires even without a placement: the actor
        holds a delayed copy that only changes on fires.
      donate: eager steps delete the replaced actor buffers (those nothing else
        uses) before a fired transfer, so the actor's devices never hold two
        copies. Under jit donate the actor instead (``donate_argnums=2``).
      transport: optional host callable ``(tree, placement) -> tree`` replacing
        ``jax.device_put`` for fired copies (e.g. a broadcast from process 0,
        :func:`~jaxweight.sync.broadcast_weight_sync`); every step is then in
        copy mode, and only eager steps are possible.

    Returns:
      The frozen config (``interval`` is an i32[] leaf; the rest is static and hashable).

    Raises:
      ValueError: ``"interval must be >= 1, got 0"`` (eagerly, and under
        ``jaxweight.checked(jax.jit(...))`` for a traced interval), a
        non-integer interval, a bad placement, a bad or overlapping update map.

    Example::

        import jax
        from jaxweight import sync

        cfg = sync.config(4, placement=jax.devices()[0])
        assert int(cfg.interval) == 4
    """
    return SyncConfig(interval=_check_interval(interval), placement=placement, update_map=update_map,
                      copy_on_same_device=copy_on_same_device, donate=donate, transport=transport)


def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, SyncConfig):
        raise ValueError(f"cfg must be a SyncConfig (from sync.config()), got {type(cfg).__name__}")


# ==================================================================== state
def staleness(state: SyncState) -> Array:
    """i32[...] ``counter - last_sync``: steps since the actor's weights were last synced.

    The one definition: :attr:`SyncState.staleness`, ``WeightSync.staleness`` and
    :func:`metrics_dict` all use it.
    """
    return state.counter - state.last_sync


@struct.dataclass
class SyncState:
    """Counters of a weight sync.

    Attributes:
      counter: i32[] steps so far (collected batches).
      version: i32[] number of syncs that fired.
      last_sync: i32[] ``counter`` at the last fire (0 if none).

    Eager steps keep the counters as NumPy ``int32`` scalars (no device round
    trip per step); under jit they are jax arrays. Both checkpoint the same.
    """

    counter: Array
    version: Array
    last_sync: Array

    @property
    def staleness(self) -> Array:
        """i32[] steps since the actor's weights were last synced (:func:`staleness`)."""
        return staleness(self)


def _zeros() -> SyncState:
    z = lambda: jnp.zeros((), jnp.int32)  # noqa: E731
    return SyncState(counter=z(), version=z(), last_sync=z())


def init(cfg: SyncConfig) -> SyncState:
    """A fresh :class:`SyncState` (all counters 0, int32 scalars).

    Args:
      cfg: from :func:`config` (the state does not depend on it; the argument
        keeps the ``init(cfg)`` shape of every jaxweight component).
    """
    _check_cfg(cfg)
    return _zeros()


def metrics_dict(state: SyncState) -> dict[str, float]:
    """``{"sync/version", "sync/staleness", "sync/counter"}`` as floats (host side).

    Batched states (vmapped) give their means (:func:`jaxweight.metrics.flatten`).
    """
    if not isinstance(state, SyncState):
        raise ValueError(f"state must be a SyncState, got {type(state).__name__}")
    return flatten({"version": state.version, "staleness": staleness(state), "counter": state.counter},
                   prefix="sync")


def _check_state(state: Any) -> None:
    if not isinstance(state, SyncState):
        raise ValueError(f"state must be a SyncState (from sync.init(cfg)), got {type(state).__name__}")
    for name in ("counter", "version", "last_sync"):
        if np.ndim(getattr(state, name)) != 0:
            raise ValueError(
                f"state.{name} must be a scalar i32[], got shape {np.shape(getattr(state, name))}; "
                "use jax.vmap(step, ...) for a batch of SyncStates"
            )


# ===================================================================== step
def _count(c: Any, v: Any, s: Any, interval: Any) -> tuple[Any, Any, Any, Any]:
    """THE counting rule: ``counter += 1``; on a multiple of ``interval``: ``version += 1``,
    ``last_sync = counter``. On host ints (eager steps, the host hook) or traced i32[] alike."""
    c = c + 1
    fired = c % interval == 0
    if isinstance(fired, bool):
        return (c, v + 1, c, True) if fired else (c, v, s, False)
    return c, jnp.where(fired, v + 1, v), jnp.where(fired, c, s), fired


def _advance_traced(state: SyncState, interval: Any) -> tuple[SyncState, Array]:
    i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    # an interval < 1 is reported by checkify; the maximum keeps the remainder defined meanwhile
    c, v, s, fired = _count(i32(state.counter), i32(state.version), i32(state.last_sync),
                            jnp.maximum(i32(interval), 1))
    return SyncState(counter=c, version=v, last_sync=s), fired


def _host_counters(state: SyncState) -> tuple[int, int, int]:
    leaves = (state.counter, state.version, state.last_sync)
    if not all(type(x) is np.ndarray for x in leaves):
        leaves = jax.device_get(leaves)  # one round trip, then NumPy for good
    return int(leaves[0]), int(leaves[1]), int(leaves[2])


def _host_state(c: int, v: int, s: int) -> SyncState:
    return SyncState(counter=np.asarray(c, np.int32), version=np.asarray(v, np.int32),
                     last_sync=np.asarray(s, np.int32))


def _interval_now(interval: Any) -> int | None:
    """The interval as a Python int when concrete (checked), else None (checked by checkify)."""
    if type(interval) is np.ndarray and interval.dtype == np.int32 and interval.ndim == 0:
        iv = int(interval)
        if iv >= 1:
            return iv
    if _is_tracer(interval):
        _util.check_value(interval, "interval", ge=1, finite=False)
        return None
    _util.check_value(interval, "interval", ge=1, finite=False)
    return int(np.asarray(interval))


def _like(new: Any, old: Any) -> Any:
    if jax.dtypes.issubdtype(old.dtype, jax.dtypes.prng_key):
        return new
    return jnp.asarray(new, dtype=old.dtype)


def _into(new: Any, old: Any) -> Any:
    """``new`` written into ``old``'s buffer: a whole-array update slice, which XLA runs in place
    in a donated actor (a plain copy gets a fresh output buffer on the CPU: a page fault per 4 KiB)."""
    new = _like(new, old)
    if new.ndim == 0 or jax.dtypes.issubdtype(old.dtype, jax.dtypes.prng_key) or new.shape != old.shape:
        return new
    return jax.lax.dynamic_update_slice(old, new, (0,) * old.ndim)


_TRUE, _FALSE = np.asarray(True), np.asarray(False)
_TRUE.flags.writeable = _FALSE.flags.writeable = False  # shared by every eager step


def _host_scalar(x: Any) -> bool:
    return type(x) is np.ndarray and x.ndim == 0


def _actor_update(learner: Any, actor: Any, cfg: SyncConfig, placement: Placement, fired: Any,
                  counters_traced: bool) -> Any:
    """The copying rule: the new actor params for a step whose fire flag is ``fired``
    (a host bool, or a traced ``bool[]``); ``cfg.transport`` replaces ``jax.device_put`` on fires."""
    update_map, transport = cfg.update_map, cfg.transport
    if transport is None and _same_device_mode(learner, update_map, placement, cfg.copy_on_same_device,
                                               counters_traced):
        if update_map is None:
            _check_same_tree(learner, actor, "learner_params", "actor_params")
            return learner
        return apply_update_map(actor, learner, update_map)

    if counters_traced or any(_is_tracer(x) for x in jax.tree_util.tree_leaves((learner, actor))):
        if transport is not None:
            raise ValueError("a sync config with a transport runs on the host: call sync.step eagerly "
                             "(not under jax.jit / vmap), e.g. through WeightSync")
        # validate once, outside the branches, so errors surface at trace time
        _pull_sources(actor, learner, update_map, placement, lambda t, p: t)

        def fire(lp, ap):
            new = _pull_sources(ap, lp, update_map, None, lambda t, p: t)
            if placement is not None:
                # under explicit-sharding meshes the layout is part of the type: both
                # branches must return the actor's layout
                new = jax.device_put(new, placement)
            # a weakly typed learner leaf must not change the cond's output type
            return jax.tree.map(_into, new, ap)

        new_actor = jax.lax.cond(fired, fire, lambda lp, ap: ap, learner, actor)
        if placement is not None:
            new_actor = jax.device_put(new_actor, placement)
        return new_actor

    if fired:
        return _pull_sources(actor, learner, update_map, placement, transport or _transfer, free_old=cfg.donate)
    # validate on every step, not only on fires
    if update_map is None:
        _check_same_tree(learner, actor, "learner_params", "actor_params")
    else:
        _checked_entries(actor, learner, update_map)
    return actor


def step(state: SyncState, learner_params: Any, actor_params: Any,
         cfg: SyncConfig) -> tuple[SyncState, Any, Array]:
    """Count one collected batch and sync the actor's weights when it fires.

    ``counter += 1``; the sync fires when the new counter is a multiple of
    ``cfg.interval``. On a fire the actor gets the learner tree (or, with an
    update map, the actor tree with the mapped subtrees replaced), placed with
    one ``jax.device_put``; ``version += 1`` and ``last_sync = counter``.

    *Same-device mode* (``cfg.placement`` None, or, outside jit, equal to where
    the learner leaves already are; and ``copy_on_same_device=False``): the
    returned actor params *are* ``learner_params`` on every step, fired or not
    (with a map: the mapped subtrees alias the learner's leaves). Nothing is
    copied and the actor sees every optimiser update at once (torchrl: the
    collector shares the trainer's module); the counters still advance.

    Jittable (``cfg`` may be a jit argument: ``interval`` is a leaf, the rest
    static; donate the actor with ``donate_argnums=2`` in copy mode) and
    vmappable over independent states. Eager steps keep the counters on the
    host (NumPy ``int32``) and dispatch nothing unless a sync fires. Inside jit
    a placement acts as a sharding constraint and the copy runs under
    ``lax.cond``, only when it fires; every array of one jitted call must live
    on the same devices, so a sync *between* device sets (learner mesh ->
    actor mesh) is an eager step (one ``device_put`` of the whole tree).

    Args:
      state: the :class:`SyncState` (scalar leaves; ``jax.vmap`` for several).
      learner_params: pytree of the learner's weights and buffers.
      actor_params: pytree of the actor's current weights: the same structure,
        shapes and dtypes as ``learner_params`` unless ``cfg.update_map`` is set.
        Initialise it with :func:`~jaxweight.sync.place` ``(learner_params, cfg.placement)``.
      cfg: from :func:`config`.

    Returns:
      ``(state, actor_params, fired)`` with ``fired: bool[]``.

    Raises:
      ValueError: a learner/actor tree mismatch (naming the first mismatching
        path), a bad update map or placement, an interval < 1 (under jit through
        ``jaxweight.checked``). KeyError: an update-map path that does not exist.

    Example::

        import jax.numpy as jnp
        from jaxweight import sync

        cfg = sync.config(3, copy_on_same_device=True)
        state, learner = sync.init(cfg), {"w": jnp.zeros(2)}
        actor = sync.place(learner, copy=True)
        fires = []
        for t in range(6):
            learner = {"w": learner["w"] + 1}
            state, actor, fired = sync.step(state, learner, actor, cfg)
            fires.append(bool(fired))
        assert fires == [False, False, True, False, False, True] and int(state.version) == 2
    """
    learner, actor = learner_params, actor_params
    # cheap checks first: an eager step must cost a few microseconds beyond the tree check
    if type(cfg) is not SyncConfig:
        _check_cfg(cfg)
    c0, v0, s0 = (state.counter, state.version, state.last_sync) if type(state) is SyncState else (None,) * 3
    on_host = _host_scalar(c0) and _host_scalar(v0) and _host_scalar(s0)
    if not on_host:
        _check_state(state)
    placement = _placement(cfg)
    iv = _interval_now(cfg.interval)
    counters_traced = iv is None or (not on_host and any(_is_tracer(x) for x in (c0, v0, s0)))
    if counters_traced:
        new_state, fired = _advance_traced(state, cfg.interval if iv is None else iv)
    else:
        # counters that are concrete (also inside a trace that closes over them) advance on the host
        c, v, s, f = _count(*((int(c0), int(v0), int(s0)) if on_host else _host_counters(state)), iv)
        new_state, fired = _host_state(c, v, s), (_TRUE if f else _FALSE)
    new_actor = _actor_update(learner, actor, cfg, placement, fired, counters_traced)
    return new_state, new_actor, fired
