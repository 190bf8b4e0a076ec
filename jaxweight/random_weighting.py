"""Random log-normal loss-component weights (torchref ``RandomWeightingScheme``).

A refinement minimises a weighted sum of loss components (X-ray likelihood,
bond, angle, ..., KL). To record diverse trajectories for learning a weight
policy (see :mod:`jaxweight.awr`), the weights are drawn at random on two
levels, each component ``k`` independently:

.. code-block:: text

    base_k = clip(mu_k + trajectory_sigma_k * z,  lo_k, hi_k)    z  ~ N(0, 1), once per trajectory
    lw_k   = clip(base_k + step_sigma_k * z',     lo_k, hi_k)    z' ~ N(0, 1), fresh at every step
    w_k    = exp(lw_k)                                            float32

Every step perturbs the *base*: perturbations never accumulate (this is not
a random walk). The functions are pure and jittable, take explicit keys (or
int seeds) and are vmappable over trajectories and over stacked configs
(hyperparameter sweeps: ``mu``, the sigmas and the bounds are array leaves,
so new values never recompile).

:func:`sample_schedule` draws the log-weights of a whole batch of rollouts,
``f32[num_trajectories, num_steps, K]``, in one call. It equals the loop over
:func:`init` / :func:`step` with the documented key splits bit for bit; with
threefry keys (the default) it computes the threefry hashes of all split
levels itself, unrolled and fused with the normal transform, which on CPU is
several times faster than a bare ``jax.random.normal`` of the same shape.

Example::

    from jaxweight import random_weighting as rw

    cfg = rw.config(trajectory_sigmas={"xray": 1.0}, step_sigmas=0.1)
    state = rw.init(cfg, 0)                       # int seed or jax.random.key
    state = rw.step(state, jax.random.key(1), cfg)
    w = rw.weights(state)                         # f32[10], order of cfg.components
    lw = rw.sample_schedule(jax.random.key(2), cfg, 10_000, 100)   # f32[10000, 100, 10]

References:
  torchref ``torchref/refinement/weighting/random_weighting.py``
  (https://github.com/HatPdotS/TorchRef, 0.4.3 - 0.5.3): ``RandomWeightingScheme``,
  ``RandomComponentWeighting``, ``XrayScaleWeighting``.
  J. K. Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011
  (the Threefry-2x32 hash that ``jax.random`` uses).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from . import _util
from ._util import as_key, check_static_int

Array = jax.Array

__all__ = [
    "TORCHREF_COMPONENTS",
    "TORCHREF_CODE_DEFAULTS",
    "DEFAULT_LOG_WEIGHT",
    "DEFAULT_TRAJECTORY_SIGMA",
    "DEFAULT_STEP_SIGMA",
    "DEFAULT_LOG_WEIGHT_BOUNDS",
    "RandomWeightingConfig",
    "RandomWeightingState",
    "XrayScaleState",
    "ComponentWeightingState",
    "config",
    "stack_configs",
    "init",
    "step",
    "resample_trajectory",
    "weights",
    "sample_schedule",
    "sample_schedule_with_base",
    "Schedule",
    "to_dict",
    "stats",
    "metrics_dict",
    "xray_scale_init",
    "xray_scale_update",
    "combine",
    "component_init",
    "component_weights",
]

TORCHREF_COMPONENTS: tuple[str, ...] = (
    "xray", "bond", "angle", "torsion", "planarity", "chiral", "nonbonded", "simu", "locality", "KL",
)
"""The loss components of a torchref refinement, in torchref's order."""

TORCHREF_CODE_DEFAULTS: dict[str, float] = {"trajectory_sigmas": 1.5, "step_sigmas": 0.3}
"""The sigmas torchref's code actually uses (its docs say 0.8 / 0.1): ``config(**TORCHREF_CODE_DEFAULTS)``."""

DEFAULT_LOG_WEIGHT = 0.0
DEFAULT_TRAJECTORY_SIGMA = 0.8
DEFAULT_STEP_SIGMA = 0.1
DEFAULT_LOG_WEIGHT_BOUNDS = (-3.0, 3.0)

# Below this many (trajectory, step) pairs sample_schedule draws in one fused
# [T, S, K] kernel; above it, one [T, S] kernel per component (see _schedule_fused).
_SCAN_MIN_PAIRS = 4096


# ------------------------------------------------------------------ pytrees
@struct.dataclass
class RandomWeightingConfig:
    """Sampling law of the random weights; build it with :func:`config`.

    Attributes:
      components: static tuple of the K component names (the order of every ``f32[K]``).
      mu: f32[K] mean log-weight of the trajectory base.
      trajectory_sigma: f32[K] std of the base around ``mu`` (once per trajectory).
      step_sigma: f32[K] std of each step's log-weights around the base.
      lower: f32[K] lower bound of every log-weight.
      upper: f32[K] upper bound of every log-weight.
    """

    mu: Array
    trajectory_sigma: Array
    step_sigma: Array
    lower: Array
    upper: Array
    components: tuple[str, ...] = struct.field(pytree_node=False, default=TORCHREF_COMPONENTS)

    @property
    def num_components(self) -> int:
        return len(self.components)


