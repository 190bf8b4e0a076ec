"""Reward-model training on a preference buffer (imitation ``BasicRewardTrainer`` / ``EnsembleTrainer``).

One train step, used everywhere. :func:`train_step` (one optimiser step on a
batch), :func:`train_epoch` (one pass over the buffer), :func:`train_epochs` /
:func:`train_reward` (several epochs in one compiled loop), the host class
:class:`RewardTrainer`, the preference loop and the data-parallel
``jaxweight.distributed.reward_train_step`` all run the same per-member step
(``_member_step``). It is single-device by default; with ``axis_name=`` (inside
``jax.shard_map``) every device computes the gradient of its rows of each batch
and the shard gradients are added with ``lax.psum``; ``mesh=`` does the
``shard_map`` for you. Ensembles and single nets share one code path (members
are ``vmap``-ed; a single net is the same function without the member axis).

The semantics follow imitation v1.0.1 exactly where they are observable:

- optimiser: ``optax.adamw(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)``,
  i.e. torch's ``AdamW`` defaults that imitation uses (optax's own default
  weight decay is 1e-4, so it is passed explicitly);
- an epoch permutes the ``N`` valid stored pairs with an explicit key, walks
  them in minibatches of ``minibatch_size``, scales each minibatch loss by
  ``len(minibatch) / batch_size`` and accumulates gradients, stepping whenever
  ``batch_size`` pairs are accumulated and once more at the end for a short
  last batch: ``ceil(N / batch_size)`` steps, each with the full-batch mean
  gradient whatever the minibatch size (a short last batch is *not*
  renormalised);
- ``epochs = round(epochs * epoch_multiplier)`` (Python's round-half-even), >= 1;
- ensembles: every member gets its own bootstrap resample (``N`` indices drawn
  with replacement, fresh on every ``train`` call) and its own optimiser
  state; all members train at once under ``jax.vmap``;
- regularisers as ``imitation.regularization``: Lp (``lam * sum |theta|^p``
  added to every minibatch loss), weight decay (``theta -= lam * lr * theta``
  after every minibatch) and the ``IntervalParamScaler`` lambda updater with a
  validation split;
- metrics: ``reward/epoch-{k}/train/{loss,accuracy,gt_reward_loss}`` (means
  over the epoch's minibatches), the last epoch copied to ``reward/final/...``,
  and for ensembles the member mean plus ``<name>_std`` (ddof 0);
  :func:`metrics_dict` gives the flat ``{"preference/loss", "preference/accuracy",
  "preference/n_invalid", ...}`` of one step / epoch / call.

Bad data. A pair with a non-finite observation or action, a preference that
is non-finite or outside ``[0, 1]``, or a discrete action / observation out of
its space's range is invalid: it is left out of the loss and the gradients
(its inputs are replaced before the net runs, so NaN never reaches a
gradient), and counted in the ``n_invalid`` metric. A batch without a valid
pair leaves params and optimiser state exactly unchanged. Bad hyperparameters
(negative or NaN learning rate, probabilities outside [0, 1], ...) raise
``ValueError`` eagerly, and the same message through
``jaxweight.checked(jax.jit(...))`` when they are traced.

Design. ``N`` is traced: an epoch is a ``lax.while_loop`` over the
``ceil(N / batch_size)`` steps with data (steps without data never run).
Everything continuous (learning rate, AdamW betas/eps/decay, noise,
discount, clipping threshold, regulariser constants) lives in
:class:`TrainerHParams` inside the :class:`TrainerState`, so new values never
recompile and states can be vmapped over hyperparameters or seeds. The static
structure (module, batch sizes, members, regulariser kind) is the hashable
:class:`TrainerConfig`, passed last.

Example::

    net = RewardMLP(observation_space=Box((4,)), action_space=Discrete(2))
    trainer = RewardTrainer(net, num_members=5, batch_size=32)
    state = trainer.init(0, example_inputs)
    state, metrics = trainer.train(state, key, buffer, epoch_multiplier=1.0)
    metrics["reward/final/train/loss"], metrics["reward/final/train/loss_std"]
    # the pure core, e.g. inside a jitted loop (epochs may be traced):
    state, m = train_reward(state, key, buffer, trainer.config, epochs=3)
    metrics_dict(m)    # {"preference/loss": ..., "preference/accuracy": ..., "preference/n_invalid": ...}

References:
  imitation ``algorithms/preference_comparisons.py`` and ``regularization/``;
  Loshchilov & Hutter (2019), "Decoupled weight decay regularization".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from .._util import as_key, check_static_int, check_value, progress_bar, warn_deprecated
from .buffer import PreferenceBuffer, buffer_mask
from .data import FragmentPairs
from .model import _preference_probabilities, binary_cross_entropy
from .reward_nets import ensemble_init, valid_inputs

Array = jax.Array

__all__ = [
    "IntervalParamScaler",
    "Regularizer",
    "lp_regularizer",
    "weight_decay_regularizer",
    "TrainerConfig",
    "TrainerHParams",
    "TrainerState",
    "TrainData",
    "RewardTrainer",
    "trainer_config",
    "trainer_hparams",
    "trainer_init",
    "make_optimizer",
    "num_epochs",
    "minibatch_grad",
    "train_step",
    "prepare_data",
    "train_epoch",
    "train_epochs",
    "train_reward",
    "epoch_metrics_dict",
    "metrics_dict",
]

_EPS64 = float(np.finfo(float).eps)
TRAIN_METRICS = ("loss", "accuracy", "gt_reward_loss")


# ------------------------------------------------------------- regularizers
@dataclasses.dataclass(frozen=True)
class IntervalParamScaler:
    """imitation's ``IntervalParamScaler``: scale lambda by ``1 +- scaling_factor`` when
    ``val_loss / train_loss`` leaves ``tolerable_interval``.

    Attributes:
      scaling_factor: in (0, 1).
      tolerable_interval: ``(low, high)`` with ``0 <= low < high``.
      loss_ratio: ``"sum"`` (default, as imitation's trainer feeds it: the sum of
        the epoch's scaled train minibatch losses and the sum of the validation
        minibatch mean losses, so the ratio also depends on the split sizes) or
        ``"mean"`` (ratio of the mean per-pair losses).
    """

    scaling_factor: float
    tolerable_interval: tuple[float, float]
    loss_ratio: str = "sum"

    def __post_init__(self):
        check_value(self.scaling_factor, "scaling_factor", static=True)
        if not (_EPS64 < self.scaling_factor < 1 - _EPS64):
            raise ValueError("scaling_factor must be in (0, 1) within machine precision.")
        if len(self.tolerable_interval) != 2:
            raise ValueError("tolerable_interval must be a tuple of length 2")
        lo, hi = self.tolerable_interval
        check_value(lo, "tolerable_interval[0]", static=True)
        check_value(hi, "tolerable_interval[1]", static=True)
        if not (0 <= lo < hi):
            raise ValueError(
                "tolerable_interval must be a tuple whose first element is at least 0 and the second "
                "element is greater than the first"
            )
        if self.loss_ratio not in ("sum", "mean"):
            raise ValueError(f"loss_ratio must be 'sum' or 'mean', got {self.loss_ratio!r}")
        object.__setattr__(self, "tolerable_interval", (float(lo), float(hi)))


@dataclasses.dataclass(frozen=True)
class Regularizer:
    """A regulariser of reward training (imitation ``LpRegularizer`` / ``WeightDecayRegularizer``).

    Attributes:
      kind: ``"lp"`` (penalty ``lam * sum |theta|^p`` added to each minibatch
        loss) or ``"weight_decay"`` (``theta -= lam * lr * theta`` after each minibatch).
      initial_lambda: starting strength (finite, >= 0).
      p: Lp exponent (int >= 1).
      lambda_updater: optional :class:`IntervalParamScaler` (needs ``val_split``).
      val_split: fraction of the data held out to drive ``lambda_updater``.
    """

    kind: str
    initial_lambda: float
    p: int = 2
    lambda_updater: IntervalParamScaler | None = None
    val_split: float | None = None

    def __post_init__(self):
        if self.kind not in ("lp", "weight_decay"):
            raise ValueError(f"kind must be 'lp' or 'weight_decay', got {self.kind!r}")
        check_value(self.initial_lambda, "initial_lambda", ge=0.0, static=True)
        if self.lambda_updater is None and np.allclose(self.initial_lambda, 0.0):
            raise ValueError(
                "If you do not pass a regularizer parameter updater your regularization strength must be "
                "non-zero, as this would result in no regularization."
            )
        vs = self.val_split
        if vs is not None:
            check_value(vs, "val_split", static=True)
        if vs is not None and (not isinstance(vs, float) or np.allclose(vs, 0.0) or vs <= 0 or vs >= 1):
            raise ValueError(f"val_split = {vs} must be a float strictly between 0 and 1.")
        if self.lambda_updater is not None and vs is None:
            raise ValueError(
                "If you pass a regularizer parameter updater, you must also specify a validation split. "
                "Otherwise the updater won't have any validation data to use for updating."
            )
        if self.lambda_updater is None and vs is not None:
            raise ValueError(
                "If you pass a validation split, you must also pass a regularizer parameter updater. "
                "Otherwise you are wasting data into the validation split that will not be used."
            )
        if self.kind == "lp" and (isinstance(self.p, bool) or not isinstance(self.p, int) or self.p < 1):
            raise ValueError("p must be a positive integer")


def lp_regularizer(
    initial_lambda: float, p: int = 2, *, lambda_updater: IntervalParamScaler | None = None,
    val_split: float | None = None,
) -> Regularizer:
    """imitation ``LpRegularizer``: adds ``lam * sum_theta |theta|^p`` to every minibatch loss."""
    check_value(initial_lambda, "initial_lambda", ge=0.0, static=True)
    return Regularizer("lp", float(initial_lambda), p, lambda_updater, val_split)


def weight_decay_regularizer(
    initial_lambda: float, *, lambda_updater: IntervalParamScaler | None = None, val_split: float | None = None
) -> Regularizer:
    """imitation ``WeightDecayRegularizer``: ``theta -= lam * lr * theta`` after every minibatch."""
    check_value(initial_lambda, "initial_lambda", ge=0.0, static=True)
    return Regularizer("weight_decay", float(initial_lambda), 2, lambda_updater, val_split)




# ------------------------------------------------------------ config/state
@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Static (structural) settings; hashable, part of the compiled program.

    Attributes:
      module: the reward module, ``module.apply(p, state, action, next_state, done)``.
      batch_size: pairs per optimiser step.
      minibatch_size: pairs per gradient evaluation (divides ``batch_size``).
      epochs: base number of epochs per ``train`` call.
      num_members: ``None`` for a single net, else ``M >= 2`` (params stacked on axis 0).
      bagging: bootstrap-resample the data for every member (ensembles only).
      reg_kind: ``None``, ``"lp"`` or ``"weight_decay"``.
      reg_p: Lp exponent.
      val_split: validation fraction (only with a lambda updater).
      reg_loss_ratio: ``"sum"`` or ``"mean"`` (see :class:`IntervalParamScaler`).
    """

    module: nn.Module
    batch_size: int = 32
    minibatch_size: int = 32
    epochs: int = 1
    num_members: int | None = None
    bagging: bool = True
    reg_kind: str | None = None
    reg_p: int = 2
    val_split: float | None = None
    reg_loss_ratio: str = "sum"

    @property
    def ensemble(self) -> bool:
        return self.num_members is not None

    @property
    def has_updater(self) -> bool:
        return self.val_split is not None


