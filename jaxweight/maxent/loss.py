"""The GRPO / MaxEnt policy loss: token-level clipped ratio, per-completion signal, k3 KL.

``policy_loss`` is the learner's objective of GRPO-style training, written once: the ratio
``pi / pi_behaviour`` of every sampled token (``behaviour_logp``: the log-prob of the
distribution the token was *sampled from*), clipped PPO-style around the per-completion
``signal`` (GRPO advantages, or MaxEnt weights centred on their group, ``G * w - 1``), plus
``kl_coef`` times the k3 estimate of KL(pi || pi_ref) per token. ``kl_coef`` is the loss's
own coefficient: it is not the ``beta`` inside the MaxEnt weights. Token normalisation:
``"sequence_mean"`` (GRPO: mean over each completion's tokens, then over completions),
``"token_mean"`` (DAPO: mean over all tokens of the batch), ``"constant"`` (Dr.GRPO: sum over
tokens / (rows x ``max_tokens``)). Optional per-candidate ``weights`` (xDr.GRPO,
:func:`~jaxweight.maxent.candidate_weights`) replace the uniform aggregation over each group's
completions. Non-finite log-probs, signals or weights are masked out and counted.

Example::

    import jax, jax.numpy as jnp
    from jaxweight import maxent

    logp = jnp.log(jnp.full((4, 3), 0.5))                 # f32[N, L] under the learner
    signal = jnp.array([1.0, -1.0, 0.5, -0.5])            # f32[N] e.g. group advantages
    mask = jnp.array([[1, 1, 0]] * 4, bool)
    loss, m = jax.jit(maxent.policy_loss)(logp, logp, signal, mask, ref_logp=logp, kl_coef=0.04)
    assert abs(float(loss)) < 1e-6 and float(m["policy/clip_fraction"]) == 0.0

References: GRPO arXiv:2402.03300; PPO arXiv:1707.06347; k3 estimator (J. Schulman,
"Approximating KL divergence", 2020); DAPO arXiv:2503.14476; Dr.GRPO arXiv:2503.20783;
xDr.GRPO ("Exploration Should Act at the Group Level in RL LLM Fine-Tuning",
https://github.com/liv-daliberti/maxent-grpo ``paper/main.tex``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._util import check_choice, check_rank, check_same_shape, check_value
from ._common import FMAX

__all__ = ["NORMALIZATIONS", "policy_loss", "k3_kl"]

NORMALIZATIONS = ("sequence_mean", "token_mean", "constant")


def k3_kl(logp: Any, ref_logp: Any) -> jax.Array:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(d) - d - 1`` with ``d = ref_logp - logp`` (>= 0).

    Args:
      logp, ref_logp: f32[..., L] log-probs of the sampled tokens under the policy and the reference.

    Returns:
      f32[..., L].
    """
    d = jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)
    return jnp.exp(d) - d - 1.0


def _aggregation_scale(w: jax.Array, cand: jax.Array) -> jax.Array:
    """f32[N] multipliers ``n_g w_i / sum_g w`` over the candidates ``cand`` (bool[P, G]); 0 elsewhere."""
    n = jnp.sum(cand, axis=-1, keepdims=True, dtype=jnp.float32)
    hi = jnp.max(jnp.where(cand, w, 0.0), axis=-1, keepdims=True)
    lo = jnp.min(jnp.where(cand, w, FMAX), axis=-1, keepdims=True)
    has = hi > 0
    # divided by the group's largest first, so that weights near the float32 limit sum finitely
    wv = jnp.where(cand, w, 0.0) / jnp.where(has, hi, 1.0)
    tot = jnp.sum(wv, axis=-1, keepdims=True)
    # equal weights are the uniform aggregation: exactly 1, where n w / sum w can round away from it
    s = jnp.where(hi == lo, 1.0, n * wv / jnp.where(has, tot, 1.0))
    return jnp.where(cand & has, s, 0.0).reshape(-1)