@struct.dataclass
class RandomWeightingState:
    """Weights of one trajectory.

    Attributes:
      base_log_weights: f32[K] the trajectory's base ("character"), drawn by init / resample_trajectory.
      log_weights: f32[K] the current log-weights (the base until the first step).
      sample_count: i32[] number of steps since the base was drawn.
    """

    base_log_weights: Array
    log_weights: Array
    sample_count: Array


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
class ComponentWeightingState:
    """torchref ``RandomComponentWeighting``: X-ray scale times random weights.

    Attributes:
      random: the :class:`RandomWeightingState`.
      xray: the :class:`XrayScaleState`.
    """

    random: RandomWeightingState
    xray: XrayScaleState


# ------------------------------------------------------------------- config
def _per_component(value: Any, default: float, components: tuple[str, ...], name: str) -> Array:
    """Scalar / mapping-over-defaults / [K] array -> f32[K]."""
    K = len(components)
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in components]
        if unknown:
            raise ValueError(
                f"{name} names unknown component {unknown[0]!r}; components are {components}"
            )
        entries = []
        for c in components:
            v = jnp.asarray(value.get(c, default), jnp.float32)
            if v.shape != ():
                raise ValueError(f"{name}[{c!r}] must be a scalar, got shape {v.shape}")
            entries.append(v)
        return jnp.stack(entries)
    if isinstance(value, str) or value is None:
        raise ValueError(
            f"{name} must be a scalar, a mapping {{component: value}} or an array of shape ({K},), "
            f"got {value!r}"
        )
    try:
        arr = jnp.asarray(value, jnp.float32)
    except TypeError as e:
        raise ValueError(f"{name} must be numeric: {e}") from None
    if arr.shape == ():
        return jnp.full((K,), arr, jnp.float32)
    if arr.shape != (K,):
        raise ValueError(f"{name} must be a scalar, a mapping or an array of shape ({K},), got shape {arr.shape}")
    return arr


def _check_values(x: Array, name: str, components: tuple[str, ...], *, nonneg: bool,
                  finite: bool = True) -> None:
    """Value check of an ``f32[K]`` (``_util.check_value``), naming the first bad component:
    ``"step_sigmas['KL'] must be finite and >= 0.0, got -1.0"``, eagerly and under ``checked(jit)``."""
    kw = dict(ge=0.0 if nonneg else None, finite=finite)
    c = _util.concrete(x)
    if c is not None:
        try:
            _util.check_value(c, name, **kw)
            return
        except ValueError:
            pass
        for i, comp in enumerate(components):
            _util.check_value(c[i], f"{name}[{comp!r}]", **kw)
        return
    for i, comp in enumerate(components):
        _util.check_value(x[..., i], f"{name}[{comp!r}]", **kw)


def _check_bounds(lo: Array, hi: Array, components: tuple[str, ...]) -> None:
    """``lo <= hi`` per component (``_util.check_order``), naming the first reversed one."""
    a, b = _util.concrete(lo), _util.concrete(hi)
    if a is not None and b is not None:
        if np.all(a <= b):
            return
        idx = range(len(components))
        lo_i, hi_i = a, b
    else:
        idx, lo_i, hi_i = range(len(components)), lo, hi
    for i in idx:
        comp = components[i]
        _util.check_order(lo_i[..., i], hi_i[..., i], f"log_weight_bounds[0][{comp!r}]",
                          f"log_weight_bounds[1][{comp!r}]")


