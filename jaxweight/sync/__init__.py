"""Learner -> actor weight sync (torchrl ``UpdateWeights``) as one pure, jittable tick.

The data collector (the *actor*) acts with a copy of the policy that may live on
other devices; every ``interval`` collected batches the learner's current
weights are pushed to that copy. The component has the shape of every
jaxweight part::

    cfg = sync.config(interval, placement=None, update_map=None)   # frozen; interval an i32 leaf
    state = sync.init(cfg)                                          # SyncState(counter, version, last_sync)
    state, actor, fired = sync.tick(state, learner, actor, cfg)     # state, data, cfg (no key)
    sync.metrics_dict(state)                                        # {"sync/version", "sync/staleness", "sync/counter"}

Two modes:

* **Same device** (``placement`` None, or outside jit equal to where the learner
  leaves already are, and ``copy_on_same_device=False``): the actor reads the
  learner params directly. The returned actor params *are* the learner params
  on every tick, fired or not; nothing is copied (torchrl: the collector shares
  the trainer's module). The counters still advance.
* **Copy** (a ``placement`` elsewhere, or ``copy_on_same_device=True``): on a
  fire the whole tree (parameters *and* buffers such as batch statistics) is
  transferred with one ``jax.device_put``; between fires the actor keeps its
  stale copy.

The host hook :class:`WeightSync` and the jitted, donating :func:`donated_tick`
call the same :func:`tick`. Files: ``core.py`` (config / state / tick),
``paths.py`` (path grammar and update maps), ``placement.py`` (placement,
transfer, donation), ``hook.py`` (the host hook).

Example::

    from jaxweight import sync

    cfg = sync.config(4, placement=actor_device)
    state = sync.init(cfg)
    actor = sync.place(learner, actor_device)               # initial actor
    for step in range(num_steps):
        learner = train_step(learner, batch)
        state, actor, fired = sync.tick(state, learner, actor, cfg)

    # or, in a Python loop, the host hook:
    hook = sync.WeightSync(4, placement=actor_device)
    actor = hook(learner, actor)        # once per collected batch
    hook.state_dict()                   # {"counter": .., "version": .., "last_sync": ..}

Deprecated spellings (``DeprecationWarning``, same results): ``init_sync()``,
``make_tick(interval, ...)`` and ``tick(state, learner, actor, interval,
placement=None, update_map=None, copy_on_same_device=False)``.

References:
  torchrl, ``torchrl/trainers/trainers.py``, class ``UpdateWeights``
  (https://github.com/pytorch/rl).
"""

from .core import (
    DEFAULT_INTERVAL,
    SyncConfig,
    SyncState,
    config,
    donated_tick,
    init,
    init_sync,
    make_tick,
    metrics_dict,
    staleness,
    tick,
)
from .hook import WeightSync
from .paths import UpdateMap, apply_update_map, freeze_update_map, parse_path, resolve_path  # noqa: F401
from .placement import Placement, _bucket_fns, _shares_buffers, place  # noqa: F401 - the tests look at these

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
    "place",
    "resolve_path",
    "apply_update_map",
    "parse_path",
    "freeze_update_map",
    "WeightSync",
    # deprecated
    "init_sync",
    "make_tick",
]
