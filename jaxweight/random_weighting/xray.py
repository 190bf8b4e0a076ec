"""X-ray scale weight and torchref's component weighting (X-ray scale x random weights).

.. code-block:: text

    if not initialized: L0 = xray_loss; initialized = True   # only the first loss sets the scale
    t      = clip(target_scale / (L0 + 1e-6), min_weight, max_weight)
    weight = smoothing * weight + (1 - smoothing) * t

Example::

    from jaxweight import random_weighting as rw

    cfg = rw.xray_scale_config()
    s = rw.xray_scale_init(cfg)
    s, w = rw.xray_scale_step(s, 100.0, cfg)      # 0.75, then 0.625, 0.5625
    assert abs(float(w) - 0.75) < 1e-6

References:
  torchref 0.4.3 ``XrayScaleWeighting`` and ``RandomComponentWeighting``
  (https://github.com/HatPdotS/TorchRef).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import _util
from .law import RandomWeightingConfig, RandomWeightingState, check_config, config, init, step, weights

Array = jax.Array
_XRAY_LEAVES = ("target_scale", "min_weight", "max_weight", "smoothing")


@struct.dataclass
class XrayScaleConfig:
    """Settings of the X-ray scale weight (f32[] leaves); build it with :func:`xray_scale_config`.

    The constructor checks concrete values as :func:`xray_scale_config` does.
    """

    target_scale: Array
    min_weight: Array
    max_weight: Array
    smoothing: Array

    def __post_init__(self):
        leaves = [getattr(self, f) for f in _XRAY_LEAVES]
        if _util.all_concrete(*leaves):
            _validate_xray(*leaves)


@struct.dataclass
class XrayScaleState:
    """torchref 0.4.3 ``XrayScaleWeighting``: a weight that brings the first X-ray loss to ``target_scale``.

    Attributes:
      weight: f32[] current (smoothed) weight, starts at 1.
      initial_loss: f32[] the loss that set the scale (0 until initialised).
      initialized: bool[] whether ``initial_loss`` has been set.
    """

    weight: Array
    initial_loss: Array
    initialized: Array


@struct.dataclass
class ComponentWeightingConfig:
    """torchref ``RandomComponentWeighting`` settings; build it with :func:`component_config`.

    Attributes:
      random: the :class:`RandomWeightingConfig`.
      xray: the :class:`XrayScaleConfig`.
      resample_each_step: static bool, draw new random weights at every step.
    """

    random: RandomWeightingConfig
    xray: XrayScaleConfig
    resample_each_step: bool = struct.field(pytree_node=False, default=True)

    def __post_init__(self):
        # the checks of component_config, also when built directly (None / ints: vmap axis specs)
        for name, kind, build in (("random", RandomWeightingConfig, "config()"),
                                  ("xray", XrayScaleConfig, "xray_scale_config()")):
            v = getattr(self, name)
            if not isinstance(v, kind | int | type(None)):
                article = "an" if kind.__name__[0] in "AEIOUX" else "a"
                raise ValueError(f"{name} must be {article} {kind.__name__} (from {build}), got {type(v).__name__}")
        if not isinstance(self.resample_each_step, bool):
            raise ValueError(f"resample_each_step must be a static bool, got {type(self.resample_each_step).__name__}")


@struct.dataclass
class ComponentWeightingState:
    """torchref ``RandomComponentWeighting``: X-ray scale times random weights.

    Attributes:
      random: the :class:`RandomWeightingState`.
      xray: the :class:`XrayScaleState`.
    """

    random: RandomWeightingState
    xray: XrayScaleState


# ---------------------------------------------------------------- X-ray scale
def _scalar_f32(x: Any, name: str) -> Array:
    try:
        a = _util.as_f32(x)   # a NaN loss (bad data) reaches the device without a checked op
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a number: {e}") from None
    if a.shape != ():
        raise ValueError(f"{name} must be a scalar (shape ()), got shape {a.shape}")
    return a


def _validate_xray(ts, lo, hi, sm) -> None:
    _util.check_value(ts, "target_scale", gt=0.0)
    _util.check_value(lo, "min_weight", ge=0.0)
    _util.check_value(hi, "max_weight", gt=0.0)
    _util.check_order(lo, hi, "min_weight", "max_weight")
    _util.check_value(sm, "smoothing", ge=0.0, le=1.0)


def xray_scale_config(target_scale: Any = 50.0, min_weight: Any = 0.01, max_weight: Any = 10.0,
                      smoothing: Any = 0.5) -> XrayScaleConfig:
    """Settings of the X-ray scale weight: ``target_scale > 0``, ``0 <= min_weight <= max_weight``,
    ``max_weight > 0``, ``smoothing`` in [0, 1], all finite.

    Raises:
      ValueError: a bad value (also under ``jaxweight.checked(jax.jit(...))`` when traced).
    """
    leaves = [_scalar_f32(v, n) for v, n in zip((target_scale, min_weight, max_weight, smoothing), _XRAY_LEAVES)]
    if not _util.is_concrete(leaves):   # concrete values are checked by the constructor
        _validate_xray(*leaves)
    return XrayScaleConfig(*leaves)


def _check_xray_config(cfg: Any, name: str = "cfg") -> None:
    if not isinstance(cfg, XrayScaleConfig):
        raise ValueError(f"{name} must be an XrayScaleConfig (from xray_scale_config()), got {type(cfg).__name__}")


def xray_scale_init(cfg: XrayScaleConfig, initial_loss: Any = None) -> XrayScaleState:
    """State of the X-ray scale weight (torchref 0.4.3 ``XrayScaleWeighting``).

    Args:
      cfg: from :func:`xray_scale_config`.
      initial_loss: the loss that sets the scale, or None to take the first
        loss passed to :func:`xray_scale_step`. An explicit 0.0 counts as
        set. Must be finite (ValueError when concrete and not).

    Returns:
      ``XrayScaleState(weight=1.0, initial_loss=initial_loss or 0.0, initialized=initial_loss is not None)``.
    """
    _check_xray_config(cfg)
    if initial_loss is None:
        L0, init_ = jnp.zeros((), jnp.float32), jnp.asarray(False)
    else:
        L0, init_ = _scalar_f32(initial_loss, "initial_loss"), jnp.asarray(True)
        _util.check_value(L0, "initial_loss")
    return XrayScaleState(weight=jnp.ones((), jnp.float32), initial_loss=L0, initialized=init_)


def xray_scale_step(state: XrayScaleState, xray_loss: Any, cfg: XrayScaleConfig) -> tuple[XrayScaleState, Array]:
    """One update of the X-ray scale weight: ``(new_state, weight f32[])``.

    Later losses are ignored (the original docstring's "current loss"
    notwithstanding). A non-finite ``xray_loss`` (bad data) leaves the state
    exactly unchanged and returns the current (finite) weight, initialised or not.
    If ``L0 + 1e-6 == 0`` the target (``target_scale / 0``) lands on ``max_weight``.

    Args:
      state: from :func:`xray_scale_init`.
      xray_loss: f32[] the current X-ray loss.
      cfg: from :func:`xray_scale_config`.
    """
    if not isinstance(state, XrayScaleState):
        raise ValueError(f"state must be an XrayScaleState, got {type(state).__name__}")
    _check_xray_config(cfg)
    loss = _scalar_f32(xray_loss, "xray_loss")
    skip = ~jnp.isfinite(loss)
    L0 = jnp.where(state.initialized | skip, state.initial_loss, loss)
    den = L0 + np.float32(1e-6)
    # target / 0 = +inf clips to max_weight: taken directly, so no inf appears (jax_debug_infs)
    t = jnp.where(den == 0, cfg.max_weight,
                  jnp.clip(cfg.target_scale / jnp.where(den == 0, 1.0, den), cfg.min_weight, cfg.max_weight))
    w = cfg.smoothing * state.weight + (1 - cfg.smoothing) * t
    w = jnp.where(skip, state.weight, w)
    return XrayScaleState(weight=w, initial_loss=L0, initialized=state.initialized | ~skip), w


# ----------------------------------------------------------------- combining
def combine(*named: Mapping[str, Any]) -> dict[str, Array]:
    """Merge weight mappings left to right, multiplying values of shared keys.

    Keys keep the order of their first appearance; values are float32 arrays
    that broadcast. A plain product: a NaN (or inf) entry is not masked and
    propagates to its key only; the weights this module produces are always finite.

    Example::

        from jaxweight import random_weighting as rw

        out = rw.combine({"xray": 0.75}, {"xray": 1.8331685, "bond": 0.7067238})
        assert abs(float(out["xray"]) - 1.3748764) < 1e-6 and list(out) == ["xray", "bond"]
    """
    out: dict[str, Array] = {}
    for i, m in enumerate(named):   # a few named mappings, merged by key
        if not isinstance(m, Mapping):
            raise ValueError(f"combine: argument {i} must be a mapping of name -> weight, got {type(m).__name__}")
        for k, v in m.items():
            if not isinstance(k, str):
                raise ValueError(f"combine: argument {i} has a non-string key {k!r}")
            v = _util.as_f32(v)
            out[k] = out[k] * v if k in out else v
    return out


# ------------------------------------------------------- component weighting
def component_config(random: RandomWeightingConfig | None = None, xray: XrayScaleConfig | None = None, *,
                     resample_each_step: bool = True) -> ComponentWeightingConfig:
    """Settings of torchref's ``RandomComponentWeighting`` (defaults: :func:`config`, :func:`xray_scale_config`)."""
    random = config() if random is None else random
    xray = xray_scale_config() if xray is None else xray
    check_config(random, "random")
    _check_xray_config(xray, "xray")
    if not isinstance(resample_each_step, bool):
        raise ValueError(f"resample_each_step must be a static bool, got {type(resample_each_step).__name__}")
    return ComponentWeightingConfig(random, xray, resample_each_step)


