"""The pure pair of :mod:`jaxweight.sync`: ``config`` / ``init`` / ``tick``.

One implementation of the torchrl ``UpdateWeights`` counting and copying rule;
:class:`~jaxweight.sync.WeightSync` (the host hook), :func:`donated_tick` (the
jitted, donating path) and the deprecated spellings all call :func:`tick`.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    _shares_buffers,
    _transfer,
)

Array = jax.Array

__all__ = [
    "DEFAULT_INTERVAL",
    "SyncConfig",
    "SyncState",
    "config",
    "init",
    "tick",
    "donated_tick",
    "staleness",
    "metrics_dict",
    "init_sync",
    "make_tick",
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

    Attributes:
      interval: i32[] ticks between syncs (>= 1). An array leaf: sweep or vmap
        it, and a new value never recompiles a jitted tick.
      placement: static; None, a ``jax.Device``, a ``jax.sharding.Sharding`` or
        (frozen, hashable) a pytree of Shardings matching the actor tree.
      update_map: static tuple of ``(dest_path, src_path)`` pairs, or None.
      copy_on_same_device: static; keep a delayed copy even without a placement.
      donate: static; eager ticks free the replaced actor buffers before the
        transfer of a fire (the passed-in actor becomes invalid).
    """

    interval: Array
    placement: Any = struct.field(pytree_node=False, default=None)
    update_map: tuple[tuple[str, str], ...] | None = struct.field(pytree_node=False, default=None)
    copy_on_same_device: bool = struct.field(pytree_node=False, default=False)
    donate: bool = struct.field(pytree_node=False, default=False)


def _check_interval(interval: Any) -> Any:
    """The interval as an i32[] leaf (NumPy when concrete: eager ticks read it for free)."""
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
) -> SyncConfig:
    """Build a :class:`SyncConfig`; every check runs here.

    Args:
      interval: int >= 1 (or an integer array / traced value): ticks between syncs.
      placement: where the actor lives: None (the learner's devices: the actor
        reads the learner params, no copy), a ``jax.Device``, a
        ``jax.sharding.Sharding`` (e.g. ``NamedSharding(actor_mesh, P())``) or a
        pytree of Shardings matching the actor tree.
      update_map: ``{dest_path_in_actor: src_path_in_learner}`` or ``(dest, src)``
        pairs (paths as in :func:`~jaxweight.sync.resolve_path`).
      copy_on_same_device: copy on fires even without a placement: the actor
        holds a delayed copy that only changes on fires.
      donate: eager ticks delete the replaced actor buffers (those nothing else
        uses) before a fired transfer, so the actor's devices never hold two
        copies. Under jit use :func:`donated_tick`.

    Returns:
      The frozen config (``interval`` is an i32[] leaf; the rest is static and hashable).

    Raises:
      ValueError: ``"interval must be >= 1, got 0"`` (eagerly, and under
        ``jaxweight.checked(jax.jit(...))`` for a traced interval), a
        non-integer interval, a bad placement, a bad or overlapping update map.

    Example::

        cfg = sync.config(4, placement=jax.devices()[1])
    """
    iv = _check_interval(interval)
    frozen = _freeze_placement(placement)
    umap = freeze_update_map(update_map)
    if umap is not None:  # syntax and overlap checks up front
        for d, s in umap:
            parse_path(d), parse_path(s)
        _checked_overlap(umap)
    for v, n in ((copy_on_same_device, "copy_on_same_device"), (donate, "donate")):
        if not isinstance(v, bool | np.bool_):
            raise ValueError(f"{n} must be a bool, got {v!r}")
    return SyncConfig(interval=iv, placement=frozen, update_map=umap,
                      copy_on_same_device=bool(copy_on_same_device), donate=bool(donate))


def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, SyncConfig):
        raise ValueError(f"cfg must be a SyncConfig (from sync.config()), got {type(cfg).__name__}")


# ==================================================================== state
def staleness(state: SyncState) -> Array:
    """i32[...] ``counter - last_sync``: ticks since the actor's weights were last synced.

    The one definition: :attr:`SyncState.staleness`, ``WeightSync.staleness`` and
    :func:`metrics_dict` all use it.
    """
    return state.counter - state.last_sync


@struct.dataclass
class SyncState:
    """Counters of a weight sync.

    Attributes:
      counter: i32[] ticks so far (collected batches).
      version: i32[] number of syncs that fired.
      last_sync: i32[] ``counter`` at the last fire (0 if none).

    Eager ticks keep the counters as NumPy ``int32`` scalars (no device round
    trip per tick); under jit they are jax arrays. Both checkpoint the same.
    """

    counter: Array
    version: Array
    last_sync: Array

    @property
    def staleness(self) -> Array:
        """i32[] ticks since the actor's weights were last synced (:func:`staleness`)."""
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


