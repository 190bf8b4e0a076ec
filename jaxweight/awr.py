"""Advantage-weighted regression (AWR) of a loss-weight policy.

Random loss weights (:mod:`jaxweight.random_weighting`) give rollouts
``(features, log-weights, reward)``; AWR (Peng et al. 2019) fits a policy that
predicts good log-weights from the features by weighted maximum likelihood,
each recorded action weighted by ``min(exp(A / beta), max_weight)``.
:func:`awr_weights` and :func:`awr_loss` are the stateless math;
:class:`WeightPolicy` is a Gaussian policy over K log-weights; ``config`` /
``init`` / ``step`` / ``metrics_dict`` fit it one minibatch at a time;
:func:`fit_weight_policy` is the host driver over epochs.

Example::

    import numpy as np
    from jaxweight import awr

    rng = np.random.default_rng(0)
    feats, log_w, adv = rng.normal(size=(128, 4)), rng.normal(size=(128, 3)), rng.normal(size=128)
    params, metrics = awr.fit_weight_policy(0, feats, log_w, adv, awr.config(3), num_epochs=3)
    lw = awr.predict_log_weights(params, feats[:5])        # f32[5, 3]

References:
  X. B. Peng, A. Kumar, G. Zhang, S. Levine, "Advantage-Weighted Regression:
  Simple and Scalable Off-Policy Reinforcement Learning", arXiv:1910.00177 (2019).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from . import _util
from ._util import as_key, check_rank, check_same_shape, check_static_int, masked_count, masked_mean, masked_std
from .metrics import flatten

Array = jax.Array

__all__ = [
    "AWRConfig",
    "AWRState",
    "config",
    "init",
    "step",
    "metrics_dict",
    "awr_weights",
    "awr_loss",
    "gaussian_log_prob",
    "WeightPolicy",
    "WeightPolicyParams",
    "fit_weight_policy",
    "predict_log_weights",
    "predict_distribution",
]

_LOG_2PI = float(np.log(2 * np.pi))


def _positive_scalar(x: Any, name: str) -> Array:
    if np.ndim(x) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {np.shape(x)}")
    _util.check_value(x, name, gt=0.0)
    return jnp.asarray(x, jnp.float32)


def _valid_mask(x: Array, mask: Any, name: str) -> Array:
    valid = jnp.isfinite(x)
    if mask is not None:
        mask = jnp.asarray(mask)
        check_same_shape(x, mask, name, "mask")
        valid &= mask.astype(bool)
    return valid


def awr_weights(
    advantages: Any,
    temperature: Any = 1.0,
    max_weight: Any = 20.0,
    normalize: bool = True,
    mask: Any = None,
) -> Array:
    """AWR sample weights ``min(exp(A / temperature), max_weight)``.

    With ``normalize`` the advantages are first standardised,
    ``A = (A - mean) / (std + 1e-8)`` (population std over the valid
    entries; computed on advantages scaled by their largest magnitude when
    that exceeds 1, so values up to 3e38 give finite weights). Masked-out and
    non-finite advantages (NaN, +-inf: bad data) get weight 0 and do not enter
    the mean/std (:func:`fit_weight_policy` reports how many as ``n_invalid``).

    Args:
      advantages: f32[...] advantages.
      temperature: f32[] beta, finite and > 0 (ValueError otherwise, also
        under ``jaxweight.checked(jax.jit(...))`` when traced).
      max_weight: f32[] clip, finite and > 0.
      normalize: static bool, standardise the advantages first.
      mask: optional bool[...] of the same shape; False = excluded.

    Returns:
      f32[...] weights in ``[0, max_weight]`` (0 exactly where excluded).

    Example::

        import jax.numpy as jnp
        from jaxweight import awr

        w = awr.awr_weights(jnp.array([0.0, 1.0, 2.0]), normalize=False)   # [1, e, e**2]

    References:
      Peng et al. 2019, arXiv:1910.00177, eq. 11 and the weight clipping of Sec. 5.
    """
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a static bool, got {normalize!r}")
    adv = _util.as_f32(advantages)
    beta = _positive_scalar(temperature, "temperature")
    wmax = _positive_scalar(max_weight, "max_weight")
    valid = _valid_mask(adv, mask, "advantages")
    a = jnp.where(valid, adv, 0.0)
    if normalize:
        # scale first so that huge finite advantages cannot overflow the mean/std
        s = jnp.maximum(jnp.max(jnp.abs(a), initial=0.0), 1.0)
        a = a / s
        mu = masked_mean(a, valid)
        sd = masked_std(a, valid)
        den = sd + 1e-8 / s
        a = jnp.where(den > 0, (a - mu) / jnp.where(den > 0, den, 1.0), 0.0)
    # exp of the clipped exponent: the same value as min(exp(z), wmax) without overflow to inf
    z = jnp.minimum(a / beta, jnp.log(wmax))
    return jnp.where(valid, jnp.minimum(jnp.exp(z), wmax), 0.0)


def awr_loss(
    log_probs: Any,
    advantages: Any,
    temperature: Any = 1.0,
    max_weight: Any = 20.0,
    normalize: bool = True,
    mask: Any = None,
) -> Array:
    """AWR loss: ``-mean(w * log_probs)`` over the valid entries, ``w`` from :func:`awr_weights`.

    The weights are constants (``stop_gradient``); only ``log_probs`` carries
    gradients. Entries that are masked out or have a non-finite advantage or
    log-prob are excluded (from the advantage normalisation and from the
    mean); 0 if none is valid.

    Args:
      log_probs: f32[...] log-likelihood of each recorded action under the policy.
      advantages: f32[...] same shape.
      temperature, max_weight, normalize, mask: as in :func:`awr_weights`.

    Returns:
      f32[] loss.
    """
    # a jax array (or tracer, e.g. under jax.grad) is used as is: a conversion op would carry
    # its NaN entries before they are masked, which jax_debug_nans reports (host data: as_f32)
    lp = log_probs if isinstance(log_probs, jax.Array) else _util.as_f32(log_probs)
    adv = _util.as_f32(advantages)
    check_same_shape(adv, lp, "advantages", "log_probs")
    # an entry with a non-finite log-prob is invalid too: it stays out of the normalisation
    valid = _valid_mask(adv, mask, "advantages") & jnp.isfinite(lp)
    w = awr_weights(adv, temperature, max_weight, normalize, valid)
    w = jax.lax.stop_gradient(jnp.where(valid, w, 0.0))
    return -masked_mean(w * jnp.where(valid, lp, 0.0), valid)


# |z| above this saturates: z**2 (and a weighted sum of many of them) stays finite in f32
_Z_MAX = 1e12


def gaussian_log_prob(x: Array, mean: Array, log_std: Array) -> Array:
    """Log density of a diagonal Gaussian, summed over the last axis: f32[..., K] -> f32[...].

    The standardised distance ``z = (x - mean) / std`` saturates at ``|z| = 1e12`` (where the
    density is already 0 in float32), so finite inputs of any magnitude give a finite
    log-density (and a zero gradient beyond that distance).
    """
    z = jnp.clip((x - mean) * jnp.exp(-log_std), -_Z_MAX, _Z_MAX)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * _LOG_2PI, axis=-1)


# ------------------------------------------------------------------ policy
class WeightPolicy(nn.Module):
    """MLP policy over K log-weights: ``features f32[..., F] -> (mean f32[..., K], log_std f32[..., K])``.

    The mean is squashed into ``mean_bounds`` (a sigmoid) unless
    ``mean_bounds`` is None; the output layer starts at zero, so an untrained
    policy predicts the midpoint (log-weight 0, the default weights, for
    symmetric bounds). The log-std is a learned
    per-component parameter (state independent), clipped to
    ``[log_std_min, log_std_max]``.

    Attributes:
      num_components: K.
      hidden_sizes: widths of the hidden layers (``()`` = linear policy).
      activation: hidden activation.
      mean_bounds: ``(lo, hi)`` of the mean, e.g. the log-weight bounds, or None.
      log_std_init, log_std_min, log_std_max: the log-std parameter.

    Finite settings with ``log_std_min <= log_std_max`` and ``lo < hi`` are checked when the
    module is built (``ValueError`` naming the field).

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import awr

        pol = awr.WeightPolicy(num_components=5)
        variables = pol.init(jax.random.key(0), jnp.zeros((1, 4)))
        mean, log_std = pol.apply(variables, jnp.ones((8, 4)))    # f32[8, 5] each
    """

    num_components: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: Callable[[Array], Array] = nn.tanh
    mean_bounds: tuple[float, float] | None = (-3.0, 3.0)
    log_std_init: float = -0.5
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    def __post_init__(self):
        # static settings of the network: checked when the module is built
        for name in ("log_std_init", "log_std_min", "log_std_max"):
            _util.check_value(getattr(self, name), name, static=True)
        _util.check_order(self.log_std_min, self.log_std_max, "log_std_min", "log_std_max")
        if self.mean_bounds is not None:
            if len(self.mean_bounds) != 2:
                raise ValueError(f"mean_bounds must be None or (lo, hi), got {self.mean_bounds!r}")
            lo, hi = self.mean_bounds
            _util.check_value(lo, "mean_bounds[0]", static=True)
            _util.check_value(hi, "mean_bounds[1]", static=True)
            _util.check_order(lo, hi, "mean_bounds[0]", "mean_bounds[1]", strict=True)
        super().__post_init__()

    @nn.compact
    def __call__(self, features: Array) -> tuple[Array, Array]:
        x = jnp.asarray(features, jnp.float32)
        for h in self.hidden_sizes:
            x = self.activation(nn.Dense(h)(x))
        # zero output layer: the untrained policy predicts the midpoint of mean_bounds (log-weight 0
        # for symmetric bounds), i.e. the default weights
        raw = nn.Dense(self.num_components, kernel_init=nn.initializers.zeros)(x)
        if self.mean_bounds is None:
            mean = raw
        else:
            lo, hi = self.mean_bounds
            mean = lo + (hi - lo) * jax.nn.sigmoid(raw)
        log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.num_components,))
        log_std = jnp.clip(log_std, self.log_std_min, self.log_std_max)
        return mean, jnp.broadcast_to(log_std, mean.shape)


@struct.dataclass
class WeightPolicyParams:
    """A fitted policy: network variables plus the feature standardisation.

    Attributes:
      variables: flax variables of ``module``.
      feature_mean: f32[F] subtracted from the features.
      feature_std: f32[F] divides the features.
      module: static :class:`WeightPolicy`.
    """

    variables: Any
    feature_mean: Array
    feature_std: Array
    module: WeightPolicy = struct.field(pytree_node=False)


# standardised features saturate here: huge finite inputs (3e38) cannot overflow the network
_X_MAX = 1e6


def _standardize(params: WeightPolicyParams, features: Any) -> Array:
    x = _util.as_f32(features)
    F = params.feature_mean.shape[-1]
    if x.ndim < 1 or x.shape[-1] != F:
        raise ValueError(f"features must have shape (..., {F}), got {x.shape}")
    return jnp.clip((x - params.feature_mean) / params.feature_std, -_X_MAX, _X_MAX)


def predict_distribution(params: WeightPolicyParams, features: Any) -> tuple[Array, Array]:
    """The policy's Gaussian over log-weights: ``(mean, log_std)``, each f32[..., K]."""
    if not isinstance(params, WeightPolicyParams):
        raise ValueError("params must be WeightPolicyParams (state.policy, or from fit_weight_policy), "
                         f"got {type(params).__name__}")
    return params.module.apply(params.variables, _standardize(params, features))


