"""Advantage-weighted regression (AWR) of a loss-weight policy.

The reason to sample random loss weights (:mod:`jaxweight.random_weighting`)
is to record ``(features, log-weights, reward)`` rollouts and fit a policy
that predicts good log-weights from the features. AWR (Peng et al. 2019) does
this by weighted maximum likelihood: each recorded action is imitated with
weight ``min(exp(A / beta), max_weight)`` where ``A`` is its advantage.

* :func:`awr_weights`, :func:`awr_loss`: the weights and the weighted
  negative log-likelihood, masked and NaN-safe.
* :class:`WeightPolicy`: a flax module ``features f32[..., F] -> (mean, log_std) f32[..., K]``,
  a diagonal Gaussian over the K log-weights.
* :func:`fit_weight_policy`: minibatch AWR with optax (one jitted ``lax.scan``
  per epoch; progress only through an explicit ``callback=``, nothing is printed).
* :func:`predict_log_weights`: the policy's mean log-weights for new features.

Example::

    from jaxweight import awr

    params, metrics = awr.fit_weight_policy(key, feats, log_w, adv, num_epochs=30)
    lw = awr.predict_log_weights(params, new_feats)        # f32[..., K]

References:
  X. B. Peng, A. Kumar, G. Zhang, S. Levine, "Advantage-Weighted Regression:
  Simple and Scalable Off-Policy Reinforcement Learning", arXiv:1910.00177 (2019).
  torchref ``RandomWeightingScheme`` (https://github.com/HatPdotS/TorchRef), which
  records the random-weight trajectories this policy is fitted on.
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

Array = jax.Array

__all__ = [
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

        awr_weights(jnp.array([0.0, 1.0, 2.0]), normalize=False)   # [1, e, e**2]

    References:
      Peng et al. 2019, arXiv:1910.00177, eq. 11 and the weight clipping of Sec. 5.
    """
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a static bool, got {normalize!r}")
    adv = jnp.asarray(advantages, jnp.float32)
    beta = _positive_scalar(temperature, "temperature")
    wmax = _positive_scalar(max_weight, "max_weight")
    valid = _valid_mask(adv, mask, "advantages")
    a = jnp.where(valid, adv, 0.0)
    if normalize:
        # scale first so that huge finite advantages cannot overflow the mean/std
        s = jnp.maximum(jnp.max(jnp.abs(a)), 1.0)
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
    lp = jnp.asarray(log_probs)
    adv = jnp.asarray(advantages, jnp.float32)
    check_same_shape(adv, lp, "advantages", "log_probs")
    # an entry with a non-finite log-prob is invalid too: it stays out of the normalisation
    valid = _valid_mask(adv, mask, "advantages") & jnp.isfinite(lp)
    w = awr_weights(adv, temperature, max_weight, normalize, valid)
    w = jax.lax.stop_gradient(jnp.where(valid, w, 0.0))
    return -masked_mean(w * jnp.where(valid, lp, 0.0), valid)


def gaussian_log_prob(x: Array, mean: Array, log_std: Array) -> Array:
    """Log density of a diagonal Gaussian, summed over the last axis: f32[..., K] -> f32[...]."""
    z = (x - mean) * jnp.exp(-log_std)
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

        pol = WeightPolicy(num_components=5)
        variables = pol.init(jax.random.key(0), jnp.zeros((1, 4)))
        mean, log_std = pol.apply(variables, feats)            # f32[B, 5] each
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


def _standardize(params: WeightPolicyParams, features: Any) -> Array:
    x = jnp.asarray(features, jnp.float32)
    F = params.feature_mean.shape[-1]
    if x.ndim < 1 or x.shape[-1] != F:
        raise ValueError(f"features must have shape (..., {F}), got {x.shape}")
    return (x - params.feature_mean) / params.feature_std


def predict_distribution(params: WeightPolicyParams, features: Any) -> tuple[Array, Array]:
    """The policy's Gaussian over log-weights: ``(mean, log_std)``, each f32[..., K]."""
    if not isinstance(params, WeightPolicyParams):
        raise ValueError(f"params must be WeightPolicyParams (from fit_weight_policy), got {type(params).__name__}")
    return params.module.apply(params.variables, _standardize(params, features))


def predict_log_weights(params: WeightPolicyParams, features: Any) -> Array:
    """The policy's mean log-weights for ``features f32[..., F]``: f32[..., K] (jittable, vmappable).

    Example::

        w = jnp.exp(predict_log_weights(params, feats))          # loss-component weights
    """
    return predict_distribution(params, features)[0]


