"""The policy loss ``"jaxweight_maxent"``: the listwise loss toward the MaxEnt weights plus tunix's KL term."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ... import maxent as M
from ._compat import tunix_modules

__all__ = ["POLICY_LOSS_MAXENT", "listwise_loss", "weights_from_centred", "masked_token_mean", "maxent_policy_loss"]

POLICY_LOSS_MAXENT = "jaxweight_maxent"


def masked_token_mean(per_token: Any, mask: Any) -> jax.Array:
    """f32[B, L] per-token values -> f32[B] mean over the mask (0 for an empty row)."""
    m = jnp.asarray(mask, jnp.float32)
    return jnp.sum(jnp.asarray(per_token, jnp.float32) * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def listwise_loss(seq_logp: Any, weights: Any, valid: Any, group_scale: Any = None) -> jax.Array:
    """Listwise cross-entropy ``-sum_i w_i log softmax_valid(seq_logp)_i``, mean over groups with mass.

    The policy renormalised over a group's valid completions is pulled toward the MaxEnt
    weights. Invalid entries take no part; groups without weight mass give 0.

    Args:
      seq_logp: f32[P, G] length-normalised sequence log-probs under the policy.
      weights: f32[P, G] non-negative, each row summing to 1 over its valid entries (or 0).
      valid: bool[P, G].
      group_scale: f32[P] multiplier of each group's term (SEED-GRPO) or None.

    Returns:
      f32[] loss.
    """
    s = jnp.asarray(seq_logp, jnp.float32)
    valid = jnp.asarray(valid, bool)
    w = jnp.where(valid, jnp.asarray(weights, jnp.float32), 0.0)
    # log-softmax over the valid entries, with finite masks only (runs under jax_debug_infs)
    mx = jnp.max(jnp.where(valid, s, 0.0), axis=-1, keepdims=True, initial=0.0, where=valid)
    e = jnp.where(valid, jnp.exp(jnp.where(valid, s - mx, 0.0)), 0.0)
    tot = jnp.sum(e, axis=-1, keepdims=True)
    logq = jnp.where(valid, s - mx - jnp.log(jnp.where(tot > 0, tot, 1.0)), 0.0)
    per_group = -jnp.sum(jnp.where(valid, w * jnp.where(valid, logq, 0.0), 0.0), axis=-1)
    if group_scale is not None:
        per_group = per_group * jnp.asarray(group_scale, jnp.float32)
    has = jnp.sum(w, axis=-1) > 0
    return jnp.sum(jnp.where(has, per_group, 0.0)) / jnp.maximum(jnp.sum(has), 1)


def weights_from_centred(advantages: Any) -> tuple[jax.Array, jax.Array]:
    """Invert :class:`MaxEntAdvantageEstimator`'s ``n*w - 1``: ``(w, valid)``, both [P, G].

    An entry whose signal is exactly 0 (an invalid entry, or a group with uniform weights)
    is left out: a uniform target carries no listwise signal here.
    """
    a = jnp.asarray(advantages, jnp.float32)
    valid = (a != 0.0) & jnp.isfinite(a)
    m = jnp.where(valid, jnp.maximum(a + 1.0, 0.0), 0.0)
    tot = jnp.sum(m, axis=-1, keepdims=True)
    return jnp.where(tot > 0, m / jnp.where(tot > 0, tot, 1.0), 0.0), valid


# tunix's aggregation modes that jaxweight.maxent.policy_loss computes the same way
_AGG_MODES = {"token-mean": "token_mean", "sequence-mean-token-mean": "sequence_mean"}


def _kl_term(common, per_token_logps, ref_per_token_logps, mask, algo_config) -> jax.Array:
    """The aggregated KL to the reference: jaxweight's k3 policy-loss term where tunix's mode is the
    k3 estimator (``"low_var_kl"``, no clamp) and its aggregation one jaxweight has, else tunix's."""
    mode, agg = algo_config.kl_loss_mode, algo_config.loss_agg_mode
    clamp = getattr(algo_config, "kl_clamp_value", None)
    if mode == "low_var_kl" and clamp is None and agg in _AGG_MODES:
        # a zero signal leaves only kl_coef * k3 KL, normalised as tunix aggregates it
        kl, _ = M.policy_loss(per_token_logps, jax.lax.stop_gradient(per_token_logps),
                              jnp.zeros(per_token_logps.shape[:1], jnp.float32), mask > 0,
                              ref_logp=ref_per_token_logps, kl_coef=1.0, normalization=_AGG_MODES[agg])
        return kl
    kl = common.compute_kl_divergence(per_token_logps, ref_per_token_logps, mode, clamp_value=clamp)
    return common.aggregate_loss(kl, mask, agg)


