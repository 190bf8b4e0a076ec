"""The tau / beta / meta controllers of MaxEnt-GRPO: their settings, their state and their rules.

maxent_grpo steers the two scalars of its weights ``w ~ q^(1/tau) * pi_ref^(beta/tau)``:
tau toward a target weight entropy (:func:`update_tau`), beta toward a target KL
(:func:`update_beta`), and both by a gradient step of the analytic meta-controller
(:func:`meta_update`, :func:`analytic_meta_grads`). Every early exit of the original
is a masked ``jnp.where``, so the rules run eagerly, under ``jax.jit`` and ``jax.vmap``.
The settings classes validate when built with concrete values, like
:func:`jaxweight.maxent.config`; :func:`jaxweight.maxent.step` applies tau then beta.

Example::

    from jaxweight import maxent

    cfg = maxent.config(tau=0.5, schedule=maxent.TauSchedule(target_entropy=0.8, learning_rate=0.1,
                                                              warmup_steps=0))
    state = maxent.init(cfg)
    state = maxent.update_tau(state, 1.0, 0, cfg)   # step 0: the EMA is set, tau stays
    state = maxent.update_tau(state, 1.0, 1, cfg)   # tau = 0.5 * exp(0.1 * (0.8 - 1.0))
    assert abs(float(state.tau) - 0.490099) < 1e-5

References:
  maxent-grpo, ``maxent_grpo.training.weighting``, https://github.com/liv-daliberti/maxent-grpo
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from .._util import array_module, check_order, check_static_int, check_value
from .weights import WeightEntropy

Array = jax.Array

__all__ = [
    "ControllerState",
    "TauSchedule",
    "KLController",
    "MetaController",
    "META_METHODS",
    "ENTROPY_EMA_DECAY",
    "MetaGrads",
    "update_tau",
    "update_beta",
    "meta_update",
    "target_entropy_at",
    "analytic_meta_grads",
    "meta_should_update",
]

ENTROPY_EMA_DECAY = 0.9
TAU_FLOOR = 1e-8

# Methods of maxent_grpo's meta-controller that take a gradient step.
META_METHODS = ("analytic", "analytic_grad", "potential", "first_order", "truncated", "truncated_backprop",
                "backprop")


def f32(x: Any) -> Array:
    return jnp.asarray(x, jnp.float32)


def f32_or_none(x: Any) -> Array | None:
    """``x`` as f32; ``None`` ("unset") stays ``None`` (no leaf, so no NaN placeholder)."""
    return None if x is None else jnp.asarray(x, jnp.float32)


def measurement(x: Any, valid: Any = True) -> tuple[Array, Array]:
    """``(value f32[], ok bool[])`` of a controller input.

    A :class:`~jaxweight.maxent.WeightEntropy` measures its ``mean`` and is valid iff it saw a
    group (``count > 0``); a number is valid as given. Either is valid only if ``valid`` is
    set and the value is finite; an invalid value reads 0, so nothing downstream sees NaN.
    """
    ok = jnp.asarray(valid, bool)
    if isinstance(x, WeightEntropy):
        v = f32(x.mean)
        ok = ok & (jnp.asarray(x.count) > 0)
    else:
        v = f32(x)
    ok = ok & jnp.isfinite(v)
    return jnp.where(ok, v, 0.0), ok


def checkable(v: Any, traced: bool = False) -> bool:
    """Whether a settings field holds a value to check.

    ``None`` and the placeholders jax tree utilities pass when they rebuild a settings
    object (``object()``, abstract values, shardings) are skipped, and so are tracers
    unless ``traced`` (:func:`~jaxweight.maxent.config` checks them through checkify; a
    constructor does not, as jit rebuilds every config argument with tracers).
    """
    if v is None:
        return False
    if isinstance(v, jax.core.Tracer):
        return traced
    return isinstance(v, int | float | str | np.ndarray | np.generic | jax.Array)


def _check(obj: Any, traced: bool, name: str, label: str | None = None, **bounds: Any) -> None:
    v = getattr(obj, name)
    if checkable(v, traced):
        check_value(v, label or name, **bounds)


def _check_target(v: Any, name: str, traced: bool) -> None:
    """An entropy target is unset (None) or finite and >= 0 (an entropy is never negative,
    so a negative target would drive tau to its floor; NaN is not a spelling of "unset")."""
    if checkable(v, traced):
        check_value(v, name, ge=0.0)


def _check_cap(lo: Any, hi: Any, name_lo: str, name_hi: str, traced: bool) -> None:
    """``lo <= hi`` where ``hi > 0`` (``hi <= 0`` means "no cap")."""
    if checkable(lo, traced) and checkable(hi, traced) and not isinstance(lo, str) and not isinstance(hi, str):
        xp = array_module(lo, hi)
        mx = xp.asarray(hi, xp.float32)
        # no cap: compare lo with itself (no inf placeholder, which jax_debug_infs would flag)
        check_order(lo, xp.where(mx > 0, mx, xp.asarray(lo, xp.float32)), name_lo, name_hi)


# --------------------------------------------------------------------- state
@flax.struct.dataclass
class ControllerState:
    """The state of :mod:`jaxweight.maxent`: controller scalars (0-d arrays; a batch is a sweep).

    Attributes:
      tau: f32[] temperature of the weights.
      beta: f32[] reference (KL) coefficient.
      denom: f32[] denominator of the weight scores; the controllers keep it equal to
        ``tau`` (1 if ``tau <= 0``); right after loading a maxent_grpo file it is
        ``tau + beta`` (maxent_grpo's rule).
      log_tau: f32[] ``ln tau`` as tracked by the tau controller.
      entropy_ema: f32[] EMA of the measured weight entropy (0 while ``has_entropy_ema`` is False).
      has_entropy_ema: bool[] whether a valid entropy has been measured ("not measured yet" is
        False: no NaN placeholder, so the state runs under ``jax_debug_nans``).
      current_target: f32[] entropy target of the last :func:`update_tau` with a valid
        measurement (0 while ``has_target`` is False).
      has_target: bool[] whether that update had a target (the schedule may have none).
      tau_projected, beta_projected: bool[] whether the last meta update hit a bound.
      last_tau_grad, last_beta_grad: f32[] the last gradients the meta controller applied.
    """

    tau: Array
    beta: Array
    denom: Array
    log_tau: Array
    entropy_ema: Array
    has_entropy_ema: Array
    current_target: Array
    has_target: Array
    tau_projected: Array
    beta_projected: Array
    last_tau_grad: Array
    last_beta_grad: Array


def tau_log(tau: Array) -> Array:
    return jnp.log(jnp.maximum(tau, TAU_FLOOR))


def denom_for(tau: Array) -> Array:
    return jnp.where(tau > 0, tau, 1.0)


def _write_back(state: ControllerState, tau: Array, beta: Array, changed: Array) -> ControllerState:
    """New tau/beta where ``changed``; then ``denom = tau`` and ``log_tau = ln tau`` there."""
    new_tau = jnp.where(changed, tau, state.tau)
    new_beta = jnp.where(changed, beta, state.beta)
    return state.replace(
        tau=new_tau,
        beta=new_beta,
        denom=jnp.where(changed, denom_for(new_tau), state.denom),
        log_tau=jnp.where(changed, tau_log(new_tau), state.log_tau),
    )


# ------------------------------------------------------------------ settings
@flax.struct.dataclass
class TauSchedule:
    """Settings of the tau controller (maxent_grpo's ``TauSchedule`` plus an annealed target).

    Numeric fields may be Python numbers or arrays (a stacked schedule is a sweep); a
    target of ``None`` is unset (maxent_grpo's ``Optional[float]``: it stays ``None`` in the
    normalised schedule, so a sweep sets it in every member or in none). Concrete values are
    checked when the schedule is built (``ValueError`` naming the field, its value and the
    accepted range; NaN is refused like any other non-finite value).

    Attributes:
      target_entropy: weight entropy to reach (finite, >= 0); None disables the controller.
      learning_rate: step in log-tau space per unit of entropy error (>= 0).
      minimum_value: lower clamp of tau (>= 0).
      maximum_value: upper clamp of tau; ``<= 0`` means no cap, else ``>= minimum_value``.
      warmup_steps: no update while ``global_step <= max(0, warmup_steps)`` (an integer).
      target_entropy_start, target_entropy_final: annealed target (each finite and >= 0, or
        None; each defaults to ``target_entropy``).
      target_entropy_horizon: steps (>= 0) from start to final; ``0`` uses final at once.
    """

    target_entropy: Any = None
    learning_rate: Any = 0.0
    minimum_value: Any = 0.0
    maximum_value: Any = 0.0
    warmup_steps: Any = -1
    target_entropy_start: Any = None
    target_entropy_final: Any = None
    target_entropy_horizon: Any = 0

    def __post_init__(self):
        self.check()

    def check(self, traced: bool = False) -> None:
        """Refuse bad settings (``ValueError``); traced ones too (through checkify) with ``traced``."""
        _check(self, traced, "learning_rate", ge=0.0)
        _check(self, traced, "minimum_value", ge=0.0)
        _check(self, traced, "maximum_value")
        _check(self, traced, "warmup_steps", integer=True)
        _check(self, traced, "target_entropy_horizon", ge=0.0)
        for name in ("target_entropy", "target_entropy_start", "target_entropy_final"):
            _check_target(getattr(self, name), name, traced)
        _check_cap(self.minimum_value, self.maximum_value, "minimum_value", "maximum_value", traced)

    def normalized(self) -> TauSchedule:
        """The same schedule with f32 / i32 array leaves (unset targets stay ``None``)."""
        return TauSchedule(
            target_entropy=f32_or_none(self.target_entropy),
            learning_rate=f32(self.learning_rate),
            minimum_value=f32(self.minimum_value),
            maximum_value=f32(self.maximum_value),
            warmup_steps=jnp.asarray(self.warmup_steps, jnp.int32),
            target_entropy_start=f32_or_none(self.target_entropy_start),
            target_entropy_final=f32_or_none(self.target_entropy_final),
            target_entropy_horizon=f32(self.target_entropy_horizon),
        )


@flax.struct.dataclass
class KLController:
    """Adaptive-KL settings for beta (maxent_grpo ``KlControllerSettings``); active when all are > 0.

    Attributes:
      target: KL to reach (>= 0; 0 = off).
      horizon: steps over which a full error changes beta by ``step_size`` (>= 1 when active).
      step_size: clip of the relative KL error per step (>= 0).
    """

    target: Any = 0.0
    horizon: Any = 0
    step_size: Any = 0.0

    def __post_init__(self):
        self.check()

    def check(self, traced: bool = False) -> None:
        """Refuse bad settings (``ValueError``); traced ones too (through checkify) with ``traced``."""
        _check(self, traced, "target", "kl target", ge=0.0)
        _check(self, traced, "step_size", "kl step_size", ge=0.0)
        _check(self, traced, "horizon", "kl horizon", ge=0.0)
        vals = (self.target, self.step_size, self.horizon)
        if all(checkable(v, traced) and not isinstance(v, str) for v in vals):
            xp = array_module(*vals)
            t, s, h = (xp.asarray(v, xp.float32) for v in vals)
            # an active KL controller needs a horizon of at least one step
            check_value(xp.where((t > 0) & (s > 0), h, 1.0), "kl horizon (with target and step_size > 0)",
                        ge=1.0)

    def normalized(self) -> KLController:
        return KLController(target=f32(self.target), horizon=f32(self.horizon), step_size=f32(self.step_size))


@flax.struct.dataclass
class MetaController:
    """maxent_grpo's ``ControllerMetaSettings`` plus tau bounds.

    Numeric fields and ``enabled`` are leaves; ``method``, ``objective``, ``optimizer``,
    ``use_hessian`` and the step counts are static. Only the first-order analytic update
    is implemented (every method in :data:`META_METHODS` takes it); another ``method``
    leaves the state unchanged, as in the original.

    Attributes:
      enabled: the controller acts only when set.
      method: one of :data:`META_METHODS` to act.
      learning_rate: step size for tau and beta (>= 0).
      tau_learning_rate, beta_learning_rate: per-parameter step sizes (used when > 0).
      beta_grad_clip: clip of the beta gradient (when > 0).
      update_interval: the caller updates when ``step % update_interval == 0`` (>= 1).
      objective, analytic_steps, optimizer, truncation_steps, use_hessian: stored for
        maxent_grpo files.
      last_tau_grad, last_beta_grad: persisted last gradients (live ones: the state).
      tau_min: lower bound of tau (>= 0); tau_max: upper bound (``<= 0``: none).
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

    def __post_init__(self):
        self.check()

    def check(self, traced: bool = False) -> None:
        """Refuse bad settings (``ValueError``); traced ones too (through checkify) with ``traced``."""
        for name in ("learning_rate", "tau_learning_rate", "beta_learning_rate"):
            _check(self, traced, name, f"meta {name}", ge=0.0)
        _check(self, traced, "beta_grad_clip", "meta beta_grad_clip", ge=0.0)
        _check(self, traced, "tau_min", "meta tau_min", ge=0.0)
        _check(self, traced, "tau_max", "meta tau_max")
        check_static_int(self.update_interval, "meta update_interval", 1)
        _check_cap(self.tau_min, self.tau_max, "meta tau_min", "meta tau_max", traced)

    def normalized(self) -> MetaController:
        return self.replace(
            enabled=jnp.asarray(self.enabled, bool),
            learning_rate=f32(self.learning_rate),
            tau_learning_rate=f32(self.tau_learning_rate),
            beta_learning_rate=f32(self.beta_learning_rate),
            beta_grad_clip=f32(self.beta_grad_clip),
            last_tau_grad=f32(self.last_tau_grad),
            last_beta_grad=f32(self.last_beta_grad),
            tau_min=f32(self.tau_min),
            tau_max=f32(self.tau_max),
        )


def part_of(cfg: Any, kind: type, field: str) -> Any:
    """``cfg`` itself when it is a ``kind``, else the ``field`` of a :class:`~jaxweight.maxent.MaxEntConfig`."""
    if isinstance(cfg, kind):
        return cfg
    part = getattr(cfg, field, None)
    if isinstance(part, kind):
        return part
    raise ValueError(f"cfg must be a maxent.MaxEntConfig (maxent.config(...)) or a {kind.__name__}, "
                     f"got {type(cfg).__name__}")


# ----------------------------------------------------------------- tau rule
def target_entropy_at(cfg: Any, global_step: Any) -> tuple[Array, Array]:
    """The entropy target at ``global_step`` of a config or :class:`TauSchedule`.

    ``target_entropy`` if neither start nor final is set; else (each defaulting to
    ``target_entropy``) ``final`` if ``horizon <= 0``, else
    ``start + (final - start) * min(max(step, 0), H) / H``. A value the rule needs that is
    unset (None) means no target.

    Returns:
      ``(target f32[], has_target bool[])``; ``target`` is 0 where there is none.
    """
    schedule = part_of(cfg, TauSchedule, "schedule")
    none = (jnp.float32(0.0), jnp.asarray(False))
    base, start, final = schedule.target_entropy, schedule.target_entropy_start, schedule.target_entropy_final
    if start is None and final is None:
        return none if base is None else (f32(base), jnp.asarray(True))
    start = base if start is None else start
    final = base if final is None else final
    if final is None:  # the rule needs final at every step
        return none
    final = f32(final)
    horizon = f32(schedule.target_entropy_horizon)
    ramp = horizon > 0
    if start is None:  # defined only where the horizon is 0 (final at once)
        return jnp.where(ramp, 0.0, final), ~ramp
    start = f32(start)
    step = jnp.asarray(global_step, jnp.float32)
    frac = jnp.minimum(jnp.maximum(step, 0.0), horizon) / jnp.where(ramp, horizon, 1.0)
    return jnp.where(ramp, start + (final - start) * frac, final), jnp.asarray(True)


def update_tau(state: ControllerState, measured_entropy: Any, global_step: Any, cfg: Any, *,
               valid: Any = True, lr_scale: Any = 1.0) -> ControllerState:
    """One step of the entropy-targeting tau controller (maxent_grpo ``maybe_update_tau``).

    The measurement is used only if it is valid: a :class:`~jaxweight.maxent.WeightEntropy`
    that saw at least one group (``count > 0``; an all-masked or all-NaN batch saw none), or
    a number, in both cases with ``valid`` set and a finite value.

    The first call starts the EMA (maxent_grpo's rule): at ``m`` if ``m`` is valid, else at
    the current ``tau`` (``has_entropy_ema`` becomes True either way; nothing else changes on
    an invalid first measurement). Once the EMA is set, an invalid measurement leaves the
    state exactly unchanged (EMA, flags and target included). With a valid ``m``:

    1. ``lr = learning_rate * (max(lr_scale, 0) if lr_scale is finite else 1)``.
    2. A first measurement (``has_entropy_ema`` False) starts the EMA at ``m``.
    3. The target (:func:`target_entropy_at`) goes to ``current_target`` / ``has_target``;
       none -> stop.
    4. Skip while ``global_step <= max(0, warmup_steps)`` (step 0 always skips).
    5. ``entropy_ema = 0.9 * entropy_ema + 0.1 * m``; ``err = target - ema``; stop if
       ``|err| < 1e-12``.
    6. ``log_tau += lr * err``; ``tau = max(exp(log_tau), minimum_value)``, capped at
       ``maximum_value`` if that is > 0; then ``denom = tau``, ``log_tau = ln tau``.

    Args:
      state: the controller state.
      measured_entropy: :class:`~jaxweight.maxent.WeightEntropy` (its ``mean`` is the
        measurement) or f32[] the measured weight entropy.
      global_step: i32[] training step.
      cfg: :class:`~jaxweight.maxent.MaxEntConfig` or :class:`TauSchedule`.
      valid: bool[] whether the measurement may be used (e.g. False for a batch that was
        all padding); combined with the measurement's own validity.
      lr_scale: multiplier of the learning rate (e.g. the main LR schedule).

    Returns:
      The updated state (same structure, dtypes and shapes).
    """
    schedule = part_of(cfg, TauSchedule, "schedule")
    m, m_ok = measurement(measured_entropy, valid)
    step = jnp.asarray(global_step, jnp.int32)
    lr_scale = f32(lr_scale)
    lr = f32(schedule.learning_rate) * jnp.where(jnp.isfinite(lr_scale), jnp.maximum(lr_scale, 0.0), 1.0)

    # an unset EMA starts at m, or at tau when m is invalid (maxent_grpo: an unmeasured EMA reads tau)
    ema0 = jnp.where(state.has_entropy_ema, state.entropy_ema, jnp.where(m_ok, m, state.tau))
    target, has_target = target_entropy_at(schedule, step)
    warm = step <= jnp.maximum(0, jnp.asarray(schedule.warmup_steps, jnp.int32))
    active = m_ok & has_target & ~warm
    ema1 = ENTROPY_EMA_DECAY * ema0 + (1.0 - ENTROPY_EMA_DECAY) * m
    err = target - ema1
    move = active & (jnp.abs(err) >= 1e-12)

    log_tau = state.log_tau + lr * err
    tau = jnp.maximum(jnp.exp(log_tau), f32(schedule.minimum_value))
    cap = f32(schedule.maximum_value)
    tau = jnp.where(cap > 0, jnp.minimum(tau, cap), tau)

    # invalid m: ema0 is the EMA as it was, or tau on the first call
    new = state.replace(entropy_ema=jnp.where(active, ema1, ema0),
                        has_entropy_ema=jnp.ones_like(state.has_entropy_ema),
                        current_target=jnp.where(m_ok, target, state.current_target),
                        has_target=jnp.where(m_ok, has_target, state.has_target))
    return _write_back(new, tau, new.beta, move)


# ------------------------------------------------------------------ KL rule
def update_beta(state: ControllerState, measured_kl: Any, cfg: Any, *, valid: Any = True) -> ControllerState:
    """One step of the adaptive-KL beta controller.

    Active only if ``target``, ``horizon`` and ``step_size`` are all > 0 and the measurement
    is valid (``valid`` set and the KL finite; an invalid one leaves the state unchanged):
    ``err = kl / max(target, 1e-8) - 1`` (stop if ``|err| < 1e-8``);
    ``f = 1 + clip(err, +-step_size) / max(1, horizon)`` (``f <= 0`` -> ``1e-6``);
    ``beta = max(0, beta * f)``; then ``denom``/``log_tau`` are written back.

    Args:
      state: the controller state.
      measured_kl: f32[] the measured KL(policy || reference).
      cfg: :class:`~jaxweight.maxent.MaxEntConfig` or :class:`KLController`.
      valid: bool[] whether the KL was measured on anything (e.g. ``tokens > 0``).

    Returns:
      The updated state.
    """
    kl = part_of(cfg, KLController, "kl")
    x, x_ok = measurement(measured_kl, valid)
    target, horizon, step_size = f32(kl.target), f32(kl.horizon), f32(kl.step_size)
    on = (target > 0) & (horizon > 0) & (step_size > 0) & x_ok
    err = jnp.where(on, x, 0.0) / jnp.maximum(target, 1e-8) - 1.0
    move = on & (jnp.abs(err) >= 1e-8)
    f = 1.0 + jnp.clip(err, -step_size, step_size) / jnp.maximum(1.0, horizon)
    f = jnp.where(f <= 0, 1e-6, f)
    return _write_back(state, state.tau, jnp.maximum(0.0, state.beta * f), move)


# ---------------------------------------------------------------- meta rule
class MetaGrads(NamedTuple):
    """The analytic meta-controller gradients and whether each applies (:func:`analytic_meta_grads`).

    Attributes:
      tau_grad, beta_grad: f32[] (0 where they do not apply).
      tau_valid, beta_valid: bool[] pass to :func:`meta_update` as ``tau_valid`` / ``beta_valid``.
    """

    tau_grad: Array
    beta_grad: Array
    tau_valid: Array
    beta_valid: Array


def meta_should_update(cfg: Any, global_step: Any) -> Array:
    """bool[]: whether ``global_step`` is a meta update step (``step % update_interval == 0``)."""
    meta = part_of(cfg, MetaController, "meta")
    return jnp.asarray(global_step, jnp.int32) % max(1, int(meta.update_interval)) == 0


def analytic_meta_grads(measured_entropy: Any, target_entropy: Any, measured_kl: Any = None,
                        kl_target: Any = 0.0, *, valid: Any = True, target_valid: Any = True,
                        kl_valid: Any = True) -> MetaGrads:
    """The analytic meta-controller gradients ``tau_grad = H - target``, ``beta_grad = kl - kl_target``.

    The tau gradient applies when the entropy measurement is valid (as in :func:`update_tau`:
    a :class:`~jaxweight.maxent.WeightEntropy` with ``count > 0`` or a number, ``valid`` set,
    finite) and there is a target (not None, ``target_valid``, finite); the beta gradient when
    a KL is given, valid (``kl_valid``, finite) and ``kl_target > 0``.

    Args:
      measured_entropy: :class:`~jaxweight.maxent.WeightEntropy` or f32[] weight entropy.
      target_entropy: f32[] its target, or None (no tau gradient); e.g. the pair of
        :func:`target_entropy_at` as ``target_entropy=t, target_valid=has``.
      measured_kl: f32[] or None (no beta gradient).
      kl_target: f32[] finite (<= 0: no beta gradient).
      valid, target_valid, kl_valid: bool[] validity of the entropy, the target and the KL.

    Returns:
      :class:`MetaGrads` (gradients 0 where they do not apply).

    Example::

        from jaxweight import maxent

        g = maxent.analytic_meta_grads(1.2, 0.8, 0.3, 0.1)
        s, changed = maxent.meta_update(maxent.init(maxent.config(0.5, 0.1)), g.tau_grad, g.beta_grad,
                                        maxent.MetaController(enabled=True, learning_rate=0.1),
                                        tau_valid=g.tau_valid, beta_valid=g.beta_valid)
        assert bool(changed) and abs(float(s.tau) - 0.46) < 1e-6
    """
    check_value(kl_target, "kl_target")
    h, h_ok = measurement(measured_entropy, valid)
    if target_entropy is None:
        tau_grad, tau_ok = jnp.float32(0.0), jnp.asarray(False)
    else:
        t, t_ok = measurement(target_entropy, target_valid)
        tau_ok = h_ok & t_ok
        tau_grad = jnp.where(tau_ok, h - t, 0.0)
    if measured_kl is None:
        return MetaGrads(tau_grad, jnp.float32(0.0), tau_ok, jnp.asarray(False))
    kt = f32(kl_target)
    x, x_ok = measurement(measured_kl, kl_valid)
    beta_ok = x_ok & (kt > 0)
    return MetaGrads(tau_grad, jnp.where(beta_ok, x - kt, 0.0), tau_ok, beta_ok)


def meta_update(state: ControllerState, tau_grad: Any, beta_grad: Any, cfg: Any, *, tau_valid: Any = True,
                beta_valid: Any = True, lr_scale: Any = 1.0) -> tuple[ControllerState, Array]:
    """One gradient step of the meta-controller on tau and beta.

    Active only if ``enabled`` and ``method`` is in :data:`META_METHODS`. With
    ``lr_x = (x_learning_rate if > 0 else learning_rate) * lr_scale`` (no step if <= 0):

    - tau (valid ``g``): ``tau = max(tau - lr * g, tau_min)``, capped at ``tau_max`` if
      > 0; ``tau_projected`` if the cap was hit or (``tau_min > 0`` and ``tau <= tau_min``).
    - beta (valid ``g``, clipped to ``+-beta_grad_clip`` if > 0): ``beta = beta + lr * g``
      (plus: the gradient is ``kl - kl_target``); ``beta_projected`` if < 0, then floored at 0.

    A gradient is valid when given (not None), its flag is set and it is finite; an invalid
    one changes nothing.

    Args:
      state: the controller state.
      tau_grad, beta_grad: f32[] gradients or None (no step).
      cfg: :class:`~jaxweight.maxent.MaxEntConfig` or :class:`MetaController`.
      tau_valid, beta_valid: bool[] whether each gradient may be used (:class:`MetaGrads`).
      lr_scale: multiplier of both learning rates.

    Returns:
      ``(state, changed bool[])``.
    """
    meta = part_of(cfg, MetaController, "meta")
    active = jnp.asarray(meta.enabled, bool) & (meta.method in META_METHODS)
    lr_scale = f32(lr_scale)
    base_lr, tlr, blr = f32(meta.learning_rate), f32(meta.tau_learning_rate), f32(meta.beta_learning_rate)
    lr_tau = jnp.where(tlr > 0, tlr, base_lr) * lr_scale
    lr_beta = jnp.where(blr > 0, blr, base_lr) * lr_scale

    tau, beta = state.tau, state.beta
    tau_proj, beta_proj = state.tau_projected, state.beta_projected
    last_t, last_b = state.last_tau_grad, state.last_beta_grad
    tau_moved = beta_moved = jnp.asarray(False)

    if tau_grad is not None:
        g0, g_ok = measurement(tau_grad, tau_valid)
        tau_moved = active & (lr_tau > 0) & g_ok
        g0 = jnp.where(tau_moved, g0, 0.0)
        tmin, tmax = f32(meta.tau_min), f32(meta.tau_max)
        raw = jnp.maximum(state.tau - lr_tau * g0, tmin)
        capped = (tmax > 0) & (raw > tmax)
        new_tau = jnp.where(capped, tmax, raw)
        tau = jnp.where(tau_moved, new_tau, tau)
        tau_proj = jnp.where(tau_moved, capped | ((tmin > 0) & (new_tau <= tmin)), tau_proj)
        last_t = jnp.where(tau_moved, g0, last_t)

    if beta_grad is not None:
        g0, g_ok = measurement(beta_grad, beta_valid)
        beta_moved = active & (lr_beta > 0) & g_ok
        g0 = jnp.where(beta_moved, g0, 0.0)
        clip = f32(meta.beta_grad_clip)
        raw = state.beta + lr_beta * jnp.where(clip > 0, jnp.clip(g0, -clip, clip), g0)
        beta = jnp.where(beta_moved, jnp.maximum(raw, 0.0), beta)
        beta_proj = jnp.where(beta_moved, raw < 0, beta_proj)
        last_b = jnp.where(beta_moved, g0, last_b)

    changed = tau_moved | beta_moved
    state = state.replace(tau_projected=tau_proj, beta_projected=beta_proj, last_tau_grad=last_t,
                          last_beta_grad=last_b)
    return _write_back(state, tau, beta, changed), changed