def predict_log_weights(params: WeightPolicyParams, features: Any) -> Array:
    """The policy's mean log-weights for ``features f32[..., F]``: f32[..., K] (jittable, vmappable).

    Example::

        import jax.numpy as jnp
        from jaxweight import awr

        x = jnp.ones((4, 2))
        state = awr.init(awr.config(3, hidden_sizes=(8,)), 0, x)
        w = jnp.exp(awr.predict_log_weights(state.policy, x))     # f32[4, 3] loss-component weights
    """
    return predict_distribution(params, features)[0]


# ------------------------------------------------------------------ fitting
@struct.dataclass
class AWRConfig:
    """Settings of the AWR fit; build it with :func:`config`.

    Attributes:
      temperature: f32[] beta of the AWR weights (> 0).
      max_weight: f32[] clip of the AWR weights (> 0).
      learning_rate: f32[] AdamW step size (> 0).
      weight_decay: f32[] AdamW decoupled weight decay (>= 0).
      max_grad_norm: f32[] global gradient-norm clip (> 0).
      module: static :class:`WeightPolicy`.
      normalize: static bool, standardise the advantages of a batch first.

    The constructor checks concrete values as :func:`config` does.
    """

    temperature: Array
    max_weight: Array
    learning_rate: Array
    weight_decay: Array
    max_grad_norm: Array
    module: WeightPolicy = struct.field(pytree_node=False)
    normalize: bool = struct.field(pytree_node=False, default=True)

    def __post_init__(self):
        leaves = [getattr(self, f) for f in _HPARAMS]
        if _util.all_concrete(*leaves):
            _validate(*leaves)


