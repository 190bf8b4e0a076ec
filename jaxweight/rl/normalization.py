"""Running normalisation of observations for the agents (PPO's and SAC's ``normalize_observations``).

:class:`ObsNorm` holds running mean and variance in the agent state; :func:`obs_norm_update` folds a
batch of observations in, :func:`obs_norm_apply` feeds the networks ``clip((obs - mean) / std, +-10)``.

Our own, kept small: it must be array leaves of the agent state (vmapped over seeds, saved in the
loop's checkpoints); brax's ``running_statistics`` does the same but needs brax (an optional extra),
and neither optax nor flax has one.

Example::

    import jax.numpy as jnp
    from jaxweight import rl
    norm = rl.obs_norm_update(rl.obs_norm_init((2,)), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    x = rl.obs_norm_apply(norm, jnp.array([2.0, 3.0]))     # ~0: the mean of what was seen
    assert float(jnp.abs(x).max()) < 1e-3
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["ObsNorm", "OBS_CLIP", "obs_norm_init", "obs_norm_update", "obs_norm_apply"]

Array = jax.Array


@struct.dataclass
class ObsNorm:
    """Running statistics of the observations (Chan et al.'s parallel mean / variance update).

    Attributes:
      mean: ``f32[*obs_shape]``.
      m2: ``f32[*obs_shape]`` sum of squared deviations from the mean.
      count: ``f32[]`` observations seen (starts at a tiny 1e-4 so that the
        first normalisation is the identity up to 1e-4).
    """

    mean: Array
    m2: Array
    count: Array


#: normalised observations are clipped to +-this (Stable-Baselines3's VecNormalize ``clip_obs``)
OBS_CLIP = 10.0
_OBS_EPS = 1e-8


def obs_norm_init(obs_shape: Sequence[int]) -> ObsNorm:
    """Statistics of no observation: mean 0, variance 1."""
    shape = tuple(obs_shape)
    c = jnp.asarray(1e-4, jnp.float32)
    return ObsNorm(jnp.zeros(shape, jnp.float32), c * jnp.ones(shape, jnp.float32), c)


def obs_norm_update(norm: ObsNorm, obs: Array) -> ObsNorm:
    """``norm`` with the observations ``f32[..., *obs_shape]`` folded in (all leading axes are a batch)."""
    x = jnp.asarray(obs, jnp.float32).reshape((-1,) + norm.mean.shape)
    n = jnp.asarray(x.shape[0], jnp.float32)
    b_mean = jnp.mean(x, axis=0)
    b_m2 = jnp.sum(jnp.square(x - b_mean), axis=0)
    total = norm.count + n
    delta = b_mean - norm.mean
    mean = norm.mean + delta * (n / total)
    m2 = norm.m2 + b_m2 + jnp.square(delta) * (norm.count * n / total)
    return ObsNorm(mean, m2, total)


def obs_norm_apply(norm: ObsNorm | None, obs: Array) -> Array:
    """``clip((obs - mean) / sqrt(var + 1e-8), +-10)`` of ``f32[..., *obs_shape]``; ``obs`` itself for ``None``."""
    if norm is None:
        return obs
    var = norm.m2 / norm.count
    return jnp.clip((obs - norm.mean) / jnp.sqrt(var + _OBS_EPS), -OBS_CLIP, OBS_CLIP)
