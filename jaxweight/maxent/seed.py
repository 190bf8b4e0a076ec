"""SEED-GRPO: semantic entropy of each group and the advantage scale it gives.

Example::

    import jax.numpy as jnp
    from jaxweight import maxent

    ids = jnp.array([[0, 1, 0, 2]])                   # maxent.cluster_ids of the extracted answers
    h = maxent.semantic_entropy(ids, jnp.array([[-0.5, -2.0, -0.5, -2.0]]))
    scale = maxent.seed_grpo_scale(h, 0.0417, num_generations=4)
    assert abs(float(h[0]) - 0.6015) < 1e-3 and abs(float(scale[0]) - 0.9822) < 1e-3

References:
  Chen et al., "SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware
  Policy Optimization", arXiv:2505.12346.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .._util import check_rank, check_value
from ._common import LOW, Array, mask_of, other

__all__ = ["semantic_entropy", "seed_grpo_scale"]


def _masked_lse(x: Array, m: Array, axis: int) -> tuple[Array, Array]:
    """``(lse, finite)``: logsumexp over the entries ``m`` and whether it is finite.

    The logsumexp is finite iff some entry is finite and none is ``+inf`` (``-inf``
    entries have no mass); where it is not, ``lse`` is 0. Masked entries hold the finite
    ``LOW``, so finite inputs give no infinite intermediate.
    """
    xm = jnp.where(m, x, LOW)
    mx = jnp.max(xm, axis=axis, keepdims=True, initial=LOW)
    ok = jnp.isfinite(mx) & (mx > LOW)
    mx_safe = jnp.where(ok, mx, 0.0)
    s = jnp.sum(jnp.where(m, jnp.exp(xm - mx_safe), 0.0), axis=axis, keepdims=True)
    lse = jnp.log(jnp.where(s > 0, s, 1.0)) + mx_safe
    return jnp.squeeze(jnp.where(ok, lse, 0.0), axis), jnp.squeeze(ok, axis)


def semantic_entropy(cluster_ids: Any, seq_logp: Any, mask: Any = None) -> Array:
    """Semantic entropy of each group (SEED-GRPO).

    ``Z`` = logsumexp of the row's valid ``seq_logp``; for each cluster ``k``
    present, ``c_k = logsumexp(seq_logp of k's members) - Z``;
    ``H = -sum_k exp(c_k) c_k``, skipping non-finite terms. Ids outside
    ``[0, G)`` and NaN log-likelihoods count as masked; an empty row or a
    non-finite ``Z`` gives 0.

    Args:
      cluster_ids: i32[P, G] (:func:`cluster_ids` on the host; padding -1).
      seq_logp: f32[P, G] sequence log-likelihoods (length-normalised or not).
      mask: bool[P, G] or None.

    Returns:
      f32[P].

    References:
      Chen et al., "SEED-GRPO: Semantic Entropy Enhanced GRPO", arXiv:2505.12346.
    """
    check_rank(cluster_ids, 2, "cluster_ids")
    ids = jnp.asarray(cluster_ids, jnp.int32)
    lp = other(seq_logp, ids, "cluster_ids", "seq_logp")
    g = ids.shape[1]
    valid = mask_of(mask, lp, "seq_logp") & (ids >= 0) & (ids < g) & ~jnp.isnan(lp)
    z, ok_z = _masked_lse(lp, valid, axis=1)  # [P]
    member = (ids[:, :, None] == jnp.arange(g, dtype=jnp.int32)) & valid[:, :, None]  # [P, G, K]
    lse_k, ok_k = _masked_lse(lp[:, :, None], member, axis=1)  # [P, K]
    # a cluster with no finite mass (absent, or all -inf) has exp(c) c = 0 * -inf: skipped
    use = ok_k & ok_z[:, None]
    c = jnp.where(use, lse_k - z[:, None], 0.0)
    term = jnp.exp(c) * c
    keep = use & jnp.isfinite(term)
    h = -jnp.sum(jnp.where(keep, term, 0.0), axis=1)
    return jnp.where(ok_z, h, 0.0)


def seed_grpo_scale(
    entropy: Any,
    alpha: Any = 0.0417,
    num_generations: Any = None,
    normalize_by_max_entropy: bool = True,
) -> Array:
    """SEED-GRPO advantage scale ``1 / (1 + a * H)``.

    ``Hmax = ln G`` if ``G > 1`` else 0; ``a = alpha / Hmax`` when normalising
    and ``Hmax > 0``, else ``alpha``. Non-finite scales become 1.

    Args:
      entropy: f32[P] semantic entropies (:func:`semantic_entropy`).
      alpha: f32[] >= 0 strength (NaN refused).
      num_generations: G, generations per prompt (required, finite; may be traced).
      normalize_by_max_entropy: static, divide ``alpha`` by ``ln G``.

    Returns:
      f32[P] multipliers of the advantages.
    """
    if num_generations is None:
        raise ValueError("num_generations (G, the generations per prompt) is required")
    check_value(alpha, "alpha", ge=0.0)
    check_value(num_generations, "num_generations")
    h = jnp.asarray(entropy, jnp.float32)
    a, _ = seed_alpha(alpha, num_generations, normalize_by_max_entropy)
    sc = 1.0 / (1.0 + a * h)
    return jnp.where(jnp.isfinite(sc), sc, 1.0)


def seed_alpha(alpha: Any, g: Any, normalize: bool) -> tuple[Array, Array]:
    g = jnp.asarray(g, jnp.float32)
    hmax = jnp.where(g > 1, jnp.log(jnp.maximum(g, 1.0)), 0.0)
    alpha = jnp.asarray(alpha, jnp.float32)
    if normalize:
        a = jnp.where(hmax > 0, alpha / jnp.where(hmax > 0, hmax, 1.0), alpha)
    else:
        a = alpha
    return a, hmax
