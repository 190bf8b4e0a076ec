"""xDr.GRPO candidate aggregation: tempered weights over each group's candidates and their diagnostics."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax.numpy as jnp

from .._util import check_value
from ._common import W_FLOOR, Array, mask_of, matrix, other, row_sums
from .weights import tilted_softmax

__all__ = ["candidate_weights", "positive_class_weights", "AggregationDiagnostics", "aggregation_diagnostics"]


def candidate_weights(
    utilities: Any,
    mask: Any = None,
    *,
    tau: Any,
    lam: Any = 0.0,
    ref_logp: Any = None,
) -> Array:
    """xDr.GRPO aggregation weights ``w_i ~ exp(U_i / (tau + lam)) * pi_ref_i^(lam / (tau + lam))`` per group.

    The maximiser over the simplex of ``<w, U> + tau H(w) - lam KL(w || pi_ref)`` (the paper's
    closed form). ``tau -> inf`` gives uniform weights (Dr.GRPO); ``tau = 0`` with ``lam = 0`` is
    computed exactly: uniform over the valid entries at the group's largest utility (ties
    share equally), with no division by zero. ``tau`` and ``lam`` may be traced (a sweep over
    ``tau``, 0 and huge values included, is one ``jax.vmap``).

    This is :func:`weight_matrix`'s formula with ``log q`` replaced by ``U``, ``beta`` by
    ``lam`` and ``denom`` by ``tau + lam`` (no token normalisation), and it runs the same
    internal softmax; it differs only where :func:`weight_matrix` floors: ``U`` is not a log
    of a probability (no ``1e-12`` floor) and ``tau + lam = 0`` is the exact argmax limit,
    not ``1e-8``.

    With the paper's utility ``U_i = A_i T_i / T_max`` (the Dr.GRPO surrogate at the rollout
    policy: advantage times the completion's token count over the constant normaliser), the
    weights are computed once per rollout batch and frozen for the update, like the
    advantages; pass them to :func:`policy_loss` as ``weights=``.

    Args:
      utilities: f32[P, G] per-candidate utilities ``U``.
      mask: bool[P, G] or None; non-finite utilities count as masked.
      tau: f32[] candidate-entropy temperature, finite and ``>= 0``.
      lam: f32[] reference-tilt coefficient, finite and ``>= 0`` (the paper's runs: 0).
      ref_logp: f32[P, G] log of the reference distribution over each group's candidates
        (e.g. length-normalised reference sequence log-probs; a per-group constant cancels),
        or None: a uniform reference, so ``w = softmax(U / (tau + lam))``. Used only when
        ``lam > 0``; then an entry with a non-finite ``ref_logp`` counts as masked.

    Returns:
      f32[P, G]; each row with a valid entry sums to 1 over its valid entries; invalid
      entries and empty rows are 0.

    Raises:
      ValueError: ``tau`` or ``lam`` negative or not finite (eagerly, or through
        ``jaxweight.checked`` when traced), wrong rank or shape.

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import maxent

        adv = jnp.array([[0.5, 0.5, -0.5, -0.5]])           # Dr.GRPO advantages of one group
        tokens = jnp.array([[100., 300., 200., 400.]])
        U = adv * tokens / 512                                # U_i = A_i T_i / T_max
        w = maxent.candidate_weights(U, tau=0.5)
        w0 = maxent.candidate_weights(U, tau=0.0)             # exact: all mass on candidate 1
        sweep = jax.vmap(lambda t: maxent.candidate_weights(U, tau=t))(jnp.array([0.0, 0.5, 1e9]))
        assert float(w0[0, 1]) == 1.0 and abs(float(sweep[2, 0, 0]) - 0.25) < 1e-6
        assert float(w[0, 1]) > float(w[0, 0]) > float(w[0, 2]) > float(w[0, 3])

    References:
      "Exploration Should Act at the Group Level in RL LLM Fine-Tuning" (xDr.GRPO),
      maxent-grpo ``paper/main.tex``, the closed-form maximiser and its ``tau`` limits
      (https://github.com/liv-daliberti/maxent-grpo); Dr.GRPO arXiv:2503.20783.
    """
    check_value(tau, "tau", ge=0.0)
    check_value(lam, "lam", ge=0.0)
    u = matrix(utilities, "utilities")
    valid = mask_of(mask, u, "utilities") & jnp.isfinite(u)
    tau = jnp.asarray(tau, jnp.float32)
    lam = jnp.asarray(lam, jnp.float32)
    ref = None
    if ref_logp is not None:
        r = other(ref_logp, u, "utilities", "ref_logp")
        finite = jnp.isfinite(r)
        # lam = 0 ignores the reference, so its NaNs mask nothing then
        valid = valid & (finite | (lam <= 0))
        ref = jnp.where(finite, r, 0.0)
    d = tau + lam
    hard = d <= 0
    return tilted_softmax(jnp.where(valid, u, 0.0), ref, None, valid, lam, jnp.where(hard, 1.0, d), hard)[0]


def positive_class_weights(rewards: Any, mask: Any = None) -> Array:
    """Class-level aggregation: uniform weights over each group's best-rewarded candidates, 0 on the rest.

    The class-level limit of xDr.GRPO with a binary reward: all of a group's weight on its correct
    completions, shared equally, none on the wrong ones. With Dr.GRPO advantages
    ``A = r - mean(r)`` and :func:`policy_loss`'s scaling ``n w_i / sum w``, a group with ``k`` of
    ``G`` correct trains each correct completion with the signal ``(G / k) (1 - k / G) = (G - k) / k``
    and each wrong one with 0 (positive-only updates). A group whose rewards are all equal gets
    uniform weights (its advantages are 0). It is :func:`candidate_weights` of the rewards at
    ``tau = 0`` (exact ties share), so the same validity rules hold.

    Args:
      rewards: f32[P, G] per-candidate rewards (the class is the reward value).
      mask: bool[P, G] or None; non-finite rewards count as masked.

    Returns:
      f32[P, G]; each row with a valid entry sums to 1 over its valid entries.

    Example::

        import jax.numpy as jnp
        from jaxweight import maxent

        w = maxent.positive_class_weights(jnp.array([[1., 0., 0., 1.]]))
        assert w.tolist() == [[0.5, 0.0, 0.0, 0.5]]
    """
    return candidate_weights(rewards, mask, tau=0.0)


@flax.struct.dataclass
class AggregationDiagnostics:
    """The candidate-aggregation diagnostics the xDr.GRPO paper logs for every arm.

    Attributes:
      effective_candidates: f32[P] effective number of active candidates ``exp(H(w'))`` of each
        group, ``w'`` the group's weights renormalised over its valid entries (``n`` for
        uniform weights, 1 for one winner); 0 for a group without mass.
      incorrect_mass: f32[P] share of ``w'`` on incorrect candidates (reward ``<= 0``); 0 for
        a group without mass.
      count: i32[] groups with positive mass (the ones the means cover).
      mean_effective_candidates, mean_incorrect_mass: f32[] means over those groups (0 if
        none): the paper's logged ``agg_eff_rollouts`` and ``agg_incorrect_mass``.
    """

    effective_candidates: Array
    incorrect_mass: Array
    count: Array
    mean_effective_candidates: Array
    mean_incorrect_mass: Array


def aggregation_diagnostics(weights: Any, rewards: Any, mask: Any = None) -> AggregationDiagnostics:
    """Effective number of active candidates and incorrect-mass share of aggregation weights.

    For any per-candidate weights (uniform for Dr.GRPO, :func:`candidate_weights` for
    xDr.GRPO, or a loss's realised row multipliers): each group is renormalised over its
    valid entries, ``effective = exp(-sum w' log max(w', 1e-12))`` (the perplexity of the
    weights, not :func:`effective_sample_size`'s Kish ``1 / sum w'^2``) and
    ``incorrect = sum w' [reward <= 0]``.

    Args:
      weights: f32[P, G] non-negative weights (need not be normalised).
      rewards: f32[P, G] the candidates' rewards; a candidate is incorrect iff its reward is
        ``<= 0`` (binary verifiable rewards, the paper's rule).
      mask: bool[P, G] or None; entries with a negative or non-finite weight or a non-finite
        reward count as masked.

    Returns:
      :class:`AggregationDiagnostics`.

    Example::

        import jax.numpy as jnp
        from jaxweight import maxent

        rewards = jnp.array([[1., 0., 0., 1.]])
        d = maxent.aggregation_diagnostics(maxent.candidate_weights(rewards, tau=0.0), rewards)
        assert float(d.mean_effective_candidates) == 2.0 and float(d.mean_incorrect_mass) == 0.0

    References:
      "Exploration Should Act at the Group Level in RL LLM Fine-Tuning" (xDr.GRPO),
      maxent-grpo ``aggregation_group_diagnostics``
      (https://github.com/liv-daliberti/maxent-grpo).
    """
    w = matrix(weights, "weights")
    r = other(rewards, w, "weights", "rewards")
    valid = mask_of(mask, w, "weights") & jnp.isfinite(w) & (w >= 0) & jnp.isfinite(r)
    wv = jnp.where(valid, w, 0.0)
    (tot,) = row_sums(wv)
    has = tot > 0
    p = wv / jnp.where(has, tot, 1.0)[:, None]
    ent = -jnp.sum(p * jnp.log(jnp.maximum(p, W_FLOOR)), axis=-1)
    eff = jnp.where(has, jnp.exp(ent), 0.0)
    bad = jnp.where(has, jnp.sum(jnp.where(valid & (r <= 0), p, 0.0), axis=-1), 0.0)
    k = jnp.sum(has, dtype=jnp.float32)
    mean = lambda x: jnp.where(k > 0, jnp.sum(x) / jnp.maximum(k, 1.0), 0.0)  # noqa: E731
    return AggregationDiagnostics(effective_candidates=eff, incorrect_mass=bad, count=k.astype(jnp.int32),
                                  mean_effective_candidates=mean(eff), mean_incorrect_mass=mean(bad))
