"""The listwise target ``q``, MaxEnt weights, their entropy and effective sample size."""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from .._util import check_rank, check_same_shape, check_value
from ._common import LOW, Q_FLOOR, T_FLOOR, W_FLOOR, Array, mask_of, matrix, other, row_counts, row_maxes, row_sums
from .advantages import RowStats, row_stats

__all__ = [
    "q_distribution",
    "weight_matrix",
    "uniform_weights",
    "WeightEntropy",
    "weight_entropy",
    "effective_sample_size",
]


# ------------------------------------------------------------ q distribution
def q_from(rs: RowStats, epsilon: Array) -> Array:
    """``q`` from row statistics taken with a temperature (``rs.e``); 0 off ``rs.valid``."""
    # the row max contributes exp(0) = 1, so the sum is >= 1 on non-empty rows
    total = rs.e_sum[:, None]
    nk = rs.n[:, None]
    cap = jnp.where(nk > 0, 1.0 / jnp.maximum(nk, 1.0) - 1e-8, 0.0)
    eps = jnp.clip(epsilon, 0.0, cap)
    # p * (1 - e n) + e sums to 1 exactly in real arithmetic, so the spec's final
    # renormalisation only moves q by rounding; it is folded away
    return jnp.where(rs.valid, rs.e * ((1.0 - eps * nk) / jnp.maximum(total, Q_FLOOR)) + eps, 0.0)


def q_distribution(
    utilities: Any,
    mask: Any = None,
    *,
    temperature: Any = 1.0,
    epsilon: Any = 1e-6,
) -> Array:
    """Listwise target ``q``: a smoothed softmax of each group's utilities.

    ``p = softmax(u / max(temperature, 1e-8))`` over the valid entries (max-subtracted,
    so ``3e38`` never overflows; temperature 0 is the hard limit, maxent_grpo's rule);
    ``e = clip(epsilon, 0, 1/n - 1e-8)``;
    ``q = p * (1 - e*n) + e``. The cap on ``e`` keeps the order of ``q`` the
    order of ``u`` (at the cap the row is nearly uniform).

    Args:
      utilities: f32[P, G] rewards (after zero-truncation; never advantages).
      mask: bool[P, G] or None; non-finite utilities count as masked.
      temperature: f32[] >= 0 softmax temperature (traceable).
      epsilon: f32[] >= 0 smoothing floor.

    Returns:
      f32[P, G], each non-empty row a distribution over its valid entries.

    Raises:
      ValueError: ``temperature < 0`` or NaN, ``epsilon < 0`` or NaN (eagerly,
        or through ``jaxweight.checked`` when traced), wrong rank or shape.

    Example::

        import jax.numpy as jnp
        from jaxweight import maxent

        q = maxent.q_distribution(jnp.array([[.5, 1., 2.]]), temperature=0.5)
        assert abs(float(q[0, 2]) - 0.8438) < 1e-3
    """
    check_value(temperature, "temperature", ge=0.0)
    check_value(epsilon, "epsilon", ge=0.0)
    u = matrix(utilities, "utilities")
    rs = row_stats(u, mask_of(mask, u, "utilities"), jnp.asarray(temperature, jnp.float32))
    return q_from(rs, jnp.asarray(epsilon, jnp.float32))


# -------------------------------------------------------------------- weights
def _resolve_denom(tau: Array, denom: Any) -> Array:
    tau_d = jnp.where(tau > 0, tau, T_FLOOR)
    if denom is None:
        return tau_d
    d = jnp.asarray(denom, jnp.float32)
    return jnp.where(d > 0, d, tau_d)


