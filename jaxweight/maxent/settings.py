"""The settings of :mod:`jaxweight.maxent` in one frozen config, and the state it starts.

Example::

    import jax, jax.numpy as jnp
    from jaxweight import maxent

    cfg = maxent.config(tau=0.5, beta=0.04, q_temperature=0.5)
    state = maxent.init(cfg)                                   # ControllerState, 0-d leaves
    cfgs = jax.tree.map(lambda *x: jnp.stack(x), *[maxent.config(tau=t) for t in (0.3, 0.5)])
    states = jax.vmap(maxent.init)(cfgs)                       # a sweep over tau
    assert states.tau.shape == (2,)
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from .._util import check_value
from ._common import check_modes
from .controllers import (
    ControllerState,
    KLController,
    MetaController,
    TauSchedule,
    checkable,
    denom_for,
    f32,
    f32_or_none,
    tau_log,
)

Array = jax.Array

__all__ = ["MaxEntConfig", "config", "init"]

_PARTS = (("schedule", TauSchedule), ("kl", KLController), ("meta", MetaController))


def _check_settings(values: dict[str, Any], traced: bool) -> None:
    """The checks of every setting (see :func:`~jaxweight.maxent.controllers.checkable` for what is skipped)."""
    bounds = {"tau": {"ge": 0.0}, "beta": {"ge": 0.0}, "q_temperature": {"ge": 0.0}, "q_epsilon": {"ge": 0.0},
              "eps": {"ge": 0.0}}
    for name, kw in bounds.items():
        if checkable(values[name], traced):
            check_value(values[name], name, **kw)
    if checkable(values["denom"], traced):  # None (= tau) is skipped
        check_value(values["denom"], "denom", ge=0.0)
    for name, cls in _PARTS:
        v = values[name]
        if isinstance(v, cls):
            v.check(traced)
        # config() is strict; a rebuild by a tree utility may hold other placeholders here
        elif traced or checkable(v) or isinstance(v, tuple(c for _, c in _PARTS)):
            raise ValueError(f"{name} must be a maxent.{cls.__name__}, got {type(v).__name__}")


@flax.struct.dataclass
class MaxEntConfig:
    """Every setting of :mod:`jaxweight.maxent` (built and checked by :func:`config`).

    Attributes:
      tau, beta: f32[] initial controller values (:func:`init`).
      denom: f32[] initial weight-score denominator, or None (``tau``; 1 if ``tau <= 0``).
      q_temperature, q_epsilon: f32[] of :func:`~jaxweight.maxent.q_distribution`.
      eps: f32[] of :func:`~jaxweight.maxent.group_advantages`.
      schedule, kl, meta: the tau, beta and meta controller settings (array leaves).
      scale, baseline, ddof: static advantage modes.
      include_reference_term, normalize_by_tokens: static weight options.
    """

    tau: Array
    beta: Array
    denom: Array | None
    q_temperature: Array
    q_epsilon: Array
    eps: Array
    schedule: TauSchedule
    kl: KLController
    meta: MetaController
    scale: str = flax.struct.field(pytree_node=False, default="group")
    baseline: str = flax.struct.field(pytree_node=False, default="mean")
    ddof: int = flax.struct.field(pytree_node=False, default=1)
    include_reference_term: bool = flax.struct.field(pytree_node=False, default=True)
    normalize_by_tokens: bool = flax.struct.field(pytree_node=False, default=True)

    def __post_init__(self):
        check_modes(self.scale, self.baseline, self.ddof)
        _check_settings({k: getattr(self, k) for k in ("tau", "beta", "denom", "q_temperature", "q_epsilon",
                                                       "eps", "schedule", "kl", "meta")}, traced=False)


def config(
    tau: Any = 1.0,
    beta: Any = 0.0,
    *,
    denom: Any = None,
    q_temperature: Any = 1.0,
    q_epsilon: Any = 1e-6,
    scale: str = "group",
    eps: Any = 1e-4,
    ddof: int = 1,
    baseline: str = "mean",
    include_reference_term: bool = True,
    normalize_by_tokens: bool = True,
    schedule: TauSchedule | None = None,
    kl: KLController | None = None,
    meta: MetaController | None = None,
) -> MaxEntConfig:
    """All settings of the weighting and its controllers, checked, as array leaves.

    Args:
      tau, beta: initial temperature and reference coefficient (finite, >= 0: a negative
        value can only be a mistake here, though :func:`~jaxweight.maxent.weight_matrix`
        gives it maxent_grpo's meaning).
      denom: initial weight-score denominator (None = tau, 1 if ``tau <= 0``), finite and >= 0.
      q_temperature: softmax temperature of ``q`` (>= 0; 0 is the hard limit).
      q_epsilon: smoothing floor of ``q`` (>= 0).
      scale, eps, ddof, baseline: see :func:`~jaxweight.maxent.group_advantages`.
      include_reference_term, normalize_by_tokens: see :func:`~jaxweight.maxent.weight_matrix`.
      schedule: tau controller settings (default: no target, tau fixed).
      kl: adaptive-KL settings for beta (default: off).
      meta: meta-controller settings (default: disabled).

    Returns:
      :class:`MaxEntConfig`; numeric settings are f32 / i32 arrays, so new values never
      recompile and ``jax.vmap`` over stacked configs runs a sweep.

    Raises:
      ValueError: naming the setting, its value and the accepted range; for traced
        values (``config`` called inside ``jax.jit`` / ``jax.vmap``) through
        ``jaxweight.checked``.
    """
    schedule = TauSchedule() if schedule is None else schedule
    kl = KLController() if kl is None else kl
    meta = MetaController() if meta is None else meta
    check_modes(scale, baseline, ddof)
    _check_settings({"tau": tau, "beta": beta, "denom": denom, "q_temperature": q_temperature,
                     "q_epsilon": q_epsilon, "eps": eps, "schedule": schedule, "kl": kl, "meta": meta}, traced=True)
    return MaxEntConfig(
        tau=f32(tau), beta=f32(beta), denom=f32_or_none(denom), q_temperature=f32(q_temperature),
        q_epsilon=f32(q_epsilon), eps=f32(eps), schedule=schedule.normalized(), kl=kl.normalized(),
        meta=meta.normalized(), scale=scale, baseline=baseline, ddof=int(ddof),
        include_reference_term=bool(include_reference_term), normalize_by_tokens=bool(normalize_by_tokens),
    )


def init(cfg: MaxEntConfig, key: Any = None) -> ControllerState:
    """Fresh controller state from a :class:`MaxEntConfig` (``key`` unused: no randomness).

    ``denom`` defaults to ``tau`` (1 if ``tau <= 0``), ``log_tau = ln(max(tau, 1e-8))``;
    nothing is measured yet: ``has_entropy_ema`` and ``has_target`` are False (their values
    0), so no leaf holds a NaN placeholder. Every leaf is its own buffer, so the state can be
    donated without touching the config.
    """
    if not isinstance(cfg, MaxEntConfig):
        raise ValueError(f"cfg must be a maxent.MaxEntConfig (maxent.config(...)), got {type(cfg).__name__}")
    tau, beta = f32(cfg.tau), f32(cfg.beta)
    if jnp.ndim(tau) != 0 or jnp.ndim(beta) != 0:
        raise ValueError(f"init takes one config (vmap init over stacked configs), got tau shape "
                         f"{jnp.shape(tau)}")
    d = denom_for(tau) if cfg.denom is None else f32(cfg.denom)

    def full(v, dtype=jnp.float32):
        return jnp.full((), v, dtype)

    return ControllerState(
        tau=jnp.array(tau, jnp.float32, copy=True),
        beta=jnp.array(beta, jnp.float32, copy=True),
        denom=jnp.array(d, jnp.float32, copy=True),
        log_tau=tau_log(tau),
        entropy_ema=full(0.0),
        has_entropy_ema=full(False, bool),
        current_target=full(0.0),
        has_target=full(False, bool),
        tau_projected=full(False, bool),
        beta_projected=full(False, bool),
        last_tau_grad=full(0.0),
        last_beta_grad=full(0.0),
    )