def config(
    components: Sequence[str] = TORCHREF_COMPONENTS,
    default_log_weights: Any = DEFAULT_LOG_WEIGHT,
    trajectory_sigmas: Any = DEFAULT_TRAJECTORY_SIGMA,
    step_sigmas: Any = DEFAULT_STEP_SIGMA,
    log_weight_bounds: Any = DEFAULT_LOG_WEIGHT_BOUNDS,
) -> RandomWeightingConfig:
    """Build a :class:`RandomWeightingConfig`.

    Each of ``default_log_weights``, ``trajectory_sigmas`` and ``step_sigmas``
    is a scalar (every component), a mapping ``{name: value}`` naming any
    subset (the others keep the defaults 0.0 / 0.8 / 0.1) or an array of
    shape ``[K]``. Ints become float32.

    Args:
      components: the K component names (non-empty, no duplicates).
      default_log_weights: mean log-weight ``mu`` of the trajectory base.
      trajectory_sigmas: std of the base around ``mu`` (>= 0).
      step_sigmas: std of each step around the base (>= 0).
      log_weight_bounds: ``(lo, hi)``; each a scalar, an ``[K]`` array or a
        mapping over the defaults (-3, 3). ``lo <= hi``; infinite bounds are
        allowed (no clipping), NaN is not.

    Returns:
      The config; ``components`` is static, the five ``f32[K]`` fields are leaves.

    Raises:
      ValueError: empty or duplicate components, unknown names in a mapping,
        wrong array shape, negative or non-finite sigma, non-finite mean,
        NaN bounds, ``lo > hi``. Traced values (a config built inside
        ``jax.jit``) are checked through checkify: ``jaxweight.checked(jax.jit(f))``
        raises the same ``ValueError`` as an eager call.

    Example::

        cfg = config(trajectory_sigmas={"xray": 1.5}, log_weight_bounds=(-2.0, 2.0))
        cfg = config(**TORCHREF_CODE_DEFAULTS)      # torchref's code values 1.5 / 0.3
    """
    if isinstance(components, str):
        raise ValueError(f"components must be a sequence of names, got the string {components!r}")
    comps = tuple(components)
    if not comps:
        raise ValueError("components must name at least one component, got an empty sequence")
    if not all(isinstance(c, str) for c in comps):
        raise ValueError(f"components must be strings, got {comps!r}")
    dup = sorted({c for c in comps if comps.count(c) > 1})
    if dup:
        raise ValueError(f"components must be unique; duplicated: {dup}")

    mu = _per_component(default_log_weights, DEFAULT_LOG_WEIGHT, comps, "default_log_weights")
    ts = _per_component(trajectory_sigmas, DEFAULT_TRAJECTORY_SIGMA, comps, "trajectory_sigmas")
    ss = _per_component(step_sigmas, DEFAULT_STEP_SIGMA, comps, "step_sigmas")
    _check_values(mu, "default_log_weights", comps, nonneg=False)
    _check_values(ts, "trajectory_sigmas", comps, nonneg=True)
    _check_values(ss, "step_sigmas", comps, nonneg=True)

    if isinstance(log_weight_bounds, str | Mapping) or not isinstance(log_weight_bounds, Sequence) \
            or len(log_weight_bounds) != 2:
        raise ValueError(f"log_weight_bounds must be a pair (lo, hi), got {log_weight_bounds!r}")
    lo = _per_component(log_weight_bounds[0], DEFAULT_LOG_WEIGHT_BOUNDS[0], comps, "log_weight_bounds[0]")
    hi = _per_component(log_weight_bounds[1], DEFAULT_LOG_WEIGHT_BOUNDS[1], comps, "log_weight_bounds[1]")
    _check_values(lo, "log_weight_bounds[0]", comps, nonneg=False, finite=False)
    _check_values(hi, "log_weight_bounds[1]", comps, nonneg=False, finite=False)
    _check_bounds(lo, hi, comps)
    return RandomWeightingConfig(mu=mu, trajectory_sigma=ts, step_sigma=ss, lower=lo, upper=hi,
                                 components=comps)


def stack_configs(*cfgs: RandomWeightingConfig) -> RandomWeightingConfig:
    """Stack configs with the same components along a new leading axis (for ``jax.vmap`` sweeps).

    Example::

        sweep = stack_configs(*(config(trajectory_sigmas=s) for s in (0.2, 0.8, 1.5)))
        lw = jax.vmap(lambda c: sample_schedule(key, c, 1000, 50))(sweep)   # f32[3, 1000, 50, K]
    """
    if not cfgs:
        raise ValueError("stack_configs needs at least one config")
    comps = {c.components for c in cfgs}
    if len(comps) != 1:
        raise ValueError(f"stack_configs: all configs must have the same components, got {sorted(comps)}")
    return jax.tree.map(lambda *x: jnp.stack(x), *cfgs)


def _check_cfg(cfg: Any, name: str = "cfg") -> int:
    if not isinstance(cfg, RandomWeightingConfig):
        raise ValueError(f"{name} must be a RandomWeightingConfig (from config()), got {type(cfg).__name__}")
    K = len(cfg.components)
    for f in ("mu", "trajectory_sigma", "step_sigma", "lower", "upper"):
        shape = jnp.shape(getattr(cfg, f))
        if shape != (K,):
            raise ValueError(
                f"{name}.{f} must have shape ({K},), got {shape} (vmap over stacked configs, do not pass them whole)"
            )
    return K


def _check_key(key: Any, name: str = "key") -> Array:
    key = as_key(key, name)
    if key.shape != ():
        raise ValueError(f"{name} must be a single key (shape ()), got a key array of shape {key.shape}; "
                         "use jax.vmap for batches")
    return key


def _check_state(state: Any, K: int, name: str = "state") -> None:
    if not isinstance(state, RandomWeightingState):
        raise ValueError(f"{name} must be a RandomWeightingState, got {type(state).__name__}")
    for f in ("base_log_weights", "log_weights"):
        if jnp.shape(getattr(state, f)) != (K,):
            raise ValueError(f"{name}.{f} must have shape ({K},), got {jnp.shape(getattr(state, f))}")