def weight_matrix(
    q: Any,
    ref_logp: Any,
    token_counts: Any = None,
    mask: Any = None,
    *,
    tau: Any,
    beta: Any,
    denom: Any = None,
    include_reference_term: bool = True,
    normalize_by_tokens: bool = True,
) -> Array:
    """MaxEnt sequence weights ``w ~ q^(1/d) * pi_ref^(beta/d)`` per group.

    ``d = denom if denom > 0 else (tau if tau > 0 else 1e-8)``;
    ``s = (log max(q, 1e-12) + [include_reference_term and beta > 0] * beta * ref_logp) / d``;
    ``w = softmax(s)`` over each row's valid entries; with
    ``normalize_by_tokens`` and ``token_counts``: ``w *= max(tok, 1)`` and the
    row is renormalised. A row whose largest score is infinite shares its mass
    among the entries at that score (all ``-inf``: uniform). maxent_grpo's
    call sites use ``normalize_by_tokens=False``.

    Settings outside :func:`~jaxweight.maxent.config`'s ranges keep maxent_grpo's meaning
    here, as the formula above says: ``beta <= 0`` drops the reference term, ``denom <= 0``
    (or None) falls back to ``tau``, and ``tau <= 0`` to ``1e-8`` (the hard, argmax limit).
    Only non-finite values are refused. (``config`` refuses negative values, which there
    can only be mistakes.)

    An entry is valid if masked in and ``q`` is finite, and (with the reference
    term) ``ref_logp`` is finite, and (with token normalisation) its token
    count is finite. ``jax.grad`` with respect to ``tau``, ``beta`` and
    ``denom`` is finite (invalid inputs are replaced before any arithmetic).

    Args:
      q: f32[P, G] listwise target (:func:`q_distribution`).
      ref_logp: f32[P, G] length-normalised reference sequence log-probs.
      token_counts: f32[P, G] completion lengths or None.
      mask: bool[P, G] or None.
      tau: f32[] temperature, finite (traceable; a NaN or inf value raises ``ValueError``
        eagerly, or through ``jaxweight.checked`` when traced); ``<= 0`` means ``1e-8``.
      beta: f32[] reference coefficient, finite (checked as ``tau``); ``<= 0`` drops the
        reference term.
      denom: f32[] denominator or None (= tau); finite (checked as ``tau``); ``<= 0`` means
        ``tau``.
      include_reference_term: static, use the ``beta * ref_logp`` term.
      normalize_by_tokens: static, multiply by token counts and renormalise.

    Returns:
      f32[P, G] weights; each non-empty row sums to 1, invalid entries and
      rows without a valid entry are 0.

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import maxent

        q = jnp.array([[.1, .2, .7]])
        ref_logp = jnp.array([[-1.0, -2.0, -0.5]])
        w = maxent.weight_matrix(q, ref_logp, tau=0.5, beta=0.1, denom=0.5)   # [[0.0171, 0.0561, 0.9268]]
        dw_dtau = jax.jacfwd(lambda t: maxent.weight_matrix(q, ref_logp, tau=t, beta=0.1))(0.5)
        assert abs(float(w[0, 2]) - 0.9268) < 1e-3 and dw_dtau.shape == (1, 3)
    """
    # stateless math: maxent_grpo defines every finite setting (beta <= 0: no reference term,
    # denom <= 0: tau, tau <= 0: 1e-8); only NaN / inf, which define nothing, are refused
    check_value(tau, "tau")
    check_value(beta, "beta")
    if denom is not None:
        check_value(denom, "denom")
    qa = matrix(q, "q")
    valid = mask_of(mask, qa, "q") & jnp.isfinite(qa)
    ref = None
    if include_reference_term:
        ref = other(ref_logp, qa, "q", "ref_logp")
        valid = valid & jnp.isfinite(ref)
    else:
        check_rank(ref_logp, 2, "ref_logp")
        check_same_shape(qa, ref_logp, "q", "ref_logp")
    tok = None
    if normalize_by_tokens and token_counts is not None:
        tok = other(token_counts, qa, "q", "token_counts")
        valid = valid & jnp.isfinite(tok)
    elif token_counts is not None:
        check_same_shape(qa, token_counts, "q", "token_counts")
    return weights_from(qa, ref, tok, valid, tau, beta, denom)[0]


def weights_from(q: Array, ref: Array | None, tok: Array | None, valid: Array, tau: Any, beta: Any,
                 denom: Any) -> tuple[Array, Array]:
    """The weight formula on checked inputs (invalid entries may hold anything).

    Returns ``(w, log w)``; ``log w = z + log(tok) - log(sum)`` comes without a
    logarithm of the weights (``LOW`` where ``w`` is 0). Masked entries hold finite
    placeholders (never ``-inf``), so on finite inputs no intermediate is infinite.
    """
    tau = jnp.asarray(tau, jnp.float32)
    d = _resolve_denom(tau, denom)
    num = jnp.log(jnp.maximum(jnp.where(valid, q, 1.0), Q_FLOOR))
    return tilted_softmax(num, ref, tok, valid, beta, d)


