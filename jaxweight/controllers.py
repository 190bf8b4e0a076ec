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

The original mutates a settings object and returns early on warmup,
non-finite measurements, tiny errors or a disabled controller. Here every
update is a pure function ``state -> state`` whose early exits are masked
``jnp.where`` updates, so the same code runs eagerly, under ``jax.jit`` and
under ``jax.vmap`` over a batch of controllers (a hyperparameter sweep), and
all continuous settings may be traced arrays.

Persistence (:func:`save_controller_state` / :func:`load_controller_state`)
reads and writes maxent_grpo's ``controller_state.json`` layout.

Differences from the original: the learning rate is read on every call (the
original cached ``tau_lr`` on first use), and there is no cross-rank
broadcast -- in a multi-device loop average the measurement first
(``jax.lax.pmean(entropy, axis_name)``) so every device applies the same
update.

Example::

    from jaxweight import controllers as C

    state = C.init_controller(tau=0.5, beta=0.04)
    sched = C.TauSchedule(target_entropy=0.8, learning_rate=0.1,
                          minimum_value=0.05, maximum_value=2.0, warmup_steps=0)
    state = C.update_tau(state, measured_entropy=1.0, global_step=1, schedule=sched)
    C.save_controller_state("run/controller_state.json", state)

References:
  maxent-grpo, ``maxent_grpo.training.weighting`` (controllers and the
  ``controller_state.json`` format), https://github.com/liv-daliberti/maxent-grpo
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from ._util import atomic_write_json

Array = jax.Array

__all__ = [
    "ControllerState",
    "init_controller",
    "TauSchedule",
    "update_tau",
    "target_entropy_at",
    "KLController",
    "update_beta",
    "MetaController",
    "META_METHODS",
    "meta_update",
    "analytic_meta_grads",
    "meta_should_update",
    "controller_state_dict",
    "save_controller_state",
    "load_controller_state",
    "CONTROLLER_STATE_FILENAME",
    "STATE_VERSION",
    "ENTROPY_EMA_DECAY",
]