def init_sync() -> SyncState:
    """Deprecated: use ``sync.init(cfg)``."""
    _util.warn_deprecated("jaxweight.sync.init_sync()", "jaxweight.sync.init(cfg)")
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
                "use jax.vmap(tick, ...) for a batch of SyncStates"
            )


# ===================================================================== tick
def _count(c: Any, v: Any, s: Any, interval: Any) -> tuple[Any, Any, Any, Any]:
    """THE counting rule: ``counter += 1``; on a multiple of ``interval``: ``version += 1``,
    ``last_sync = counter``. On host ints (eager ticks, the host hook) or traced i32[] alike."""
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


_TRUE, _FALSE = np.asarray(True), np.asarray(False)
_TRUE.flags.writeable = _FALSE.flags.writeable = False  # shared by every eager tick


def _host_scalar(x: Any) -> bool:
    return type(x) is np.ndarray and x.ndim == 0


def _actor_update(learner: Any, actor: Any, cfg: SyncConfig, placement: Placement, fired: Any,
                  counters_traced: bool, transport=None) -> Any:
    """The copying rule: the new actor params for a tick whose fire flag is ``fired``
    (a host bool, or a traced ``bool[]``); ``transport`` replaces ``jax.device_put`` on eager fires."""
    update_map = cfg.update_map
    if transport is None and _same_device_mode(learner, update_map, placement, cfg.copy_on_same_device,
                                               counters_traced):
        if update_map is None:
            _check_same_tree(learner, actor, "learner_params", "actor_params")
            return learner
        return apply_update_map(actor, learner, update_map)

    if counters_traced or any(_is_tracer(x) for x in jax.tree_util.tree_leaves((learner, actor))):
        # validate once, outside the branches, so errors surface at trace time
        _pull_sources(actor, learner, update_map, placement, lambda t, p: t)

        def fire(lp, ap):
            new = _pull_sources(ap, lp, update_map, None, lambda t, p: t)
            if placement is not None:
                # under explicit-sharding meshes the layout is part of the type: both
                # branches must return the actor's layout
                new = jax.device_put(new, placement)
            # a weakly typed learner leaf must not change the cond's output type
            return jax.tree.map(_like, new, ap)

        new_actor = jax.lax.cond(fired, fire, lambda lp, ap: ap, learner, actor)
        if placement is not None:
            new_actor = jax.device_put(new_actor, placement)
        return new_actor

    if fired:
        return _pull_sources(actor, learner, update_map, placement, transport or _transfer, free_old=cfg.donate)
    # validate on every tick, not only on fires
    if update_map is None:
        _check_same_tree(learner, actor, "learner_params", "actor_params")
    else:
        _checked_entries(actor, learner, update_map)
    return actor


def _tick(state: SyncState, learner: Any, actor: Any, cfg: SyncConfig):
    """The one tick: :func:`_count` (or its traced form) then :func:`_actor_update`."""
    # cheap checks first: an eager tick must cost a few microseconds beyond the tree check
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


def tick(state: SyncState, learner_params: Any, actor_params: Any, cfg: SyncConfig = None, *legacy: Any,
         **legacy_kw: Any) -> tuple[SyncState, Any, Array]:
    """Count one collected batch and sync the actor's weights when it fires.

    ``counter += 1``; the sync fires when the new counter is a multiple of
    ``cfg.interval``. On a fire the actor gets the learner tree (or, with an
    update map, the actor tree with the mapped subtrees replaced), placed with
    one ``jax.device_put``; ``version += 1`` and ``last_sync = counter``.

    *Same-device mode* (``cfg.placement`` None, or, outside jit, equal to where
    the learner leaves already are; and ``copy_on_same_device=False``): the
    returned actor params *are* ``learner_params`` on every tick, fired or not
    (with a map: the mapped subtrees alias the learner's leaves). Nothing is
    copied and the actor sees every optimiser update at once (torchrl: the
    collector shares the trainer's module); the counters still advance.

    Jittable (``cfg`` may be a jit argument: ``interval`` is a leaf, the rest
    static) and vmappable over independent states (and stacked configs).
    Eager ticks keep the counters on the host (NumPy ``int32``) and dispatch
    nothing unless a sync fires. Inside jit a placement acts as a sharding
    constraint and the copy runs under ``lax.cond``, only when it fires; every
    array of one jitted call must live on the same devices, so a sync *between*
    device sets (learner mesh -> actor mesh) is an eager tick (one
    ``device_put`` of the whole tree) or :class:`~jaxweight.sync.WeightSync`.

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

        cfg = sync.config(3, placement=jax.devices()[1])
        state, actor = sync.init(cfg), sync.place(learner, jax.devices()[1])
        state, actor, fired = sync.tick(state, learner, actor, cfg)   # fires on ticks 3, 6, 9, ...

    The old spelling ``tick(state, learner, actor, interval, placement=None,
    update_map=None, copy_on_same_device=False, *, donate_actor=False)`` still
    works with a ``DeprecationWarning``.
    """
    if isinstance(cfg, SyncConfig) and not legacy and not legacy_kw:
        return _tick(state, learner_params, actor_params, cfg)
    if isinstance(cfg, SyncConfig):
        raise TypeError("tick(state, learner_params, actor_params, cfg) takes no further arguments")
    head = () if cfg is None else (cfg,)
    return _tick_legacy(state, learner_params, actor_params, *head, *legacy, **legacy_kw)