def tilted_softmax(num: Array, ref: Array | None, tok: Array | None, valid: Array, beta: Any, d: Array,
                   hard: Array | None = None) -> tuple[Array, Array]:
    """``softmax((num + [beta > 0] beta ref) / d)`` over each row's valid entries (times ``tok``).

    The one weight formula of the package: :func:`weights_from` calls it with ``num = log q``,
    :func:`~jaxweight.maxent.candidate_weights` with ``num = U``. ``num`` must be finite where
    ``valid``; ``d > 0``. ``hard`` (bool[], optional) selects the exact ``d -> 0`` limit:
    uniform over the valid entries at the row's largest ``num`` (the caller passes a safe ``d``).
    Returns ``(w, log w)`` as :func:`weights_from`.
    """
    beta = jnp.asarray(beta, jnp.float32)
    if ref is not None:
        num = num + jnp.where(beta > 0, beta, 0.0) * jnp.where(valid, ref, 0.0)
    s = jnp.where(valid, num / d, LOW)
    if hard is not None:
        top_num = jnp.max(jnp.where(valid, num, LOW), axis=-1, keepdims=True, initial=LOW)
        s = jnp.where(hard, jnp.where(valid & (num == top_num), 0.0, LOW), s)
    mx = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True, initial=LOW))
    # a valid score can overflow to +-inf (huge finite inputs): a row whose largest score is not
    # finite shares its mass among the valid entries at it (+inf: those; all -inf: every one;
    # a valid score of exactly LOW, -3.4e38, next to -inf ones counts as -inf here)
    top = jnp.isfinite(mx) & (mx > LOW)
    at_top = valid & ((s == mx) | ((mx == LOW) & (s == -jnp.inf)))
    z = jnp.where(top, s - mx, jnp.where(at_top, 0.0, LOW))
    lw = z
    if tok is not None:
        # w ~ exp(z) * tok in the log domain, shifted again: a huge finite count (3e38)
        # would overflow the product
        lw = z + jnp.log(jnp.maximum(jnp.where(valid, tok, 1.0), 1.0))
        m2 = jax.lax.stop_gradient(jnp.max(jnp.where(valid, lw, LOW), axis=-1, keepdims=True, initial=LOW))
        lw = lw - m2
    e = jnp.where(valid, jnp.exp(lw), 0.0)
    tot = jnp.sum(e, axis=-1, keepdims=True)
    tot = jnp.where(tot > 0, tot, 1.0)
    return e / tot, lw - jnp.log(tot)


def uniform_weights(mask: Any) -> Array:
    """``1/n`` on the masked-in entries of each row, 0 elsewhere.

    Args:
      mask: bool[P, G].

    Returns:
      f32[P, G].
    """
    check_rank(mask, 2, "mask")
    m = jnp.asarray(mask, bool)
    n = jnp.sum(m, axis=-1, keepdims=True, dtype=jnp.float32)
    return jnp.where(m, 1.0 / jnp.maximum(n, 1.0), 0.0)


# -------------------------------------------------------------------- entropy
@flax.struct.dataclass
class WeightEntropy:
    """Entropy statistics of a weight matrix.

    Attributes:
      mean, min, max: f32[] over rows with at least one valid entry (0 if none).
      per_group: f32[P] ``-sum w log max(w, 1e-12)`` (not renormalised).
      normalized: f32[] mean over all rows of ``H(w') / ln n`` (``w'`` the
        floored, renormalised row; rows with ``n <= 1`` count 0).
      advantage: f32[P, G] ``w - 1/n`` on valid entries, 0 elsewhere.
      count: i32[] rows with at least one valid entry. ``count == 0`` (an all-masked or
        all-NaN batch) means nothing was measured: ``mean`` is then 0 by convention, and the
        controllers (:func:`~jaxweight.maxent.update_tau`) ignore the measurement.
    """

    mean: Array
    min: Array
    max: Array
    per_group: Array
    normalized: Array
    advantage: Array
    count: Array

    @property
    def valid(self) -> Array:
        """bool[]: whether the statistics measured anything (``count > 0``)."""
        return self.count > 0


def weight_entropy(weights: Any, mask: Any = None) -> WeightEntropy:
    """Entropy statistics of per-group weights (maxent_grpo ``WeightStats``).

    Args:
      weights: f32[P, G].
      mask: bool[P, G] or None; non-finite weights count as masked.

    Returns:
      :class:`WeightEntropy`.

    Example::

        import jax.numpy as jnp
        from jaxweight import maxent

        assert abs(float(maxent.weight_entropy(jnp.array([[.1, .2, .7]])).mean) - 0.8018) < 1e-3
    """
    w = matrix(weights, "weights")
    return entropy_from(w, mask_of(mask, w, "weights") & jnp.isfinite(w))[0]