def policy_loss(logp: Any, behaviour_logp: Any, signal: Any, mask: Any, *, ref_logp: Any = None,
                kl_coef: Any = 0.0, clip_eps: Any = 0.2, clip_eps_high: Any = None,
                normalization: str = "sequence_mean", max_tokens: int | None = None,
                token_entropy: Any = None, weights: Any = None) -> tuple[jax.Array, dict]:
    """Clipped token-level policy-gradient loss plus ``kl_coef`` x k3 KL to the reference.

    Per valid token ``t`` of completion ``i``: ``r = exp(logp - behaviour_logp)``,
    ``pg = -min(r A_i, clip(r, 1 - clip_eps, 1 + clip_eps_high) A_i)`` and
    ``kl = k3(logp, ref_logp)``; the loss is the normalised sum of ``pg + kl_coef * kl``.
    ``signal`` and the log-probs other than ``logp`` are data (no gradient flows into them).

    ``weights`` (xDr.GRPO) replace the uniform aggregation over each group's candidates:
    completion ``i`` of group ``g`` has its ``pg`` multiplied by ``n_g w_i / sum_g w``
    (``n_g`` the group's completions with a valid token), so that uniform weights give exactly
    the loss without them (a group whose valid weights are all equal gets exactly 1, bit for
    bit) and ``normalization="constant"`` with uniform weights is Dr.GRPO. Only the
    policy-gradient term is reweighted, not the KL term. Weights are data, like ``signal``.

    Args:
      logp: f32[N, L] log-probs of the sampled tokens under the policy being trained.
      behaviour_logp: f32[N, L] their log-probs under the distribution they were sampled from
        (with the sampling temperature applied).
      signal: f32[N] per-completion signal (advantage, or centred MaxEnt weight).
      mask: bool[N, L] the completion's tokens (up to and including EOS).
      ref_logp: f32[N, L] log-probs under the reference policy, or None (no KL term).
      kl_coef: f32[] coefficient of the KL term (>= 0).
      clip_eps: f32[] lower clip range (> 0); ``clip_eps_high``: upper (DAPO's clip-higher),
        default ``clip_eps``.
      normalization: ``"sequence_mean"``, ``"token_mean"`` or ``"constant"`` (static).
      max_tokens: the constant of ``"constant"`` (default L).
      token_entropy: f32[N, L] policy entropy at each position, reported as ``policy/entropy``;
        without it, ``policy/entropy`` is the Monte-Carlo estimate ``-mean(behaviour_logp)``.
      weights: f32[P, G] per-candidate aggregation weights with ``P * G = N``, the rows of
        ``logp`` in group-major order (completion ``i`` is candidate ``i % G`` of group
        ``i // G``), e.g. :func:`candidate_weights`; need not be normalised; None: uniform.
        A completion with a negative or non-finite weight is left out (its tokens counted in
        ``invalid_tokens``) and its group renormalised without it; a group whose weights are
        all 0 contributes no policy gradient.

    Returns:
      ``(loss f32[], metrics)``: flat ``{"policy/...": f32[]}`` with ``pg_loss``, ``kl``,
      ``clip_fraction`` (tokens whose gradient the clip removed), ``ratio_mean``, ``ratio_max``,
      ``entropy``, ``tokens`` and ``invalid_tokens`` (masked-in tokens with non-finite inputs).
    """
    check_rank(logp, 2, "logp")
    n_rows = jnp.shape(logp)[0]
    for x, name in ((behaviour_logp, "behaviour_logp"), (mask, "mask")):
        check_rank(x, 2, name)
        check_same_shape(logp, x, "logp", name)
    check_rank(signal, 1, "signal")
    if jnp.shape(signal)[0] != jnp.shape(logp)[0]:
        raise ValueError(f"signal must have shape ({jnp.shape(logp)[0]},), got {jnp.shape(signal)}")
    if weights is not None:
        check_rank(weights, 2, "weights")
        if np.prod(jnp.shape(weights)) != jnp.shape(logp)[0]:
            raise ValueError(f"weights must have shape (P, G) with P * G = {jnp.shape(logp)[0]} (the rows of "
                             f"logp), got {jnp.shape(weights)}")
    check_choice(normalization, "normalization", NORMALIZATIONS)
    check_value(kl_coef, "kl_coef", ge=0.0)
    check_value(clip_eps, "clip_eps", gt=0.0)
    n, L = jnp.shape(logp)
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be a static int >= 1, got {max_tokens!r}")
    hi = clip_eps if clip_eps_high is None else check_value(clip_eps_high, "clip_eps_high", gt=0.0)
    lp = jnp.asarray(logp, jnp.float32)
    old = jax.lax.stop_gradient(jnp.asarray(behaviour_logp, jnp.float32))
    adv = jax.lax.stop_gradient(jnp.asarray(signal, jnp.float32))
    m = jnp.asarray(mask, bool)
    bad = ~jnp.isfinite(old) | ~jnp.isfinite(jax.lax.stop_gradient(lp)) | ~jnp.isfinite(adv)[:, None]
    if ref_logp is not None:
        check_rank(ref_logp, 2, "ref_logp")
        check_same_shape(logp, ref_logp, "logp", "ref_logp")
        ref = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
        bad = bad | ~jnp.isfinite(ref)
    if weights is not None:
        wg = jax.lax.stop_gradient(jnp.asarray(weights, jnp.float32))
        w_ok = jnp.isfinite(wg) & (wg >= 0)
        bad = bad | ~w_ok.reshape(n_rows)[:, None]
    invalid = jnp.sum(m & bad, dtype=jnp.int32)
    m = m & ~bad
    mf = m.astype(jnp.float32)
    # every masked-out entry is replaced before exp so no NaN / inf reaches the gradient
    lp_s = jnp.where(m, lp, 0.0)
    old_s = jnp.where(m, old, 0.0)
    a = jnp.where(jnp.isfinite(adv), adv, 0.0)
    if weights is not None:
        # -min(r s A, clip(r) s A) = -s min(r A, clip(r) A) for s >= 0; scaling the signal, not pg,
        # keeps the graph after it unchanged, so s = 1 gives the unweighted loss bit for bit under jit
        a = a * _aggregation_scale(wg, jnp.any(m, axis=-1).reshape(wg.shape))
    a = a[:, None]
    ratio = jnp.exp(lp_s - old_s)
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + hi)
    pg = -jnp.minimum(ratio * a, clipped * a)
    per_tok = pg
    kl = jnp.zeros_like(pg)
    if ref_logp is not None:
        kl = k3_kl(lp_s, jnp.where(m, ref, 0.0))
        per_tok = pg + jnp.asarray(kl_coef, jnp.float32) * kl
    ntok = jnp.sum(mf)
    row_tok = jnp.sum(mf, -1)

    def reduce(x):
        x = jnp.where(m, x, 0.0)
        if normalization == "sequence_mean":
            has = row_tok > 0
            per_row = jnp.sum(x, -1) / jnp.maximum(row_tok, 1.0)
            return jnp.sum(jnp.where(has, per_row, 0.0)) / jnp.maximum(jnp.sum(has), 1)
        if normalization == "token_mean":
            return jnp.sum(x) / jnp.maximum(ntok, 1.0)
        return jnp.sum(x) / jnp.float32(n * (max_tokens or L))

    loss = reduce(per_tok)
    sg = jax.lax.stop_gradient
    tok_mean = lambda x: jnp.sum(jnp.where(m, sg(x), 0.0)) / jnp.maximum(ntok, 1.0)  # noqa: E731
    active = ((ratio > 1.0 + hi) & (a > 0)) | ((ratio < 1.0 - clip_eps) & (a < 0))
    ent = -old_s if token_entropy is None else jnp.asarray(token_entropy, jnp.float32)
    metrics = {
        "policy/pg_loss": sg(reduce(pg)),
        "policy/kl": tok_mean(kl),
        "policy/clip_fraction": tok_mean(active.astype(jnp.float32)),
        "policy/ratio_mean": tok_mean(ratio),
        "policy/ratio_max": jnp.max(jnp.where(m, sg(ratio), 0.0), initial=0.0),
        "policy/entropy": tok_mean(ent),
        "policy/tokens": ntok,
        "policy/invalid_tokens": invalid.astype(jnp.float32),
    }
    return loss, metrics
