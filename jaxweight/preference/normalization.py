"""Normalising predicted rewards (imitation ``NormalizedRewardNet`` with ``RunningNorm`` / ``EMANorm``).

For prediction only: training always sees raw rewards, as in imitation. One
component: :func:`config` (``kind`` static, ``decay`` and ``eps`` array
leaves), :func:`init`, :func:`step` (normalise with the current statistics,
then fold the batch in; non-finite or masked entries never count),
:func:`apply` (normalise only) and :func:`metrics_dict`.

Example::

    import jax.numpy as jnp
    from jaxweight.preference import normalization as rn
    cfg = rn.config("ema", decay=0.9)
    state = rn.init(cfg)
    state, out = rn.step(state, jnp.array([1.0, 2.0, 3.0]), cfg)   # out: normalised by the old statistics
    assert rn.metrics_dict(state, cfg)["reward_norm/mean"] == 2.0
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import check_choice, check_value
from ._training_config import _known

Array = jax.Array

__all__ = ["RewardNormConfig", "RewardNormState", "config", "init", "step", "apply", "metrics_dict"]

_RANGES = {"decay": dict(gt=0.0, lt=1.0), "eps": dict(ge=0.0)}


@struct.dataclass
class RewardNormConfig:
    """Settings of the normaliser.

    Attributes:
      kind: ``"running"`` (Chan et al. parallel update) or ``"ema"`` (static).
      decay: ``f32[]`` EMA decay in ``(0, 1)``.
      eps: ``f32[]`` added to the variance before the square root (>= 0).
    """

    kind: str = struct.field(pytree_node=False, default="running")
    decay: Any = 0.99
    eps: Any = 1e-5

    def __post_init__(self):
        check_choice(self.kind, "kind", ("running", "ema"))
        for name, rng in _RANGES.items():
            if _known(getattr(self, name)):
                check_value(getattr(self, name), name, **rng)


@struct.dataclass
class RewardNormState:
    """Running statistics of the rewards seen.

    Attributes:
      mean, var: ``f32[]`` running mean and (population) variance; start at 0 and 1.
      count: ``i32[]`` number of values seen.
      inv_learning_rate: ``f32[]`` EMA only: ``sum_k decay**k`` over the batches seen.
      num_batches: ``i32[]`` number of updates.
    """

    mean: Array
    var: Array
    count: Array
    inv_learning_rate: Array
    num_batches: Array


def config(kind: str = "running", decay: Any = 0.99, eps: Any = 1e-5) -> RewardNormConfig:
    """Validate and build a :class:`RewardNormConfig`.

    Raises:
      ValueError: an unknown ``kind``; ``decay`` outside ``(0, 1)``; ``eps`` negative; NaN or inf
        (through ``jaxweight.checked`` when traced).
    """
    check_value(decay, "decay", **_RANGES["decay"])
    check_value(eps, "eps", **_RANGES["eps"])
    return RewardNormConfig(kind=kind, decay=jnp.asarray(decay, jnp.float32), eps=jnp.asarray(eps, jnp.float32))


def init(cfg: RewardNormConfig, key: Any = None) -> RewardNormState:
    """The identity normaliser (mean 0, var 1); ``key`` is unused."""
    return RewardNormState(
        mean=jnp.zeros((), jnp.float32), var=jnp.ones((), jnp.float32), count=jnp.zeros((), jnp.int32),
        inv_learning_rate=jnp.zeros((), jnp.float32), num_batches=jnp.zeros((), jnp.int32),
    )


def _update(state: RewardNormState, batch: Array, cfg: RewardNormConfig, mask: Array | None) -> RewardNormState:
    x = jnp.asarray(batch, jnp.float32).reshape(-1)
    m = jnp.ones(x.shape, bool) if mask is None else jnp.broadcast_to(jnp.asarray(mask, bool), jnp.shape(batch)).reshape(-1)
    m = m & jnp.isfinite(x)  # NaN / inf rewards never reach the statistics
    x = jnp.where(m, x, 0.0)
    n_i = jnp.sum(m, dtype=jnp.int32)
    n = n_i.astype(jnp.float32)
    safe_n = jnp.maximum(n, 1.0)
    b_mean = jnp.sum(jnp.where(m, x, 0.0)) / safe_n
    b_var = jnp.sum(jnp.where(m, jnp.square(x - b_mean), 0.0)) / safe_n
    delta = b_mean - state.mean
    if cfg.kind == "running":
        old = state.count.astype(jnp.float32)
        tot = old + n
        safe_tot = jnp.maximum(tot, 1.0)
        new_mean = state.mean + delta * n / safe_tot
        new_var = (state.var * old + b_var * n + jnp.square(delta) * old * n / safe_tot) / safe_tot
        new = state.replace(mean=new_mean, var=new_var, count=state.count + n_i, num_batches=state.num_batches + 1)
    else:
        inv_lr = state.inv_learning_rate + cfg.decay ** state.num_batches.astype(jnp.float32)
        lr = 1.0 / inv_lr
        new_mean = state.mean + lr * delta
        new_var = state.var + lr * (b_var + (1.0 - lr) * jnp.square(delta) - state.var)
        new = state.replace(mean=new_mean, var=new_var, count=state.count + n_i, inv_learning_rate=inv_lr,
                            num_batches=state.num_batches + 1)
    return jax.tree.map(lambda a, b: jnp.where(n_i > 0, a, b), new, state)


def apply(state: RewardNormState, rewards: Array, cfg: RewardNormConfig) -> Array:
    """``(r - mean) / sqrt(var + eps)`` with the current statistics."""
    return (jnp.asarray(rewards, jnp.float32) - state.mean) / jnp.sqrt(state.var + cfg.eps)


def step(state: RewardNormState, rewards: Array, cfg: RewardNormConfig, *, mask: Array | None = None,
         update_stats: bool = True) -> tuple[RewardNormState, Array]:
    """imitation ``NormalizedRewardNet.predict_processed``: normalise with the current statistics, then
    (``update_stats``) fold the raw rewards in (imitation ``update_stats``).

    Args:
      state: current statistics.
      rewards: ``f32[...]`` rewards.
      cfg: the normaliser's config.
      mask: optional ``bool[...]``: only True entries count. Non-finite entries
        never count; a batch without a (finite) entry leaves the state unchanged.
      update_stats: fold the batch into the statistics.

    Returns:
      ``(state, normalized f32[...])``.
    """
    out = apply(state, rewards, cfg)
    if update_stats:
        state = _update(state, rewards, cfg, mask)
    return state, out


def metrics_dict(state: RewardNormState, cfg: RewardNormConfig | None = None) -> dict[str, float]:
    """``{"reward_norm/mean", "reward_norm/std", "reward_norm/count"}`` (host side; averaged over a seed axis)."""
    mean, var, count = (np.asarray(x, np.float64) for x in jax.device_get((state.mean, state.var, state.count)))
    return {"reward_norm/mean": float(mean.mean()), "reward_norm/std": float(np.sqrt(var).mean()),
            "reward_norm/count": float(count.mean())}
