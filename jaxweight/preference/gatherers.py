"""Synthetic preference teachers (imitation ``SyntheticGatherer``, plus B-Pref's noisy teachers).

Example::

    prefs, entropy = synthetic_preferences(key, pairs, temperature=1.0)        # f32[P], f32[]
    prefs, entropy, valid = synthetic_preferences(key, pairs, mistake_prob=0.1,
                                                  skip_threshold=0.0, return_valid=True)

References:
  imitation ``SyntheticGatherer`` (https://github.com/HumanCompatibleAI/imitation);
  Lee, Smith, Dragan, Abbeel (2021), "B-Pref: Benchmarking Preference-Based
  Reinforcement Learning" (https://github.com/rll-research/BPref): the
  ``mistake`` / ``equal`` / ``skip`` teachers.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from .._util import as_key, masked_mean
from .data import FragmentPairs, discounted_returns

Array = jax.Array

__all__ = ["synthetic_preferences", "binary_entropy"]


def binary_entropy(p: Array) -> Array:
    """``-p ln p - (1-p) ln(1-p)`` with ``0 ln 0 = 0``."""
    p = jnp.asarray(p, jnp.float32)
    return -(jax.scipy.special.xlogy(p, p) + jax.scipy.special.xlogy(1.0 - p, 1.0 - p))


def synthetic_preferences(
    key: Any,
    pairs: FragmentPairs,
    *,
    temperature: Any = 1.0,
    discount: Any = 1.0,
    sample: bool = True,
    threshold: Any = 50.0,
    mistake_prob: Any = 0.0,
    equal_threshold: Any = 0.0,
    skip_threshold: Any = None,
    return_valid: bool = False,
) -> tuple[Array, Array] | tuple[Array, Array, Array]:
    """Preferences of a simulated teacher who sees the ground-truth rewards.

    With ``R = sum_t discount**t * rews`` (float32) for each fragment:

    - ``temperature == 0``: ``prefs = (sign(R1 - R2) + 1) / 2`` (deterministic; ties 0.5);
    - otherwise ``p = 1 / (1 + exp(clip(R2/T - R1/T, -threshold, threshold)))`` and
      ``prefs`` are Bernoulli(p) draws as float32 (``sample=True``) or ``p`` itself.

    ``entropy`` is the mean binary entropy of ``p`` (of the returned values when
    ``T == 0``) over the valid pairs. ``temperature`` may be traced: both
    branches are computed NaN-safely and selected, so sweeping it never recompiles.

    B-Pref teachers (all off by default, applied in B-Pref's order):

    - ``mistake_prob``: each answer is flipped (``y -> 1 - y``) with this probability;
    - ``equal_threshold``: ``|R1 - R2| < equal_threshold`` gives 0.5 ("equally preferable");
    - ``skip_threshold``: pairs with ``max(R1, R2) <= skip_threshold`` are not
      answered (``valid = False``); needs ``return_valid=True``.

    Args:
      key: PRNG key or int seed (Bernoulli draws and mistakes).
      pairs: ``P >= 1`` fragment pairs.
      temperature, discount, threshold: teacher model (may be traced).
      sample: draw 0/1 labels (static).
      mistake_prob, equal_threshold, skip_threshold: see above.
      return_valid: also return ``valid bool[P]`` (``pairs.valid`` minus skipped pairs).

    Returns:
      ``(prefs f32[P], entropy f32[])``, or ``(prefs, entropy, valid)``.

    Raises:
      ValueError: ``P == 0``; ``skip_threshold`` without ``return_valid=True``.

    Example (spec example 4): pairs ([1,1] vs [0,0]), ([1,0] vs [0,1]), ([0,0] vs [5,5])
    give ``[1, .5, 0]`` at T=0 and ``[.880797, .5, 4.54e-5]`` at T=1 with ``sample=False``.
    """
    if pairs.num_pairs == 0:
        raise ValueError("pairs must contain at least one pair (P == 0)")
    if skip_threshold is not None and not return_valid:
        raise ValueError("skip_threshold marks skipped pairs invalid: pass return_valid=True to receive them")
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    prefs, entropy, valid = _teacher(
        as_key(key), pairs, f32(temperature), f32(discount), f32(threshold), f32(mistake_prob),
        f32(equal_threshold), f32(0.0 if skip_threshold is None else skip_threshold), bool(sample),
        skip_threshold is not None,
    )
    if return_valid:
        return prefs, entropy, valid
    return prefs, entropy


@partial(jax.jit, static_argnums=(8, 9))
def _teacher(key, pairs, temperature, discount, threshold, mistake_prob, equal_threshold, skip_threshold, sample,
             skip):
    k_sample, k_mistake = jax.random.split(key)
    rets = discounted_returns(pairs.rews, discount)  # [P, 2]
    r1, r2 = rets[:, 0], rets[:, 1]
    is_zero = temperature == 0
    safe_t = jnp.where(is_zero, 1.0, temperature)
    # dividing each return by T before subtracting, as the original
    diff = jnp.clip(r2 / safe_t - r1 / safe_t, -threshold, threshold)
    p = 1.0 / (1.0 + jnp.exp(diff))
    hard = (jnp.sign(r1 - r2) + 1.0) / 2.0
    soft = jax.random.bernoulli(k_sample, p).astype(jnp.float32) if sample else p
    prefs = jnp.where(is_zero, hard, soft)

    flip = jax.random.uniform(k_mistake, prefs.shape) < mistake_prob
    prefs = jnp.where(flip, 1.0 - prefs, prefs)
    prefs = jnp.where(jnp.abs(r1 - r2) < equal_threshold, 0.5, prefs).astype(jnp.float32)

    valid = jnp.asarray(pairs.valid, bool)
    if skip:
        valid = valid & (jnp.maximum(r1, r2) > skip_threshold)
    entropy = masked_mean(binary_entropy(jnp.where(is_zero, prefs, p)), valid)
    return prefs, entropy, valid
