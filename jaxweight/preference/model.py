"""The Bradley-Terry preference model and the cross-entropy reward loss.

imitation's ``PreferenceModel`` loops over pairs in Python and cannot run an
ensemble's forward pass (it raises); here :func:`probability` is one pure
function of two reward sequences, ``[L] -> []`` for a single net and
``[L, M] -> [M]`` per member, batched with ``jax.vmap`` and differentiable
everywhere. :func:`fragment_rewards` / :func:`preference_probabilities` score
whole :class:`FragmentPairs` batches for a single net or an ensemble.

Example::

    import jax.numpy as jnp
    from jaxweight.preference import cross_entropy_loss, probability
    p = probability(jnp.array([1., 2., 3.]), jnp.array([0., 1., 1.]))   # 0.9820138 (spec example 1)
    loss, metrics = cross_entropy_loss(jnp.array([.5, .7, .2, .9]), jnp.array([.5, 1., 0., 0.]))
    assert abs(float(p) - 0.9820138) < 1e-6 and float(metrics["accuracy"]) == 0.75

References:
  Christiano et al. (2017), "Deep reinforcement learning from human preferences",
  arXiv:1706.03741; imitation ``algorithms/preference_comparisons.py``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from .._util import check_rank, check_same_shape, check_value, masked_mean
from .data import FragmentPairs, check_preferences, preference_ok
from .reward_nets import ensemble_apply

Array = jax.Array

__all__ = [
    "probability",
    "fragment_rewards",
    "preference_probabilities",
    "binary_cross_entropy",
    "binary_entropy",
    "cross_entropy_loss",
]


def probability(
    rews1: Array, rews2: Array, *, noise_prob: Any = 0.0, discount: Any = 1.0, threshold: Any = 50.0
) -> Array:
    """Bradley-Terry probability that fragment 1 is preferred.

    ``D = clip(sum_t discount**t * (rews2_t - rews1_t), -threshold, threshold)``,
    ``p = noise_prob / 2 + (1 - noise_prob) / (1 + exp(D))``.

    Args:
      rews1: ``f[L]`` (single net) or ``f[L, M]`` (one column per ensemble member).
      rews2: same shape as ``rews1``.
      noise_prob: probability that the teacher answers uniformly at random.
      discount: discount factor of the returns.
      threshold: clip bound of the return difference (in log space; avoids overflow).

    Returns:
      ``f32[]`` for ``[L]`` inputs, ``f32[M]`` for ``[L, M]``. Ties and ``L = 0`` give 0.5.
      The hyperparameters may be traced (vmapped sweeps compile once).

    Raises:
      ValueError: ``noise_prob`` or ``discount`` outside ``[0, 1]``, ``threshold <= 0``
        or any of them NaN / inf (eagerly, or through ``jaxweight.checked`` when traced).

    Example:
      >>> probability(jnp.array([1., 2., 3.]), jnp.array([0., 1., 1.]))  # 0.9820138
    """
    check_rank(rews1, (1, 2), "rews1")
    check_same_shape(rews1, rews2, "rews1", "rews2")
    _check_bt(noise_prob, discount, threshold)
    return _probability(rews1, rews2, noise_prob, discount, threshold)


def _check_bt(noise_prob: Any, discount: Any, threshold: Any) -> None:
    """The ranges of the Bradley-Terry settings (the trainer's ``_HPARAM_RANGES`` use the same)."""
    check_value(noise_prob, "noise_prob", ge=0.0, le=1.0)
    check_value(discount, "discount", ge=0.0, le=1.0)
    check_value(threshold, "threshold", gt=0.0)


def _probability(rews1: Array, rews2: Array, noise_prob: Any, discount: Any, threshold: Any) -> Array:
    """:func:`probability` on checked settings (the trainer's hot path checks them once per step)."""
    r1 = jnp.asarray(rews1, jnp.float32)
    r2 = jnp.asarray(rews2, jnp.float32)
    length = r1.shape[0]
    w = jnp.asarray(discount, jnp.float32) ** jnp.arange(length, dtype=jnp.float32)
    w = w.reshape((length,) + (1,) * (r1.ndim - 1))
    threshold = jnp.asarray(threshold, jnp.float32)
    diff = jnp.clip(jnp.sum(w * (r2 - r1), axis=0), -threshold, threshold)
    noise = jnp.asarray(noise_prob, jnp.float32)
    # sigmoid(-D) == 1 / (1 + exp(D)) without overflow in the backward pass
    return noise * 0.5 + (1.0 - noise) * jax.nn.sigmoid(-diff)


def fragment_rewards(module: nn.Module, params: Any, pairs: FragmentPairs, *, ensemble: bool = False) -> Array:
    """Predicted per-step rewards of both fragments of every pair.

    Args:
      module: reward module called as ``module.apply(p, state, action, next_state, done)``.
      params: its params; with a leading member axis when ``ensemble``.
      pairs: ``P`` fragment pairs of length ``L``.
      ensemble: params carry a leading member axis (from ``ensemble_init``).

    Returns:
      ``f32[P, 2, L]``, or ``f32[P, 2, L, M]`` for an ensemble.
    """
    r = ensemble_apply(module, params, *pairs.transitions(), stacked=ensemble)
    return r if ensemble else r[..., 0]


def preference_probabilities(
    module: nn.Module,
    params: Any,
    pairs: FragmentPairs,
    *,
    noise_prob: Any = 0.0,
    discount: Any = 1.0,
    threshold: Any = 50.0,
    ensemble: bool = False,
) -> tuple[Array, Array]:
    """Model and ground-truth preference probabilities of a batch of pairs.

    Returns:
      ``(probs, gt_probs)``: ``probs`` is ``f32[P]`` (``f32[P, M]`` for an
      ensemble, one column per member; this is what imitation's
      ``PreferenceModel.forward`` would return if it worked for ensembles);
      ``gt_probs`` is ``f32[P]`` from the pairs' ground-truth rewards.

    Raises:
      ValueError: a setting outside its range (see :func:`probability`).
    """
    _check_bt(noise_prob, discount, threshold)
    return _preference_probabilities(module, params, pairs, noise_prob, discount, threshold, ensemble)


def _preference_probabilities(module, params, pairs, noise_prob, discount, threshold, ensemble):
    """:func:`preference_probabilities` on checked settings (used inside the trainer's jitted step)."""
    r = fragment_rewards(module, params, pairs, ensemble=ensemble)
    prob = jax.vmap(lambda a, b: _probability(a, b, noise_prob, discount, threshold))
    probs = prob(r[:, 0], r[:, 1])
    gt = prob(pairs.rews[:, 0], pairs.rews[:, 1])
    return probs, gt


def binary_cross_entropy(probs: Array, targets: Array) -> Array:
    """Element-wise ``-(y log p + (1-y) log(1-p))`` with each log clamped at -100 (as torch's BCE)."""
    p = jnp.asarray(probs, jnp.float32)
    y = jnp.asarray(targets, jnp.float32)
    # p saturates to exactly 0 or 1 in float32 (|D| > ~17); the inner where keeps log's
    # gradient finite there, otherwise 0 * inf = NaN would poison the whole update
    log_p = jnp.maximum(jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -100.0), -100.0)
    log_1mp = jnp.maximum(jnp.where(p < 1, jnp.log1p(-jnp.where(p < 1, p, 0.0)), -100.0), -100.0)
    return -(y * log_p + (1.0 - y) * log_1mp)