def entropy_from(w: Array, valid: Array, n: Array | None = None, log_w: Array | None = None,
                 extra_sums: tuple[Array, ...] = ()):
    """Entropy statistics and ESS of ``w`` over ``valid`` in one pass (invalid entries may hold anything).

    ``n`` (f32[P], the valid count of each row) is counted and ``log_w``
    (``log w``, e.g. from :func:`weights_from`) computed when not given.
    Returns ``(WeightEntropy, ess f32[P], sums)``; ``sums`` are the totals of
    ``[n > 0, ess, *extra_sums]`` (f32[P] vectors), pooled with the
    entropy's own scalar reductions.
    """
    if n is None:
        (n,) = row_counts(valid)
    wv = jnp.where(valid, w, 0.0)
    if log_w is None:
        # clamp before the log: a valid 0 weight must not give log 0 (and a NaN gradient)
        log_w = jnp.log(jnp.maximum(jnp.where(valid, wv, 1.0), W_FLOOR))
    lw = jnp.where(valid, jnp.maximum(log_w, math.log(W_FLOOR)), 0.0)  # log max(w, 1e-12)
    # wc = max(w, 1e-12) differs from w by d = max(1e-12 - w, 0), where log(wc) = log(1e-12):
    # sum(wc) = s1 + sum(d) and sum(wc log wc) = sum(w log wc) + log(1e-12) sum(d)
    d = jnp.where(valid, jnp.maximum(W_FLOOR - wv, 0.0), 0.0)
    wlw, s1, s2, dsum = row_sums(wv * lw, wv, wv * wv, d)
    per_group = 0.0 - wlw
    # H(w') with w' = wc / S: H = log S - sum(wc log wc) / S
    S = s1 + dsum
    clw = wlw + math.log(W_FLOOR) * dsum
    Sg = jnp.where(S > 0, S, 1.0)
    h_norm = jnp.log(Sg) - clw / Sg
    ratio = jnp.where(n > 1, h_norm / jnp.log(jnp.maximum(n, 2.0)), 0.0)
    ess = jnp.where(s2 > 0, s1 * s1 / jnp.where(s2 > 0, s2, 1.0), 0.0)
    nonempty = n > 0
    rows, total, ratio_sum, *sums = row_sums(nonempty, jnp.where(nonempty, per_group, 0.0), ratio, ess,
                                             *extra_sums)
    neg_min, mx = row_maxes(jnp.where(nonempty, -per_group, LOW), jnp.where(nonempty, per_group, LOW))
    has = rows > 0
    mean = jnp.where(has, total / jnp.maximum(rows, 1.0), 0.0)
    normalized = ratio_sum / max(n.shape[0], 1)
    adv = jnp.where(valid, wv - 1.0 / jnp.maximum(n, 1.0)[:, None], 0.0)
    ent = WeightEntropy(mean=mean, min=jnp.where(has, -neg_min, 0.0), max=jnp.where(has, mx, 0.0),
                        per_group=per_group, normalized=normalized, advantage=adv, count=rows.astype(jnp.int32))
    return ent, ess, (rows, *sums)


def effective_sample_size(weights: Any, mask: Any = None) -> Array:
    """Kish effective sample size ``(sum w)^2 / sum w^2`` of each row.

    Args:
      weights: f32[P, G] non-negative weights.
      mask: bool[P, G] or None.

    Returns:
      f32[P] in ``[1, n]``; empty or all-zero rows give 0. The ESS does not depend on the
      scale of a row, so it is computed from ``log w`` shifted by the row's largest:
      finite weights of any magnitude (3e38) give a finite ESS.
    """
    w = matrix(weights, "weights")
    pos = mask_of(mask, w, "weights") & jnp.isfinite(w) & (w > 0)
    lw = jnp.log(jnp.where(pos, w, 1.0))
    top = jnp.max(jnp.where(pos, lw, LOW), axis=-1, keepdims=True, initial=LOW)
    e = jnp.where(pos, jnp.exp(jnp.where(pos, lw - top, 0.0)), 0.0)
    s1, s2 = jnp.sum(e, axis=-1), jnp.sum(e * e, axis=-1)
    return jnp.where(s2 > 0, s1 * s1 / jnp.where(s2 > 0, s2, 1.0), 0.0)