# ------------------------------------------------------------ sampling core
_NORMAL_LO = np.nextafter(np.float32(-1.0), np.float32(0.0), dtype=np.float32)
_NORMAL_SPAN = np.float32(1.0) - _NORMAL_LO
_ONE_BITS = np.array(1.0, np.float32).view(np.uint32)
_SQRT2 = np.array(np.sqrt(2), np.float32)


def _draw(mean: Array, scale: Array, bits: Array, lo: Array, hi: Array) -> Array:
    """``clip(mean + sigma * z, lo, hi)`` from 32 random bits, ``scale = sigma * sqrt(2)``.

    ``z`` is ``jax.random.normal``'s transform of the same bits (uniform on
    (-1, 1), then ``sqrt(2) * erfinv``), but the product is rounded as
    ``(sigma * sqrt(2)) * erfinv(u)``: XLA reassociates a chain of two
    broadcast multiplications only in some shapes (e.g. under ``vmap``), so
    with a single multiplication every code path (one state, vmapped states,
    :func:`sample_schedule`) rounds the same way and agrees bit for bit.
    """
    fb = lax.shift_right_logical(bits, np.uint32(32 - 23)) | _ONE_BITS
    u = lax.bitcast_convert_type(fb, jnp.float32) - np.float32(1.0)
    u = lax.max(_NORMAL_LO, u * _NORMAL_SPAN + _NORMAL_LO)
    return jnp.clip(mean + scale * lax.erf_inv(u), lo, hi)


@jax.jit
def _init_core(key: Array, cfg: RandomWeightingConfig) -> RandomWeightingState:
    K = len(cfg.components)
    bits = jax.random.bits(key, (K,), jnp.uint32)
    base = _draw(cfg.mu, cfg.trajectory_sigma * _SQRT2, bits, cfg.lower, cfg.upper)
    return RandomWeightingState(base, base, jnp.zeros((), jnp.int32))


@jax.jit
def _step_core(state: RandomWeightingState, key: Array, cfg: RandomWeightingConfig) -> RandomWeightingState:
    K = len(cfg.components)
    bits = jax.random.bits(key, (K,), jnp.uint32)
    lw = _draw(state.base_log_weights, cfg.step_sigma * _SQRT2, bits, cfg.lower, cfg.upper)
    return RandomWeightingState(state.base_log_weights, lw, state.sample_count + jnp.int32(1))


def init(cfg: RandomWeightingConfig, key: Any = None) -> RandomWeightingState:
    """Draw a trajectory base; ``log_weights = base``, ``sample_count = 0``.

    Args:
      cfg: from :func:`config`.
      key: ``jax.random.key`` (shape ``()``) or an int seed.

    Returns:
      ``RandomWeightingState(base_log_weights f32[K], log_weights f32[K], sample_count i32[])``.

    The old order ``init(key, cfg)`` still works with a ``DeprecationWarning``
    (a config in the first position is the new order).

    Example::

        states = jax.vmap(init, in_axes=(None, 0))(cfg, jax.random.split(key, 10_000))
    """
    if not isinstance(cfg, RandomWeightingConfig) and isinstance(key, RandomWeightingConfig):
        _util.warn_deprecated("jaxweight.random_weighting.init(key, cfg)", "jaxweight.random_weighting.init(cfg, key)")
        cfg, key = key, cfg
    if key is None:
        raise ValueError("init(cfg, key) needs a key: a jax.random.key or an int seed")
    _check_cfg(cfg)
    return _init_core(_check_key(key), cfg)


def step(state: RandomWeightingState, key: Any, cfg: RandomWeightingConfig) -> RandomWeightingState:
    """New log-weights around the unchanged base; ``sample_count += 1``.

    torchref's ``apply_step_perturbation`` / ``resample_weights``. Each step
    starts again from the base (no random walk).

    Args:
      state: the trajectory's state.
      key: ``jax.random.key`` or an int seed (use a fresh one every step).
      cfg: from :func:`config`.

    Returns:
      The new state.
    """
    K = _check_cfg(cfg)
    _check_state(state, K)
    return _step_core(state, _check_key(key), cfg)


def resample_trajectory(state: RandomWeightingState, key: Any, cfg: RandomWeightingConfig) -> RandomWeightingState:
    """Start a new trajectory: new base, ``log_weights = base``, ``sample_count = 0``.

    ``resample_trajectory(s, k, cfg)`` equals ``init(cfg, k)``; ``state`` only
    fixes the layout.
    """
    K = _check_cfg(cfg)
    _check_state(state, K)
    return _init_core(_check_key(key), cfg)


def weights(state: RandomWeightingState) -> Array:
    """``exp(log_weights)``: f32[..., K] in ``[exp(lo), exp(hi)]``."""
    return jnp.exp(state.log_weights)