# ------------------------------------------------------------------ fitting
@functools.partial(jax.jit, static_argnames="normalize")
def _prepare(x, a, adv, mask, temperature, max_weight, normalize):
    """Valid rows, AWR weights over the whole data set, standardised features, weight statistics."""
    finite = jnp.isfinite(adv) & jnp.all(jnp.isfinite(x), axis=1) & jnp.all(jnp.isfinite(a), axis=1)
    valid = finite & mask.astype(bool)
    w = awr_weights(adv, temperature, max_weight, normalize, valid)
    x = jnp.where(valid[:, None], x, 0.0)
    a = jnp.where(valid[:, None], a, 0.0)
    fmean = masked_mean(x, valid[:, None], axis=0)
    fstd = masked_std(x, valid[:, None], axis=0)
    fstd = jnp.where(fstd > 1e-6, fstd, 1.0)
    n_valid = masked_count(w, valid)
    sw, sw2 = jnp.sum(w), jnp.sum(w * w)
    stats = {
        "num_valid": n_valid,
        "n_invalid": jnp.sum(mask.astype(bool) & ~finite, dtype=jnp.int32),
        "weight_ess": jnp.where(sw2 > 0, sw * sw / jnp.maximum(sw2, 1e-30), 0.0) / jnp.maximum(n_valid, 1.0),
        "clipped_fraction": masked_mean((w >= max_weight).astype(jnp.float32), valid),
    }
    return (x - fmean) / fstd, a, w, valid, fmean, fstd, stats


@functools.lru_cache(maxsize=16)
def _trainer(module: WeightPolicy, learning_rate: float, weight_decay: float, max_grad_norm: float,
             batch_size: int):
    """``init(key, x0) -> (variables, opt_state, epoch)``; cached so repeated fits with the same
    settings and data shapes compile once."""
    tx = optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adamw(learning_rate, weight_decay=weight_decay))

    def batch_loss(variables, xb, ab, wb, vb):
        mean, log_std = module.apply(variables, xb)
        lp = gaussian_log_prob(ab, mean, log_std)
        return -jnp.sum(jnp.where(vb, wb * lp, 0.0)) / jnp.maximum(jnp.sum(vb), 1.0)

    grad_fn = jax.value_and_grad(batch_loss)

    @jax.jit
    def epoch(variables, opt_state, k, xs, a, w, valid):
        N = xs.shape[0]
        nb = math.ceil(N / batch_size)
        perm = jax.random.permutation(k, N)
        # the last minibatch is filled up with (masked) repeats so all have the same shape
        idx = jnp.concatenate([perm, perm[: nb * batch_size - N]]).reshape(nb, batch_size)
        fresh = (jnp.arange(nb * batch_size) < N).reshape(nb, batch_size)

        def one(carry, inp):
            variables, opt_state = carry
            ib, fb = inp
            loss, g = grad_fn(variables, xs[ib], a[ib], w[ib], fb & valid[ib])
            upd, opt_state = tx.update(g, opt_state, variables)
            return (optax.apply_updates(variables, upd), opt_state), loss

        (variables, opt_state), losses = jax.lax.scan(one, (variables, opt_state), (idx, fresh))
        return variables, opt_state, jnp.mean(losses)

    @jax.jit
    def init(k, x0):
        variables = module.init(k, x0)
        return variables, tx.init(variables)

    return lambda k, x0: (*init(k, x0), epoch)


