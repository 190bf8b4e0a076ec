"""The reward pipeline and the MaxEnt-GRPO training step, composed from the public functions.

:func:`compute_reward_statistics` is zero-truncation -> :func:`group_advantages`
-> SEED scaling -> :func:`q_distribution`; :func:`maxent_step` adds
:func:`weight_matrix`, :func:`weight_entropy`, :func:`effective_sample_size`
and the controller update (:func:`jaxweight.controllers.update`). Each public
function is argument checks plus an internal kernel (``row_stats`` +
``advantages_from``, ``q_from``, ``weights_from``, ``entropy_from``,
``ess_from``); the pipeline calls the same kernels once on shared row
statistics, so there is one implementation of the math.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from .. import controllers as C
from .._util import check_same_shape, warn_deprecated
from ._common import Array, check_if_concrete, check_modes, mask_of, matrix, other
from .advantages import advantages_from, batch_stats, moments_from, row_stats, zero_std_rows, zero_truncated
from .seed import seed_alpha as seed_alpha_of
from .seed import semantic_entropy
from .weights import WeightEntropy, entropy_from, q_from, weights_from

__all__ = ["RewardStatistics", "compute_reward_statistics", "MaxEntStepOutput", "maxent_step"]


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

    @property
    def num_nonfinite(self) -> Array:
        """Deprecated spelling of :attr:`n_nonfinite`."""
        warn_deprecated("RewardStatistics.num_nonfinite", "RewardStatistics.n_nonfinite")
        return self.n_nonfinite


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

    Hyperparameters given as Python numbers / concrete arrays are checked
    (``q_temperature > 0``, ``q_epsilon >= 0``, ``eps >= 0``, ``seed_alpha >= 0``,
    a finite ``seed_num_generations``); traced ones are not (see :func:`q_distribution` for a checked leaf).

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

        stats = compute_reward_statistics(rewards, mask, q_temperature=0.5)
        stats.advantages, stats.q, stats.frac_zero_std
    """
    return _reward_statistics(
        utilities, mask, truncated, q_temperature, q_epsilon, scale, eps, ddof, baseline, seed_cluster_ids,
        seed_logp_sum, seed_token_counts, seed_alpha, seed_normalize_by_max_entropy, seed_length_normalize,
        seed_num_generations)[0]