@struct.dataclass
class TrainerHParams:
    """Continuous hyperparameters (``f32[]`` leaves; vmappable, never recompile)."""

    learning_rate: Array
    weight_decay: Array
    b1: Array
    b2: Array
    eps: Array
    noise_prob: Array
    discount: Array
    threshold: Array
    reg_scaling_factor: Array
    reg_interval_low: Array
    reg_interval_high: Array


@struct.dataclass
class TrainerState:
    """Everything that changes during reward training.

    Attributes:
      params: reward-net params (leading member axis ``M`` for ensembles).
      opt_state: AdamW state (per member for ensembles).
      reg_lambda: ``f32[]`` (``f32[M]``) current regularisation strength (0 without a regulariser).
      hparams: :class:`TrainerHParams`.
      steps: ``i32[]`` optimiser steps taken so far (steps on a batch without a valid pair do not count).
    """

    params: Any
    opt_state: Any
    reg_lambda: Array
    hparams: TrainerHParams
    steps: Array


@struct.dataclass
class TrainData:
    """Which buffer slots each member trains / validates on in one ``train`` call.

    Attributes:
      train_idx: ``i32[C]`` (``[M, C]``) buffer slots; the first ``n_train`` are used.
      n_train: ``i32[]`` number of training pairs (the same for every member).
      val_idx: ``i32[C]`` (``[M, C]``) validation slots; the first ``n_val`` are used.
      n_val: ``i32[]``.
      n_invalid: ``i32[]`` stored pairs left out because their data is bad (see the module docstring).
    """

    train_idx: Array
    n_train: Array
    val_idx: Array
    n_val: Array
    n_invalid: Array


