"""Synthetic preference teachers (imitation ``SyntheticGatherer``, plus B-Pref's noisy teachers).

Example::

    import numpy as np
    from jaxweight.preference import fragment_pairs_from_arrays, synthetic_preferences, synthetic_teacher
    rews = np.array([[[1.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [5.0, 5.0]]])   # [P=2, 2, L=2]
    pairs = fragment_pairs_from_arrays(np.zeros((2, 2, 3, 1)), np.zeros((2, 2, 2), np.int32), rews)
    prefs, entropy = synthetic_preferences(0, pairs, temperature=0.0)       # [1, 0], 0
    out = synthetic_teacher(0, pairs, mistake_prob=0.1, skip_threshold=0.5)  # TeacherOutput
    assert prefs.tolist() == [1.0, 0.0] and out.valid.tolist() == [True, True]

References:
  imitation ``SyntheticGatherer`` (https://github.com/HumanCompatibleAI/imitation);
  Lee, Smith, Dragan, Abbeel (2021), "B-Pref: Benchmarking Preference-Based
  Reinforcement Learning" (https://github.com/rll-research/BPref): the
  ``mistake`` / ``equal`` / ``skip`` teachers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from .._util import as_key, check_value, masked_mean
from .data import FragmentPairs, _discounted_returns
from .model import binary_entropy

Array = jax.Array

__all__ = ["synthetic_preferences", "synthetic_teacher", "TeacherOutput"]


@struct.dataclass
class TeacherOutput:
    """What a synthetic teacher answers.

    Attributes:
      prefs: ``f32[P]`` probability / label that fragment 1 is preferred (0.5 for
        pairs it did not answer).
      entropy: ``f32[]`` mean binary entropy of the answers over the valid pairs.
      valid: ``bool[P]``: ``pairs.valid`` minus skipped pairs and pairs with
        non-finite ground-truth rewards.
      n_invalid: ``i32[]`` pairs (with ``pairs.valid``) left unanswered because a
        ground-truth reward is NaN or infinite.
    """

    prefs: Array
    entropy: Array
    valid: Array
    n_invalid: Array

    def to_dict(self, prefix: str = "preference/teacher") -> dict[str, float]:
        """Flat ``{"preference/teacher/entropy": ..., ".../n_invalid": ..., ".../n_valid": ...}`` (host side)."""
        from .. import metrics  # noqa: PLC0415

        return metrics.flatten({"entropy": self.entropy, "n_invalid": self.n_invalid,
                                "n_valid": jnp.sum(self.valid, dtype=jnp.int32)}, prefix=prefix)


def _check(temperature, discount, threshold, mistake_prob, equal_threshold, skip_threshold):
    check_value(temperature, "temperature", ge=0.0)
    check_value(discount, "discount", ge=0.0, le=1.0)
    check_value(threshold, "threshold", gt=0.0)
    check_value(mistake_prob, "mistake_prob", ge=0.0, le=1.0)
    check_value(equal_threshold, "equal_threshold", ge=0.0)
    if skip_threshold is not None:
        check_value(skip_threshold, "skip_threshold")


def synthetic_teacher(
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
) -> TeacherOutput:
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
      answered (``valid = False``).

    A pair whose ground-truth rewards are not all finite is not answered either:
    ``valid = False``, ``prefs = 0.5``, counted in ``n_invalid``.

    Args:
      key: PRNG key or int seed (Bernoulli draws and mistakes).
      pairs: ``P >= 1`` fragment pairs.
      temperature: ``>= 0`` (may be traced).
      discount: in ``[0, 1]``.
      sample: draw 0/1 labels (static).
      threshold: ``> 0``, clip bound of the scaled return difference.
      mistake_prob: in ``[0, 1]``.
      equal_threshold: ``>= 0``.
      skip_threshold: ``None`` (off) or a finite number.

    Returns:
      :class:`TeacherOutput`.

    Raises:
      ValueError: ``P == 0``; a setting outside its range (eagerly, or through
        ``jaxweight.checked`` when traced).
    """
    if not isinstance(pairs, FragmentPairs):
        raise ValueError(f"pairs must be FragmentPairs, got {type(pairs).__name__}")
    if pairs.num_pairs == 0:
        raise ValueError("pairs must contain at least one pair (P == 0)")
    _check(temperature, discount, threshold, mistake_prob, equal_threshold, skip_threshold)
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    prefs, entropy, valid, n_invalid = _teacher(
        as_key(key), pairs, f32(temperature), f32(discount), f32(threshold), f32(mistake_prob),
        f32(equal_threshold), f32(0.0 if skip_threshold is None else skip_threshold), bool(sample),
        skip_threshold is not None,
    )
    return TeacherOutput(prefs=prefs, entropy=entropy, valid=valid, n_invalid=n_invalid)


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
) -> tuple[Array, Array]:
    """``(prefs f32[P], entropy f32[])`` of :func:`synthetic_teacher` (imitation's ``SyntheticGatherer``).

    Same arguments as :func:`synthetic_teacher`. Use :func:`synthetic_teacher`
    to also receive which pairs were answered (``skip_threshold``, non-finite
    rewards).

    Raises:
      ValueError: ``P == 0``; ``skip_threshold`` (use :func:`synthetic_teacher`);
        a setting outside its range.

    Example (spec example 4): pairs ([1,1] vs [0,0]), ([1,0] vs [0,1]), ([0,0] vs [5,5])
    give ``[1, .5, 0]`` at T=0 and ``[.880797, .5, 4.54e-5]`` at T=1 with ``sample=False``.
    """
    if skip_threshold is not None:
        raise ValueError("skip_threshold marks skipped pairs invalid: use synthetic_teacher(...) to receive them")
    out = synthetic_teacher(key, pairs, temperature=temperature, discount=discount, sample=sample,
                            threshold=threshold, mistake_prob=mistake_prob, equal_threshold=equal_threshold,
                            skip_threshold=skip_threshold)
    return out.prefs, out.entropy


def _teacher(key, pairs, temperature, discount, threshold, mistake_prob, equal_threshold, skip_threshold, sample,
             skip):
    k_sample, k_mistake = jax.random.split(key)
    finite = jnp.all(jnp.isfinite(pairs.rews.reshape(pairs.rews.shape[0], -1)), axis=-1)  # [P]
    rews = jnp.where(finite[:, None, None], pairs.rews, 0.0)  # never let NaN reach the draws
    rets = _discounted_returns(rews, discount)  # [P, 2] (discount checked by synthetic_teacher)
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
    prefs = jnp.where(jnp.abs(r1 - r2) < equal_threshold, 0.5, prefs)

    given = jnp.asarray(pairs.valid, bool)
    valid = given & finite
    if skip:
        valid = valid & (jnp.maximum(r1, r2) > skip_threshold)
    prefs = jnp.where(finite, prefs, 0.5).astype(jnp.float32)
    entropy = masked_mean(binary_entropy(jnp.where(is_zero, prefs, p)), valid)
    return prefs, entropy, valid, jnp.sum(given & ~finite, dtype=jnp.int32)
