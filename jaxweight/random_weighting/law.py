"""The sampling law: config, trajectory state, ``init``/``step``/``resample_trajectory``, reporting.

.. code-block:: text

    base_k = clip(mu_k + trajectory_sigma_k * z,  lo_k, hi_k)    z  ~ N(0, 1), once per trajectory
    lw_k   = clip(base_k + step_sigma_k * z',     lo_k, hi_k)    z' ~ N(0, 1), fresh at every step

Example::

    import jax
    from jaxweight import random_weighting as rw

    cfg = rw.config(trajectory_sigmas={"xray": 1.0}, step_sigmas=0.1)
    state = rw.init(cfg, 0)
    state = rw.step(state, jax.random.key(1), cfg)
    assert rw.weights(state).shape == (10,)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from .. import _util
from ..metrics import flatten

Array = jax.Array

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

_LEAVES = ("mu", "trajectory_sigma", "step_sigma", "lower", "upper")


# ------------------------------------------------------------------ pytrees
@struct.dataclass
class RandomWeightingConfig:
    """Sampling law of the random weights; build it with :func:`config`.

    The constructor checks concrete values as :func:`config` does (messages name
    :func:`config`'s arguments); traced values are checked by ``config`` under
    ``jaxweight.checked``.

    Attributes:
      mu: f32[K] mean log-weight of the trajectory base.
      trajectory_sigma: f32[K] std of the base around ``mu`` (once per trajectory).
      step_sigma: f32[K] std of each step's log-weights around the base.
      lower: f32[K] lower bound of every log-weight.
      upper: f32[K] upper bound of every log-weight.
      components: static tuple of the K component names (the order of every ``f32[K]``).
    """

    mu: Array
    trajectory_sigma: Array
    step_sigma: Array
    lower: Array
    upper: Array
    components: tuple[str, ...] = struct.field(pytree_node=False, default=TORCHREF_COMPONENTS)

    def __post_init__(self):
        leaves = [getattr(self, f) for f in _LEAVES]
        K = len(self.components)
        if _util.all_concrete(*leaves):
            bad = [f for f, x in zip(_LEAVES, leaves) if np.shape(x)[-1:] != (K,)]
            if bad:
                raise ValueError(f"{bad[0]} must have shape (..., {K}) (one per component), "
                                 f"got {np.shape(getattr(self, bad[0]))}")
            _validate(*leaves, self.components)

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


# ------------------------------------------------------------------- config
def _per_component(value: Any, default: float, components: tuple[str, ...], name: str) -> Array:
    """Scalar / mapping-over-defaults / [K] array -> f32[K]."""
    K = len(components)
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in components]
        if unknown:
            raise ValueError(f"{name} names unknown component {unknown[0]!r}; components are {components}")
        entries = [jnp.asarray(value.get(c, default), jnp.float32) for c in components]
        bad = [c for c, v in zip(components, entries) if v.shape != ()]
        if bad:
            raise ValueError(f"{name}[{bad[0]!r}] must be a scalar, got shape {np.shape(value[bad[0]])}")
        return jnp.stack(entries)
    if isinstance(value, str) or value is None:
        raise ValueError(
            f"{name} must be a scalar, a mapping {{component: value}} or an array of shape ({K},), got {value!r}"
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


def _check_values(x: Array, name: str, components: tuple[str, ...], *, nonneg: bool, finite: bool = True) -> None:
    """``_util.check_value`` of an ``f32[..., K]``, naming the first bad component:
    ``"step_sigmas['KL'] must be finite and >= 0.0, got -1.0"``, eagerly and under ``checked(jit)``."""
    kw = dict(ge=0.0 if nonneg else None, finite=finite)
    c = _util.concrete(x)
    if c is not None:
        try:
            _util.check_value(c, name, **kw)
            return
        except ValueError:
            x = c
    for i, comp in enumerate(components):   # K named messages (K is a handful of loss terms)
        _util.check_value(x[..., i], f"{name}[{comp!r}]", **kw)


def _validate(mu, ts, ss, lo, hi, components: tuple[str, ...]) -> None:
    """Every value check of a config (concrete: ``ValueError`` now; traced: checkify)."""
    _check_values(mu, "default_log_weights", components, nonneg=False)
    _check_values(ts, "trajectory_sigmas", components, nonneg=True)
    _check_values(ss, "step_sigmas", components, nonneg=True)
    _check_values(lo, "log_weight_bounds[0]", components, nonneg=False, finite=False)
    _check_values(hi, "log_weight_bounds[1]", components, nonneg=False, finite=False)
    a, b = _util.concrete(lo), _util.concrete(hi)
    if a is not None and b is not None and np.all(a <= b):
        return
    for i, comp in enumerate(components):
        _util.check_order(lo[..., i], hi[..., i], f"log_weight_bounds[0][{comp!r}]",
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
        ``jax.jit``) raise the same error under ``jaxweight.checked(jax.jit(f))``.

    Example::

        from jaxweight import random_weighting as rw

        cfg = rw.config(trajectory_sigmas={"xray": 1.5}, log_weight_bounds=(-2.0, 2.0))
        code = rw.config(**rw.TORCHREF_CODE_DEFAULTS)      # torchref's code values 1.5 / 0.3
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
    if isinstance(log_weight_bounds, str | Mapping) or not isinstance(log_weight_bounds, Sequence) \
            or len(log_weight_bounds) != 2:
        raise ValueError(f"log_weight_bounds must be a pair (lo, hi), got {log_weight_bounds!r}")
    leaves = (
        _per_component(default_log_weights, DEFAULT_LOG_WEIGHT, comps, "default_log_weights"),
        _per_component(trajectory_sigmas, DEFAULT_TRAJECTORY_SIGMA, comps, "trajectory_sigmas"),
        _per_component(step_sigmas, DEFAULT_STEP_SIGMA, comps, "step_sigmas"),
        _per_component(log_weight_bounds[0], DEFAULT_LOG_WEIGHT_BOUNDS[0], comps, "log_weight_bounds[0]"),
        _per_component(log_weight_bounds[1], DEFAULT_LOG_WEIGHT_BOUNDS[1], comps, "log_weight_bounds[1]"),
    )
    if not _util.is_concrete(leaves):   # concrete values are checked by the constructor
        _validate(*leaves, comps)
    return RandomWeightingConfig(*leaves, components=comps)


def stack_configs(*cfgs: RandomWeightingConfig) -> RandomWeightingConfig:
    """Stack configs with the same components along a new leading axis (for ``jax.vmap`` sweeps).

    Example::

        import jax
        from jaxweight import random_weighting as rw

        sweep = rw.stack_configs(*(rw.config(trajectory_sigmas=s) for s in (0.2, 0.8, 1.5)))
        lw = jax.vmap(lambda c: rw.sample_schedule(jax.random.key(0), c, 8, 4))(sweep)
        assert lw.shape == (3, 8, 4, 10)
    """
    if not cfgs:
        raise ValueError("stack_configs needs at least one config")
    comps = {c.components for c in cfgs}
    if len(comps) != 1:
        raise ValueError(f"stack_configs: all configs must have the same components, got {sorted(comps)}")
    return jax.tree.map(lambda *x: jnp.stack(x), *cfgs)


def check_config(cfg: Any, name: str = "cfg") -> int:
    """K, after checking that ``cfg`` is one (unstacked) :class:`RandomWeightingConfig`."""
    if not isinstance(cfg, RandomWeightingConfig):
        raise ValueError(f"{name} must be a RandomWeightingConfig (from config()), got {type(cfg).__name__}")
    K = len(cfg.components)
    for f in _LEAVES:
        shape = jnp.shape(getattr(cfg, f))
        if shape != (K,):
            raise ValueError(
                f"{name}.{f} must have shape ({K},), got {shape} (vmap over stacked configs, do not pass them whole)"
            )
    return K


def check_key(key: Any, name: str = "key") -> Array:
    """A single typed key from a key or an int seed."""
    key = _util.as_key(key, name)
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


# ------------------------------------------------------------------- draws
_NORMAL_LO = np.nextafter(np.float32(-1.0), np.float32(0.0), dtype=np.float32)
_NORMAL_SPAN = np.float32(1.0) - _NORMAL_LO
_ONE_BITS = np.array(1.0, np.float32).view(np.uint32)
_SQRT2 = np.array(np.sqrt(2), np.float32)


def _draw(mean: Array, scale: Array, bits: Array, lo: Array, hi: Array) -> Array:
    """``clip(mean + sigma * z, lo, hi)`` from 32 random bits (``u32``), with ``scale = sigma * sqrt(2)``.

    ``z`` is ``jax.random.normal``'s transform of the same bits (uniform on
    (-1, 1), then ``sqrt(2) * erfinv``), rounded as ``(sigma * sqrt(2)) *
    erfinv(u)``: one multiplication, so every code path (one state, vmapped
    states, :func:`sample_schedule`) rounds the same way and agrees bit for bit.
    """
    fb = lax.shift_right_logical(bits, np.uint32(32 - 23)) | _ONE_BITS
    u = lax.bitcast_convert_type(fb, jnp.float32) - np.float32(1.0)
    u = lax.max(_NORMAL_LO, u * _NORMAL_SPAN + _NORMAL_LO)
    return jnp.clip(mean + scale * lax.erf_inv(u), lo, hi)


def _base(key: Array, cfg: RandomWeightingConfig) -> Array:
    bits = jax.random.bits(key, (len(cfg.components),), jnp.uint32)
    return _draw(cfg.mu, cfg.trajectory_sigma * _SQRT2, bits, cfg.lower, cfg.upper)


def init(cfg: RandomWeightingConfig, key: Any = None) -> RandomWeightingState:
    """Draw a trajectory base; ``log_weights = base``, ``sample_count = 0``.

    Args:
      cfg: from :func:`config`.
      key: ``jax.random.key`` (shape ``()``) or an int seed.

    Returns:
      ``RandomWeightingState(base_log_weights f32[K], log_weights f32[K], sample_count i32[])``.

    Example::

        import jax
        from jaxweight import random_weighting as rw

        cfg = rw.config()
        states = jax.vmap(rw.init, in_axes=(None, 0))(cfg, jax.random.split(jax.random.key(0), 100))
    """
    check_config(cfg)
    if key is None:
        raise ValueError("init(cfg, key) needs a key: a jax.random.key or an int seed")
    base = _base(check_key(key), cfg)
    # two buffers: the state can be donated leaf by leaf
    return RandomWeightingState(base, jnp.array(base, copy=True), jnp.zeros((), jnp.int32))


def step(state: RandomWeightingState, key: Any, cfg: RandomWeightingConfig) -> RandomWeightingState:
    """New log-weights around the unchanged base; ``sample_count += 1``.

    torchref's ``apply_step_perturbation`` / ``resample_weights``. Each step
    starts again from the base (no random walk).

    Args:
      state: the trajectory's state.
      key: ``jax.random.key`` or an int seed (a fresh one every step).
      cfg: from :func:`config`.

    Returns:
      The new state.
    """
    K = check_config(cfg)
    _check_state(state, K)
    bits = jax.random.bits(check_key(key), (K,), jnp.uint32)
    lw = _draw(state.base_log_weights, cfg.step_sigma * _SQRT2, bits, cfg.lower, cfg.upper)
    return RandomWeightingState(state.base_log_weights, lw, state.sample_count + jnp.int32(1))


def resample_trajectory(state: RandomWeightingState, key: Any, cfg: RandomWeightingConfig) -> RandomWeightingState:
    """Start a new trajectory: new base, ``log_weights = base``, ``sample_count = 0``.

    ``resample_trajectory(s, k, cfg)`` equals ``init(cfg, k)``; ``state`` only
    fixes the layout.
    """
    _check_state(state, check_config(cfg))
    return init(cfg, key)


def weights(state: RandomWeightingState) -> Array:
    """``exp(log_weights)``: f32[..., K] in ``[exp(lo), exp(hi)]``."""
    return jnp.exp(state.log_weights)


# --------------------------------------------------------------- reporting
def to_dict(values: Any, cfg: RandomWeightingConfig) -> dict[str, float]:
    """Host helper: ``{component: float}`` of an ``f32[K]`` (e.g. ``weights(state)``).

    Raises:
      ValueError: unless ``values.shape == (K,)``.
    """
    K = check_config(cfg)
    v = np.asarray(jax.device_get(values))
    if v.shape != (K,):
        raise ValueError(f"values must have shape ({K},) (one per component of cfg), got {v.shape}")
    return dict(zip(cfg.components, v.tolist()))


def stats(state: RandomWeightingState, cfg: RandomWeightingConfig) -> dict[str, Array]:
    """Jittable diagnostics: ``sample_count`` plus ``weight_<k>``, ``log_weight_<k>``, ``base_log_weight_<k>``.

    1 + 3K entries; the values are arrays (batched states give batched values).
    """
    K = check_config(cfg)
    if jnp.shape(state.log_weights)[-1:] != (K,):
        raise ValueError(f"state.log_weights must end in ({K},), got {jnp.shape(state.log_weights)}")
    w = weights(state)
    out: dict[str, Array] = {"sample_count": state.sample_count}
    for i, c in enumerate(cfg.components):   # naming K keys, not computing
        out[f"weight_{c}"] = w[..., i]
        out[f"log_weight_{c}"] = state.log_weights[..., i]
        out[f"base_log_weight_{c}"] = state.base_log_weights[..., i]
    return out


def metrics_dict(state: RandomWeightingState, cfg: RandomWeightingConfig) -> dict[str, float]:
    """Host side: :func:`stats` as a flat ``{"random_weighting/<key>": float}`` (:func:`jaxweight.metrics.flatten`).

    Batched states give the mean over the batch (``.../mean`` keys).
    """
    return flatten(stats(state, cfg), prefix="random_weighting")