# --------------------------------------------------------- whole schedules
_R0 = (13, 15, 26, 6)
_R1 = (17, 29, 16, 24)


def _threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """Threefry-2x32 (20 rounds), unrolled; the same hash as jax's ``threefry2x32_p``.

    jax lowers its primitive on CPU as a rolled 5-iteration loop whose every
    iteration materialises two arrays the size of the output; written out as
    plain integer ops XLA fuses the whole hash (and what consumes it) into one
    pass over memory. Integer arithmetic, so the bits are identical.
    """
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for i in range(5):
        for r in (_R0, _R1)[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _schedule_fused(key: Array, cfg: RandomWeightingConfig, T: int, S: int) -> tuple[Array, Array]:
    """The key contract, with the two large levels hashed by hand.

    With ``jax_threefry_partitionable`` (the default since jax 0.5),
    ``split(k, n)[i] = threefry(k, (0, i))`` and 32-bit word ``i`` of
    ``random_bits(k)`` is ``xor(threefry(k, (0, i)))``, both elementwise in
    ``i``. The small levels (trajectory keys [T], init/step keys [T, 2],
    bases [T, K]) go through ``jax.random`` (its rolled hash compiles fast);
    the step keys [T, S] and the step draws [T, S, K] are unrolled hashes
    that XLA fuses with the normal transform. The last level runs with the
    long [T*S] axis innermost, one component per iteration of a scan: with K
    (often 10) innermost the CPU code is not vectorised (5-10x slower), and
    the scan keeps XLA from fusing the [T, S] keys into the consumer (which
    would recompute them K times). One transpose puts K last.
    """
    K = len(cfg.components)
    pairs = jax.vmap(jax.random.split)(jax.random.split(key, T))                # [T, 2]
    bits = jax.vmap(lambda k: jax.random.bits(k, (K,), jnp.uint32))(pairs[:, 0])
    base = _draw(cfg.mu, cfg.trajectory_sigma * _SQRT2, bits, cfg.lower, cfg.upper)
    if T * S == 0:
        return jnp.zeros((T, S, K), jnp.float32), base
    kd = jax.random.key_data(pairs[:, 1])                                        # u32[T, 2]
    zero = np.uint32(0)
    s0, s1 = _threefry2x32(kd[:, :1], kd[:, 1:], zero, lax.iota(jnp.uint32, S)[None])   # split(k_steps, S)
    step_scale = cfg.step_sigma * _SQRT2
    if T * S < _SCAN_MIN_PAIRS:
        g0, g1 = _threefry2x32(s0[..., None], s1[..., None], zero, lax.iota(jnp.uint32, K))
        return _draw(base[:, None, :], step_scale, g0 ^ g1, cfg.lower, cfg.upper), base

    def one_component(_, xs):
        k, base_k, scale_k, lo_k, hi_k = xs
        g0, g1 = _threefry2x32(s0, s1, zero, k)
        return None, _draw(base_k[:, None], scale_k, g0 ^ g1, lo_k, hi_k)

    xs = (lax.iota(jnp.uint32, K), base.T, step_scale, cfg.lower, cfg.upper)
    _, out = lax.scan(one_component, None, xs)                                   # [K, T, S]
    return jnp.transpose(out, (1, 2, 0)), base


def _schedule_looped(key: Array, cfg: RandomWeightingConfig, T: int, S: int, mapper) -> tuple[Array, Array]:
    """The key contract written as the loop, with ``mapper`` (``jax.vmap`` or ``lax.map``)
    over trajectories and steps."""
    K = len(cfg.components)
    if T == 0:
        return jnp.zeros((0, S, K), jnp.float32), jnp.zeros((0, K), jnp.float32)

    def trajectory(k):
        k_init, k_steps = jax.random.split(k)
        s = _init_core(k_init, cfg)
        if S == 0:
            return jnp.zeros((0, K), jnp.float32), s.base_log_weights
        lw = mapper(lambda ks: _step_core(s, ks, cfg).log_weights)(jax.random.split(k_steps, S))
        return lw, s.base_log_weights

    return mapper(trajectory)(jax.random.split(key, T))


def _schedule_vmap(key: Array, cfg: RandomWeightingConfig, T: int, S: int) -> tuple[Array, Array]:
    """The key contract written as the loop, vmapped (any key implementation)."""
    return _schedule_looped(key, cfg, T, S, jax.vmap)


def _schedule_map(key: Array, cfg: RandomWeightingConfig, T: int, S: int) -> tuple[Array, Array]:
    """The key contract as a sequential ``lax.map`` loop: exact for any key implementation,
    including ``rbg``, whose draws are not the same under ``vmap`` as one key at a time."""
    return _schedule_looped(key, cfg, T, S, lambda f: functools.partial(lax.map, f))


_SCHEDULERS = {"fused": _schedule_fused, "vmap": _schedule_vmap, "map": _schedule_map}


def _fused_available(key: Array) -> bool:
    return str(jax.random.key_impl(key)) == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)