def _reward_statistics(utilities, mask, truncated, q_temperature, q_epsilon, scale, eps, ddof, baseline,
                       seed_cluster_ids=None, seed_logp_sum=None, seed_token_counts=None, seed_alpha=0.0417,
                       seed_normalize_by_max_entropy=True, seed_length_normalize=True,
                       seed_num_generations=None, ok=None):
    """``(RewardStatistics, RowStats, excluded f32[])``: ``ok`` (bool[P, G] or None) marks entries
    whose other inputs are usable; masked-in entries that are not are left out and counted."""
    ddof = check_modes(scale, baseline, ddof)
    check_if_concrete(eps, "eps", ge=0.0)
    check_if_concrete(q_temperature, "q_temperature", gt=0.0)
    check_if_concrete(q_epsilon, "q_epsilon", ge=0.0)
    check_if_concrete(seed_alpha, "seed_alpha", ge=0.0)
    check_if_concrete(seed_num_generations, "seed_num_generations")
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
    """Result of :func:`maxent_step`.

    Attributes:
      advantages: f32[P, G] group advantages.
      q: f32[P, G] listwise target.
      weights: f32[P, G] MaxEnt weights (computed with the *incoming* tau/beta).
      entropy: :class:`WeightEntropy` of ``weights``.
      ess: f32[P] effective sample size of each row.
      ess_mean: f32[] mean ESS over non-empty rows.
      max_weight: f32[] largest weight.
      frac_zero_std: f32[] fraction of non-empty groups with zero reward std.
      zero_std: bool[P].
      mean, std: f32[] reward moments (population std).
      n_nonfinite: i32[] masked-in entries whose reward was NaN / inf (and
        whose reference log-prob and token count were finite).
      n_invalid: i32[] masked-in entries left out because their reward,
        ``ref_logp`` or token count was NaN / inf.
      valid: bool[P, G] entries that took part (masked in, every input finite).
      kl: f32[] the measured KL passed in (NaN when none).
      state: the updated :class:`~jaxweight.controllers.ControllerState`
        (exactly the incoming one when no entry was valid).
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
    state: C.ControllerState

    @property
    def num_nonfinite(self) -> Array:
        """Deprecated spelling of :attr:`n_nonfinite`."""
        warn_deprecated("MaxEntStepOutput.num_nonfinite", "MaxEntStepOutput.n_nonfinite")
        return self.n_nonfinite

    def to_dict(self, prefix: str = "maxent") -> dict[str, float]:
        """Flat ``{"maxent/weight_entropy": float, ...}`` for loggers (host side, one transfer).

        Keys: ``weight_entropy`` (mean), ``weight_entropy_min``,
        ``weight_entropy_max``, ``weight_entropy_normalized``, ``ess_mean``,
        ``max_weight``, ``frac_zero_std``, ``reward_mean``, ``reward_std``,
        ``tau``, ``beta`` (the updated controller), ``entropy_target``,
        ``kl``, ``n_invalid``, ``n_nonfinite``. ``kl`` and ``entropy_target``
        are left out when unset (NaN). A vmapped (sweep) output gives the mean
        over the sweep.
        """
        from .. import metrics

        d = {
            "weight_entropy": self.entropy.mean,
            "weight_entropy_min": self.entropy.min,
            "weight_entropy_max": self.entropy.max,
            "weight_entropy_normalized": self.entropy.normalized,
            "ess_mean": self.ess_mean,
            "max_weight": self.max_weight,
            "frac_zero_std": self.frac_zero_std,
            "reward_mean": self.mean,
            "reward_std": self.std,
            "tau": self.state.tau,
            "beta": self.state.beta,
            "entropy_target": self.state.current_target,
            "kl": self.kl,
            "n_invalid": self.n_invalid,
            "n_nonfinite": self.n_nonfinite,
        }
        out = metrics.flatten(d, prefix)
        p = prefix.rstrip("/")
        for k in ("kl", "entropy_target"):
            key = f"{p}/{k}" if p else k
            if key in out and out[key] != out[key]:
                del out[key]
        return out


def maxent_step(
    state: C.ControllerState,
    utilities: Any,
    ref_logp: Any,
    token_counts: Any = None,
    mask: Any = None,
    cfg: C.ControllerConfig | None = None,
    *,
    global_step: Any = 0,
    measured_kl: Any = None,
    q_temperature: Any = 1.0,
    q_epsilon: Any = 1e-6,
    truncated: Any = None,
    lr_scale: Any = 1.0,
    scale: str = "group",
    eps: Any = 1e-4,
    ddof: int = 1,
    baseline: str = "mean",
    include_reference_term: bool = True,
    normalize_by_tokens: bool = True,
    schedule: C.TauSchedule | None = None,
    kl: C.KLController | None = None,
) -> MaxEntStepOutput:
    """One jitted MaxEnt-GRPO weighting step (statistics, weights, controllers).

    In a single compiled call: :func:`compute_reward_statistics`
    (zero-truncation, moments, advantages, ``q``), :func:`weight_matrix` with
    the state's ``tau`` / ``beta`` / ``denom``, :func:`weight_entropy`,
    :func:`effective_sample_size`, the max weight and the zero-std fraction,
    then :func:`jaxweight.controllers.update` -- tau toward ``cfg``'s entropy
    target from the measured mean weight entropy, and beta from
    ``measured_kl`` -- the order of maxent_grpo's training loop (the weights
    use the incoming tau).

    Bad data: an entry whose reward, ``ref_logp`` or token count is NaN / inf
    is left out of every statistic, exactly as if it were masked (advantage,
    ``q`` and weight 0), and counted in ``n_invalid``; a batch with no valid
    entry leaves the controller state exactly unchanged.

    Every continuous argument (state leaves, ``cfg`` leaves, ``q_temperature``,
    ``q_epsilon``, ``eps``, ``global_step``) is traced, so new values never
    recompile and ``jax.vmap`` over states and temperatures runs a whole
    hyperparameter sweep in one call::

        states = jax.vmap(controllers.init_controller)(taus, betas)          # [S]
        out = jax.vmap(lambda s, t: maxent_step(s, u, ref, tok, mask, cfg, q_temperature=t))(
            states, temps)                                                    # out.weights: [S, P, G]

    Args:
      state: :class:`~jaxweight.controllers.ControllerState`.
      utilities: f32[P, G] rewards.
      ref_logp: f32[P, G] length-normalised reference log-probs.
      token_counts: f32[P, G] or None (token normalisation of the weights).
      mask: bool[P, G] or None.
      cfg: :class:`~jaxweight.controllers.ControllerConfig` or None (no
        controller update).
      global_step: i32[] step for warmup / annealing.
      measured_kl: f32[] or None (no beta update).
      q_temperature, q_epsilon: see :func:`q_distribution`.
      truncated: bool[P, G] or None (zero-truncation).
      lr_scale: multiplier of the tau learning rate.
      scale, eps, ddof, baseline: see :func:`group_advantages` (static modes).
      include_reference_term, normalize_by_tokens: see :func:`weight_matrix`.
      schedule, kl: deprecated; pass ``cfg=controllers.config(schedule=..., kl=...)``.

    Returns:
      :class:`MaxEntStepOutput` (``out.state`` is the updated controller state;
      ``out.to_dict()`` the metrics).

    Example::

        cfg = controllers.config(0.5, 0.04, schedule=controllers.TauSchedule(target_entropy=2.0,
                                                                             learning_rate=0.1))
        state = controllers.init(cfg)
        out = maxent_step(state, rewards, ref_logp, None, mask, cfg, global_step=step)
        state, logs = out.state, out.to_dict()
    """
    if schedule is not None or kl is not None:
        warn_deprecated("maxent_step(..., schedule=, kl=)", "maxent_step(..., cfg=controllers.config(schedule=, kl=))")
        if cfg is not None:
            raise ValueError("pass either cfg or the deprecated schedule= / kl=, not both")
        cfg = C.config(schedule=schedule, kl=kl)
    if cfg is not None and not isinstance(cfg, C.ControllerConfig):
        raise ValueError(f"cfg must be a controllers.ControllerConfig (controllers.config(...)), "
                         f"got {type(cfg).__name__}")
    check_modes(scale, baseline, ddof)
    check_if_concrete(eps, "eps", ge=0.0)
    check_if_concrete(q_temperature, "q_temperature", gt=0.0)
    check_if_concrete(q_epsilon, "q_epsilon", ge=0.0)
    return _maxent_step(
        state, utilities, ref_logp, token_counts, mask, cfg, global_step, measured_kl, q_temperature,
        q_epsilon, truncated, lr_scale, eps, scale=scale, ddof=ddof, baseline=baseline,
        include_reference_term=include_reference_term, normalize_by_tokens=normalize_by_tokens,
    )


@functools.partial(
    jax.jit,
    static_argnames=("scale", "ddof", "baseline", "include_reference_term", "normalize_by_tokens"),
)
def _maxent_step(state, utilities, ref_logp, token_counts, mask, cfg, global_step, measured_kl,
                 q_temperature, q_epsilon, truncated, lr_scale, eps, *, scale, ddof, baseline,
                 include_reference_term, normalize_by_tokens) -> MaxEntStepOutput:
    u = matrix(utilities, "utilities")
    m_in = mask_of(mask, u, "utilities")
    # an entry is valid only if its reward, reference log-prob and token count are all
    # finite: one bad input removes the entry from every statistic, as a mask would
    aux_ok = jnp.ones(u.shape, bool)
    ref = tok = None
    if include_reference_term:
        ref = other(ref_logp, u, "utilities", "ref_logp")
        aux_ok = aux_ok & jnp.isfinite(ref)
    else:
        other(ref_logp, u, "utilities", "ref_logp")
    if normalize_by_tokens and token_counts is not None:
        tok = other(token_counts, u, "utilities", "token_counts")
        aux_ok = aux_ok & jnp.isfinite(tok)
    elif token_counts is not None:
        other(token_counts, u, "utilities", "token_counts")
    stats, rs, n_bad_aux = _reward_statistics(u, m_in, truncated, q_temperature, q_epsilon, scale, eps, ddof,
                                              baseline, ok=aux_ok)
    valid = stats.valid
    # weight_matrix, weight_entropy and effective_sample_size on the checked arrays
    w, log_w = weights_from(stats.q, ref, tok, valid, state.tau, state.beta, state.denom)
    ent, ess, (rows, ess_sum) = entropy_from(w, valid, rs.n, log_w)
    ess_mean = jnp.where(rows > 0, ess_sum / jnp.maximum(rows, 1.0), 0.0)
    max_w = jnp.max(w, initial=0.0)

    new_state = state
    if cfg is not None:
        new_state = C.update(state, ent.mean, global_step, cfg, measured_kl=measured_kl, lr_scale=lr_scale)
        # a batch without a valid entry measured nothing: the state stays exactly as it was
        new_state = jax.tree.map(lambda a, b: jnp.where(rows > 0, a, b), new_state, state)
    kl_val = jnp.asarray(jnp.nan if measured_kl is None else measured_kl, jnp.float32)
    return MaxEntStepOutput(
        advantages=stats.advantages, q=stats.q, weights=w, entropy=ent, ess=ess, ess_mean=ess_mean,
        max_weight=max_w, frac_zero_std=stats.frac_zero_std, zero_std=stats.zero_std, mean=stats.mean,
        std=stats.std, n_nonfinite=stats.n_nonfinite, n_invalid=stats.n_nonfinite + n_bad_aux.astype(jnp.int32),
        valid=valid, kl=kl_val, state=new_state,
    )
