"""tau / beta / meta controllers of MaxEnt-GRPO as pure functions over a pytree.

maxent_grpo steers two scalars of its sequence weights
``w ~ q^(1/tau) * pi_ref^(beta/tau)``:

- **tau** toward a target weight entropy (:func:`update_tau`): an EMA of the
  measured entropy, a step in log space, warmup, clamps and an optionally
  annealed target;
- **beta** toward a target KL (:func:`update_beta`), the multiplicative
  PPO-style KL controller;
- both by a gradient step (:func:`meta_update`) of the analytic
  meta-controller (:func:`analytic_meta_grads`).

The component shape of jaxweight: every setting lives in one frozen
:class:`ControllerConfig` built (and validated) by :func:`config`; the state
comes from :func:`init`; updates take ``(state, data..., cfg)``::

    from jaxweight import controllers as C

    cfg = C.config(tau=0.5, beta=0.04,
                   schedule=C.TauSchedule(target_entropy=0.8, learning_rate=0.1,
                                          minimum_value=0.05, maximum_value=2.0, warmup_steps=0),
                   kl=C.KLController(target=0.05, horizon=10, step_size=0.2))
    state = C.init(cfg)
    state = C.update(state, measured_entropy=1.0, global_step=1, cfg=cfg, measured_kl=0.07)

Every numeric setting is a float32 / int32 array leaf, so a new value never
recompiles and ``jax.vmap`` over a batch of configs runs a sweep. Every early
exit of the original is a masked ``jnp.where`` update, so the same code runs
eagerly, under ``jax.jit`` and under ``jax.vmap``.

Bad settings (reversed bounds, negative or NaN learning rates, NaN or
negative tau / beta, a KL horizon < 1 on an active KL controller) raise
``ValueError`` at :func:`config` / :func:`init_controller` time, and with the
same message under ``jaxweight.checked(jax.jit(...))`` when they are traced.
Updates given a :class:`ControllerConfig` do not check it again (it was
checked when built), so a jitted update keeps JAX's fast dispatch path; a
bare :class:`TauSchedule` / :class:`KLController` / :class:`MetaController`
is checked on every call (a traced check costs ~0.2 ms of dispatch under a
plain ``jax.jit``).
Bad data (a NaN / inf measured entropy, KL or gradient) leaves the state
exactly as it was.

The maxent_grpo ``controller_state.json`` format lives in
:mod:`jaxweight.interop.maxent_grpo`.

Differences from the original: the learning rate is read on every call (the
original cached ``tau_lr`` on first use); a non-finite measured entropy leaves
the state unchanged (the original initialised an unset EMA with tau); there
is no cross-rank broadcast -- in a multi-device loop average the measurement
first (``jax.lax.pmean(entropy, axis_name)``) so every device applies the
same update.

References:
  maxent-grpo, ``maxent_grpo.training.weighting`` (controllers and the
  ``controller_state.json`` format), https://github.com/liv-daliberti/maxent-grpo
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from ._util import array_module, check_order, check_static_int, check_value, warn_deprecated

Array = jax.Array

__all__ = [
    "ControllerState",
    "ControllerConfig",
    "TauSchedule",
    "KLController",
    "MetaController",
    "META_METHODS",
    "ENTROPY_EMA_DECAY",
    "config",
    "init",
    "init_controller",
    "update",
    "update_tau",
    "update_beta",
    "meta_update",
    "target_entropy_at",
    "analytic_meta_grads",
    "meta_should_update",
    "metrics_dict",
]

CONTROLLER_STATE_FILENAME = "controller_state.json"  # kept for old imports; see interop.maxent_grpo
ENTROPY_EMA_DECAY = 0.9
_TAU_FLOOR = 1e-8

# Methods of maxent_grpo's meta-controller that take a gradient step.
META_METHODS = (
    "analytic",
    "analytic_grad",
    "potential",
    "first_order",
    "truncated",
    "truncated_backprop",
    "backprop",
)


def _f32(x: Any) -> Array:
    return jnp.asarray(x, jnp.float32)


def _finite_or_nan(x: Any) -> Array:
    """``x`` as f32; ``None`` (statically "unset") becomes NaN."""
    return jnp.asarray(jnp.nan if x is None else x, jnp.float32)


# --------------------------------------------------------------------- state
@flax.struct.dataclass
class ControllerState:
    """Controller scalars (all 0-d arrays, so a batch of them is a sweep).

    Attributes:
      tau: f32[] temperature of the weights.
      beta: f32[] reference (KL) coefficient.
      denom: f32[] denominator of the weight scores; the controllers keep it
        equal to ``tau`` (1 if ``tau <= 0``); right after loading a
        maxent_grpo file it is ``tau + beta`` (maxent_grpo's rule).
      log_tau: f32[] ``ln tau`` as tracked by the tau controller.
      entropy_ema: f32[] EMA of the measured weight entropy; NaN = unset.
      current_target: f32[] entropy target of the last :func:`update_tau`
        (NaN before the first call or with no target).
      tau_projected, beta_projected: bool[] whether the last meta update of
        tau / beta hit a bound.
      last_tau_grad, last_beta_grad: f32[] the last gradients the meta
        controller applied.
    """

    tau: Array
    beta: Array
    denom: Array
    log_tau: Array
    entropy_ema: Array
    current_target: Array
    tau_projected: Array
    beta_projected: Array
    last_tau_grad: Array
    last_beta_grad: Array


def _tau_log(tau: Array) -> Array:
    return jnp.log(jnp.maximum(tau, _TAU_FLOOR))


def _denom_for(tau: Array) -> Array:
    return jnp.where(tau > 0, tau, 1.0)


def init_controller(tau: Any, beta: Any, denom: Any = None) -> ControllerState:
    """Fresh controller state from initial values (see also :func:`init`).

    Args:
      tau: initial temperature, finite and >= 0 (Python float or f32[] array,
        may be traced).
      beta: initial reference coefficient, finite and >= 0.
      denom: weight-score denominator, finite and >= 0; default (None or NaN)
        ``tau`` (1 if ``tau <= 0``).

    Returns:
      ``ControllerState`` with f32 / bool 0-d leaves; ``entropy_ema`` and
      ``current_target`` unset (NaN).

    Raises:
      ValueError: tau / beta / denom NaN, infinite or negative, or not scalars.

    Example::

        states = jax.vmap(init_controller)(jnp.array([0.3, 0.5]), jnp.array([0.0, 0.1]))
    """
    tau = _f32(tau)
    beta = _f32(beta)
    if jnp.ndim(tau) != 0 or jnp.ndim(beta) != 0:
        raise ValueError(
            f"tau and beta must be scalars (vmap init_controller for a batch), got shapes "
            f"{jnp.shape(tau)} and {jnp.shape(beta)}"
        )
    check_value(tau, "tau", ge=0.0)
    check_value(beta, "beta", ge=0.0)
    if denom is None:
        d = _denom_for(tau)
    else:
        d = _f32(denom)
        # NaN is the "unset" spelling a config uses; anything else must be a number >= 0
        check_value(jnp.where(jnp.isnan(d), 0.0, d), "denom", ge=0.0)
        d = jnp.where(jnp.isnan(d), _denom_for(tau), d)
    # every leaf its own buffer, none shared with the caller's (a config's) arrays: a state
    # passed to jax.jit(..., donate_argnums=...) must not donate one buffer twice or a config's tau
    def nan():
        return jnp.full((), jnp.nan, jnp.float32)

    def zero():
        return jnp.zeros((), jnp.float32)

    return ControllerState(
        tau=jnp.array(tau, jnp.float32, copy=True),
        beta=jnp.array(beta, jnp.float32, copy=True),
        denom=jnp.array(d, jnp.float32, copy=True),
        log_tau=_tau_log(tau),
        entropy_ema=nan(),
        current_target=nan(),
        tau_projected=jnp.zeros((), bool),
        beta_projected=jnp.zeros((), bool),
        last_tau_grad=zero(),
        last_beta_grad=zero(),
    )


def _is_py_nan(x: Any) -> bool:
    return isinstance(x, float) and x != x


def _write_back(state: ControllerState, tau: Array, beta: Array, changed: Array) -> ControllerState:
    """New tau/beta where ``changed``; then ``denom = tau`` and ``log_tau = ln tau`` there."""
    new_tau = jnp.where(changed, tau, state.tau)
    new_beta = jnp.where(changed, beta, state.beta)
    return state.replace(
        tau=new_tau,
        beta=new_beta,
        denom=jnp.where(changed, _denom_for(new_tau), state.denom),
        log_tau=jnp.where(changed, _tau_log(new_tau), state.log_tau),
    )


# ------------------------------------------------------------------ settings
@flax.struct.dataclass
class TauSchedule:
    """Settings of the tau controller (maxent_grpo's ``TauSchedule`` + annealing).

    Every numeric field may be a Python number or an array (vmap a schedule to
    sweep it); :func:`config` turns them into f32 / i32 leaves and checks them.
    ``None`` for a target means "unset"; NaN means the same (what a batched
    sweep uses).

    Attributes:
      target_entropy: weight entropy to reach; ``None`` disables the controller.
      learning_rate: step size in log-tau space per unit of entropy error (>= 0).
      minimum_value: lower clamp of tau (>= 0).
      maximum_value: upper clamp of tau; ``<= 0`` means no cap, else
        ``>= minimum_value``.
      warmup_steps: no update while ``global_step <= max(0, warmup_steps)``.
      target_entropy_start, target_entropy_final: annealed target (each
        defaults to ``target_entropy``).
      target_entropy_horizon: steps (>= 0) over which the target moves
        linearly from start to final; ``0`` uses final at once.
    """

    target_entropy: Any = None
    learning_rate: Any = 0.0
    minimum_value: Any = 0.0
    maximum_value: Any = 0.0
    warmup_steps: Any = -1
    target_entropy_start: Any = None
    target_entropy_final: Any = None
    target_entropy_horizon: Any = 0


@flax.struct.dataclass
class KLController:
    """Adaptive-KL settings for beta (maxent_grpo ``KlControllerSettings``).

    The controller is active only when all three are > 0.

    Attributes:
      target: KL to reach (>= 0; 0 = off).
      horizon: steps over which a full error changes beta by ``step_size``
        (>= 1 when the controller is active).
      step_size: clip of the relative KL error per step (>= 0).
    """

    target: Any = 0.0
    horizon: Any = 0
    step_size: Any = 0.0


@flax.struct.dataclass
class MetaController:
    """maxent_grpo's ``ControllerMetaSettings`` plus tau bounds.

    Numeric fields and ``enabled`` are pytree leaves (sweepable, traceable);
    ``method``, ``objective``, ``optimizer``, ``use_hessian`` and the integer
    step counts are static. Only the first-order analytic update is
    implemented (the methods in :data:`META_METHODS` all take it); any other
    ``method`` leaves the state unchanged, as in the original.

    Attributes:
      enabled: bool, the controller acts only when set.
      method: one of :data:`META_METHODS` to act.
      learning_rate: default step size for both tau and beta (>= 0).
      tau_learning_rate, beta_learning_rate: per-parameter step sizes
        (used when > 0; >= 0).
      beta_grad_clip: clip of the beta gradient (when > 0; >= 0).
      update_interval: the caller applies an update when
        ``step % update_interval == 0`` (:func:`meta_should_update`; >= 1).
      objective, analytic_steps, optimizer, truncation_steps, use_hessian:
        stored and persisted for compatibility with maxent_grpo files.
      last_tau_grad, last_beta_grad: persisted last gradients (the live ones
        are in :class:`ControllerState`).
      tau_min: lower bound of tau (>= 0).
      tau_max: upper bound of tau (``<= 0`` = none, else ``>= tau_min``).
    """

    enabled: Any = False
    method: str = flax.struct.field(pytree_node=False, default="analytic")
    learning_rate: Any = 0.0
    tau_learning_rate: Any = 0.0
    beta_learning_rate: Any = 0.0
    beta_grad_clip: Any = 0.0
    update_interval: int = flax.struct.field(pytree_node=False, default=1)
    objective: str = flax.struct.field(pytree_node=False, default="potential")
    analytic_steps: int = flax.struct.field(pytree_node=False, default=1)
    optimizer: str = flax.struct.field(pytree_node=False, default="sgd")
    truncation_steps: int = flax.struct.field(pytree_node=False, default=1)
    use_hessian: bool = flax.struct.field(pytree_node=False, default=False)
    last_tau_grad: Any = 0.0
    last_beta_grad: Any = 0.0
    tau_min: Any = 0.0
    tau_max: Any = 0.0

    def to_state(self, state: ControllerState | None = None) -> dict[str, Any]:
        """Deprecated: use :func:`jaxweight.interop.maxent_grpo.meta_to_payload`."""
        warn_deprecated("MetaController.to_state", "jaxweight.interop.maxent_grpo.meta_to_payload")
        from .interop import maxent_grpo

        return maxent_grpo.meta_to_payload(self, state)

    @classmethod
    def from_state(cls, payload: Any, base: MetaController | None = None) -> MetaController:
        """Deprecated: use :func:`jaxweight.interop.maxent_grpo.meta_from_payload`."""
        warn_deprecated("MetaController.from_state", "jaxweight.interop.maxent_grpo.meta_from_payload")
        from .interop import maxent_grpo

        return maxent_grpo.meta_from_payload(payload, base)


def _check_schedule(s: TauSchedule) -> None:
    check_value(s.learning_rate, "learning_rate", ge=0.0)
    check_value(s.minimum_value, "minimum_value", ge=0.0)
    check_value(s.maximum_value, "maximum_value")
    check_value(s.warmup_steps, "warmup_steps", integer=True)
    check_value(s.target_entropy_horizon, "target_entropy_horizon", ge=0.0)
    for name in ("target_entropy", "target_entropy_start", "target_entropy_final"):
        v = getattr(s, name)
        if v is not None and not _is_py_nan(v):
            # NaN = unset; +-inf is refused
            xp = array_module(v)
            a = xp.asarray(v, xp.float32)
            check_value(xp.where(xp.isnan(a), 0.0, a), name)
    # maximum_value <= 0 means "no cap": only a positive cap is ordered against the floor
    xp = array_module(s.minimum_value, s.maximum_value)
    mx = xp.asarray(s.maximum_value, xp.float32)
    check_order(s.minimum_value, xp.where(mx > 0, mx, xp.inf), "minimum_value", "maximum_value")


def _check_kl(k: KLController) -> None:
    check_value(k.target, "kl target", ge=0.0)
    check_value(k.step_size, "kl step_size", ge=0.0)
    check_value(k.horizon, "kl horizon", ge=0.0)
    xp = array_module(k.target, k.step_size, k.horizon)
    f32 = lambda x: xp.asarray(x, xp.float32)  # noqa: E731
    active = (f32(k.target) > 0) & (f32(k.step_size) > 0)
    # an active KL controller needs a horizon of at least one step
    check_value(xp.where(active, f32(k.horizon), 1.0), "kl horizon (with target and step_size > 0)", ge=1.0)


def _check_meta(m: MetaController) -> None:
    for name in ("learning_rate", "tau_learning_rate", "beta_learning_rate"):
        check_value(getattr(m, name), f"meta {name}", ge=0.0)
    check_value(m.beta_grad_clip, "meta beta_grad_clip", ge=0.0)
    check_value(m.tau_min, "meta tau_min", ge=0.0)
    check_value(m.tau_max, "meta tau_max")
    check_static_int(m.update_interval, "meta update_interval", 1)
    xp = array_module(m.tau_min, m.tau_max)
    tmax = xp.asarray(m.tau_max, xp.float32)
    check_order(m.tau_min, xp.where(tmax > 0, tmax, xp.inf), "meta tau_min", "meta tau_max")


def _norm_schedule(s: TauSchedule) -> TauSchedule:
    return TauSchedule(
        target_entropy=_finite_or_nan(s.target_entropy),
        learning_rate=_f32(s.learning_rate),
        minimum_value=_f32(s.minimum_value),
        maximum_value=_f32(s.maximum_value),
        warmup_steps=jnp.asarray(s.warmup_steps, jnp.int32),
        target_entropy_start=_finite_or_nan(s.target_entropy_start),
        target_entropy_final=_finite_or_nan(s.target_entropy_final),
        target_entropy_horizon=_f32(s.target_entropy_horizon),
    )


def _norm_kl(k: KLController) -> KLController:
    return KLController(target=_f32(k.target), horizon=_f32(k.horizon), step_size=_f32(k.step_size))


def _norm_meta(m: MetaController) -> MetaController:
    return m.replace(
        enabled=jnp.asarray(m.enabled, bool),
        learning_rate=_f32(m.learning_rate),
        tau_learning_rate=_f32(m.tau_learning_rate),
        beta_learning_rate=_f32(m.beta_learning_rate),
        beta_grad_clip=_f32(m.beta_grad_clip),
        last_tau_grad=_f32(m.last_tau_grad),
        last_beta_grad=_f32(m.last_beta_grad),
        tau_min=_f32(m.tau_min),
        tau_max=_f32(m.tau_max),
    )


@flax.struct.dataclass
class ControllerConfig:
    """Every setting of the controllers in one frozen pytree (built by :func:`config`).

    Attributes:
      tau, beta: f32[] initial values (:func:`init`).
      denom: f32[] initial weight-score denominator (NaN = ``tau``).
      schedule: :class:`TauSchedule` with f32 / i32 leaves (target NaN = off).
      kl: :class:`KLController` with f32 leaves.
      meta: :class:`MetaController` with f32 / bool leaves.
    """

    tau: Array
    beta: Array
    denom: Array
    schedule: TauSchedule
    kl: KLController
    meta: MetaController


def config(
    tau: Any = 1.0,
    beta: Any = 0.0,
    *,
    denom: Any = None,
    schedule: TauSchedule | None = None,
    kl: KLController | None = None,
    meta: MetaController | None = None,
) -> ControllerConfig:
    """All controller settings, checked, as array leaves.

    Args:
      tau: initial temperature (finite, >= 0).
      beta: initial reference coefficient (finite, >= 0).
      denom: initial denominator (None = tau), finite and >= 0.
      schedule: tau controller settings (default: no target, tau fixed).
      kl: adaptive-KL settings for beta (default: off).
      meta: meta-controller settings (default: disabled).

    Returns:
      :class:`ControllerConfig`; numeric settings are f32 / i32 arrays, so a
      new value never recompiles and ``jax.vmap`` over configs sweeps them.

    Raises:
      ValueError: naming the setting, its value and the accepted range, e.g.
        reversed bounds (``minimum_value > maximum_value``), a negative or NaN
        learning rate, a NaN or negative tau / beta, a KL horizon < 1 on an
        active KL controller. The same checks run under
        ``jaxweight.checked(jax.jit(...))`` when the settings are traced.

    Example::

        cfg = config(0.5, 0.04, schedule=TauSchedule(target_entropy=0.8, learning_rate=0.1))
        state = init(cfg)
    """
    schedule = TauSchedule() if schedule is None else schedule
    kl = KLController() if kl is None else kl
    meta = MetaController() if meta is None else meta
    for obj, cls, name in ((schedule, TauSchedule, "schedule"), (kl, KLController, "kl"),
                           (meta, MetaController, "meta")):
        if not isinstance(obj, cls):
            raise ValueError(f"{name} must be a controllers.{cls.__name__}, got {type(obj).__name__}")
    check_value(tau, "tau", ge=0.0)
    check_value(beta, "beta", ge=0.0)
    if denom is not None:
        check_value(denom, "denom", ge=0.0)
    _check_schedule(schedule)
    _check_kl(kl)
    _check_meta(meta)
    return ControllerConfig(
        tau=_f32(tau),
        beta=_f32(beta),
        denom=_finite_or_nan(denom),
        schedule=_norm_schedule(schedule),
        kl=_norm_kl(kl),
        meta=_norm_meta(meta),
    )


def init(cfg: ControllerConfig) -> ControllerState:
    """Fresh controller state from a :class:`ControllerConfig` (no randomness).

    Example::

        state = init(config(tau=0.5, beta=0.04))
    """
    if not isinstance(cfg, ControllerConfig):
        raise ValueError(f"cfg must be a controllers.ControllerConfig (controllers.config(...)), "
                         f"got {type(cfg).__name__}")
    return init_controller(cfg.tau, cfg.beta, cfg.denom)


def _part_of(cfg: Any, kind: type, field: str, check: Any) -> Any:
    """The ``field`` part of a :class:`ControllerConfig` (checked when it was built), or a bare
    ``kind`` checked now (concrete values raise; traced ones through ``jaxweight.checked``)."""
    if isinstance(cfg, ControllerConfig):
        return getattr(cfg, field)
    if isinstance(cfg, kind):
        check(cfg)
        return cfg
    raise ValueError(f"cfg must be a controllers.ControllerConfig or {kind.__name__}, got {type(cfg).__name__}")


def _schedule_of(cfg: Any) -> TauSchedule:
    return _part_of(cfg, TauSchedule, "schedule", _check_schedule)


def _kl_of(cfg: Any) -> KLController:
    return _part_of(cfg, KLController, "kl", _check_kl)


def _meta_of(cfg: Any) -> MetaController:
    return _part_of(cfg, MetaController, "meta", _check_meta)


# ----------------------------------------------------------------- tau rule
def target_entropy_at(schedule: TauSchedule | ControllerConfig, global_step: Any) -> Array:
    """The entropy target of ``schedule`` at ``global_step`` (NaN if none).

    ``target_entropy`` if neither start nor final is set; else (each defaulting
    to ``target_entropy``) ``final`` if ``horizon <= 0``, else
    ``start + (final - start) * min(max(step, 0), H) / H``.
    """
    if isinstance(schedule, ControllerConfig):
        schedule = schedule.schedule
    base = _finite_or_nan(schedule.target_entropy)
    if schedule.target_entropy_start is None and schedule.target_entropy_final is None:
        return base
    start = _finite_or_nan(schedule.target_entropy_start)
    final = _finite_or_nan(schedule.target_entropy_final)
    # NaN (unset) start/final fall back to target_entropy
    start = jnp.where(jnp.isnan(start), base, start)
    final = jnp.where(jnp.isnan(final), base, final)
    horizon = _f32(schedule.target_entropy_horizon)
    step = jnp.asarray(global_step, jnp.float32)
    frac = jnp.minimum(jnp.maximum(step, 0.0), horizon) / jnp.where(horizon > 0, horizon, 1.0)
    annealed = start + (final - start) * frac
    return jnp.where(horizon > 0, annealed, final)


def update_tau(
    state: ControllerState,
    measured_entropy: Any,
    global_step: Any,
    cfg: ControllerConfig | TauSchedule,
    lr_scale: Any = 1.0,
) -> ControllerState:
    """One step of the entropy-targeting tau controller.

    The rule (maxent_grpo ``maybe_update_tau``), with every early exit a masked
    update:

    0. A non-finite ``m`` (no valid data) leaves the state exactly unchanged.
    1. ``lr = learning_rate * (max(lr_scale, 0) if lr_scale is finite else 1)``.
    2. An unset (non-finite) ``entropy_ema`` becomes ``m``.
    3. The target (:func:`target_entropy_at`) is stored in ``current_target``;
       no target -> stop.
    4. Skip while ``global_step <= max(0, warmup_steps)`` (step 0 always skips).
    5. ``entropy_ema = 0.9 * entropy_ema + 0.1 * m``; ``err = target - ema``;
       stop if ``|err| < 1e-12``.
    6. ``log_tau += lr * err``; ``tau = max(exp(log_tau), minimum_value)``,
       capped at ``maximum_value`` if that is > 0; then ``denom = tau``
       (1 if ``tau <= 0``) and ``log_tau = ln(max(tau, 1e-8))``.

    Args:
      state: the controller state.
      measured_entropy: f32[] the measured weight entropy (e.g.
        ``WeightEntropy.mean``).
      global_step: i32[] / int training step.
      cfg: :class:`ControllerConfig` (its ``schedule``) or a :class:`TauSchedule`.
      lr_scale: multiplier of the learning rate (e.g. the main LR schedule).

    Returns:
      The updated state (same structure, dtypes and shapes).

    Example::

        cfg = config(0.5, 0.0, schedule=TauSchedule(target_entropy=0.8, learning_rate=0.1,
                                                    minimum_value=0.05, maximum_value=2.0,
                                                    warmup_steps=0))
        s = init(cfg)
        s = update_tau(s, 1.0, 0, cfg)   # step 0: EMA set, tau unchanged
        s = update_tau(s, 1.0, 1, cfg)   # tau = 0.5 * exp(-0.02)
    """
    schedule = _schedule_of(cfg)
    m = _f32(measured_entropy)
    step = jnp.asarray(global_step, jnp.int32)
    lr_scale = _f32(lr_scale)
    scale = jnp.where(jnp.isfinite(lr_scale), jnp.maximum(lr_scale, 0.0), 1.0)
    lr = _f32(schedule.learning_rate) * scale

    m_ok = jnp.isfinite(m)
    m_safe = jnp.where(m_ok, m, 0.0)
    ema0 = jnp.where(jnp.isfinite(state.entropy_ema), state.entropy_ema, m_safe)

    target = target_entropy_at(schedule, step)
    has_target = jnp.isfinite(target)
    target_safe = jnp.where(has_target, target, 0.0)

    warm = step <= jnp.maximum(0, jnp.asarray(schedule.warmup_steps, jnp.int32))
    active = has_target & ~warm & m_ok
    ema1 = ENTROPY_EMA_DECAY * ema0 + (1.0 - ENTROPY_EMA_DECAY) * m_safe
    err = target_safe - ema1
    move = active & (jnp.abs(err) >= 1e-12)

    log_tau = state.log_tau + lr * err
    tau = jnp.maximum(jnp.exp(log_tau), _f32(schedule.minimum_value))
    cap = _f32(schedule.maximum_value)
    tau = jnp.where(cap > 0, jnp.minimum(tau, cap), tau)

    new = state.replace(
        entropy_ema=jnp.where(active, ema1, ema0),
        current_target=target,
    )
    new = _write_back(new, tau, new.beta, move)
    return _keep_where(m_ok, new, state)


def _keep_where(ok: Array, new: ControllerState, old: ControllerState) -> ControllerState:
    """``new`` where ``ok`` else ``old``, leaf by leaf (bit-exact when not ok)."""
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)


# ------------------------------------------------------------------ KL rule
def update_beta(state: ControllerState, measured_kl: Any, cfg: ControllerConfig | KLController) -> ControllerState:
    """One step of the adaptive-KL beta controller.

    Active only if ``target``, ``horizon`` and ``step_size`` are all > 0 and the
    measured KL is finite: ``err = kl / max(target, 1e-8) - 1`` (stop if
    ``|err| < 1e-8``); ``f = 1 + clip(err, -step_size, step_size) / max(1, horizon)``
    (``f <= 0`` -> ``1e-6``); ``beta = max(0, beta * f)``; then ``denom = tau``
    and ``log_tau = ln tau`` are written back.

    Args:
      state: the controller state.
      measured_kl: f32[] the measured KL(policy || reference).
      cfg: :class:`ControllerConfig` (its ``kl``) or a :class:`KLController`.

    Returns:
      The updated state.

    Example::

        s = update_beta(init_controller(0.5, 0.1), 0.2, KLController(0.1, 10, 0.2))
        # beta = 0.1 * (1 + 0.2 / 10)
    """
    kl = _kl_of(cfg)
    x = _f32(measured_kl)
    target = _f32(kl.target)
    horizon = _f32(kl.horizon)
    step_size = _f32(kl.step_size)
    on = (target > 0) & (horizon > 0) & (step_size > 0) & jnp.isfinite(x)
    err = jnp.where(on, x, 0.0) / jnp.maximum(target, 1e-8) - 1.0
    move = on & (jnp.abs(err) >= 1e-8)
    f = 1.0 + jnp.clip(err, -step_size, step_size) / jnp.maximum(1.0, horizon)
    f = jnp.where(f <= 0, 1e-6, f)
    beta = jnp.maximum(0.0, state.beta * f)
    return _write_back(state, state.tau, beta, move)


def update(
    state: ControllerState,
    measured_entropy: Any,
    global_step: Any,
    cfg: ControllerConfig,
    *,
    measured_kl: Any = None,
    lr_scale: Any = 1.0,
) -> ControllerState:
    """The per-step controller update of maxent_grpo's loop: tau, then beta.

    :func:`update_tau` from ``measured_entropy`` and, when ``measured_kl`` is
    given, :func:`update_beta`. Non-finite measurements leave their part of
    the state unchanged.

    Args:
      state: the controller state.
      measured_entropy: f32[] mean weight entropy of the step.
      global_step: i32[] training step.
      cfg: :class:`ControllerConfig`.
      measured_kl: f32[] or None (no beta update).
      lr_scale: multiplier of the tau learning rate.

    Returns:
      The updated state.
    """
    if not isinstance(cfg, ControllerConfig):
        raise ValueError(f"cfg must be a controllers.ControllerConfig (controllers.config(...)), "
                         f"got {type(cfg).__name__}")
    state = update_tau(state, measured_entropy, global_step, cfg, lr_scale)
    if measured_kl is not None:
        state = update_beta(state, measured_kl, cfg)
    return state


# ---------------------------------------------------------------- meta rule
def meta_should_update(meta: MetaController | ControllerConfig, global_step: Any) -> Array:
    """bool[]: whether ``global_step`` is an update step (``step % update_interval == 0``)."""
    if isinstance(meta, ControllerConfig):
        meta = meta.meta
    interval = max(1, int(meta.update_interval))
    return jnp.asarray(global_step, jnp.int32) % interval == 0


def analytic_meta_grads(
    measured_entropy: Any,
    target_entropy: Any,
    measured_kl: Any = None,
    kl_target: Any = 0.0,
) -> tuple[Array, Array]:
    """The analytic meta-controller gradients ``(tau_grad, beta_grad)``.

    ``tau_grad = H - target`` (entropy too high -> smaller tau) and
    ``beta_grad = kl - kl_target`` when ``kl_target > 0`` (KL too high ->
    larger beta). A gradient that does not apply is NaN, which
    :func:`meta_update` skips, so the result can be traced and vmapped.

    Args:
      measured_entropy: f32[] weight entropy.
      target_entropy: f32[] its target (NaN / None: no tau gradient).
      measured_kl: f32[] or None.
      kl_target: f32[] finite (<= 0: no beta gradient).

    Returns:
      ``(tau_grad f32[], beta_grad f32[])``.

    Raises:
      ValueError: ``kl_target`` NaN or infinite (eagerly, or through
        ``jaxweight.checked`` when traced).
    """
    check_value(kl_target, "kl_target")
    tau_grad = _f32(measured_entropy) - _finite_or_nan(target_entropy)
    if measured_kl is None:
        return tau_grad, jnp.asarray(jnp.nan, jnp.float32)
    kt = _f32(kl_target)
    beta_grad = jnp.where(kt > 0, _f32(measured_kl) - kt, jnp.nan)
    return tau_grad, beta_grad


def _meta_step(
    state: ControllerState, tau_grad: Any, beta_grad: Any, meta: MetaController, lr_scale: Any
) -> tuple[ControllerState, Array]:
    active = jnp.asarray(meta.enabled, bool) & (meta.method in META_METHODS)
    lr_scale = _f32(lr_scale)
    base_lr = _f32(meta.learning_rate)
    tlr = _f32(meta.tau_learning_rate)
    blr = _f32(meta.beta_learning_rate)
    lr_tau = jnp.where(tlr > 0, tlr, base_lr) * lr_scale
    lr_beta = jnp.where(blr > 0, blr, base_lr) * lr_scale

    tau, beta = state.tau, state.beta
    tau_proj, beta_proj = state.tau_projected, state.beta_projected
    last_t, last_b = state.last_tau_grad, state.last_beta_grad
    tau_moved = jnp.asarray(False)
    beta_moved = jnp.asarray(False)

    if tau_grad is not None:
        g = _f32(tau_grad)
        do = active & (lr_tau > 0) & jnp.isfinite(g)
        g0 = jnp.where(do, g, 0.0)
        tmin, tmax = _f32(meta.tau_min), _f32(meta.tau_max)
        raw = jnp.maximum(state.tau - lr_tau * g0, tmin)
        capped = (tmax > 0) & (raw > tmax)
        new_tau = jnp.where(capped, tmax, raw)
        proj = capped | ((tmin > 0) & (new_tau <= tmin))
        tau = jnp.where(do, new_tau, tau)
        tau_proj = jnp.where(do, proj, tau_proj)
        last_t = jnp.where(do, g0, last_t)
        tau_moved = do

    if beta_grad is not None:
        g = _f32(beta_grad)
        do = active & (lr_beta > 0) & jnp.isfinite(g)
        g0 = jnp.where(do, g, 0.0)
        clip = _f32(meta.beta_grad_clip)
        gc = jnp.where(clip > 0, jnp.clip(g0, -clip, clip), g0)
        raw = state.beta + lr_beta * gc
        proj = raw < 0
        beta = jnp.where(do, jnp.maximum(raw, 0.0), beta)
        beta_proj = jnp.where(do, proj, beta_proj)
        last_b = jnp.where(do, g0, last_b)
        beta_moved = do

    changed = tau_moved | beta_moved
    state = state.replace(
        tau_projected=tau_proj, beta_projected=beta_proj,
        last_tau_grad=last_t, last_beta_grad=last_b,
    )
    return _write_back(state, tau, beta, changed), changed


def meta_update(
    state: ControllerState,
    tau_grad: Any = None,
    beta_grad: Any = None,
    cfg: ControllerConfig | MetaController | None = None,
    lr_scale: Any = 1.0,
) -> tuple[ControllerState, Array]:
    """One gradient step of the meta-controller on tau and beta.

    Active only if ``meta.enabled`` and ``meta.method`` is in
    :data:`META_METHODS`. With ``lr_x = (x_learning_rate if > 0 else
    learning_rate) * lr_scale`` (no step for ``x`` if ``lr_x <= 0``):

    - tau (finite ``g``): ``tau = max(tau - lr * g, tau_min)``, capped at
      ``tau_max`` if > 0; ``tau_projected`` if the cap was hit or
      (``tau_min > 0`` and ``tau <= tau_min``).
    - beta (finite ``g``, clipped to ``+-beta_grad_clip`` if > 0):
      ``beta = beta + lr * g`` (note the plus sign: the gradient is
      ``kl - kl_target``); ``beta_projected`` if negative, then floored at 0.

    ``last_tau_grad`` / ``last_beta_grad`` record the raw gradients that were
    applied; ``denom``/``log_tau`` are written back if anything changed.

    The old argument order ``meta_update(state, meta, tau_grad, beta_grad)``
    still works and emits a ``DeprecationWarning``.

    Args:
      state: the controller state.
      tau_grad, beta_grad: f32[] gradients or None (no step); non-finite
        values are skipped (state unchanged).
      cfg: :class:`ControllerConfig` (its ``meta``) or a :class:`MetaController`.
      lr_scale: multiplier of both learning rates.

    Returns:
      ``(state, changed bool[])``.

    Example::

        g_tau, g_beta = analytic_meta_grads(H, 0.8, kl, 0.05)
        state, changed = meta_update(state, g_tau, g_beta, cfg)
    """
    if isinstance(tau_grad, MetaController | ControllerConfig):
        # old order: meta_update(state, meta, tau_grad=None, beta_grad=None, lr_scale=1.0)
        warn_deprecated("meta_update(state, meta, tau_grad, beta_grad)",
                        "meta_update(state, tau_grad, beta_grad, cfg)")
        old_meta, old_tg, old_bg = tau_grad, beta_grad, cfg
        if isinstance(old_bg, MetaController | ControllerConfig):
            raise ValueError("meta_update got two settings objects; use meta_update(state, tau_grad, beta_grad, cfg)")
        tau_grad, beta_grad, cfg = old_tg, old_bg, old_meta
    if cfg is None:
        raise ValueError("meta_update needs cfg (a controllers.ControllerConfig or MetaController)")
    return _meta_step(state, tau_grad, beta_grad, _meta_of(cfg), lr_scale)


# ------------------------------------------- deprecated file helpers (interop)
def controller_state_dict(state: ControllerState, meta: MetaController | None = None) -> dict:
    """Deprecated: use :func:`jaxweight.interop.maxent_grpo.controller_state_dict`."""
    warn_deprecated("jaxweight.controllers.controller_state_dict",
                    "jaxweight.interop.maxent_grpo.controller_state_dict")
    from .interop import maxent_grpo

    return maxent_grpo.controller_state_dict(state, meta)


def save_controller_state(
    path: str | os.PathLike, state: ControllerState, meta: MetaController | None = None
) -> Path:
    """Deprecated: use :func:`jaxweight.interop.maxent_grpo.save_controller_state`."""
    warn_deprecated("jaxweight.controllers.save_controller_state",
                    "jaxweight.interop.maxent_grpo.save_controller_state")
    from .interop import maxent_grpo

    return maxent_grpo.save_controller_state(path, state, meta)


def load_controller_state(path: str | os.PathLike, *, return_meta: bool = False):
    """Deprecated: use :func:`jaxweight.interop.maxent_grpo.load_controller_state`
    (or ``load_controller_file`` for the state and the meta settings)."""
    warn_deprecated("jaxweight.controllers.load_controller_state",
                    "jaxweight.interop.maxent_grpo.load_controller_state")
    from .interop import maxent_grpo

    if return_meta:
        f = maxent_grpo.load_controller_file(path)
        return f.state, f.meta
    return maxent_grpo.load_controller_state(path)


def __getattr__(name: str):
    if name == "STATE_VERSION":
        from .interop import maxent_grpo

        return maxent_grpo.STATE_VERSION
    raise AttributeError(f"module 'jaxweight.controllers' has no attribute {name!r}")


def metrics_dict(state: ControllerState) -> dict[str, float]:
    """``{"controllers/tau", "controllers/beta", "controllers/entropy_ema", ...}`` as floats (host side).

    The numeric fields of the state through :func:`jaxweight.metrics.flatten`; batched
    (vmapped) states give their means, an unset EMA / target (NaN) gives NaN.
    """
    from .metrics import flatten

    if not isinstance(state, ControllerState):
        raise ValueError(f"state must be a ControllerState, got {type(state).__name__}")
    return flatten(state, prefix="controllers")