def trainer_config(
    module: nn.Module,
    *,
    batch_size: int = 32,
    minibatch_size: int | None = None,
    epochs: int = 1,
    num_members: int | None = None,
    bagging: bool = True,
    regularizer: Regularizer | None = None,
) -> TrainerConfig:
    """Validate and build a :class:`TrainerConfig`.

    Raises:
      ValueError: "Batch size must be a multiple of minibatch size."; sizes or
        epochs < 1; ``minibatch_size > batch_size``; ``num_members < 2``.
    """
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a flax.linen Module (e.g. RewardMLP), got {type(module).__name__}")
    batch_size = check_static_int(batch_size, "batch_size", 1)
    minibatch_size = batch_size if minibatch_size is None else check_static_int(minibatch_size, "minibatch_size", 1)
    if minibatch_size > batch_size:
        raise ValueError(f"minibatch_size must be <= batch_size ({batch_size}), got {minibatch_size}")
    if batch_size % minibatch_size != 0:
        raise ValueError("Batch size must be a multiple of minibatch size.")
    epochs = check_static_int(epochs, "epochs", 1)
    if num_members is not None:
        num_members = check_static_int(num_members, "num_members", 0)
        if num_members < 2:
            raise ValueError("Must be at least 2 member in the ensemble.")
    if regularizer is not None and not isinstance(regularizer, Regularizer):
        raise ValueError(f"regularizer must be a Regularizer (lp_regularizer / weight_decay_regularizer), got {regularizer!r}")
    return TrainerConfig(
        module=module, batch_size=batch_size, minibatch_size=minibatch_size, epochs=epochs,
        num_members=num_members, bagging=bool(bagging),
        reg_kind=None if regularizer is None else regularizer.kind,
        reg_p=2 if regularizer is None else int(regularizer.p),
        val_split=None if regularizer is None else regularizer.val_split,
        reg_loss_ratio="sum" if regularizer is None or regularizer.lambda_updater is None
        else regularizer.lambda_updater.loss_ratio,
    )


# name -> accepted range (check_value keywords); the same checks run eagerly in trainer_hparams and,
# for traced values, inside every training entry point (raised by jaxweight.checked)
_HPARAM_RANGES = {
    "learning_rate": dict(ge=0.0),
    "weight_decay": dict(ge=0.0),
    "b1": dict(ge=0.0, lt=1.0),
    "b2": dict(ge=0.0, lt=1.0),
    "eps": dict(ge=0.0),
    "noise_prob": dict(ge=0.0, le=1.0),
    "discount": dict(ge=0.0, le=1.0),
    "threshold": dict(gt=0.0),
}


def _check_hparams(hp: TrainerHParams) -> None:
    for name, rng in _HPARAM_RANGES.items():
        check_value(getattr(hp, name), name, **rng)


def trainer_hparams(
    *,
    learning_rate: float = 1e-3,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    noise_prob: float = 0.0,
    discount: float = 1.0,
    threshold: float = 50.0,
    regularizer: Regularizer | None = None,
) -> TrainerHParams:
    """Build :class:`TrainerHParams` (defaults: torch AdamW as used by imitation).

    Raises:
      ValueError: a value outside its range (``learning_rate``, ``weight_decay``,
        ``eps >= 0``; ``b1``, ``b2`` in ``[0, 1)``; ``noise_prob``, ``discount``
        in ``[0, 1]``; ``threshold > 0``; all finite), naming it and its value.
    """
    upd = None if regularizer is None else regularizer.lambda_updater
    f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    values = dict(learning_rate=learning_rate, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps,
                  noise_prob=noise_prob, discount=discount, threshold=threshold)
    for name, v in values.items():
        check_value(v, name, **_HPARAM_RANGES[name])
    return TrainerHParams(
        **{k: f(v) for k, v in values.items()},
        reg_scaling_factor=f(0.0 if upd is None else upd.scaling_factor),
        reg_interval_low=f(0.0 if upd is None else upd.tolerable_interval[0]),
        reg_interval_high=f(0.0 if upd is None else upd.tolerable_interval[1]),
    )


def make_optimizer(hp: TrainerHParams) -> optax.GradientTransformation:
    """AdamW with torch semantics: ``p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)``.

    Built from (possibly traced) hyperparameters; its state does not depend on them.
    """
    return optax.adamw(
        learning_rate=hp.learning_rate, b1=hp.b1, b2=hp.b2, eps=hp.eps, weight_decay=hp.weight_decay
    )


def _vm(config: TrainerConfig, fn: Callable, in_axes: Any = 0) -> Callable:
    """THE ensemble branch: ``fn`` of one member, vmapped over the leading member axis for ensembles."""
    return jax.vmap(fn, in_axes=in_axes) if config.ensemble else fn


def trainer_init(config: TrainerConfig, params: Any, hparams: TrainerHParams, initial_lambda: float = 0.0) -> TrainerState:
    """Fresh optimiser state for ``params`` (per member for ensembles).

    Raises:
      ValueError: a hyperparameter outside its range; ``initial_lambda`` negative or NaN.
    """
    _check_hparams(hparams)
    check_value(initial_lambda, "initial_lambda", ge=0.0)
    opt = make_optimizer(hparams)
    shape = (config.num_members,) if config.ensemble else ()
    return TrainerState(params=params, opt_state=_vm(config, opt.init)(params),
                        reg_lambda=jnp.full(shape, initial_lambda, jnp.float32), hparams=hparams,
                        steps=jnp.zeros((), jnp.int32))


def num_epochs(epochs: int, epoch_multiplier: float = 1.0) -> int:
    """``round(epochs * epoch_multiplier)`` (Python round-half-even).

    Raises:
      ValueError: "Must train for at least one epoch." when the result is < 1;
        ``epoch_multiplier`` negative, NaN or traced (it sets a Python loop count).
    """
    check_value(epoch_multiplier, "epoch_multiplier", ge=0.0, static=True)
    n = round(epochs * float(epoch_multiplier))
    if n < 1:
        raise ValueError("Must train for at least one epoch.")
    return int(n)


def _old_order(fn: str, old: str, new: str) -> None:
    warn_deprecated(f"{fn}({old})", f"{fn}({new})")


# ---------------------------------------------------------------- the math
def _penalty(p: int, params: Any) -> Array:
    """``sum_theta |theta|^p`` (the Lp regulariser's penalty before ``lam``)."""
    leaves = jax.tree.leaves(params)
    if p == 2:
        return sum(jnp.sum(jnp.square(x)) for x in leaves)
    return sum(jnp.sum(jnp.abs(x) ** p) for x in leaves)


def _clean(pairs: FragmentPairs, prefs: Array, mask: Array) -> tuple[FragmentPairs, Array]:
    """Replace the net inputs of masked-out pairs BEFORE the net runs, so nothing non-finite in them
    can reach the gradient through ``0 * nan``.

    Only float observations / actions feed the net (integer ones cannot be NaN; out-of-range ids
    one-hot to zeros); ground-truth rewards only feed a metric and are masked there."""

    def clean(x):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            return x
        m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        return jnp.where(m, x, jnp.zeros((), x.dtype))

    return pairs.replace(obs=clean(pairs.obs), acts=clean(pairs.acts)), jnp.where(mask, prefs, 0.5)


def _pair_ok(config: TrainerConfig, pairs: FragmentPairs, prefs: Array) -> Array:
    """``bool[..., P]``: pairs training can use (finite in-range inputs, preference in [0, 1])."""
    prefs = jnp.asarray(prefs, jnp.float32)
    ok = jnp.isfinite(prefs) & (prefs >= 0.0) & (prefs <= 1.0)
    lead = prefs.ndim
    return ok & valid_inputs(config.module, pairs.obs, pairs.acts, lead)


