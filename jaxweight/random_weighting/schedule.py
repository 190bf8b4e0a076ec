"""Whole schedules: the log-weights of a batch of rollouts, ``f32[T, S, K]``, in one call.

:func:`sample_schedule` equals the loop over :func:`~jaxweight.random_weighting.init` /
:func:`~jaxweight.random_weighting.step` with the documented key splits, bit for bit under jit.
With threefry keys (the default) it computes the threefry hashes of the two large
split levels itself, unrolled and fused with the normal transform; other key
implementations run the loop itself (``init``/``step`` mapped over the keys).

Example::

    import jax
    from jaxweight import random_weighting as rw

    sample = jax.jit(rw.sample_schedule, static_argnums=(2, 3))
    lw = sample(jax.random.key(0), rw.config(), 100, 20)        # f32[100, 20, 10]

References:
  J. K. Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011
  (the Threefry-2x32 hash that ``jax.random`` uses).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._util import check_static_int
from .law import _SQRT2, RandomWeightingConfig, _base, _draw, check_config, check_key, init, step

Array = jax.Array

# Below this many (trajectory, step) pairs the draws are one fused [T, S, K] kernel;
# above it, one [T, S] kernel per component (see _fused).
_SCAN_MIN_PAIRS = 4096
_R0 = (13, 15, 26, 6)
_R1 = (17, 29, 16, 24)


class Schedule(NamedTuple):
    """A batch of rollouts' log-weights and their trajectory bases (unpacks as a pair).

    Attributes:
      log_weights: f32[T, S, K]: ``log_weights[j, t]`` = trajectory ``j`` after its ``(t+1)``-th step.
      base: f32[T, K] the base of each trajectory.
    """

    log_weights: Array
    base: Array


def _threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """Threefry-2x32 (20 rounds), unrolled; the same hash as jax's ``threefry2x32_p``.

    jax lowers its primitive on CPU as a rolled 5-iteration loop whose every
    iteration materialises two arrays the size of the output; written out as
    plain integer ops XLA fuses the whole hash (and what consumes it) into one
    pass over memory. Integer arithmetic, so the bits are identical.
    """
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for i in range(5):   # unrolled rounds of the hash (a fixed 20), not a loop over items
        for r in (_R0, _R1)[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _fused(key: Array, cfg: RandomWeightingConfig, T: int, S: int) -> tuple[Array, Array]:
    """The key contract, with the two large levels hashed by hand.

    With ``jax_threefry_partitionable`` (the default since jax 0.5),
    ``split(k, n)[i] = threefry(k, (0, i))`` and 32-bit word ``i`` of
    ``random_bits(k)`` is ``xor(threefry(k, (0, i)))``, both elementwise in
    ``i``. The small levels (trajectory keys [T], init/step keys [T, 2],
    bases [T, K]) go through ``jax.random``; the step keys [T, S] and the step
    draws [T, S, K] are unrolled hashes that XLA fuses with the normal
    transform. Above ``_SCAN_MIN_PAIRS`` the last level runs with the long
    [T*S] axis innermost, one component per iteration of a scan: with K
    innermost the CPU code is not vectorised, and the scan keeps XLA from
    recomputing the [T, S] keys K times. One transpose puts K last.
    """
    K = len(cfg.components)
    pairs = jax.vmap(jax.random.split)(jax.random.split(key, T))                # [T, 2]
    base = jax.vmap(_base, in_axes=(0, None))(pairs[:, 0], cfg)                  # [T, K]
    if T * S == 0:
        return jnp.zeros((T, S, K), jnp.float32), base
    kd = jax.random.key_data(pairs[:, 1])                                        # u32[T, 2]
    zero = np.uint32(0)
    s0, s1 = _threefry2x32(kd[:, :1], kd[:, 1:], zero, lax.iota(jnp.uint32, S)[None])   # split(k_steps, S)
    step_scale = cfg.step_sigma * _SQRT2
    if T * S < _SCAN_MIN_PAIRS:
        g0, g1 = _threefry2x32(s0[..., None], s1[..., None], zero, lax.iota(jnp.uint32, K))
        return _draw(base[:, None, :], step_scale, g0 ^ g1, cfg.lower, cfg.upper), base

    def one_component(_, xs):
        k, base_k, scale_k, lo_k, hi_k = xs
        g0, g1 = _threefry2x32(s0, s1, zero, k)
        return None, _draw(base_k[:, None], scale_k, g0 ^ g1, lo_k, hi_k)

    xs = (lax.iota(jnp.uint32, K), base.T, step_scale, cfg.lower, cfg.upper)
    _, out = lax.scan(one_component, None, xs)                                   # [K, T, S]
    return jnp.transpose(out, (1, 2, 0)), base


def _by_definition(key: Array, cfg: RandomWeightingConfig, T: int, S: int) -> tuple[Array, Array]:
    """The key contract as written: ``init``/``step`` mapped over the split keys.

    For keys the fused hash does not reproduce: vmapped for threefry (any
    ``jax_threefry_partitionable``), a sequential ``lax.map`` for other
    implementations (``rbg``'s draws change under ``vmap``).
    """
    K = len(cfg.components)
    threefry = str(jax.random.key_impl(key)) == "threefry2x32"
    mapper = jax.vmap if threefry else (lambda f: functools.partial(lax.map, f))

    def trajectory(k):
        k_init, k_steps = jax.random.split(k)
        s = init(cfg, k_init)
        if S == 0:
            return jnp.zeros((0, K), jnp.float32), s.base_log_weights
        lw = mapper(lambda ks: step(s, ks, cfg).log_weights)(jax.random.split(k_steps, S))
        return lw, s.base_log_weights

    if T == 0:
        return jnp.zeros((0, S, K), jnp.float32), jnp.zeros((0, K), jnp.float32)
    return mapper(trajectory)(jax.random.split(key, T))


def sample_schedule_with_base(key: Any, cfg: RandomWeightingConfig, num_trajectories: int,
                              num_steps: int) -> Schedule:
    """Log-weights of a whole batch of rollouts and their bases: ``Schedule(f32[T, S, K], f32[T, K])``.

    ``log_weights[j, t]`` holds the log-weights of trajectory ``j`` after its
    ``(t+1)``-th :func:`step`: the weights step ``t`` of a refinement uses when
    weights are resampled every step. Jitted, the result equals this loop of
    jitted ``init``/``step`` bit for bit (op by op, XLA may round
    ``mean + scale * z`` differently from the fused multiply-add under jit)::

        kt = jax.random.split(key, num_trajectories)
        k_init, k_steps = jax.random.split(kt[j])
        s = init(cfg, k_init)                                        # -> base[j]
        s = step(s, jax.random.split(k_steps, num_steps)[t], cfg)   # -> log_weights[j, t]

    Args:
      key: ``jax.random.key`` or an int seed.
      cfg: from :func:`config`.
      num_trajectories: static int >= 0 (T).
      num_steps: static int >= 0 (S).

    Raises:
      ValueError: a negative or non-int size, a batched key, a bad config.
    """
    K = check_config(cfg)
    T = check_static_int(num_trajectories, "num_trajectories", 0)
    S = check_static_int(num_steps, "num_steps", 0)
    if max(T, S, K) >= 2**32:
        raise ValueError("num_trajectories, num_steps and the number of components must be < 2**32")
    key = check_key(key)
    fused = str(jax.random.key_impl(key)) == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)
    return Schedule(*(_fused if fused else _by_definition)(key, cfg, T, S))


def sample_schedule(key: Any, cfg: RandomWeightingConfig, num_trajectories: int, num_steps: int) -> Array:
    """The log-weights of :func:`sample_schedule_with_base`: ``f32[T, S, K]``.

    Jit it with the sizes static: ``jax.jit(sample_schedule, static_argnums=(2, 3))``.

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import random_weighting as rw

        lw = rw.sample_schedule(jax.random.key(0), rw.config(), 50, 8)   # f32[50, 8, 10]
        w = jnp.exp(lw)
    """
    return sample_schedule_with_base(key, cfg, num_trajectories, num_steps).log_weights