CONTROLLER_STATE_FILENAME = "controller_state.json"
STATE_VERSION = 1
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
        equal to ``tau`` (1 if ``tau <= 0``); right after
        :func:`load_controller_state` it is ``tau + beta`` (maxent_grpo's rule).
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
    """Fresh controller state.

    Args:
      tau: initial temperature (Python float or f32[] array, may be traced).
      beta: initial reference coefficient.
      denom: weight-score denominator; default ``tau`` (1 if ``tau <= 0``).

    Returns:
      ``ControllerState`` with f32 / bool 0-d leaves; ``entropy_ema`` and
      ``current_target`` unset (NaN).

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
    d = _denom_for(tau) if denom is None else _f32(denom)
    nan = jnp.asarray(jnp.nan, jnp.float32)
    zero = jnp.asarray(0.0, jnp.float32)
    return ControllerState(
        tau=tau,
        beta=beta,
        denom=d,
        log_tau=_tau_log(tau),
        entropy_ema=nan,
        current_target=nan,
        tau_projected=jnp.asarray(False),
        beta_projected=jnp.asarray(False),
        last_tau_grad=zero,
        last_beta_grad=zero,
    )


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


# ----------------------------------------------------------------- tau rule
@flax.struct.dataclass
class TauSchedule:
    """Settings of the tau controller (maxent_grpo's ``TauSchedule`` + annealing).

    Every numeric field may be a Python number or an array (vmap a schedule to
    sweep it). ``None`` for a target means "unset"; an unset target can also be
    given as NaN, which is what a batched sweep uses.

    Attributes:
      target_entropy: weight entropy to reach; ``None`` disables the controller.
      learning_rate: step size in log-tau space per unit of entropy error.
      minimum_value: lower clamp of tau.
      maximum_value: upper clamp of tau; ``<= 0`` means no cap.
      warmup_steps: no update while ``global_step <= max(0, warmup_steps)``.
      target_entropy_start, target_entropy_final: annealed target (each
        defaults to ``target_entropy``).
      target_entropy_horizon: steps over which the target moves linearly from
        start to final; ``<= 0`` uses final at once.
    """

    target_entropy: Any = None
    learning_rate: Any = 0.0
    minimum_value: Any = 0.0
    maximum_value: Any = 0.0
    warmup_steps: Any = -1
    target_entropy_start: Any = None
    target_entropy_final: Any = None
    target_entropy_horizon: Any = 0


def target_entropy_at(schedule: TauSchedule, global_step: Any) -> Array:
    """The entropy target of ``schedule`` at ``global_step`` (NaN if none).

    ``target_entropy`` if neither start nor final is set; else (each defaulting
    to ``target_entropy``) ``final`` if ``horizon <= 0``, else
    ``start + (final - start) * min(max(step, 0), H) / H``.
    """
    base = _finite_or_nan(schedule.target_entropy)
    if schedule.target_entropy_start is None and schedule.target_entropy_final is None:
        return base
    start = base if schedule.target_entropy_start is None else _f32(schedule.target_entropy_start)
    final = base if schedule.target_entropy_final is None else _f32(schedule.target_entropy_final)
    # NaN entries of a traced start/final fall back to target_entropy too
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
    schedule: TauSchedule,
    lr_scale: Any = 1.0,
) -> ControllerState:
    """One step of the entropy-targeting tau controller.

    The rule (maxent_grpo ``maybe_update_tau``), with every early exit a masked
    update:

    1. ``lr = learning_rate * (max(lr_scale, 0) if lr_scale is finite else 1)``.
    2. An unset (non-finite) ``entropy_ema`` becomes ``m`` (``tau`` if ``m`` is
       not finite).
    3. The target (:func:`target_entropy_at`) is stored in ``current_target``;
       no target -> stop.
    4. Skip while ``global_step <= max(0, warmup_steps)`` (step 0 always skips)
       or if ``m`` is not finite.
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
      schedule: the :class:`TauSchedule`.
      lr_scale: multiplier of the learning rate (e.g. the main LR schedule).

    Returns:
      The updated state (same structure, dtypes and shapes).

    Example::

        s = init_controller(0.5, 0.0)
        sched = TauSchedule(target_entropy=0.8, learning_rate=0.1,
                            minimum_value=0.05, maximum_value=2.0, warmup_steps=0)
        s = update_tau(s, 1.0, 0, sched)   # step 0: EMA set, tau unchanged
        s = update_tau(s, 1.0, 1, sched)   # tau = 0.5 * exp(-0.02)
    """
    m = _f32(measured_entropy)
    step = jnp.asarray(global_step, jnp.int32)
    lr_scale = _f32(lr_scale)
    scale = jnp.where(jnp.isfinite(lr_scale), jnp.maximum(lr_scale, 0.0), 1.0)
    lr = _f32(schedule.learning_rate) * scale

    m_ok = jnp.isfinite(m)
    m_safe = jnp.where(m_ok, m, 0.0)
    ema0 = jnp.where(
        jnp.isfinite(state.entropy_ema), state.entropy_ema, jnp.where(m_ok, m_safe, state.tau)
    )

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

    state = state.replace(
        entropy_ema=jnp.where(active, ema1, ema0),
        current_target=target,
    )
    return _write_back(state, tau, state.beta, move)


# ------------------------------------------------------------------ KL rule
@flax.struct.dataclass
class KLController:
    """Adaptive-KL settings for beta (maxent_grpo ``KlControllerSettings``).

    The controller is active only when all three are > 0.

    Attributes:
      target: KL to reach.
      horizon: steps over which a full error changes beta by ``step_size``.
      step_size: clip of the relative KL error per step.
    """

    target: Any = 0.0
    horizon: Any = 0
    step_size: Any = 0.0


def update_beta(state: ControllerState, measured_kl: Any, kl: KLController) -> ControllerState:
    """One step of the adaptive-KL beta controller.

    Active only if ``target``, ``horizon`` and ``step_size`` are all > 0 and the
    measured KL is finite: ``err = kl / max(target, 1e-8) - 1`` (stop if
    ``|err| < 1e-8``); ``f = 1 + clip(err, -step_size, step_size) / max(1, horizon)``
    (``f <= 0`` -> ``1e-6``); ``beta = max(0, beta * f)``; then ``denom = tau``
    and ``log_tau = ln tau`` are written back.

    Args:
      state: the controller state.
      measured_kl: f32[] the measured KL(policy || reference).
      kl: the :class:`KLController` settings.

    Returns:
      The updated state.

    Example::

        s = update_beta(init_controller(0.5, 0.1), 0.2, KLController(0.1, 10, 0.2))
        # beta = 0.1 * (1 + 0.2 / 10)
    """
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


# ---------------------------------------------------------------- meta rule
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
      learning_rate: default step size for both tau and beta.
      tau_learning_rate, beta_learning_rate: per-parameter step sizes
        (used when > 0).
      beta_grad_clip: clip of the beta gradient (when > 0).
      update_interval: the caller applies an update when
        ``step % update_interval == 0`` (:func:`meta_should_update`).
      objective, analytic_steps, optimizer, truncation_steps, use_hessian:
        stored and persisted for compatibility with maxent_grpo files.
      last_tau_grad, last_beta_grad: persisted last gradients (the live ones
        are in :class:`ControllerState`).
      tau_min: lower bound of tau (0 = none beyond 0).
      tau_max: upper bound of tau (``<= 0`` = none).
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
        """maxent_grpo's JSON ``meta.controller`` payload (host only).

        ``last_*_grad`` come from ``state`` when given. ``tau_min`` /
        ``tau_max`` are jaxweight extras (maxent_grpo ignores unknown keys).
        """
        tg = state.last_tau_grad if state is not None else self.last_tau_grad
        bg = state.last_beta_grad if state is not None else self.last_beta_grad
        return {
            "enabled": bool(self.enabled),
            "method": str(self.method),
            "learning_rate": float(self.learning_rate),
            "tau_learning_rate": float(self.tau_learning_rate),
            "beta_learning_rate": float(self.beta_learning_rate),
            "beta_grad_clip": float(self.beta_grad_clip),
            "update_interval": int(self.update_interval),
            "objective": str(self.objective),
            "analytic_steps": int(self.analytic_steps),
            "optimizer": str(self.optimizer),
            "truncation_steps": int(self.truncation_steps),
            "use_hessian": bool(self.use_hessian),
            "last_tau_grad": float(tg),
            "last_beta_grad": float(bg),
            "tau_min": float(self.tau_min),
            "tau_max": float(self.tau_max),
        }

    @classmethod
    def from_state(cls, payload: Any, base: MetaController | None = None) -> MetaController:
        """Settings from a ``meta.controller`` payload; unreadable fields keep ``base``'s values.

        Mirrors maxent_grpo's lenient ``apply_state``: fields that are missing or
        do not parse are left as they are.
        """
        out = base if base is not None else cls()
        if not isinstance(payload, dict):
            return out
        kw: dict[str, Any] = {}
        if "enabled" in payload:
            kw["enabled"] = bool(payload["enabled"])
        for k in ("method", "objective", "optimizer"):
            if payload.get(k):
                kw[k] = str(payload[k])
        for k in ("learning_rate", "tau_learning_rate", "beta_learning_rate", "beta_grad_clip",
                  "last_tau_grad", "last_beta_grad", "tau_min", "tau_max"):
            if k in payload:
                try:
                    kw[k] = float(payload[k])
                except (TypeError, ValueError):
                    pass
        for k in ("update_interval", "analytic_steps", "truncation_steps"):
            if k in payload:
                try:
                    kw[k] = max(1, int(payload[k]))
                except (TypeError, ValueError):
                    pass
        if "use_hessian" in payload:
            kw["use_hessian"] = bool(payload["use_hessian"])
        return out.replace(**kw)


def meta_should_update(meta: MetaController, global_step: Any) -> Array:
    """bool[]: whether ``global_step`` is an update step (``step % update_interval == 0``)."""
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
      kl_target: f32[] (<= 0: no beta gradient).

    Returns:
      ``(tau_grad f32[], beta_grad f32[])``.
    """
    tau_grad = _f32(measured_entropy) - _finite_or_nan(target_entropy)
    if measured_kl is None:
        return tau_grad, jnp.asarray(jnp.nan, jnp.float32)
    kt = _f32(kl_target)
    beta_grad = jnp.where(kt > 0, _f32(measured_kl) - kt, jnp.nan)
    return tau_grad, beta_grad


def meta_update(
    state: ControllerState,
    meta: MetaController,
    tau_grad: Any = None,
    beta_grad: Any = None,
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

    Args:
      state: the controller state.
      meta: :class:`MetaController` settings.
      tau_grad, beta_grad: f32[] gradients or None (no step); non-finite
        values are skipped.
      lr_scale: multiplier of both learning rates.

    Returns:
      ``(state, changed bool[])``.

    Example::

        g_tau, g_beta = analytic_meta_grads(H, 0.8, kl, 0.05)
        state, changed = meta_update(state, MetaController(enabled=True, learning_rate=0.1),
                                     g_tau, g_beta)
    """
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


# -------------------------------------------------------------- persistence
def controller_state_dict(state: ControllerState, meta: MetaController | None = None) -> dict:
    """maxent_grpo's ``controller_state.json`` payload (host only).

    Returns:
      ``{"beta", "tau", "tau_log", "tau_entropy_ema"}`` (an unset EMA is written
      as ``tau``, as the original does) plus ``"meta": {"version": 1,
      "controller": {...}}`` when ``meta`` is given.
    """
    st = jax.device_get(state)
    if any(jnp.ndim(x) for x in jax.tree.leaves(st)):
        raise ValueError("controller_state_dict takes one controller (0-d leaves), not a batch")
    tau = float(st.tau)
    ema = float(st.entropy_ema)
    out: dict[str, Any] = {
        "beta": float(st.beta),
        "tau": tau,
        "tau_log": float(st.log_tau),
        "tau_entropy_ema": ema if math.isfinite(ema) else tau,
    }
    if meta is not None:
        out["meta"] = {"version": STATE_VERSION, "controller": meta.to_state(st)}
    return out


def save_controller_state(
    path: str | os.PathLike, state: ControllerState, meta: MetaController | None = None
) -> Path:
    """Write :func:`controller_state_dict` as JSON, atomically.

    The file is written to a temporary file in the same folder and renamed
    over ``path`` (a crash leaves the old file or the new one); parent folders
    are created; a bare file name works.

    Returns:
      The path written.
    """
    return atomic_write_json(path, controller_state_dict(state, meta))


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def load_controller_state(
    path: str | os.PathLike, *, return_meta: bool = False
) -> ControllerState | tuple[ControllerState, MetaController]:
    """Read a ``controller_state.json`` written by maxent_grpo or :func:`save_controller_state`.

    Rules (maxent_grpo's loader): a missing or non-numeric ``tau_log`` becomes
    ``ln(max(tau, 1e-8))``, a missing / non-numeric / non-finite
    ``tau_entropy_ema`` becomes ``tau``, and **``denom = tau + beta``** (1 if
    that is <= 0), the rule the original applies when it restores a controller;
    the next controller update resets ``denom`` to ``tau``. The meta
    controller's ``last_*_grad`` go into the state.

    Args:
      path: the JSON file.
      return_meta: also return the :class:`MetaController` stored under
        ``meta.controller`` (defaults where absent).

    Returns:
      ``ControllerState`` (or ``(state, meta)``).

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: not valid JSON, not an object, or ``tau`` / ``beta`` missing,
        non-numeric or non-finite (the message names the field).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"controller state file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(payload).__name__}")
    vals = {}
    for field in ("tau", "beta"):
        v = payload.get(field)
        if not _number(v) or not math.isfinite(float(v)):
            raise ValueError(f"{path}: field {field!r} must be a finite number, got {v!r}")
        vals[field] = float(v)
    tau, beta = vals["tau"], vals["beta"]
    tau_log = payload.get("tau_log")
    tau_log = float(tau_log) if _number(tau_log) and math.isfinite(float(tau_log)) else math.log(max(tau, 1e-8))
    ema = payload.get("tau_entropy_ema")
    ema = float(ema) if _number(ema) and math.isfinite(float(ema)) else tau
    denom = tau + beta if tau + beta > 0 else 1.0

    meta_payload = payload.get("meta")
    ctrl = meta_payload.get("controller") if isinstance(meta_payload, dict) else None
    meta = MetaController.from_state(ctrl)

    state = init_controller(tau, beta, denom).replace(
        log_tau=_f32(tau_log),
        entropy_ema=_f32(ema),
        last_tau_grad=_f32(meta.last_tau_grad),
        last_beta_grad=_f32(meta.last_beta_grad),
    )
    return (state, meta) if return_meta else state