@functools.partial(jax.jit, static_argnames=("num_trajectories", "num_steps", "method"))
def _schedule(key, cfg, num_trajectories, num_steps, method):
    return _SCHEDULERS[method](key, cfg, num_trajectories, num_steps)


def _sample(key: Any, cfg: RandomWeightingConfig, num_trajectories: int, num_steps: int,
            method: str) -> tuple[Array, Array]:
    K = _check_cfg(cfg)
    T = check_static_int(num_trajectories, "num_trajectories", 0)
    S = check_static_int(num_steps, "num_steps", 0)
    if max(T, S, K) >= 2**32:
        raise ValueError("num_trajectories, num_steps and the number of components must be < 2**32")
    key = _check_key(key)
    if method not in ("auto", *_SCHEDULERS):
        raise ValueError(f"method must be 'auto', 'fused', 'vmap' or 'map', got {method!r}")
    fused_ok = _fused_available(key)
    threefry = str(jax.random.key_impl(key)) == "threefry2x32"
    if method == "fused" and not fused_ok:
        raise ValueError(
            "method='fused' needs a threefry2x32 key and jax_threefry_partitionable=True; "
            f"got impl {jax.random.key_impl(key)} and partitionable={jax.config.jax_threefry_partitionable}"
        )
    if method == "auto":
        method = "fused" if fused_ok else ("vmap" if threefry else "map")
    out, base = _schedule(key, cfg, num_trajectories=T, num_steps=S, method=method)
    return out, base


def sample_schedule(
    key: Any,
    cfg: RandomWeightingConfig,
    num_trajectories: int,
    num_steps: int,
    return_base: bool = False,
    *,
    method: str = "auto",
) -> Array | tuple[Array, Array]:
    """Log-weights of a whole batch of rollouts in one call.

    ``out[j, t]`` holds the log-weights of trajectory ``j`` after its
    ``(t+1)``-th :func:`step`: the weights step ``t`` of a refinement uses when
    weights are resampled every step. The result equals this loop bit for bit
    (with the jitted ``init``/``step`` of this module)::

        kt = jax.random.split(key, num_trajectories)
        k_init, k_steps = jax.random.split(kt[j])
        s = init(cfg, k_init)
        s = step(s, jax.random.split(k_steps, num_steps)[t], cfg)   # -> out[j, t]

    Args:
      key: ``jax.random.key`` or an int seed.
      cfg: from :func:`config`.
      num_trajectories: static int >= 0 (T).
      num_steps: static int >= 0 (S).
      return_base: deprecated: use :func:`sample_schedule_with_base` (a
        struct instead of a flag that changes what is returned).
      method: ``"auto"`` (``"fused"`` for threefry keys with
        ``jax_threefry_partitionable`` on, the default; ``"vmap"`` for
        threefry keys without it; ``"map"`` for other key implementations),
        ``"fused"`` (hand-written threefry hashes fused with the normal
        transform; the fast path), ``"vmap"`` (the loop above, vmapped;
        threefry keys) or ``"map"`` (the loop above as a sequential
        ``lax.map``; exact for every key implementation, e.g. ``rbg``,
        whose draws change under ``vmap``, but slow).

    Returns:
      ``f32[T, S, K]`` (the deprecated ``return_base=True``: ``(f32[T, S, K], f32[T, K])``).

    Raises:
      ValueError: a negative or non-int size, a batched key, an unknown
        ``method`` or ``"fused"`` with a key/config it cannot reproduce.

    Example::

        lw = sample_schedule(jax.random.key(0), config(), 10_000, 100)   # f32[10000, 100, 10]
        w = jnp.exp(lw)
    """
    if not isinstance(return_base, bool):
        raise ValueError(f"return_base must be a bool, got {return_base!r}")
    out, base = _sample(key, cfg, num_trajectories, num_steps, method)
    if return_base:
        _util.warn_deprecated("sample_schedule(..., return_base=True)", "sample_schedule_with_base(...)")
        return out, base
    return out


class Schedule(NamedTuple):
    """A batch of rollouts' log-weights and their trajectory bases (a NamedTuple: unpacks as a pair).

    Attributes:
      log_weights: f32[T, S, K], as :func:`sample_schedule`.
      base: f32[T, K] the base of each trajectory.
    """

    log_weights: Array
    base: Array


def sample_schedule_with_base(key: Any, cfg: RandomWeightingConfig, num_trajectories: int, num_steps: int,
                              *, method: str = "auto") -> Schedule:
    """:func:`sample_schedule` plus the trajectory bases: ``Schedule(log_weights f32[T, S, K], base f32[T, K])``.

    The same draws as :func:`sample_schedule` (one call computes both).

    Example::

        lw, base = sample_schedule_with_base(jax.random.key(0), config(), 1000, 50)
    """
    out, base = _sample(key, cfg, num_trajectories, num_steps, method)
    return Schedule(out, base)