_LEGACY_NAMES = ("interval", "placement", "update_map", "copy_on_same_device")


def _tick_legacy(state, learner_params, actor_params, interval=None, *args, **kw):
    _util.warn_deprecated(
        "jaxweight.sync.tick(state, learner, actor, interval, placement, update_map, ...)",
        "jaxweight.sync.tick(state, learner, actor, sync.config(interval, placement, update_map))")
    opts: dict[str, Any] = dict(zip(_LEGACY_NAMES[1:], args))
    if len(args) > 3:
        raise TypeError("tick() got too many positional arguments")
    donate = bool(kw.pop("donate_actor", False))
    if "interval" in kw:
        if interval is not None:
            raise TypeError("tick() got multiple values for argument 'interval'")
        interval = kw.pop("interval")
    for k in list(kw):
        if k not in _LEGACY_NAMES[1:]:
            raise TypeError(f"tick() got an unexpected keyword argument {k!r}")
        opts[k] = kw.pop(k)
    if interval is None:
        raise TypeError("tick() missing its cfg argument (sync.config(interval, ...))")
    cfg = config(interval, opts.get("placement"), opts.get("update_map"),
                 copy_on_same_device=bool(opts.get("copy_on_same_device", False)), donate=donate)
    return _tick(state, learner_params, actor_params, cfg)


# ============================================================ jitted paths
def _tick_pure(state, learner_params, actor_params, cfg):
    return _tick(state, learner_params, actor_params, cfg)


_tick_jit = jax.jit(_tick_pure)
_tick_jit_donating = jax.jit(_tick_pure, donate_argnames=("actor_params",))


def donated_tick(state: SyncState, learner_params: Any, actor_params: Any,
                 cfg: SyncConfig) -> tuple[SyncState, Any, Array]:
    """``jax.jit(tick)`` with the old actor donated: the documented jitted path.

    In copy mode (a placement or ``copy_on_same_device``) the actor buffers are
    donated: between fires they are passed through in place, on a fire the new
    weights are written into the old actor's memory, so the actor's devices
    never hold two copies. An actor that still shares buffers with the learner
    (``place`` of a tree already at the placement) is not donated (that would
    delete the learner's weights). One compilation per config layout; a new
    ``interval`` value compiles nothing. All arguments must live on the jitted
    computation's devices (e.g. one mesh); between device sets use :func:`tick`
    eagerly or :class:`~jaxweight.sync.WeightSync`.

    Example::

        cfg = sync.config(4, placement=NamedSharding(mesh, P()))
        state, actor, fired = sync.donated_tick(state, learner, actor, cfg)   # old actor donated
    """
    _check_cfg(cfg)
    if not (cfg.copy_on_same_device or cfg.placement is not None):
        return _tick_jit(state, learner_params, actor_params, cfg)
    leaves = jax.tree_util.tree_leaves(actor_params)
    # XLA refuses (and may crash on) a donated buffer that is also passed as another
    # argument, e.g. an actor that still aliases the learner after place()
    if any(_is_tracer(x) or not isinstance(x, jax.Array) for x in leaves) or _shares_buffers(
            actor_params, learner_params):
        return _tick_jit(state, learner_params, actor_params, cfg)
    return _tick_jit_donating(state, learner_params, actor_params, cfg)


def make_tick(interval: int, placement: Placement = None, update_map: UpdateMap | None = None,
              copy_on_same_device: bool = False, *, donate: bool = True):
    """Deprecated: use ``sync.donated_tick(state, learner, actor, sync.config(...))`` (or ``jax.jit(sync.tick)``)."""
    _util.warn_deprecated("jaxweight.sync.make_tick(interval, ...)",
                          "jaxweight.sync.donated_tick(state, learner, actor, sync.config(interval, ...))")
    cfg = config(interval, placement, update_map, copy_on_same_device=copy_on_same_device)
    _util.check_value(cfg.interval, "interval", ge=1, finite=False, static=True)  # captured by the returned closure
    run = donated_tick if donate else _tick_jit

    def step(state, learner_params, actor_params):
        return run(state, learner_params, actor_params, cfg)

    return step


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