def binary_entropy(p: Array) -> Array:
    """Element-wise ``-p ln p - (1-p) ln(1-p)`` in float32, with ``0 ln 0 = 0``.

    Finite at ``p = 0`` and ``p = 1`` without an infinite intermediate (``xlogy``
    takes ``log(0) = -inf`` first), so it runs under ``jax_debug_infs``.
    """
    p = jnp.asarray(p, jnp.float32)

    def xlogx(x):
        return jnp.where(x == 0, 0.0, x * jnp.log(jnp.where(x == 0, 1.0, x)))

    return -(xlogx(p) + xlogx(1.0 - p))


def cross_entropy_loss(
    probs: Array, prefs: Array, mask: Array | None = None, gt_probs: Array | None = None
) -> tuple[Array, dict[str, Array]]:
    """imitation's ``CrossEntropyRewardLoss`` on predicted probabilities.

    Args:
      probs: ``f32[P]`` predicted probabilities that fragment 1 is preferred.
      prefs: ``f32[P]`` target probabilities (0, 1, 0.5 for ties, or soft labels).
      mask: optional ``bool[P]``; only True entries count (0 loss if none).
      gt_probs: optional ``f32[P]`` probabilities from ground-truth rewards;
        adds ``gt_reward_loss``.

    Returns:
      ``(loss f32[], metrics)`` with ``metrics["accuracy"]`` = mean of
      ``(p > 0.5) == (y > 0.5)`` (strict on both sides, so 0.5 vs 0.5 counts as
      correct), ``metrics["n_invalid"]`` (i32[]: masked-in pairs left out because
      their target is NaN or outside [0, 1], or their probability is not finite)
      and, if ``gt_probs`` is given, ``metrics["gt_reward_loss"]``.

    Raises:
      ValueError: concrete ``prefs`` that are NaN or outside ``[0, 1]`` (traced ones are
        left out and counted); wrong ranks or shapes.

    Example:
      >>> cross_entropy_loss(jnp.array([.5, .7, .2, .9]), jnp.array([.5, 1., 0., 0.]))
      (0.8938876, {'accuracy': 0.75, 'n_invalid': 0})
    """
    check_rank(probs, 1, "probs")
    check_same_shape(probs, prefs, "probs", "prefs")
    check_preferences(prefs, "prefs")
    p, y = jnp.asarray(probs, jnp.float32), jnp.asarray(prefs, jnp.float32)
    m_in = jnp.ones(p.shape, bool) if mask is None else jnp.broadcast_to(jnp.asarray(mask, bool), p.shape)
    ok = preference_ok(y) & jnp.isfinite(p)
    mask = m_in & ok
    # invalid entries are replaced before any arithmetic: no NaN reaches the loss or its gradient
    p, y = jnp.where(ok, p, 0.5), jnp.where(ok, y, 0.5)
    loss = masked_mean(binary_cross_entropy(p, y), mask)
    correct = ((p > 0.5) == (y > 0.5)).astype(jnp.float32)
    metrics = {"accuracy": masked_mean(correct, mask), "n_invalid": jnp.sum(m_in & ~ok, dtype=jnp.int32)}
    if gt_probs is not None:
        check_same_shape(probs, gt_probs, "probs", "gt_probs")
        g = jnp.asarray(gt_probs, jnp.float32)
        metrics["gt_reward_loss"] = masked_mean(binary_cross_entropy(jnp.where(jnp.isfinite(g), g, 0.5), y),
                                                mask & jnp.isfinite(g))
    return loss, metrics