@struct.dataclass
class AWRState:
    """The weight policy being fitted and its optimiser.

    Attributes:
      policy: :class:`WeightPolicyParams` (network variables, feature standardisation).
      opt_state: the optax AdamW state.
      count: i32[] number of :func:`step` calls that had a valid row (an optimiser step).
    """

    policy: WeightPolicyParams
    opt_state: Any
    count: Array


_HPARAMS = ("temperature", "max_weight", "learning_rate", "weight_decay", "max_grad_norm")


def _validate(temperature, max_weight, learning_rate, weight_decay, max_grad_norm) -> None:
    _util.check_value(temperature, "temperature", gt=0.0)
    _util.check_value(max_weight, "max_weight", gt=0.0)
    _util.check_value(learning_rate, "learning_rate", gt=0.0)
    _util.check_value(weight_decay, "weight_decay", ge=0.0)
    _util.check_value(max_grad_norm, "max_grad_norm", gt=0.0)


def config(
    num_components: int | None = None,
    *,
    module: WeightPolicy | None = None,
    hidden_sizes: Sequence[int] = (64, 64),
    mean_bounds: tuple[float, float] | None = (-3.0, 3.0),
    temperature: Any = 1.0,
    max_weight: Any = 20.0,
    normalize: bool = True,
    learning_rate: Any = 3e-3,
    weight_decay: Any = 0.0,
    max_grad_norm: Any = 1.0,
) -> AWRConfig:
    """Build an :class:`AWRConfig`.

    Args:
      num_components: K, the number of log-weights (or give ``module``).
      module: a :class:`WeightPolicy`; else one is built from ``num_components``,
        ``hidden_sizes`` and ``mean_bounds``.
      temperature, max_weight, normalize: the AWR weights (:func:`awr_weights`).
      learning_rate, weight_decay, max_grad_norm: AdamW with global-norm clipping.

    Raises:
      ValueError: a bad value (also under ``jaxweight.checked(jax.jit(...))`` when traced).

    Example::

        from jaxweight import awr

        cfg = awr.config(3, hidden_sizes=(16,), temperature=0.5)
    """
    if module is None:
        if num_components is None:
            raise ValueError("config needs num_components (K) or a module")
        K = check_static_int(num_components, "num_components", 1)
        module = WeightPolicy(num_components=K, hidden_sizes=tuple(hidden_sizes), mean_bounds=mean_bounds)
    if not isinstance(module, WeightPolicy):
        raise ValueError(f"module must be a WeightPolicy, got {type(module).__name__}")
    if num_components is not None and num_components != module.num_components:
        raise ValueError(f"num_components ({num_components}) must equal module.num_components "
                         f"({module.num_components})")
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a static bool, got {normalize!r}")
    values = (temperature, max_weight, learning_rate, weight_decay, max_grad_norm)
    for v, n in zip(values, _HPARAMS):
        if np.ndim(v) != 0:
            raise ValueError(f"{n} must be a scalar, got shape {np.shape(v)}")
    leaves = [jnp.asarray(v, jnp.float32) for v in values]
    if not _util.is_concrete(leaves):   # concrete values are checked by the constructor
        _validate(*leaves)
    return AWRConfig(*leaves, module=module, normalize=normalize)


