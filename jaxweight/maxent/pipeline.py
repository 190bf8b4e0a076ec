"""The reward pipeline and the MaxEnt-GRPO step, composed from the public functions' kernels.

:func:`compute_reward_statistics` is zero-truncation -> advantages -> SEED scaling -> ``q``;
:func:`step` adds the weights, their entropy and ESS, and the tau / beta controller updates.
Both call the kernels behind :func:`group_advantages`, :func:`q_distribution`,
:func:`weight_matrix` and :func:`weight_entropy` once on shared row statistics.

Example::

    import jax, jax.numpy as jnp
    from jaxweight import maxent

    cfg = maxent.config(tau=0.5, beta=0.04,
                        schedule=maxent.TauSchedule(target_entropy=1.0, learning_rate=0.1))
    state = maxent.init(cfg)
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.2, 0.9, 0.1]])
    step = jax.jit(maxent.step)
    state, out = step(state, rewards, -jnp.ones((2, 4)), cfg, global_step=1)
    logs = maxent.metrics_dict(out, cfg)            # {"maxent/weight_entropy": ..., "maxent/tau": ...}
    assert out.weights.shape == (2, 4) and logs["maxent/tau"] != 0.5
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from .._util import check_same_shape, check_value
from ._common import Array, check_modes, mask_of, matrix, other
from .settings import MaxEntConfig
from .controllers import ControllerState, measurement, update_beta, update_tau
from .advantages import advantages_from, batch_stats, moments_from, row_stats, zero_std_rows, zero_truncated
from .seed import seed_alpha as seed_alpha_of
from .seed import semantic_entropy
from .weights import WeightEntropy, entropy_from, q_from, weights_from

__all__ = ["RewardStatistics", "compute_reward_statistics", "MaxEntStepOutput", "step", "metrics_dict"]


# ----------------------------------------------------------- reward statistics
@flax.struct.dataclass
class RewardStatistics:
    """Everything :func:`compute_reward_statistics` computes in one call.

    Attributes:
      utilities: f32[P, G] rewards after zero-truncation (0 where invalid).
      valid: bool[P, G] masked in and finite.
      advantages: f32[P, G] (SEED-scaled when SEED is on).
      q: f32[P, G] listwise target from the (truncated) utilities.
      mean, std: f32[] moments of all valid utilities (population std).
      zero_std: bool[P] non-empty rows with population std <= 1e-8.
      frac_zero_std: f32[] fraction of non-empty rows with zero std
        (TRL's ``frac_reward_zero_std``).
      n_nonfinite: i32[] masked-in entries whose reward was NaN / inf
        (excluded).
      seed_entropy: f32[P] semantic entropy (0 when SEED is off).
      seed_scale: f32[P] advantage multiplier (1 when off).
      seed_alpha_effective, seed_max_entropy: f32[] (0 when off).
    """

    utilities: Array
    valid: Array
    advantages: Array
    q: Array
    mean: Array
    std: Array
    zero_std: Array
    frac_zero_std: Array
    n_nonfinite: Array
    seed_entropy: Array
    seed_scale: Array
    seed_alpha_effective: Array
    seed_max_entropy: Array


def compute_reward_statistics(
    utilities: Any,
    mask: Any = None,
    *,
    truncated: Any = None,
    q_temperature: Any = 1.0,
    q_epsilon: Any = 1e-6,
    scale: str = "group",
    eps: Any = 1e-4,
    ddof: int = 1,
    baseline: str = "mean",
    seed_cluster_ids: Any = None,
    seed_logp_sum: Any = None,
    seed_token_counts: Any = None,
    seed_alpha: Any = 0.0417,
    seed_normalize_by_max_entropy: bool = True,
    seed_length_normalize: bool = True,
    seed_num_generations: Any = None,
) -> RewardStatistics:
    """Reward pipeline of maxent_grpo in one call.

    Order: zero-truncation -> moments -> advantages -> SEED scaling of the
    advantages (on when ``seed_cluster_ids`` is given) -> ``q`` (from the
    truncated utilities, never from advantages). A truncated entry's reward
    becomes 0 (and is then valid even if it was NaN).

    SEED log-likelihood = ``logp_sum / tok`` where ``tok > 0`` and
    ``seed_length_normalize``, else ``logp_sum``; ``G`` =
    ``seed_num_generations`` if > 0, else the largest valid group size.

    Settings are checked like every function's (``q_temperature >= 0``, ``q_epsilon >= 0``,
    ``eps >= 0``, ``seed_alpha >= 0``, a finite ``seed_num_generations``): concrete values
    raise ``ValueError`` at once, traced ones under ``jaxweight.checked``.

    Args:
      utilities: f32[P, G] reward totals.
      mask: bool[P, G] or None.
      truncated: bool[P, G] or None (:func:`truncation_flags`).
      q_temperature, q_epsilon: see :func:`q_distribution` (traceable).
      scale, eps, ddof, baseline: see :func:`group_advantages`.
      seed_cluster_ids: i32[P, G] or None (:func:`cluster_ids`).
      seed_logp_sum: f32[P, G] summed sequence log-probs (required with SEED).
      seed_token_counts: f32[P, G] or None.
      seed_alpha: SEED strength (>= 0).
      seed_normalize_by_max_entropy, seed_length_normalize: static flags.
      seed_num_generations: G for the max entropy (<= 0 / None: from the mask).

    Returns:
      :class:`RewardStatistics`.

    Example::

        import jax.numpy as jnp
        from jaxweight import maxent

        stats = maxent.compute_reward_statistics(jnp.array([[1.0, 0.0, 1.0]]), q_temperature=0.5)
        assert stats.q.shape == (1, 3) and float(stats.frac_zero_std) == 0.0
    """
    ddof = check_modes(scale, baseline, ddof)
    check_value(eps, "eps", ge=0.0)
    check_value(q_temperature, "q_temperature", ge=0.0)
    check_value(q_epsilon, "q_epsilon", ge=0.0)
    check_value(seed_alpha, "seed_alpha", ge=0.0)
    if seed_num_generations is not None:
        check_value(seed_num_generations, "seed_num_generations")
    return statistics_from(
        utilities, mask, truncated, q_temperature, q_epsilon, scale, eps, ddof, baseline, seed_cluster_ids,
        seed_logp_sum, seed_token_counts, seed_alpha, seed_normalize_by_max_entropy, seed_length_normalize,
        seed_num_generations)[0]


def statistics_from(utilities, mask, truncated, q_temperature, q_epsilon, scale, eps, ddof, baseline,
                    seed_cluster_ids=None, seed_logp_sum=None, seed_token_counts=None, seed_alpha=0.0417,
                    seed_normalize_by_max_entropy=True, seed_length_normalize=True,
                    seed_num_generations=None, ok=None):
    """``(RewardStatistics, RowStats, excluded f32[])``: ``ok`` (bool[P, G] or None) marks entries
    whose other inputs are usable; masked-in entries that are not are left out and counted.
    Settings are not checked here (the public callers did, or the config did when built)."""
    u = matrix(utilities, "utilities")
    m_in = mask_of(mask, u, "utilities")
    if truncated is not None:
        u = zero_truncated(u, truncated)
    # group_advantages, reward_moments and q_distribution on one set of row statistics
    rs = row_stats(u, m_in, jnp.asarray(q_temperature, jnp.float32), ok)
    valid = rs.valid
    adv = advantages_from(rs, scale, jnp.asarray(eps, jnp.float32), ddof, baseline)
    zero = zero_std_rows(rs)
    extra = (rs.n > 0, zero, rs.n_nonfinite) + (() if ok is None else (rs.n_excluded,))
    b, (rows, zeros, nf, *excluded) = batch_stats(rs, extra)
    mean, std = moments_from(b)
    q = q_from(rs, jnp.asarray(q_epsilon, jnp.float32))
    frac = jnp.where(rows > 0, zeros / jnp.maximum(rows, 1.0), 0.0)

    p = u.shape[0]
    h = jnp.zeros((p,), jnp.float32)
    sc = jnp.ones((p,), jnp.float32)
    a_eff = jnp.float32(0.0)
    hmax = jnp.float32(0.0)
    if seed_cluster_ids is not None:
        if seed_logp_sum is None:
            raise ValueError("seed_logp_sum is required when seed_cluster_ids is given")
        ids = jnp.asarray(seed_cluster_ids, jnp.int32)
        check_same_shape(u, ids, "utilities", "seed_cluster_ids")
        lp = other(seed_logp_sum, u, "utilities", "seed_logp_sum")
        if seed_length_normalize and seed_token_counts is not None:
            tok = other(seed_token_counts, u, "utilities", "seed_token_counts")
            lp = jnp.where(tok > 0, lp / jnp.where(tok > 0, tok, 1.0), lp)
        h = semantic_entropy(ids, lp, m_in)
        largest = jnp.max(rs.n, initial=0.0)
        if seed_num_generations is None:
            g = largest
        else:
            gn = jnp.asarray(seed_num_generations, jnp.float32)
            g = jnp.where(gn > 0, gn, largest)
        a_eff, hmax = seed_alpha_of(seed_alpha, g, seed_normalize_by_max_entropy)
        sc = 1.0 / (1.0 + a_eff * h)
        sc = jnp.where(jnp.isfinite(sc), sc, 1.0)
        adv = adv * sc[:, None]
    stats = RewardStatistics(
        utilities=jnp.where(valid, u, 0.0), valid=valid, advantages=adv, q=q, mean=mean, std=std,
        zero_std=zero, frac_zero_std=frac, n_nonfinite=nf.astype(jnp.int32),
        seed_entropy=h, seed_scale=sc,
        seed_alpha_effective=jnp.asarray(a_eff, jnp.float32),
        seed_max_entropy=jnp.asarray(hmax, jnp.float32),
    )
    return stats, rs, (excluded[0] if excluded else jnp.float32(0.0))


# ------------------------------------------------------------------ the step
@flax.struct.dataclass
class MaxEntStepOutput:
    """The outputs of :func:`step` (the new state is returned beside it).

    Attributes:
      advantages: f32[P, G] group advantages.
      q: f32[P, G] listwise target.
      weights: f32[P, G] MaxEnt weights (computed with the *incoming* tau / beta).
      entropy: :class:`WeightEntropy` of ``weights``.
      ess: f32[P] effective sample size of each row; ess_mean: f32[] over non-empty rows.
      max_weight: f32[] largest weight.
      frac_zero_std: f32[] fraction of non-empty groups with zero reward std; zero_std: bool[P].
      mean, std: f32[] reward moments (population std).
      n_nonfinite: i32[] masked-in entries whose reward was NaN / inf (other inputs finite).
      n_invalid: i32[] masked-in entries left out (reward, ``ref_logp`` or token count not finite).
      valid: bool[P, G] entries that took part.
      kl: f32[] the measured KL passed in (0 when ``has_kl`` is False).
      has_kl: bool[] whether a valid KL was passed (given, ``kl_valid`` and finite).
      tau, beta: f32[] of the updated controller state.
      entropy_target: f32[] the state's ``current_target`` (0 when ``has_entropy_target`` is False).
      has_entropy_target: bool[] the state's ``has_target``.
    """

    advantages: Array
    q: Array
    weights: Array
    entropy: WeightEntropy
    ess: Array
    ess_mean: Array
    max_weight: Array
    frac_zero_std: Array
    zero_std: Array
    mean: Array
    std: Array
    n_nonfinite: Array
    n_invalid: Array
    valid: Array
    kl: Array
    has_kl: Array
    tau: Array
    beta: Array
    entropy_target: Array
    has_entropy_target: Array


def step(
    state: ControllerState,
    rewards: Any,
    ref_logp: Any,
    cfg: MaxEntConfig,
    *,
    token_counts: Any = None,
    mask: Any = None,
    truncated: Any = None,
    global_step: Any = 0,
    measured_kl: Any = None,
    kl_valid: Any = True,
    lr_scale: Any = 1.0,
) -> tuple[ControllerState, MaxEntStepOutput]:
    """One MaxEnt-GRPO weighting step: statistics, weights, then the controllers.

    :func:`compute_reward_statistics` (zero-truncation, moments, advantages, ``q``),
    :func:`weight_matrix` with the state's ``tau`` / ``beta`` / ``denom``,
    :func:`weight_entropy` and :func:`effective_sample_size`, then
    :func:`~jaxweight.maxent.update_tau` from the mean weight entropy and, when
    ``measured_kl`` is given, :func:`~jaxweight.maxent.update_beta` -- the order of
    maxent_grpo's loop (the weights use the incoming tau). The settings come from ``cfg``
    (checked when it was built); the user jits (``jax.jit(maxent.step)``).

    Bad data: an entry whose reward, ``ref_logp`` or token count is NaN / inf is left out
    of every statistic as if masked, and counted in ``n_invalid``; a batch with no valid
    entry leaves the state unchanged, except that an entropy EMA not yet set starts at ``tau``
    (maxent_grpo's rule for a first invalid measurement, which holds even for an empty batch). A KL that is not valid (``kl_valid`` False,
    or not finite) is not used. Nothing the step returns holds a NaN or inf placeholder:
    "not measured" is a flag (``has_kl``, ``has_entropy_target``), so the step runs under
    ``jax_debug_nans`` / ``jax_debug_infs`` on finite, masked inputs.

    Args:
      state: :class:`~jaxweight.maxent.ControllerState`.
      rewards: f32[P, G].
      ref_logp: f32[P, G] length-normalised reference log-probs.
      cfg: :class:`~jaxweight.maxent.MaxEntConfig`.
      token_counts: f32[P, G] or None (token normalisation of the weights).
      mask: bool[P, G] or None.
      truncated: bool[P, G] or None (zero-truncation of the rewards).
      global_step: i32[] step for warmup / annealing.
      measured_kl: f32[] or None (no beta update).
      kl_valid: bool[] whether ``measured_kl`` measured anything (e.g. ``tokens > 0``).
      lr_scale: multiplier of the tau learning rate.

    Returns:
      ``(state, out)``: the updated state and a :class:`MaxEntStepOutput`.
    """
    if not isinstance(cfg, MaxEntConfig):
        raise ValueError(f"cfg must be a maxent.MaxEntConfig (maxent.config(...)), got {type(cfg).__name__}")
    u = matrix(rewards, "rewards")
    m_in = mask_of(mask, u, "rewards")
    # an entry is valid only if its reward, reference log-prob and token count are all
    # finite: one bad input removes the entry from every statistic, as a mask would
    aux_ok = jnp.ones(u.shape, bool)
    ref = tok = None
    if cfg.include_reference_term:
        ref = other(ref_logp, u, "rewards", "ref_logp")
        aux_ok = aux_ok & jnp.isfinite(ref)
    else:
        other(ref_logp, u, "rewards", "ref_logp")
    if cfg.normalize_by_tokens and token_counts is not None:
        tok = other(token_counts, u, "rewards", "token_counts")
        aux_ok = aux_ok & jnp.isfinite(tok)
    elif token_counts is not None:
        other(token_counts, u, "rewards", "token_counts")
    stats, rs, n_bad_aux = statistics_from(u, m_in, truncated, cfg.q_temperature, cfg.q_epsilon, cfg.scale,
                                           cfg.eps, cfg.ddof, cfg.baseline, ok=aux_ok)
    valid = stats.valid
    w, log_w = weights_from(stats.q, ref, tok, valid, state.tau, state.beta, state.denom)
    ent, ess, (rows, ess_sum) = entropy_from(w, valid, rs.n, log_w)
    ess_mean = jnp.where(rows > 0, ess_sum / jnp.maximum(rows, 1.0), 0.0)

    new = update_tau(state, ent, global_step, cfg, lr_scale=lr_scale)
    kl, has_kl = jnp.float32(0.0), jnp.asarray(False)
    if measured_kl is not None:
        kl, has_kl = measurement(measured_kl, kl_valid)
        new = update_beta(new, kl, cfg, valid=has_kl)
    # a batch without a valid entry measured nothing: the state stays as it was, except that an
    # unset entropy EMA starts at tau (maxent_grpo's rule holds on the first call even then)
    empty = state.replace(entropy_ema=jnp.where(state.has_entropy_ema, state.entropy_ema, state.tau),
                          has_entropy_ema=jnp.ones_like(state.has_entropy_ema))
    new = jax.tree.map(lambda a, b: jnp.where(rows > 0, a, b), new, empty)
    out = MaxEntStepOutput(
        advantages=stats.advantages, q=stats.q, weights=w, entropy=ent, ess=ess, ess_mean=ess_mean,
        max_weight=jnp.max(w, initial=0.0), frac_zero_std=stats.frac_zero_std, zero_std=stats.zero_std,
        mean=stats.mean, std=stats.std, n_nonfinite=stats.n_nonfinite,
        n_invalid=stats.n_nonfinite + n_bad_aux.astype(jnp.int32), valid=valid,
        kl=kl, has_kl=has_kl, tau=new.tau, beta=new.beta, entropy_target=new.current_target,
        has_entropy_target=new.has_target,
    )
    return new, out


def metrics_dict(x: MaxEntStepOutput | ControllerState, cfg: MaxEntConfig | None = None) -> dict[str, float]:
    """Flat ``{"maxent/...": float}`` of a step output or a state (host side, one transfer).

    A :class:`MaxEntStepOutput` gives ``weight_entropy`` (mean), ``weight_entropy_min``,
    ``weight_entropy_max``, ``weight_entropy_normalized``, ``ess_mean``, ``max_weight``,
    ``frac_zero_std``, ``reward_mean``, ``reward_std``, ``tau``, ``beta`` (updated),
    ``entropy_target``, ``kl``, ``n_invalid`` and ``n_nonfinite``; a
    :class:`ControllerState` gives its fields but the flags. A value whose flag says it was
    not measured (``kl``, ``entropy_target``; the state's ``entropy_ema``,
    ``current_target``) is left out, in a sweep unless every member has it. A vmapped
    (sweep) output gives the mean over the sweep. ``cfg`` is not needed.
    """
    import numpy as np

    from .. import metrics

    if isinstance(x, ControllerState):
        x = jax.device_get(x)
        out = metrics.flatten(x, prefix="maxent", skip=("has_entropy_ema", "has_target"))
        unset = {"maxent/entropy_ema": x.has_entropy_ema, "maxent/current_target": x.has_target}
    elif isinstance(x, MaxEntStepOutput):
        x = jax.device_get(x)
        d = {
            "weight_entropy": x.entropy.mean, "weight_entropy_min": x.entropy.min,
            "weight_entropy_max": x.entropy.max, "weight_entropy_normalized": x.entropy.normalized,
            "ess_mean": x.ess_mean, "max_weight": x.max_weight, "frac_zero_std": x.frac_zero_std,
            "reward_mean": x.mean, "reward_std": x.std, "tau": x.tau, "beta": x.beta,
            "entropy_target": x.entropy_target, "kl": x.kl, "n_invalid": x.n_invalid, "n_nonfinite": x.n_nonfinite,
        }
        out = metrics.flatten(d, "maxent")
        unset = {"maxent/kl": x.has_kl, "maxent/entropy_target": x.has_entropy_target}
    else:
        raise ValueError(f"metrics_dict takes a MaxEntStepOutput or a ControllerState, got {type(x).__name__}")
    for k, flag in unset.items():
        if not np.all(flag):
            out.pop(k, None)
    return out
