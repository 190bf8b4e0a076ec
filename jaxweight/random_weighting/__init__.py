"""Random log-normal loss-component weights (torchref ``RandomWeightingScheme``).

A refinement minimises a weighted sum of loss components; to record diverse
trajectories for learning a weight policy (:mod:`jaxweight.awr`), the weights
are drawn on two levels: a log-normal base per trajectory and a fresh jitter
around it at every step (not a random walk). ``law`` holds the config, the
trajectory state and its ``init``/``step``; ``schedule`` draws a whole batch of
rollouts in one call; ``xray`` has the X-ray scale weight and ``combine``.

Example::

    import jax
    from jaxweight import random_weighting as rw

    cfg = rw.config(trajectory_sigmas={"xray": 1.0}, step_sigmas=0.1)
    state = rw.init(cfg, jax.random.key(0))
    state = jax.jit(rw.step)(state, jax.random.key(1), cfg)
    w = rw.weights(state)                                      # f32[10], order of cfg.components
    lw = rw.sample_schedule(jax.random.key(2), cfg, 100, 20)   # f32[100, 20, 10]
    rw.metrics_dict(state, cfg)                                # {"random_weighting/weight_xray": ...}

References:
  torchref ``torchref/refinement/weighting/random_weighting.py``
  (https://github.com/HatPdotS/TorchRef, 0.4.3 - 0.5.3).
"""

from .law import (
    DEFAULT_LOG_WEIGHT,
    DEFAULT_LOG_WEIGHT_BOUNDS,
    DEFAULT_STEP_SIGMA,
    DEFAULT_TRAJECTORY_SIGMA,
    TORCHREF_CODE_DEFAULTS,
    TORCHREF_COMPONENTS,
    RandomWeightingConfig,
    RandomWeightingState,
    config,
    init,
    metrics_dict,
    resample_trajectory,
    stack_configs,
    stats,
    step,
    to_dict,
    weights,
)
from .schedule import Schedule, sample_schedule, sample_schedule_with_base
from .xray import (
    ComponentWeightingConfig,
    ComponentWeightingState,
    XrayScaleConfig,
    XrayScaleState,
    combine,
    component_config,
    component_init,
    component_step,
    xray_scale_config,
    xray_scale_init,
    xray_scale_step,
)

__all__ = [
    "TORCHREF_COMPONENTS",
    "TORCHREF_CODE_DEFAULTS",
    "DEFAULT_LOG_WEIGHT",
    "DEFAULT_TRAJECTORY_SIGMA",
    "DEFAULT_STEP_SIGMA",
    "DEFAULT_LOG_WEIGHT_BOUNDS",
    "RandomWeightingConfig",
    "RandomWeightingState",
    "config",
    "stack_configs",
    "init",
    "step",
    "resample_trajectory",
    "weights",
    "Schedule",
    "sample_schedule",
    "sample_schedule_with_base",
    "to_dict",
    "stats",
    "metrics_dict",
    "XrayScaleConfig",
    "XrayScaleState",
    "xray_scale_config",
    "xray_scale_init",
    "xray_scale_step",
    "combine",
    "ComponentWeightingConfig",
    "ComponentWeightingState",
    "component_config",
    "component_init",
    "component_step",
]