def component_init(cfg: ComponentWeightingConfig, key: Any = None,
                   initial_xray_loss: Any = None) -> ComponentWeightingState:
    """State of torchref's ``RandomComponentWeighting``: :func:`init` plus :func:`xray_scale_init`."""
    if not isinstance(cfg, ComponentWeightingConfig):
        raise ValueError(f"cfg must be a ComponentWeightingConfig (from component_config()), got {type(cfg).__name__}")
    return ComponentWeightingState(random=init(cfg.random, key), xray=xray_scale_init(cfg.xray, initial_xray_loss))


def component_step(state: ComponentWeightingState, key: Any, xray_loss: Any,
                   cfg: ComponentWeightingConfig) -> tuple[ComponentWeightingState, dict[str, Array]]:
    """One refinement step's weights: X-ray scale times the random weights.

    1. If ``cfg.resample_each_step``, ``random = step(random, key, cfg.random)``;
       otherwise ``key`` is unused (may be None).
    2. The X-ray scale EMA advances on every call (:func:`xray_scale_step`).
    3. Returns ``combine({"xray": scale}, dict(zip(components, weights(random))))``.

    Returns:
      ``(new_state, {name: f32[]})``; with the default components exactly the
      K component keys, ``"xray"`` = X-ray scale x random ``xray`` weight.

    Example::

        from jaxweight import random_weighting as rw

        cfg = rw.component_config()
        s = rw.component_init(cfg, 0)
        s, w = rw.component_step(s, 1, 100.0, cfg)         # {"xray": ..., "bond": ..., ...}
    """
    if not isinstance(state, ComponentWeightingState):
        raise ValueError(f"state must be a ComponentWeightingState, got {type(state).__name__}")
    if not isinstance(cfg, ComponentWeightingConfig):
        raise ValueError(f"cfg must be a ComponentWeightingConfig (from component_config()), got {type(cfg).__name__}")
    rnd = step(state.random, key, cfg.random) if cfg.resample_each_step else state.random
    xray, scale = xray_scale_step(state.xray, xray_loss, cfg.xray)
    w = weights(rnd)
    out = combine({"xray": scale}, dict(zip(cfg.random.components, jnp.unstack(w, axis=-1))))
    return ComponentWeightingState(random=rnd, xray=xray), out
