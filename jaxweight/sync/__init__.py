"""Learner -> actor weight sync (torchrl ``UpdateWeights``) as one pure, jittable step.

The data collector (the *actor*) acts with a copy of the policy that may live on
other devices; every ``interval`` collected batches the learner's weights are
pushed to that copy with one ``jax.device_put`` (parameters *and* buffers).
Without a placement the actor reads the learner params directly: no copy, and
the counters still advance. :class:`WeightSync` is the host hook over the same
:func:`step`; :func:`broadcast_weight_sync` its multi-host form. Files:
``core.py`` (config / state / step), ``paths.py`` (update maps),
``placement.py`` (placement and transfer), ``hook.py`` (host hooks).

Example::

    import jax, jax.numpy as jnp
    from jaxweight import sync

    cfg = sync.config(2, placement=jax.devices()[-1], copy_on_same_device=True)   # every 2 steps
    learner = {"w": jnp.zeros(4)}
    state, actor = sync.init(cfg), sync.place(learner, jax.devices()[-1], copy=True)
    for t in range(5):
        learner = {"w": learner["w"] + 1.0}                  # an optimiser step
        state, actor, fired = sync.step(state, learner, actor, cfg)
    assert int(state.version) == 2 and float(actor["w"][0]) == 4.0   # last synced at step 4
    logs = sync.metrics_dict(state)          # {"sync/version": 2.0, "sync/staleness": 1.0, ...}
"""

from .core import DEFAULT_INTERVAL, SyncConfig, SyncState, config, init, metrics_dict, staleness, step
from .hook import WeightSync, broadcast_weight_sync
from .paths import UpdateMap, apply_update_map, freeze_update_map, parse_path, resolve_path
from .placement import Placement, place

__all__ = [
    "DEFAULT_INTERVAL",
    "SyncConfig",
    "SyncState",
    "UpdateMap",
    "Placement",
    "config",
    "init",
    "step",
    "staleness",
    "metrics_dict",
    "place",
    "resolve_path",
    "apply_update_map",
    "parse_path",
    "freeze_update_map",
    "WeightSync",
    "broadcast_weight_sync",
]
