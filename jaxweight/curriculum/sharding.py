"""Sharded pools: the ``[N]`` leaves of the state split over a 1-D device mesh."""

from __future__ import annotations

import jax

from ._config import CurriculumConfig
from .state import CurriculumState

__all__ = ["state_sharding", "shard_state"]


def state_sharding(cfg: CurriculumConfig, mesh: jax.sharding.Mesh, axis: str | None = None
                   ) -> CurriculumState:
    """Shardings that split the ``[N]`` leaves over a 1-D ``mesh`` axis (rest replicated).

    Use as ``jax.jit(..., in_shardings=..., out_shardings=...)`` or with
    :func:`shard_state`. ``capacity`` must divide evenly over the axis.
    """
    from jax.sharding import NamedSharding, PartitionSpec as P

    axis = axis if axis is not None else mesh.axis_names[0]
    ndev = mesh.shape[axis]
    if cfg.capacity % ndev:
        raise ValueError(f"capacity ({cfg.capacity}) must be a multiple of the {ndev} devices of axis {axis!r}")
    pool, rep = NamedSharding(mesh, P(axis)), NamedSharding(mesh, P())
    return CurriculumState(ema=pool, count=pool, last_update=pool, boundaries=rep,
                           has_boundaries=rep, last_rebin_count=rep, total_updates=rep)


def shard_state(state: CurriculumState, cfg: CurriculumConfig, mesh: jax.sharding.Mesh,
                axis: str | None = None) -> CurriculumState:
    """``jax.device_put`` the state with :func:`state_sharding`.

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import curriculum as cur

        mesh = jax.make_mesh((len(jax.devices()),), ("pool",), axis_types=(jax.sharding.AxisType.Auto,))
        cfg = cur.config(capacity=128 * len(jax.devices()))
        state = cur.shard_state(cur.init(cfg), cfg, mesh)
        state = jax.jit(cur.update, donate_argnums=0)(state, jnp.arange(4), jnp.ones(4), cfg)  # stays sharded
        assert state.ema.sharding.spec == jax.sharding.PartitionSpec("pool")
    """
    return jax.device_put(state, state_sharding(cfg, mesh, axis))