def _piece(config: TrainerConfig, hp: TrainerHParams, params: Any, pairs: FragmentPairs, prefs: Array,
           mask: Array) -> tuple[Any, Array]:
    """Gradient of ``sum_i mask_i * BCE_i / batch_size`` over some rows of one minibatch (pairs already
    cleaned) and their sums ``f32[4]``: loss, correct answers, ground-truth loss, count."""

    def loss(p):
        # hp is checked once per step by the entry points (_check_hparams), not per minibatch here
        probs, gt = _preference_probabilities(
            config.module, p, pairs, hp.noise_prob, hp.discount, hp.threshold, False
        )
        li = jnp.where(mask, binary_cross_entropy(probs, prefs), 0.0)
        return jnp.sum(li) / config.batch_size, (li, probs, gt)

    grads, (li, probs, gt) = jax.grad(loss, has_aux=True)(params)
    correct = jnp.where(mask, (probs > 0.5) == (prefs > 0.5), False)
    gt_loss = binary_cross_entropy(gt, prefs)
    gt_loss = jnp.where(mask & jnp.isfinite(gt_loss), gt_loss, 0.0)  # NaN ground truth: a metric only
    sums = jnp.stack([jnp.sum(li), jnp.sum(correct, dtype=jnp.float32), jnp.sum(gt_loss),
                      jnp.sum(mask, dtype=jnp.float32)])
    return grads, sums


def minibatch_grad(
    params: Any, pairs: FragmentPairs, prefs: Array, mask: Array, config: TrainerConfig | None = None,
    hparams: TrainerHParams | None = None, reg_lambda: Any = 0.0,
) -> tuple[Any, dict[str, Array]]:
    """Gradient of one (mini)batch of a single net (the per-batch gradient of :func:`train_step`).

    The differentiated value is ``sum_i mask_i * BCE(p_i, y_i) / batch_size``
    (plus ``reg_lambda * sum |theta|^p`` for the Lp regulariser when the
    minibatch is not empty), so gradients of disjoint shards of a batch add up
    to the full-batch gradient. Invalid pairs (bad data, see the module
    docstring) count as masked out.

    Args:
      params: params of ONE net (vmap over members for ensembles).
      pairs: ``[b, 2, L+1, ...]`` fragment pairs.
      prefs: ``f32[b]`` targets.
      mask: ``bool[b]`` pairs that count.
      config: trainer config (its ``batch_size`` is the denominator).
      hparams: noise / discount / threshold of the Bradley-Terry model.
      reg_lambda: current regularisation strength.

    Returns:
      ``(grads, aux)`` with ``aux`` holding the minibatch's mean ``loss``,
      ``accuracy``, ``gt_reward_loss`` (imitation's logged values), the
      ``regularized_loss`` that was differentiated, ``scaled_loss``,
      ``loss_sum``, ``count``, ``nonempty`` and ``n_invalid``.
    """
    if isinstance(params, TrainerConfig):  # old order (config, hparams, params, pairs, prefs, mask, reg_lambda)
        _old_order("minibatch_grad", "config, hparams, params, pairs, prefs, mask",
                   "params, pairs, prefs, mask, config, hparams")
        old = (params, pairs, prefs, mask, config, hparams)
        config, hparams, params, pairs, prefs, mask = old
    mask = jnp.asarray(mask, bool)
    prefs = jnp.asarray(prefs, jnp.float32)
    ok = _pair_ok(config, pairs, prefs)
    n_invalid = jnp.sum(mask & ~ok, dtype=jnp.int32)
    mask = mask & ok
    cpairs, cprefs = _clean(pairs, prefs, mask)
    grads, sums = _piece(config, hparams, params, cpairs, cprefs, mask)
    n = sums[3]
    nonempty = n > 0
    scaled = sums[0] / config.batch_size
    total = scaled
    if config.reg_kind == "lp":
        pen, pen_grad = jax.value_and_grad(partial(_penalty, config.reg_p))(params)
        lam = jnp.where(nonempty, jnp.asarray(reg_lambda, jnp.float32), 0.0)
        grads = jax.tree.map(lambda g, q: g + lam * q, grads, pen_grad)
        total = total + lam * pen
    safe = jnp.maximum(n, 1.0)
    aux = {"loss": sums[0] / safe, "accuracy": sums[1] / safe, "gt_reward_loss": sums[2] / safe,
           "regularized_loss": total, "scaled_loss": scaled, "loss_sum": sums[0], "count": n,
           "nonempty": nonempty.astype(jnp.float32), "n_invalid": n_invalid}
    return grads, aux


def _varying(tree: Any, axis_name: str | None) -> Any:
    if axis_name is None:
        return tree
    from ..distributed import _varying as varying  # noqa: PLC0415  (shard_map helper)

    return varying(tree, axis_name)


def _psum(x: Any, axis_name: str | None) -> Any:
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def _local_batch(config: TrainerConfig, n_dev: int, axis_name: Any = None) -> int:
    """Rows of each batch one of ``n_dev`` devices holds; checks that minibatches tile the devices."""
    b, mb = config.batch_size, config.minibatch_size
    if b % n_dev:
        raise ValueError(f"batch_size {b} must be a multiple of the {n_dev} devices on mesh axis {axis_name!r}")
    local_b = b // n_dev
    if local_b % mb and mb % local_b:
        raise ValueError(
            f"minibatch_size {mb} and the per-device batch {local_b} (batch_size {b} / {n_dev} devices) "
            "must divide one another"
        )
    return local_b


def _n_dev(axis_name: str | None) -> int:
    return 1 if axis_name is None else int(jax.lax.axis_size(axis_name))