def _check_config(cfg: Any) -> None:
    if not isinstance(cfg, AWRConfig):
        raise ValueError(f"cfg must be an AWRConfig (from awr.config()), got {type(cfg).__name__}")


def _clip_by_global_norm(max_norm: Array) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` with the same values and state, without its ``0 / 0``.

    optax computes the clipped branch ``t / norm * max_norm`` even when it keeps ``t``; a zero
    gradient (a batch without a valid row) makes that NaN, which ``jax_debug_nans`` reports.
    """

    def update(updates, state, params=None):
        del params
        g_norm = optax.tree.norm(updates)
        trigger = jnp.squeeze(g_norm < max_norm)
        safe = jnp.where(trigger, jnp.ones_like(g_norm), g_norm)
        return jax.tree.map(lambda t: jax.lax.select(trigger, t, (t / safe.astype(t.dtype)) * max_norm),
                            updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _optimizer(cfg: AWRConfig) -> optax.GradientTransformation:
    return optax.chain(_clip_by_global_norm(cfg.max_grad_norm),
                       optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay))


def _rows(features: Any, log_weights: Any, advantages: Any, mask: Any, K: int):
    """Checked f32 arrays ``x [N, F]``, ``a [N, K]``, ``adv [N]``, the requested rows and the valid ones."""
    x = _util.as_f32(features)
    a = _util.as_f32(log_weights)
    adv = _util.as_f32(advantages)
    check_rank(x, 2, "features")
    check_rank(a, 2, "log_weights")
    check_rank(adv, 1, "advantages")
    N = x.shape[0]
    if a.shape[0] != N or adv.shape[0] != N:
        raise ValueError("features, log_weights and advantages must have the same number of rows, "
                         f"got {N}, {a.shape[0]}, {adv.shape[0]}")
    if a.shape[1] != K:
        raise ValueError(f"module.num_components ({K}) must equal log_weights.shape[1] ({a.shape[1]})")
    if x.shape[1] == 0:
        raise ValueError("features need >= 1 column, got F = 0")
    req = jnp.ones((N,), bool) if mask is None else jnp.asarray(mask)
    if req.shape != (N,):
        raise ValueError(f"mask must have shape ({N},), got {req.shape}")
    req = req.astype(bool)
    finite = jnp.isfinite(adv) & jnp.all(jnp.isfinite(x), axis=1) & jnp.all(jnp.isfinite(a), axis=1)
    return x, a, adv, req, req & finite


def _weight_stats(w: Array, req: Array, valid: Array, max_weight: Array) -> dict[str, Array]:
    n_valid = masked_count(w, valid)
    sw, sw2 = jnp.sum(w), jnp.sum(w * w)
    return {
        "num_valid": n_valid,
        "n_invalid": jnp.sum(req & ~valid, dtype=jnp.int32),
        "weight_ess": jnp.where(sw2 > 0, sw * sw / jnp.maximum(sw2, 1e-30), 0.0) / jnp.maximum(n_valid, 1.0),
        "clipped_fraction": masked_mean((w >= max_weight).astype(jnp.float32), valid),
    }


def init(cfg: AWRConfig, key: Any = None, features: Any = None, *, mask: Any = None) -> AWRState:
    """A fresh policy and optimiser; the feature standardisation comes from ``features``.

    Args:
      cfg: from :func:`config`.
      key: ``jax.random.key`` or an int seed (network initialisation).
      features: f32[N, F] example features: their mean and std over the finite
        (and ``mask``-ed in) rows standardise every later input.
      mask: optional bool[N].

    Returns:
      :class:`AWRState`.
    """
    _check_config(cfg)
    if key is None or features is None:
        raise ValueError("init(cfg, key, features) needs a key and example features f32[N, F]")
    x = _util.as_f32(features)
    check_rank(x, 2, "features")
    valid = jnp.all(jnp.isfinite(x), axis=1)
    if mask is not None:
        check_same_shape(valid, jnp.asarray(mask), "features rows", "mask")
        valid &= jnp.asarray(mask).astype(bool)
    x = jnp.where(valid[:, None], x, 0.0)
    fmean = masked_mean(x, valid[:, None], axis=0)
    fstd = masked_std(x, valid[:, None], axis=0)
    fstd = jnp.where(fstd > 1e-6, fstd, 1.0)
    variables = cfg.module.init(as_key(key), jnp.zeros((1, x.shape[1]), jnp.float32))
    policy = WeightPolicyParams(variables=variables, feature_mean=fmean, feature_std=fstd, module=cfg.module)
    return AWRState(policy=policy, opt_state=_optimizer(cfg).init(variables), count=jnp.zeros((), jnp.int32))


def _update(state: AWRState, x: Array, a: Array, w: Array, valid: Array, cfg: AWRConfig) -> tuple[AWRState, Array]:
    """One AdamW step on ``-sum(valid * w * log N(a | policy(x))) / n_valid``: the one gradient path."""
    xs = _standardize(state.policy, jnp.where(valid[:, None], x, 0.0))
    a = jnp.where(valid[:, None], a, 0.0)

    def loss_fn(variables):
        mean, log_std = cfg.module.apply(variables, xs)
        lp = gaussian_log_prob(a, mean, log_std)
        return -jnp.sum(jnp.where(valid, w * lp, 0.0)) / jnp.maximum(jnp.sum(valid), 1.0)

    variables = state.policy.variables
    loss, g = jax.value_and_grad(loss_fn)(variables)
    upd, opt_state = _optimizer(cfg).update(g, state.opt_state, variables)
    # a batch without a valid row measured nothing: no AdamW step (its weight decay and moment
    # decay would still move the state), the state stays exactly as it was
    applied = jnp.any(valid)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(applied, a, b), new, old)  # noqa: E731
    policy = state.policy.replace(variables=keep(optax.apply_updates(variables, upd), variables))
    return AWRState(policy=policy, opt_state=keep(opt_state, state.opt_state),
                    count=state.count + applied.astype(jnp.int32)), loss


def step(state: AWRState, features: Any, log_weights: Any, advantages: Any, cfg: AWRConfig, *,
         mask: Any = None) -> tuple[AWRState, dict[str, Array]]:
    """One AWR fit step: one AdamW step of the weighted likelihood of a batch.

    The batch's weights are :func:`awr_weights` of its advantages (normalised
    over the batch when ``cfg.normalize``). Rows with a False ``mask`` or a
    non-finite entry are excluded and counted (``n_invalid``; masked-out rows
    are not counted); a batch without a valid row (empty, all masked or all
    invalid) leaves the state exactly unchanged.

    Args:
      state: from :func:`init`.
      features: f32[B, F]; log_weights: f32[B, K] recorded actions; advantages: f32[B].
      cfg: from :func:`config`.
      mask: optional bool[B].

    Returns:
      ``(state, out)`` with ``out = {"loss", "num_valid", "n_invalid", "weight_ess", "clipped_fraction"}``.

    Example::

        import jax, jax.numpy as jnp
        from jaxweight import awr

        cfg = awr.config(2, hidden_sizes=(8,))
        x, a, adv = jnp.ones((16, 3)), jnp.zeros((16, 2)), jnp.arange(16.0)
        state = awr.init(cfg, 0, x)
        state, out = jax.jit(awr.step, donate_argnums=0)(state, x, a, adv, cfg)
        awr.metrics_dict(out, cfg)                  # {"awr/loss": ..., "awr/weight_ess": ...}
    """
    _check_config(cfg)
    if not isinstance(state, AWRState):
        raise ValueError(f"state must be an AWRState (from awr.init()), got {type(state).__name__}")
    x, a, adv, req, valid = _rows(features, log_weights, advantages, mask, cfg.module.num_components)
    w = awr_weights(adv, cfg.temperature, cfg.max_weight, cfg.normalize, valid)
    state, loss = _update(state, x, a, w, valid, cfg)
    return state, {"loss": loss, **_weight_stats(w, req, valid, cfg.max_weight)}


def metrics_dict(out: dict[str, Array], cfg: AWRConfig) -> dict[str, float]:
    """Host side: a :func:`step` (or :func:`fit_weight_policy`) output as ``{"awr/<key>": float}``."""
    _check_config(cfg)
    return flatten(out, prefix="awr")


@functools.partial(jax.jit, static_argnames="batch_size")
def _epoch(state, key, x, a, w, valid, cfg, batch_size):
    """One pass over shuffled minibatches (the last one filled up with masked repeats)."""
    N = x.shape[0]
    nb = math.ceil(N / batch_size)
    perm = jax.random.permutation(key, N)
    idx = jnp.concatenate([perm, perm[: nb * batch_size - N]]).reshape(nb, batch_size)
    fresh = (jnp.arange(nb * batch_size) < N).reshape(nb, batch_size)

    def one(state, inp):
        ib, fb = inp
        return _update(state, x[ib], a[ib], w[ib], fb & valid[ib], cfg)

    state, losses = jax.lax.scan(one, state, (idx, fresh))
    return state, jnp.mean(losses)


def fit_weight_policy(
    key: Any,
    features: Any,
    log_weights: Any,
    advantages: Any,
    cfg: AWRConfig | None = None,
    *,
    mask: Any = None,
    batch_size: int = 256,
    num_epochs: int = 30,
    callback: Callable[[int, dict[str, float]], Any] | None = None,
) -> tuple[WeightPolicyParams, dict[str, Array]]:
    """Host driver: fit a :class:`WeightPolicy` to recorded ``(features, log_weights, advantages)`` by AWR.

    Maximises ``mean_i w_i log N(log_weights_i | mean(x_i), std)`` with the
    weights :func:`awr_weights` computed once over the whole data set; features
    are standardised with their (valid-row) mean and std (:func:`init`). Each
    epoch is one jitted ``lax.scan`` of the :func:`step` update over shuffled
    minibatches. Rows with a False ``mask`` or any non-finite entry are excluded.

    Args:
      key: ``jax.random.key`` or int seed (initialisation and shuffling).
      features: f32[N, F]; log_weights: f32[N, K]; advantages: f32[N].
      cfg: from :func:`config` (default ``config(K)``).
      mask: optional bool[N].
      batch_size: static int >= 1 (capped at N).
      num_epochs: static int >= 0.
      callback: optional ``callback(epoch, {"loss": float})`` after every epoch.
        Without one nothing is printed and the epochs run without a host sync.

    Returns:
      ``(params, metrics)``: the fitted :class:`WeightPolicyParams` and
      ``loss f32[num_epochs]`` (mean minibatch loss per epoch), ``num_valid``,
      ``n_invalid``, ``weight_ess`` (effective sample size / valid rows) and
      ``clipped_fraction`` (rows at ``max_weight``).

    Example::

        import numpy as np
        from jaxweight import awr

        rng = np.random.default_rng(0)
        x, lw, adv = rng.normal(size=(64, 3)), rng.normal(size=(64, 2)), rng.normal(size=64)
        params, m = awr.fit_weight_policy(0, x, lw, adv, awr.config(2, hidden_sizes=(8,)), num_epochs=2)
        pred = awr.predict_log_weights(params, x)                # f32[64, 2]
    """
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be a callable (epoch, metrics) -> None, got {callback!r}")
    key = as_key(key)
    if cfg is None:
        check_rank(log_weights, 2, "log_weights")
        cfg = config(np.shape(log_weights)[1])
    _check_config(cfg)
    x, a, adv, req, valid = _rows(features, log_weights, advantages, mask, cfg.module.num_components)
    N = x.shape[0]
    if N == 0:
        raise ValueError("fit_weight_policy needs at least one row, got N = 0")
    batch_size = min(check_static_int(batch_size, "batch_size", 1), N)
    num_epochs = check_static_int(num_epochs, "num_epochs", 0)
    w = awr_weights(adv, cfg.temperature, cfg.max_weight, cfg.normalize, valid)
    k_init, k_shuffle = jax.random.split(key)
    state = init(cfg, k_init, x, mask=valid)
    losses = []
    keys = jax.random.split(k_shuffle, max(num_epochs, 1))
    for e in range(num_epochs):   # the host loop over epochs; each epoch is one compiled scan
        state, loss = _epoch(state, keys[e], x, a, w, valid, cfg, batch_size)
        losses.append(loss)
        if callback is not None:
            callback(e, {"loss": float(loss)})
    metrics = {"loss": jnp.stack(losses) if losses else jnp.zeros((0,), jnp.float32),
               **_weight_stats(w, req, valid, cfg.max_weight)}
    return state.policy, metrics