# --------------------------------------------------------------- reporting
def to_dict(values: Any, cfg: RandomWeightingConfig) -> dict[str, float]:
    """Host helper: ``{component: float}`` of an ``f32[K]`` (e.g. ``weights(state)``).

    Raises:
      ValueError: unless ``values.shape == (K,)``.
    """
    K = _check_cfg(cfg)
    v = np.asarray(jax.device_get(values))
    if v.shape != (K,):
        raise ValueError(f"values must have shape ({K},) (one per component of cfg), got {v.shape}")
    return {c: float(x) for c, x in zip(cfg.components, v)}


def stats(state: RandomWeightingState, cfg: RandomWeightingConfig) -> dict[str, Array]:
    """Jittable diagnostics: ``sample_count`` plus ``weight_<k>``, ``log_weight_<k>``, ``base_log_weight_<k>``.

    1 + 3K entries; the values are arrays (batched states give batched values).
    """
    K = _check_cfg(cfg)
    if jnp.shape(state.log_weights)[-1:] != (K,):
        raise ValueError(f"state.log_weights must end in ({K},), got {jnp.shape(state.log_weights)}")
    w = weights(state)
    out: dict[str, Array] = {"sample_count": state.sample_count}
    for i, c in enumerate(cfg.components):
        out[f"weight_{c}"] = w[..., i]
        out[f"log_weight_{c}"] = state.log_weights[..., i]
        out[f"base_log_weight_{c}"] = state.base_log_weights[..., i]
    return out


def metrics_dict(state: RandomWeightingState, cfg: RandomWeightingConfig) -> dict[str, float]:
    """Host side: :func:`stats` as a flat ``{"random_weighting/<key>": float}`` (:func:`jaxweight.metrics.flatten`).

    Batched states give the mean over the batch (``.../mean`` keys).
    """
    from .metrics import flatten

    return flatten(stats(state, cfg), prefix="random_weighting")


# ---------------------------------------------------------------- X-ray scale
def _scalar_f32(x: Any, name: str) -> Array:
    try:
        a = jnp.asarray(x, jnp.float32)
    except TypeError as e:
        raise ValueError(f"{name} must be a number: {e}") from None
    if a.shape != ():
        raise ValueError(f"{name} must be a scalar (shape ()), got shape {a.shape}")
    return a


def xray_scale_init(initial_loss: Any = None) -> XrayScaleState:
    """State of the X-ray scale weight (torchref 0.4.3 ``XrayScaleWeighting``).

    Args:
      initial_loss: the loss that sets the scale, or None to take the first
        loss passed to :func:`xray_scale_update`. An explicit 0.0 counts as
        set. Must be finite (ValueError when concrete and not).

    Returns:
      ``XrayScaleState(weight=1.0, initial_loss=initial_loss or 0.0, initialized=initial_loss is not None)``.
    """
    if initial_loss is None:
        L0, init_ = jnp.zeros((), jnp.float32), jnp.asarray(False)
    else:
        L0, init_ = _scalar_f32(initial_loss, "initial_loss"), jnp.asarray(True)
        _util.check_value(L0, "initial_loss")
    return XrayScaleState(weight=jnp.ones((), jnp.float32), initial_loss=L0, initialized=init_)


@jax.jit
def _xray_core(state, loss, target_scale, min_weight, max_weight, smoothing):
    # a non-finite loss is bad data: the state stays exactly as it was and the current weight is returned
    skip = ~jnp.isfinite(loss)
    L0 = jnp.where(state.initialized | skip, state.initial_loss, loss)
    # target / 0 is +inf and lands on max_weight, as in torchref
    t = jnp.clip(target_scale / (L0 + np.float32(1e-6)), min_weight, max_weight)
    w = smoothing * state.weight + (1 - smoothing) * t
    w = jnp.where(skip, state.weight, w)
    new = XrayScaleState(weight=w, initial_loss=L0, initialized=state.initialized | ~skip)
    return new, w