def _member_step(config, hp, axis_name, params, opt_state, lam, pairs, prefs, mask):
    """THE optimiser step of one member on its rows ``[lb, ...]`` of one batch.

    Single device: the rows are the whole batch. With ``axis_name`` device ``d``
    holds rows ``[d * lb, (d + 1) * lb)`` of the global batch; each device
    accumulates the gradients of its pieces of the global minibatches (a piece
    lies inside one minibatch), and per-minibatch counts, gradients and loss
    sums are added over devices with ``lax.psum``. Minibatch ``j`` is evaluated
    at the params decayed once per non-empty minibatch before it (imitation's
    weight-decay regulariser); the Lp penalty gradient is added once per
    non-empty minibatch. No valid pair: params and optimiser state unchanged.
    """
    b, mb = config.batch_size, config.minibatch_size
    k = b // mb
    lb = prefs.shape[0]
    pieces = max(lb // mb, 1)
    piece = lb // pieces
    dev = 0 if axis_name is None else jax.lax.axis_index(axis_name)
    mask = jnp.asarray(mask, bool)
    prefs = jnp.asarray(prefs, jnp.float32)
    ok = _pair_ok(config, pairs, prefs)
    n_invalid = _psum(jnp.sum(mask & ~ok, dtype=jnp.int32), axis_name)
    mask = mask & ok
    pairs, prefs = _clean(pairs, prefs, mask)

    ids = (dev * lb + jnp.arange(pieces) * piece) // mb  # global minibatch of each piece
    one_hot = jax.nn.one_hot(ids, k, dtype=jnp.float32)  # [pieces, k]
    split = lambda x: x.reshape(pieces, piece, *x.shape[1:])  # noqa: E731
    pp, pr, pm = jax.tree.map(split, (pairs, prefs, mask))
    counts = _psum(one_hot.T @ jnp.sum(pm, axis=1, dtype=jnp.float32), axis_name)  # [k]
    nonempty = (counts > 0).astype(jnp.float32)
    n_ne = jnp.sum(nonempty)
    decay = lam * hp.learning_rate
    wd = config.reg_kind == "weight_decay"
    scales = ((1.0 - decay) ** (jnp.cumsum(nonempty) - nonempty))[ids] if wd else jnp.ones((pieces,), jnp.float32)
    local = _varying(params, axis_name)  # per-device gradients, added by the psum below

    def one(acc, xs):
        p_, r_, m_, s_ = xs
        p_now = jax.tree.map(lambda x: x * s_.astype(x.dtype), local) if wd else local
        g, sums = _piece(config, hp, p_now, p_, r_, m_)
        return jax.tree.map(jnp.add, acc, g), sums

    zeros = jax.tree.map(jnp.zeros_like, local)
    if pieces == 1:
        grads, sums = one(zeros, jax.tree.map(lambda x: x[0], (pp, pr, pm, scales)))
        sums = sums[None]
    else:
        grads, sums = jax.lax.scan(one, zeros, (pp, pr, pm, scales))
    grads = _psum(grads, axis_name)
    mb_sums = _psum(sums.T @ one_hot, axis_name)  # [4, k] per-minibatch totals
    pen = jnp.zeros((), jnp.float32)
    if config.reg_kind == "lp":
        pen, pen_grad = jax.value_and_grad(partial(_penalty, config.reg_p))(params)
        grads = jax.tree.map(lambda g, q: g + n_ne * lam * q, grads, pen_grad)
    base = params
    if wd:
        base = jax.tree.map(lambda x: x * ((1.0 - decay) ** n_ne).astype(x.dtype), params)
    updates, new_opt = make_optimizer(hp).update(grads, opt_state, base)
    new_params = optax.apply_updates(base, updates)
    applied = n_ne > 0
    keep = lambda new, old: jax.tree.map(lambda a, o: jnp.where(applied, a, o), new, old)  # noqa: E731
    means = jnp.where(nonempty > 0, mb_sums[:3] / jnp.maximum(mb_sums[3], 1.0), 0.0)  # [3, k]
    loss_sum = jnp.sum(mb_sums[0])
    stats = {
        "loss": jnp.sum(means[0]), "accuracy": jnp.sum(means[1]), "gt_reward_loss": jnp.sum(means[2]),
        "regularized_loss": loss_sum / b + n_ne * lam * pen, "scaled_loss": loss_sum / b,
        "loss_sum": loss_sum, "count": jnp.sum(mb_sums[3]), "minibatches": n_ne,
        "n_invalid": n_invalid, "applied": applied,
    }
    return keep(new_params, params), keep(new_opt, opt_state), stats


def _step_metrics(stats: dict[str, Array]) -> dict[str, Array]:
    n = jnp.maximum(stats["minibatches"], 1.0)
    out = {name: stats[name] / n for name in TRAIN_METRICS}
    out["n_invalid"] = stats["n_invalid"]
    return out


def _gather(buffer_pairs: FragmentPairs, idx: Array) -> FragmentPairs:
    return jax.tree.map(lambda x: x[idx], buffer_pairs)


def train_step(
    state: TrainerState, pairs: FragmentPairs, prefs: Array, config: TrainerConfig | None = None,
    mask: Array | None = None, *, axis_name: str | None = None,
) -> tuple[TrainerState, dict[str, Array]]:
    """One optimiser step on an explicit batch (jittable; ``config`` static).

    Args:
      state: trainer state.
      pairs: ``[B, ...]`` pairs (``[M, B, ...]``: one batch per member for ensembles).
      prefs: ``f32[B]`` (``[M, B]``).
      config: trainer config.
      mask: ``bool[B]`` (``[M, B]``), default all True.
      axis_name: inside ``jax.shard_map`` over this axis, ``pairs`` / ``prefs`` /
        ``mask`` are this device's rows ``B / n_devices`` of the global batch
        (contiguous blocks in device order); gradients and metrics are summed
        over the axis, so every device applies the one-device update.

    Returns:
      ``(state, metrics)``: mean ``loss`` / ``accuracy`` / ``gt_reward_loss`` over
      the step's non-empty minibatches (``f32[]`` or ``f32[M]``) and ``n_invalid``
      (``i32[]`` / ``i32[M]``: masked-in pairs left out for bad data). A batch
      without a valid pair leaves params and optimiser state unchanged.
    """
    if isinstance(state, TrainerConfig):  # old order (config, state, pairs, prefs, mask)
        _old_order("train_step", "config, state, pairs, prefs, mask", "state, pairs, prefs, config, mask")
        state, pairs, prefs, config = pairs, prefs, config, state
    _check_hparams(state.hparams)
    b = _local_batch(config, _n_dev(axis_name), axis_name)
    lead = (config.num_members, b) if config.ensemble else (b,)
    if tuple(np.shape(prefs)) != lead:
        raise ValueError(f"prefs must have shape {lead}, got {tuple(np.shape(prefs))}")
    mask = jnp.ones(lead, bool) if mask is None else jnp.asarray(mask, bool)
    fn = partial(_member_step, config, state.hparams, axis_name)
    params, opt_state, stats = _vm(config, fn)(
        state.params, state.opt_state, state.reg_lambda, pairs, jnp.asarray(prefs, jnp.float32), mask
    )
    steps = state.steps + jnp.any(stats["applied"]).astype(jnp.int32)
    return state.replace(params=params, opt_state=opt_state, steps=steps), _step_metrics(stats)


# -------------------------------------------------------------- data prep
def _masked_permutation(key: Array, n: Array, size: int) -> Array:
    """A permutation of ``range(size)`` whose first ``n`` entries are a uniform permutation of ``range(n)``."""
    u = jax.random.uniform(key, (size,))
    u = jnp.where(jnp.arange(size) < n, u, 2.0)
    return jnp.argsort(u).astype(jnp.int32)


def _val_table(config: TrainerConfig, capacity: int) -> np.ndarray:
    # int(N * val_split) with Python floats, exactly as imitation, for every possible N
    return np.array([int(n * config.val_split) for n in range(capacity + 1)], np.int32)


def _usable(config: TrainerConfig, buffer: PreferenceBuffer) -> tuple[Array, Array]:
    """``(bool[capacity] slots to train on, i32[] filled valid slots left out for bad data)``."""
    filled = buffer_mask(buffer)
    ok = _pair_ok(config, buffer.pairs, buffer.prefs)
    return filled & ok, jnp.sum(filled & ~ok, dtype=jnp.int32)


def prepare_data(key: Any, buffer: PreferenceBuffer, config: TrainerConfig | None = None) -> TrainData:
    """Bootstrap resamples (ensembles) and the validation split for one ``train`` call (jittable).

    The valid stored pairs (``buffer_mask`` minus pairs with bad data) are the
    ``N`` training items. For an ensemble with ``bagging`` each member draws
    ``N`` of them with replacement; with a lambda updater each member's items
    are then split at random into ``N - int(N * val_split)`` training and
    ``int(N * val_split)`` validation pairs (imitation splits every member's
    bootstrap sample).
    """
    if isinstance(key, TrainerConfig):  # old order (config, key, buffer)
        _old_order("prepare_data", "config, key, buffer", "key, buffer, config")
        key, buffer, config = buffer, config, key
    key = as_key(key)
    cap = buffer.capacity
    mask, n_invalid = _usable(config, buffer)
    n = jnp.sum(mask, dtype=jnp.int32)
    base = jnp.argsort(~mask, stable=True).astype(jnp.int32)  # valid slots first, in slot order
    if config.has_updater:
        n_val = jnp.asarray(_val_table(config, cap))[n]
    else:
        n_val = jnp.zeros((), jnp.int32)
    n_train = n - n_val

    def member(k):
        k_bag, k_split = jax.random.split(k)
        if config.ensemble and config.bagging:
            draws = jax.random.randint(k_bag, (cap,), 0, jnp.maximum(n, 1), dtype=jnp.int32)
            items = base[draws]
        else:
            items = base
        if config.has_updater:
            items = items[_masked_permutation(k_split, n, cap)]
            val = jnp.roll(items, -n_train)
        else:
            val = jnp.zeros_like(items)
        return items, val

    keys = jax.random.split(key, config.num_members) if config.ensemble else key
    train_idx, val_idx = _vm(config, member)(keys)
    return TrainData(train_idx=train_idx, n_train=n_train, val_idx=val_idx, n_val=n_val, n_invalid=n_invalid)


# ------------------------------------------------------------------ epochs
def _interval_update(config, hp, lam, train_loss, val_loss):
    eps = jnp.float32(_EPS64)
    up = lam * (1.0 + hp.reg_scaling_factor)
    down = lam * (1.0 - hp.reg_scaling_factor)
    ratio = val_loss / jnp.where(train_loss < eps, 1.0, train_loss)
    scaled = jnp.where(ratio > hp.reg_interval_high, up, jnp.where(ratio < hp.reg_interval_low, down, lam))
    out = jnp.where(train_loss < eps, jnp.where(val_loss < eps, lam, up), scaled)
    return out.astype(jnp.float32)


_SUMS = (*TRAIN_METRICS, "regularized_loss", "minibatches", "scaled_loss", "loss_sum", "count")


def train_epoch(
    state: TrainerState, key: Any, buffer: PreferenceBuffer, data: TrainData, config: TrainerConfig | None = None,
    *, axis_name: str | None = None,
) -> tuple[TrainerState, dict[str, Array]]:
    """One epoch over the prepared data (jittable; ``config`` static).

    Args:
      state: trainer state.
      key: this epoch's key (the permutation; the validation order).
      buffer: the comparisons.
      data: :func:`prepare_data` of this ``train`` call.
      config: trainer config.
      axis_name: inside ``jax.shard_map`` (buffer, state and data replicated):
        every device computes the gradient of its rows of each batch (see
        :func:`train_step`); the result is the one-device result.

    Returns:
      ``(state, metrics)``; metric values are ``f32[]`` (``f32[M]`` for
      ensembles): ``train/loss``, ``train/accuracy``, ``train/gt_reward_loss``,
      ``n_invalid`` (``i32[]``: stored pairs left out for bad data), and with a
      regulariser ``train/regularized_loss`` (Lp), ``regularization_lambda``,
      and with a lambda updater ``val/loss``, ``val/accuracy``, ``val/gt_reward_loss``.
    """
    if isinstance(state, TrainerConfig):  # old order (config, state, key, buffer, data)
        _old_order("train_epoch", "config, state, key, buffer, data", "state, key, buffer, data, config")
        state, key, buffer, data, config = key, buffer, data, config, state
    _check_hparams(state.hparams)
    key = as_key(key)
    cap = buffer.capacity
    b = config.batch_size
    lb = _local_batch(config, _n_dev(axis_name), axis_name)
    dev = 0 if axis_name is None else jax.lax.axis_index(axis_name)
    n_steps = -(-cap // b)
    hp = state.hparams
    k_perm, k_val = jax.random.split(key)
    mkeys = jax.random.split(k_perm, config.num_members) if config.ensemble else k_perm

    def order_items(k, idx):
        items = idx[_masked_permutation(k, data.n_train, cap)]
        return jnp.pad(items, (0, n_steps * b - cap))

    items = _vm(config, order_items)(mkeys, data.train_idx)  # [(M,) S*B]
    shape = (config.num_members,) if config.ensemble else ()
    zero_stats = {name: jnp.zeros(shape, jnp.float32) for name in _SUMS}
    zero_stats["applied"] = jnp.zeros(shape, jnp.int32)

    def active(carry):
        return carry[0] * b < data.n_train

    def step(carry):
        s, params, opt_state, sums = carry
        start = s * b + dev * lb

        def member(p, o, lam, it):
            idx = jax.lax.dynamic_slice_in_dim(it, start, lb)
            mask = start + jnp.arange(lb) < data.n_train
            return _member_step(config, hp, axis_name, p, o, lam, _gather(buffer.pairs, idx), buffer.prefs[idx], mask)

        params, opt_state, st = _vm(config, member)(params, opt_state, state.reg_lambda, items)
        st = {**{name: st[name] for name in _SUMS}, "applied": st["applied"].astype(jnp.int32)}
        return s + 1, params, opt_state, jax.tree.map(jnp.add, sums, st)

    # a while loop over the ceil(N / B) steps with data: steps without data never run
    # (lax.cond inside a scan would copy the buffer operand on every step on CPU)
    _, params, opt_state, sums = jax.lax.while_loop(
        active, step, (jnp.zeros((), jnp.int32), state.params, state.opt_state, zero_stats)
    )
    n_mb = jnp.maximum(sums["minibatches"], 1.0)
    metrics = {f"train/{name}": sums[name] / n_mb for name in TRAIN_METRICS}
    metrics["n_invalid"] = data.n_invalid
    lam = state.reg_lambda
    if config.reg_kind == "lp":
        metrics["train/regularized_loss"] = sums["regularized_loss"] / n_mb
    if config.has_updater:
        val = _validation(config, hp, params, k_val, buffer, data)
        metrics.update({f"val/{name}": val[name] for name in TRAIN_METRICS})
        if config.reg_loss_ratio == "sum":
            tl, vl = sums["scaled_loss"], val["sum_of_means"]
        else:
            tl = sums["loss_sum"] / jnp.maximum(sums["count"], 1.0)
            vl = val["item_mean"]
        enough = (data.n_train >= 1) & (data.n_val >= 1)
        lam = jnp.where(enough, _interval_update(config, hp, lam, tl, vl), lam)
    if config.reg_kind is not None:
        metrics["regularization_lambda"] = lam
    steps = state.steps + jnp.max(sums["applied"])
    return state.replace(params=params, opt_state=opt_state, reg_lambda=lam, steps=steps), metrics


def _validation(config, hp, params, key, buffer, data):
    """Validation losses after an epoch: minibatches of ``minibatch_size`` over the shuffled split."""
    cap = buffer.capacity
    mb = config.minibatch_size
    n_mb = -(-cap // mb)
    mkeys = jax.random.split(key, config.num_members) if config.ensemble else key

    def order_items(k, idx):
        return jnp.pad(idx[_masked_permutation(k, data.n_val, cap)], (0, n_mb * mb - cap))

    items = _vm(config, order_items)(mkeys, data.val_idx)
    shape = (config.num_members,) if config.ensemble else ()
    zeros = {name: jnp.zeros(shape, jnp.float32) for name in (*TRAIN_METRICS, "minibatches", "loss_sum")}

    def active(carry):
        return carry[0] * mb < data.n_val

    def one(carry):
        j, sums = carry
        mask = j * mb + jnp.arange(mb) < data.n_val

        def member(p, it):
            idx = jax.lax.dynamic_slice_in_dim(it, j * mb, mb)
            _, aux = minibatch_grad(p, _gather(buffer.pairs, idx), buffer.prefs[idx], mask, config, hp, 0.0)
            return {**{name: aux[name] for name in TRAIN_METRICS}, "minibatches": aux["nonempty"],
                    "loss_sum": aux["loss_sum"]}

        return j + 1, jax.tree.map(jnp.add, sums, _vm(config, member)(params, items))

    _, sums = jax.lax.while_loop(active, one, (jnp.zeros((), jnp.int32), zeros))
    n = jnp.maximum(sums["minibatches"], 1.0)
    out = {name: sums[name] / n for name in TRAIN_METRICS}
    out["sum_of_means"] = sums["loss"]
    out["item_mean"] = sums["loss_sum"] / jnp.maximum(data.n_val, 1).astype(jnp.float32)
    return out


def _epoch_keys(key: Array) -> tuple[Array, Array]:
    k_prep, k_epochs = jax.random.split(as_key(key))
    return k_prep, k_epochs


def train_epochs(
    state: TrainerState, key: Any, buffer: PreferenceBuffer, config: TrainerConfig | None = None,
    epochs: int | None = None, *, axis_name: str | None = None,
) -> tuple[TrainerState, dict[str, Array]]:
    """A whole ``train`` call as one jittable function, with every epoch's metrics (``epochs`` static).

    Same keys and results as :meth:`RewardTrainer.train` and :func:`train_reward`;
    metric values gain a leading epoch axis: ``f32[E]`` or ``f32[E, M]``.
    Jit it with ``config`` and ``epochs`` static and vmap it over states / keys /
    buffers for many seeds at once.
    """
    if isinstance(state, TrainerConfig):  # old order (config, state, key, buffer, n_epochs)
        _old_order("train_epochs", "config, state, key, buffer, n_epochs", "state, key, buffer, config, epochs")
        state, key, buffer, config, epochs = key, buffer, config, state, epochs
    epochs = check_static_int(epochs, "epochs", 1)
    k_prep, k_epochs = _epoch_keys(key)
    data = prepare_data(k_prep, buffer, config)

    def body(st, e):
        return train_epoch(st, jax.random.fold_in(k_epochs, e), buffer, data, config, axis_name=axis_name)

    return jax.lax.scan(body, state, jnp.arange(epochs, dtype=jnp.int32))


def train_reward(
    state: TrainerState, key: Any, buffer: PreferenceBuffer, config: TrainerConfig, *, epochs: Any = 1,
    axis_name: str | None = None, mesh: Any = None,
) -> tuple[TrainerState, dict[str, Array]]:
    """Train the reward model for ``epochs`` epochs in one compiled loop (the preference loop's call).

    Same keys and results as :func:`train_epochs` / :meth:`RewardTrainer.train`
    (data split and bootstrap from the first half of ``key``, epoch ``e`` from
    ``fold_in(second half, e)``). ``epochs`` may be traced, so round 0
    (``initial_epoch_multiplier`` epochs) and later rounds share one program.

    Args:
      state: trainer state.
      key: key of this training call.
      buffer: the comparisons.
      config: trainer config (static).
      epochs: ``int`` or ``i32[]`` >= 1 (a traced count below 1 trains zero epochs).
      axis_name: inside ``jax.shard_map`` over this axis: data-parallel epochs
        (state, key and buffer replicated; each device computes its rows of every batch).
      mesh: a ``jax.sharding.Mesh``: run the data-parallel version over its
        ``axis_name`` (default ``"data"``) axis; the result is replicated.

    Returns:
      ``(state, metrics)`` with the LAST epoch's metrics (see :func:`train_epoch`).

    Raises:
      ValueError: concrete ``epochs < 1``; a bad hyperparameter (also under
        ``jaxweight.checked``); a batch that does not tile the mesh.
    """
    if mesh is not None:
        from jax.sharding import PartitionSpec as P  # noqa: PLC0415

        axis = axis_name or "data"
        _local_batch(config, int(mesh.shape[axis]), axis)
        fn = jax.shard_map(
            lambda st, k, buf, e: train_reward(st, k, buf, config, epochs=e, axis_name=axis),
            mesh=mesh, in_specs=(P(), P(), P(), P()), out_specs=(P(), P()),
        )
        return fn(state, as_key(key), buffer, jnp.asarray(epochs, jnp.int32))
    if not isinstance(config, TrainerConfig):
        raise ValueError(f"config must be a TrainerConfig (RewardTrainer(...).config), got {type(config).__name__}")
    check_value(epochs, "epochs", ge=1, integer=True)
    k_prep, k_epochs = _epoch_keys(key)
    data = prepare_data(k_prep, buffer, config)
    shapes = jax.eval_shape(lambda: train_epoch(state, k_epochs, buffer, data, config, axis_name=axis_name)[1])
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

    def body(e, carry):
        st, _ = carry
        return train_epoch(st, jax.random.fold_in(k_epochs, e), buffer, data, config, axis_name=axis_name)

    return jax.lax.fori_loop(0, jnp.asarray(epochs, jnp.int32), body, (state, zeros))


# ------------------------------------------------------------ host side
def epoch_metrics_dict(metrics: Sequence[dict[str, Any]], ensemble: bool) -> dict[str, float]:
    """imitation-style flat metric dict from per-epoch metrics (host helper).

    ``reward/epoch-{k}/{name}`` for every epoch, the last epoch again as
    ``reward/final/{name}``; for ensembles every per-member value is the member
    mean and ``{key}_std`` the member std (ddof 0).
    """
    out: dict[str, float] = {}
    host = jax.device_get(list(metrics))
    last = len(host) - 1
    for k, m in enumerate(host):
        for name, v in m.items():
            v = np.asarray(v, np.float64)
            for prefix in (f"reward/epoch-{k}",) + (("reward/final",) if k == last else ()):
                key = f"{prefix}/{name}"
                if ensemble and v.ndim > 0:
                    out[key] = float(v.mean())
                    out[f"{key}_std"] = float(v.std())
                else:
                    out[key] = float(v)
    return out


def metrics_dict(metrics: dict[str, Any], prefix: str = "preference") -> dict[str, float]:
    """Flat ``{"preference/loss": float, "preference/accuracy": ..., "preference/n_invalid": ...}`` (host side).

    Takes the metrics of :func:`train_step`, :func:`train_epoch` or
    :func:`train_reward` (``train/`` is dropped from the names; ``val/...`` and
    ``regularization_lambda`` keep theirs). Per-member and per-epoch values are
    averaged (NaN-aware) into one float, via :func:`jaxweight.metrics.flatten`.
    """
    from .. import metrics as _metrics  # noqa: PLC0415

    host = jax.device_get(dict(metrics))
    flat = {}
    for name, v in host.items():
        name = name[len("train/"):] if name.startswith("train/") else name
        a = np.asarray(v, np.float64)
        fin = a[np.isfinite(a)]
        flat[name] = float(fin.mean()) if a.ndim and fin.size else (float(a.mean()) if a.size else float("nan"))
    return _metrics.flatten(flat, prefix=prefix)


_train_epoch_jit = jax.jit(train_epoch, static_argnums=4)
_prepare_jit = jax.jit(prepare_data, static_argnums=2)


class RewardTrainer:
    """imitation's ``BasicRewardTrainer`` / ``EnsembleTrainer``: a host wrapper over :func:`train_epoch`.

    Args:
      module: reward module (e.g. :class:`RewardMLP`).
      num_members: ``None`` for a single net, else the ensemble size ``M >= 2``.
      batch_size: pairs per optimiser step (default 32).
      minibatch_size: pairs per gradient evaluation; must divide ``batch_size``
        (default ``batch_size``); gradients are accumulated to exactly the full-batch gradient.
      epochs: epochs per ``train`` call (times ``epoch_multiplier``).
      learning_rate, weight_decay, b1, b2, eps: AdamW (torch defaults; lr 1e-3, decay 0.01).
      noise_prob, discount, threshold: the Bradley-Terry model of the loss.
      regularizer: optional :func:`lp_regularizer` / :func:`weight_decay_regularizer`.
      bagging: bootstrap every member's data (ensembles; imitation always does).
      progress: show a tqdm bar for multi-epoch ``train`` calls (off by default).
      callback: optional ``callback(epoch, num_epochs, metrics)`` called on the
        host after every epoch of :meth:`train` (``metrics``: that epoch's arrays).

    The pure pieces (:func:`train_reward`, :func:`train_epoch`, :func:`train_epochs`,
    :func:`train_step`, :func:`minibatch_grad`) take ``trainer.config`` as their
    static last argument.

    Example::

        trainer = RewardTrainer(net, num_members=5)
        state = trainer.init(0, example_inputs)
        state, metrics = trainer.train(state, 1, buffer, epoch_multiplier=200.0)
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        num_members: int | None = None,
        batch_size: int = 32,
        minibatch_size: int | None = None,
        epochs: int = 1,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.01,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        noise_prob: float = 0.0,
        discount: float = 1.0,
        threshold: float = 50.0,
        regularizer: Regularizer | None = None,
        bagging: bool = True,
        progress: bool = False,
        callback: Callable[[int, int, dict[str, Array]], Any] | None = None,
    ):
        self.config = trainer_config(
            module, batch_size=batch_size, minibatch_size=minibatch_size, epochs=epochs,
            num_members=num_members, bagging=bagging, regularizer=regularizer,
        )
        self.hparams = trainer_hparams(
            learning_rate=learning_rate, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps,
            noise_prob=noise_prob, discount=discount, threshold=threshold, regularizer=regularizer,
        )
        self.regularizer = regularizer
        self.progress = bool(progress)
        self.callback = callback

    @property
    def module(self) -> nn.Module:
        return self.config.module

    @property
    def ensemble(self) -> bool:
        return self.config.ensemble

    def init(self, key: Any, example_inputs: Sequence[Any]) -> TrainerState:
        """Initialise the net(s) with ``key`` (one key per member) and a fresh optimiser."""
        key = as_key(key)
        if self.config.ensemble:
            params = ensemble_init(key, self.module, example_inputs, self.config.num_members)
        else:
            params = self.module.init(key, *example_inputs)
        return self.init_from_params(params)

    def init_from_params(self, params: Any) -> TrainerState:
        """Wrap existing params (member-stacked for ensembles) with a fresh optimiser state."""
        lam = 0.0 if self.regularizer is None else self.regularizer.initial_lambda
        return trainer_init(self.config, params, self.hparams, lam)

    def num_epochs(self, epoch_multiplier: float = 1.0) -> int:
        return num_epochs(self.config.epochs, epoch_multiplier)

    def check_data(self, buffer: PreferenceBuffer) -> None:
        """Host check of the validation split (imitation's error) for a concrete buffer."""
        if not self.config.has_updater:
            return
        n = int(jax.device_get(jnp.sum(_usable(self.config, buffer)[0])))
        val = int(n * self.config.val_split)
        if val < 1 or n - val < 1:
            raise ValueError(
                "Not enough data samples to split into training and validation, or the validation split "
                "is too large/small. Make sure you've generated enough initial preference data. You can "
                "adjust this through initial_comparison_frac in PreferenceComparisons."
            )

    def train(
        self, state: TrainerState, key: Any, buffer: PreferenceBuffer, epoch_multiplier: float = 1.0,
        *, progress: bool | None = None,
    ) -> tuple[TrainerState, dict[str, float]]:
        """Train for ``round(epochs * epoch_multiplier)`` epochs on the buffer (host loop over jitted epochs).

        Returns:
          ``(state, metrics)`` with imitation's metric names (see :func:`epoch_metrics_dict`).

        Raises:
          ValueError: "Must train for at least one epoch."; the validation-split error.
        """
        n = self.num_epochs(epoch_multiplier)
        self.check_data(buffer)
        k_prep, k_epochs = _epoch_keys(key)
        data = _prepare_jit(k_prep, buffer, self.config)
        show = (self.progress if progress is None else progress) and n > 1
        bar = None
        if show:
            bar = progress_bar(n, "Training reward model", leave=False)
        history = []
        for e in range(n):
            state, m = _train_epoch_jit(state, jax.random.fold_in(k_epochs, e), buffer, data, self.config)
            history.append(m)
            if bar is not None:
                bar.update(1)
            if self.callback is not None:
                self.callback(e, n, m)
        if bar is not None:
            bar.close()
        return state, epoch_metrics_dict(history, self.config.ensemble)

    def train_epochs(self, state: TrainerState, key: Any, buffer: PreferenceBuffer, n_epochs: int):
        """:func:`train_epochs` with this trainer's config (not jitted; wrap in ``jax.jit`` as needed)."""
        return train_epochs(state, key, buffer, self.config, n_epochs)

    def step(self, state: TrainerState, pairs: FragmentPairs, prefs: Array, mask: Array | None = None):
        """:func:`train_step` with this trainer's config."""
        return train_step(state, pairs, prefs, self.config, mask)