def fit_weight_policy(
    key: Any,
    features: Any,
    log_weights: Any,
    advantages: Any,
    *,
    mask: Any = None,
    module: WeightPolicy | None = None,
    hidden_sizes: Sequence[int] = (64, 64),
    mean_bounds: tuple[float, float] | None = (-3.0, 3.0),
    temperature: float = 1.0,
    max_weight: float = 20.0,
    normalize: bool = True,
    learning_rate: float = 3e-3,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    batch_size: int = 256,
    num_epochs: int = 30,
    callback: Callable[[int, dict[str, float]], Any] | None = None,
    progress: Any = None,
    desc: str | None = None,
) -> tuple[WeightPolicyParams, dict[str, Array]]:
    """Fit a :class:`WeightPolicy` to recorded ``(features, log_weights, advantages)`` by AWR.

    Maximises ``mean_i w_i log N(log_weights_i | mean(x_i), std)`` with
    ``w = awr_weights(advantages, temperature, max_weight, normalize)``
    computed once over the whole data set. Features are standardised with
    their (valid-row) mean and std, stored in the returned params. Rows with
    a False ``mask`` or any non-finite entry are excluded.

    Each epoch is one jitted ``lax.scan`` over shuffled minibatches
    (the last one is filled up with masked repeats), with optax AdamW and
    gradient clipping.

    Args:
      key: ``jax.random.key`` or int seed (initialisation and shuffling).
      features: f32[N, F].
      log_weights: f32[N, K] recorded actions (log-weights).
      advantages: f32[N].
      mask: optional bool[N].
      module: a :class:`WeightPolicy` (K must match); else one is built from
        ``hidden_sizes`` and ``mean_bounds``.
      temperature, max_weight, normalize: AWR weights (:func:`awr_weights`).
      learning_rate, weight_decay, max_grad_norm: optimiser (static Python numbers: > 0, >= 0, > 0).
      batch_size: static int >= 1 (capped at N).
      num_epochs: static int >= 0.
      callback: optional ``callback(epoch, {"loss": float})`` called after
        every epoch (the demo draws its progress bar with it). Without one
        nothing is printed and the epochs run without a host sync.
      progress: deprecated: a callable is used as ``callback``; ``True`` (the
        old tqdm bar) warns and draws nothing; ``False``/None do nothing.
      desc: deprecated, unused (the old progress-bar label).

    Returns:
      ``(params, metrics)``: :class:`WeightPolicyParams` and a dict with
      ``loss f32[num_epochs]`` (mean minibatch loss per epoch),
      ``num_valid``, ``n_invalid`` (rows excluded for a non-finite feature,
      log-weight or advantage; masked-out rows are not counted),
      ``weight_ess`` (effective sample size of the AWR
      weights / valid rows) and ``clipped_fraction`` (rows at ``max_weight``).

    Example::

        params, m = fit_weight_policy(0, feats, lw, adv, num_epochs=20,
                                      callback=lambda e, m: print(e, m["loss"]))
        pred = predict_log_weights(params, feats)                # f32[N, K]
    """
    if callable(progress) and not isinstance(progress, bool):
        if callback is not None:
            raise ValueError("pass the progress function as callback= only")
        _util.warn_deprecated("fit_weight_policy(progress=fn)", "fit_weight_policy(callback=fn)")
        callback = progress
    elif progress:
        _util.warn_deprecated("fit_weight_policy(progress=True) (no bar is drawn any more)",
                              "fit_weight_policy(callback=...)")
    if desc is not None:
        _util.warn_deprecated("fit_weight_policy(desc=...)", "fit_weight_policy(callback=...)")
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be a callable (epoch, metrics) -> None, got {callback!r}")
    key = as_key(key)
    x = jnp.asarray(features, jnp.float32)
    a = jnp.asarray(log_weights, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    check_rank(x, 2, "features")
    check_rank(a, 2, "log_weights")
    check_rank(adv, 1, "advantages")
    N, F = x.shape
    K = a.shape[1]
    if a.shape[0] != N or adv.shape[0] != N:
        raise ValueError(
            "features, log_weights and advantages must have the same number of rows, "
            f"got {N}, {a.shape[0]}, {adv.shape[0]}"
        )
    if N == 0:
        raise ValueError("fit_weight_policy needs at least one row, got N = 0")
    if K == 0 or F == 0:
        raise ValueError(f"features and log_weights need >= 1 column, got F = {F}, K = {K}")
    batch_size = min(check_static_int(batch_size, "batch_size", 1), N)
    num_epochs = check_static_int(num_epochs, "num_epochs", 0)
    if module is None:
        module = WeightPolicy(num_components=K, hidden_sizes=tuple(hidden_sizes), mean_bounds=mean_bounds)
    if not isinstance(module, WeightPolicy):
        raise ValueError(f"module must be a WeightPolicy, got {type(module).__name__}")
    if module.num_components != K:
        raise ValueError(f"module.num_components ({module.num_components}) must equal log_weights.shape[1] ({K})")
    # optimiser settings are static (the compiled trainer is cached on them)
    for v, n in ((learning_rate, "learning_rate"), (max_grad_norm, "max_grad_norm")):
        _util.check_value(v, n, gt=0.0, static=True)
        _positive_scalar(v, n)
    _util.check_value(weight_decay, "weight_decay", ge=0.0, static=True)

    if mask is None:
        m = jnp.ones((N,), bool)
    else:
        m = jnp.asarray(mask)
        if m.shape != (N,):
            raise ValueError(f"mask must have shape ({N},), got {m.shape}")
    beta = _positive_scalar(temperature, "temperature")
    wmax = _positive_scalar(max_weight, "max_weight")
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a static bool, got {normalize!r}")

    xs, a, w, valid, fmean, fstd, stats = _prepare(x, a, adv, m, beta, wmax, normalize)
    k_init, k_shuffle = jax.random.split(key)
    variables, opt_state, epoch = _trainer(module, float(learning_rate), float(weight_decay),
                                           float(max_grad_norm), batch_size)(k_init, xs[:1])
    losses = []
    keys = jax.random.split(k_shuffle, max(num_epochs, 1))
    for e in range(num_epochs):
        variables, opt_state, loss = epoch(variables, opt_state, keys[e], xs, a, w, valid)
        losses.append(loss)
        if callback is not None:
            callback(e, {"loss": float(loss)})
    metrics = {"loss": jnp.stack(losses) if losses else jnp.zeros((0,), jnp.float32), **stats}
    return WeightPolicyParams(variables=variables, feature_mean=fmean, feature_std=fstd, module=module), metrics