def xray_scale_update(
    state: XrayScaleState,
    xray_loss: Any,
    target_scale: Any = 50.0,
    min_weight: Any = 0.01,
    max_weight: Any = 10.0,
    smoothing: Any = 0.5,
) -> tuple[XrayScaleState, Array]:
    """One update of the X-ray scale weight.

    .. code-block:: text

        if not initialized: L0 = xray_loss; initialized = True   # only the first loss sets the scale
        t      = clip(target_scale / (L0 + 1e-6), min_weight, max_weight)
        weight = smoothing * weight + (1 - smoothing) * t

    Later losses are ignored (the original docstring's "current loss"
    notwithstanding). A non-finite ``xray_loss`` (bad data) leaves the state
    exactly unchanged and returns the current (finite) weight, initialised or
    not. All hyperparameters may be traced: bad values (``target_scale <= 0``,
    ``min_weight > max_weight``, ``smoothing`` outside [0, 1], NaN) raise
    ``ValueError`` eagerly and under ``jaxweight.checked(jax.jit(...))``.

    Args:
      state: from :func:`xray_scale_init`.
      xray_loss: f32[] the current X-ray loss.
      target_scale, min_weight, max_weight, smoothing: f32[] each.

    Returns:
      ``(new_state, weight f32[])``.

    Example::

        s = xray_scale_init()
        s, w = xray_scale_update(s, 100.0)      # 0.75, then 0.625, 0.5625
    """
    if not isinstance(state, XrayScaleState):
        raise ValueError(f"state must be an XrayScaleState, got {type(state).__name__}")
    args = [_scalar_f32(v, n) for v, n in (
        (xray_loss, "xray_loss"), (target_scale, "target_scale"), (min_weight, "min_weight"),
        (max_weight, "max_weight"), (smoothing, "smoothing"))]
    _, ts, lo, hi, sm = args
    _util.check_value(ts, "target_scale", gt=0.0)
    _util.check_value(lo, "min_weight", ge=0.0)
    _util.check_value(hi, "max_weight", gt=0.0)
    _util.check_order(lo, hi, "min_weight", "max_weight")
    _util.check_value(sm, "smoothing", ge=0.0, le=1.0)
    return _xray_core(state, *args)


# ----------------------------------------------------------------- combining
def combine(*named: Mapping[str, Any]) -> dict[str, Array]:
    """Merge weight mappings left to right, multiplying values of shared keys.

    Keys keep the order of their first appearance; values are float32 arrays
    that broadcast. A plain product: a NaN (or inf) entry is not masked and
    propagates to its key only (other keys are unaffected); the weights this
    module produces are always finite (clipped log-weights, a finite X-ray scale).

    Example::

        combine({"xray": 0.75}, {"xray": 1.8331685, "bond": 0.7067238})
        # {"xray": 1.3748764, "bond": 0.7067238}
    """
    out: dict[str, Array] = {}
    for i, m in enumerate(named):
        if not isinstance(m, Mapping):
            raise ValueError(f"combine: argument {i} must be a mapping of name -> weight, got {type(m).__name__}")
        for k, v in m.items():
            if not isinstance(k, str):
                raise ValueError(f"combine: argument {i} has a non-string key {k!r}")
            v = jnp.asarray(v, jnp.float32)
            out[k] = out[k] * v if k in out else v
    return out


def component_init(cfg: RandomWeightingConfig, key: Any = None,
                   initial_xray_loss: Any = None) -> ComponentWeightingState:
    """State of torchref's ``RandomComponentWeighting``: :func:`init` plus :func:`xray_scale_init`.

    The old order ``component_init(key, cfg, ...)`` still works with a ``DeprecationWarning``.
    """
    if not isinstance(cfg, RandomWeightingConfig) and isinstance(key, RandomWeightingConfig):
        _util.warn_deprecated("jaxweight.random_weighting.component_init(key, cfg, ...)",
                              "jaxweight.random_weighting.component_init(cfg, key, ...)")
        cfg, key = key, cfg
    return ComponentWeightingState(random=init(cfg, key), xray=xray_scale_init(initial_xray_loss))


def component_weights(
    state: ComponentWeightingState,
    key: Any,
    cfg: RandomWeightingConfig,
    xray_loss: Any,
    resample_each_step: bool = True,
    **xray_scale_kwargs: Any,
) -> tuple[ComponentWeightingState, dict[str, Array]]:
    """One refinement step's weights: X-ray scale times the random weights.

    1. If ``resample_each_step`` (static), ``random = step(random, key, cfg)``;
       otherwise ``key`` is unused (may be None).
    2. The X-ray scale EMA advances on every call (:func:`xray_scale_update`
       with ``xray_loss`` and ``xray_scale_kwargs``).
    3. Returns ``combine({"xray": scale}, dict(zip(components, weights(random))))``.

    Returns:
      ``(new_state, {name: f32[]})``; with the default components exactly the
      K component keys, ``"xray"`` = X-ray scale x random ``xray`` weight.
    """
    if not isinstance(state, ComponentWeightingState):
        raise ValueError(f"state must be a ComponentWeightingState, got {type(state).__name__}")
    if not isinstance(resample_each_step, bool):
        raise ValueError(f"resample_each_step must be a static bool, got {type(resample_each_step).__name__}")
    rnd = step(state.random, key, cfg) if resample_each_step else state.random
    xray, scale = xray_scale_update(state.xray, xray_loss, **xray_scale_kwargs)
    w = weights(rnd)
    out = combine({"xray": scale}, {c: w[..., i] for i, c in enumerate(cfg.components)})
    return ComponentWeightingState(random=rnd, xray=xray), out