def maxent_policy_loss(model, train_example, algo_config, pad_id, eos_id, **kwargs):
    """tunix policy loss ``"jaxweight_maxent"``: listwise loss toward the MaxEnt weights + beta * KL.

    ``loss = listwise_loss(s, w, valid) + beta * KL``: ``s`` the token-mean log-prob of each
    completion under the policy, ``w`` read back from ``train_example.advantages`` (the
    ``n*w - 1`` of :class:`MaxEntAdvantageEstimator`), groups the ``num_generations``
    consecutive rows; KL tunix's ``kl_loss_mode`` estimator against ``ref_per_token_logps``,
    aggregated by ``loss_agg_mode`` (only when tunix computed them, i.e. ``beta != 0``); the k3
    estimator (``"low_var_kl"``) with token-mean or sequence-mean aggregation is the KL term of
    :func:`jaxweight.maxent.policy_loss`.
    ``beta`` is ``train_example.maxent_beta`` when present (:class:`MaxEntGRPOLearner`'s
    controller, carried per step), else ``algo_config.beta`` (frozen into the jitted step);
    ``train_example.maxent_scale`` (f32[B], SEED-GRPO, > 0), when present, scales each group's
    term (the advantages carry ``scale * (n*w - 1)``; ``w`` is read back from them).
    No importance ratio: with ``num_iterations > 1`` later iterations are off-policy.

    Args:
      model: the policy (``nnx.Module``).
      train_example: a tunix ``TrainExample`` of B = P*G rows: ``prompt_ids i32[B, Lp]``,
        ``completion_ids i32[B, L]``, ``completion_mask [B, L]``, ``advantages f32[B]``,
        ``ref_per_token_logps f32[B, L] | None``.
      algo_config: tunix ``GRPOConfig`` (``num_generations``, ``beta``, ``kl_loss_mode``,
        ``loss_agg_mode``, ``temperature``).
      pad_id, eos_id: token ids.

    Returns:
      ``(loss f32[], aux)``; aux has ``kl``, ``pg_clipfrac`` (0: nothing is clipped; tunix
      logs both), ``listwise_loss``, ``weight_max`` and ``beta``.

    Raises:
      ValueError: a packed example (``segment_ids`` set), or B not a multiple of G.
    """
    common, _, _, _ = tunix_modules()
    if getattr(train_example, "segment_ids", None) is not None:
        raise ValueError("the jaxweight_maxent policy loss needs whole groups per row: turn off sequence packing "
                         "(RLTrainingConfig.max_seq_token_per_tpu=None)")
    from flax import nnx

    g = int(algo_config.num_generations)
    mask = jnp.asarray(train_example.completion_mask, jnp.float32)
    if mask.shape[0] % g:
        raise ValueError(f"the jaxweight_maxent policy loss got {mask.shape[0]} rows, not a multiple of "
                         f"num_generations={g}: micro-batch sizes must hold whole groups")
    graphdef, state = nnx.split(model)
    per_token_logps = common.compute_per_token_logps(
        graphdef, state, prompt_tokens=train_example.prompt_ids, completion_tokens=train_example.completion_ids,
        pad_id=pad_id, eos_id=eos_id, stop_gradient=False,
        temperature=getattr(algo_config, "temperature", 1.0))
    per_token_logps = jnp.asarray(per_token_logps, jnp.float32)
    seq = masked_token_mean(per_token_logps, mask)
    adv = jnp.asarray(train_example.advantages, jnp.float32).reshape(-1, g)
    scale = getattr(train_example, "maxent_scale", None)
    if scale is not None:  # the learner scaled the centred weights by SEED (> 0): undo it to read w back
        scale = jnp.asarray(scale, jnp.float32).reshape(-1, g)[:, 0]
        adv = adv / jnp.where(scale > 0, scale, 1.0)[:, None]
    w, valid = weights_from_centred(adv)
    loss_list = listwise_loss(seq.reshape(-1, g), w, valid, scale)
    loss = loss_list
    kl_loss = jnp.float32(0.0)
    beta = getattr(train_example, "maxent_beta", None)
    beta = jnp.float32(algo_config.beta or 0.0) if beta is None else jnp.asarray(beta, jnp.float32).reshape(-1)[0]
    if train_example.ref_per_token_logps is not None:
        kl_loss = _kl_term(common, per_token_logps, train_example.ref_per_token_logps, mask, algo_config)
        loss = loss + beta * kl_loss
    aux = {"kl": kl_loss, "pg_clipfrac": jnp.float32(0.0), "listwise_loss": loss_list,
           "weight_max": jnp.max(w, initial=0.0), "beta": beta}
    return loss, aux
