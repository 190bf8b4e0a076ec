"""Reward-model training on a preference buffer (imitation ``BasicRewardTrainer`` / ``EnsembleTrainer``).

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
  and for ensembles the member mean plus ``<name>_std`` (ddof 0).

Design. ``N`` is traced: the epoch is a ``lax.scan`` over the static maximum
number of steps ``ceil(capacity / batch_size)``; a step without data is
skipped by ``lax.cond`` on a predicate shared by all members, so its params
and optimiser state stay bit-identical (and it costs nothing unless the whole
thing is itself vmapped over, e.g., seeds, where ``cond`` becomes a select).
Everything continuous (learning rate, AdamW betas/eps/decay, noise,
discount, clipping threshold, regulariser constants) lives in
:class:`TrainerHParams` inside the :class:`TrainerState`, so new values never
recompile and states can be vmapped over hyperparameters or seeds.

The per-batch gradient is :func:`minibatch_grad`: the gradient of
``sum_i mask_i * loss_i / batch_size`` (plus the Lp penalty). Because it is a
sum over pairs divided by the *global* batch size, a data-parallel trainer
shards the batch over devices, calls it per shard and adds the shard
gradients with ``lax.psum`` (or lets ``jit`` with sharded inputs do the
reduction); the Lp penalty gradient must then be added once, not per shard.

Example::

    net = RewardMLP(observation_space=Box((4,)), action_space=Discrete(2))
    trainer = RewardTrainer(net, num_members=5, batch_size=32)
    state = trainer.init(0, example_inputs)
    state, metrics = trainer.train(state, key, buffer, epoch_multiplier=1.0)
    metrics["reward/final/train/loss"], metrics["reward/final/train/loss_std"]

References:
  imitation ``algorithms/preference_comparisons.py`` and ``regularization/``;
  Loshchilov & Hutter (2019), "Decoupled weight decay regularization".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from tqdm import tqdm

from .._util import as_key, check_static_int
from .buffer import PreferenceBuffer, buffer_mask
from .data import FragmentPairs
from .model import binary_cross_entropy, preference_probabilities
from .reward_nets import ensemble_init

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
    "epoch_metrics_dict",
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
        if not (_EPS64 < self.scaling_factor < 1 - _EPS64):
            raise ValueError("scaling_factor must be in (0, 1) within machine precision.")
        if len(self.tolerable_interval) != 2:
            raise ValueError("tolerable_interval must be a tuple of length 2")
        lo, hi = self.tolerable_interval
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
      initial_lambda: starting strength.
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
        if self.lambda_updater is None and np.allclose(self.initial_lambda, 0.0):
            raise ValueError(
                "If you do not pass a regularizer parameter updater your regularization strength must be "
                "non-zero, as this would result in no regularization."
            )
        vs = self.val_split
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
    return Regularizer("lp", float(initial_lambda), p, lambda_updater, val_split)


def weight_decay_regularizer(
    initial_lambda: float, *, lambda_updater: IntervalParamScaler | None = None, val_split: float | None = None
) -> Regularizer:
    """imitation ``WeightDecayRegularizer``: ``theta -= lam * lr * theta`` after every minibatch."""
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
      steps: ``i32[]`` optimiser steps taken so far.
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
    """

    train_idx: Array
    n_train: Array
    val_idx: Array
    n_val: Array


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
      ValueError: "Batch size must be a multiple of minibatch size."; non-positive
        sizes or epochs; ``num_members < 2``.
    """
    batch_size = check_static_int(batch_size, "batch_size", 1)
    minibatch_size = batch_size if minibatch_size is None else check_static_int(minibatch_size, "minibatch_size", 1)
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
    """Build :class:`TrainerHParams` (defaults: torch AdamW as used by imitation)."""
    upd = None if regularizer is None else regularizer.lambda_updater
    f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    return TrainerHParams(
        learning_rate=f(learning_rate), weight_decay=f(weight_decay), b1=f(b1), b2=f(b2), eps=f(eps),
        noise_prob=f(noise_prob), discount=f(discount), threshold=f(threshold),
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


def trainer_init(config: TrainerConfig, params: Any, hparams: TrainerHParams, initial_lambda: float = 0.0) -> TrainerState:
    """Fresh optimiser state for ``params`` (per member for ensembles)."""
    opt = make_optimizer(hparams)
    if config.ensemble:
        opt_state = jax.vmap(opt.init)(params)
        lam = jnp.full((config.num_members,), initial_lambda, jnp.float32)
    else:
        opt_state = opt.init(params)
        lam = jnp.asarray(initial_lambda, jnp.float32)
    return TrainerState(params=params, opt_state=opt_state, reg_lambda=lam, hparams=hparams,
                        steps=jnp.zeros((), jnp.int32))


def num_epochs(epochs: int, epoch_multiplier: float = 1.0) -> int:
    """``round(epochs * epoch_multiplier)`` (Python round-half-even).

    Raises:
      ValueError: "Must train for at least one epoch." when the result is < 1.
    """
    n = round(epochs * float(epoch_multiplier))
    if n < 1:
        raise ValueError("Must train for at least one epoch.")
    return int(n)


# ---------------------------------------------------------------- the math
def _penalty(config: TrainerConfig, params: Any) -> Array:
    p = config.reg_p
    leaves = jax.tree.leaves(params)
    if p == 2:
        return sum(jnp.sum(jnp.square(x)) for x in leaves)
    return sum(jnp.sum(jnp.abs(x) ** p) for x in leaves)


def _masked_pairs(pairs: FragmentPairs, mask: Array) -> FragmentPairs:
    """Zero the data of masked-out pairs so that nothing non-finite in them (empty or invalid
    slots) can reach the gradient through ``0 * nan``."""

    def clean(x):
        m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
        return jnp.where(m, x, jnp.zeros((), x.dtype))

    return jax.tree.map(clean, pairs)


def _minibatch_loss(config, hp, params, pairs, prefs, mask, lam):
    pairs = _masked_pairs(pairs, mask)
    prefs = jnp.where(mask, prefs, 0.5)
    probs, gt = preference_probabilities(
        config.module, params, pairs, noise_prob=hp.noise_prob, discount=hp.discount, threshold=hp.threshold
    )
    zero = jnp.zeros((), jnp.float32)
    li = jnp.where(mask, binary_cross_entropy(probs, prefs), zero)
    n = jnp.sum(mask, dtype=jnp.float32)
    scaled = jnp.sum(li) / config.batch_size
    nonempty = n > 0
    total = scaled
    if config.reg_kind == "lp":
        total = total + jnp.where(nonempty, lam * _penalty(config, params), 0.0)
    safe_n = jnp.maximum(n, 1.0)
    correct = jnp.where(mask, (probs > 0.5) == (prefs > 0.5), False).astype(jnp.float32)
    aux = {
        "loss": jnp.sum(li) / safe_n,
        "accuracy": jnp.sum(correct) / safe_n,
        "gt_reward_loss": jnp.sum(jnp.where(mask, binary_cross_entropy(gt, prefs), zero)) / safe_n,
        "regularized_loss": total,
        "scaled_loss": scaled,
        "loss_sum": jnp.sum(li),
        "count": n,
        "nonempty": nonempty.astype(jnp.float32),
    }
    return total, aux


def minibatch_grad(
    config: TrainerConfig, hparams: TrainerHParams, params: Any, pairs: FragmentPairs, prefs: Array, mask: Array,
    reg_lambda: Any = 0.0,
) -> tuple[Any, dict[str, Array]]:
    """Gradient of one (mini)batch of a single net (the per-batch gradient function).

    The differentiated value is ``sum_i mask_i * BCE(p_i, y_i) / batch_size``
    (plus ``reg_lambda * sum |theta|^p`` for the Lp regulariser when the
    minibatch is not empty), so gradients of disjoint shards of a batch add up
    to the full-batch gradient: a data-parallel step computes this per device
    and sums with ``lax.psum`` (adding the penalty gradient once).

    Args:
      config: trainer config (its ``batch_size`` is the denominator).
      hparams: noise / discount / threshold of the Bradley-Terry model.
      params: params of ONE net (vmap over members for ensembles).
      pairs: ``[b, 2, L+1, ...]`` fragment pairs.
      prefs: ``f32[b]`` targets.
      mask: ``bool[b]`` pairs that count.
      reg_lambda: current regularisation strength.

    Returns:
      ``(grads, aux)`` with ``aux`` holding the minibatch's mean ``loss``,
      ``accuracy``, ``gt_reward_loss`` (imitation's logged values), the
      ``regularized_loss`` that was differentiated, ``scaled_loss``,
      ``loss_sum``, ``count`` and ``nonempty``.
    """
    grad_fn = jax.grad(lambda p: _minibatch_loss(config, hparams, p, pairs, prefs, mask, reg_lambda), has_aux=True)
    return grad_fn(params)


def _member_step(config, hp, params, opt_state, lam, pairs, prefs, mask):
    """One optimiser step of one member on a gathered batch ``[B, ...]`` (accumulating minibatches)."""
    k = config.batch_size // config.minibatch_size
    lr = hp.learning_rate

    def one(carry, mb):
        params_now, acc = carry
        mb_pairs, mb_prefs, mb_mask = mb
        g, aux = minibatch_grad(config, hp, params_now, mb_pairs, mb_prefs, mb_mask, lam)
        acc = jax.tree.map(jnp.add, acc, g)
        if config.reg_kind == "weight_decay":
            # imitation decays the weights in place right after each minibatch's backward pass
            decay = jnp.where(aux["nonempty"] > 0, lam * lr, 0.0)
            params_now = jax.tree.map(lambda x: x - decay * x, params_now)
        return (params_now, acc), aux

    zeros = jax.tree.map(jnp.zeros_like, params)
    if k == 1:
        (params, grads), aux = one((params, zeros), (pairs, prefs, mask))
        stats = jax.tree.map(lambda a: a[None], aux)
    else:
        split = lambda x: x.reshape(k, config.minibatch_size, *x.shape[1:])  # noqa: E731
        (params, grads), stats = jax.lax.scan(one, (params, zeros), jax.tree.map(split, (pairs, prefs, mask)))
    updates, opt_state = make_optimizer(hp).update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, _reduce_step_stats(stats)


def _reduce_step_stats(stats):
    """Sums over the step's minibatches; only non-empty minibatches count (as imitation logs them)."""
    ne = stats["nonempty"]
    out = {name: jnp.sum(stats[name] * ne) for name in (*TRAIN_METRICS, "regularized_loss")}
    out["minibatches"] = jnp.sum(ne)
    out["scaled_loss"] = jnp.sum(stats["scaled_loss"])
    out["loss_sum"] = jnp.sum(stats["loss_sum"])
    out["count"] = jnp.sum(stats["count"])
    return out


def _vm(config: TrainerConfig, fn, in_axes=0):
    return jax.vmap(fn, in_axes=in_axes) if config.ensemble else fn


def _gather(buffer_pairs: FragmentPairs, idx: Array) -> FragmentPairs:
    return jax.tree.map(lambda x: x[idx], buffer_pairs)


def train_step(
    config: TrainerConfig, state: TrainerState, pairs: FragmentPairs, prefs: Array, mask: Array | None = None
) -> tuple[TrainerState, dict[str, Array]]:
    """One optimiser step on an explicit batch (jittable).

    Args:
      config: trainer config.
      state: trainer state.
      pairs: ``[B, ...]`` pairs (``[M, B, ...]``: one batch per member for ensembles).
      prefs: ``f32[B]`` (``[M, B]``).
      mask: ``bool[B]`` (``[M, B]``), default all True. A fully masked batch
        still takes an AdamW step with zero gradient (the epoch loop skips those).

    Returns:
      ``(state, metrics)``: mean ``loss`` / ``accuracy`` / ``gt_reward_loss`` over
      the step's non-empty minibatches (``f32[]`` or ``f32[M]``).
    """
    b = config.batch_size
    lead = (config.num_members, b) if config.ensemble else (b,)
    if tuple(np.shape(prefs)) != lead:
        raise ValueError(f"prefs must have shape {lead}, got {tuple(np.shape(prefs))}")
    mask = jnp.ones(lead, bool) if mask is None else jnp.asarray(mask, bool)
    fn = partial(_member_step, config, state.hparams)
    params, opt_state, stats = _vm(config, fn, in_axes=(0, 0, 0, 0, 0, 0))(
        state.params, state.opt_state, state.reg_lambda, pairs, jnp.asarray(prefs, jnp.float32), mask
    )
    n = jnp.maximum(stats["minibatches"], 1.0)
    metrics = {name: stats[name] / n for name in TRAIN_METRICS}
    return state.replace(params=params, opt_state=opt_state, steps=state.steps + 1), metrics


# -------------------------------------------------------------- data prep
def _masked_permutation(key: Array, n: Array, size: int) -> Array:
    """A permutation of ``range(size)`` whose first ``n`` entries are a uniform permutation of ``range(n)``."""
    u = jax.random.uniform(key, (size,))
    u = jnp.where(jnp.arange(size) < n, u, 2.0)
    return jnp.argsort(u).astype(jnp.int32)


def _val_table(config: TrainerConfig, capacity: int) -> np.ndarray:
    # int(N * val_split) with Python floats, exactly as imitation, for every possible N
    return np.array([int(n * config.val_split) for n in range(capacity + 1)], np.int32)


def prepare_data(config: TrainerConfig, key: Any, buffer: PreferenceBuffer) -> TrainData:
    """Bootstrap resamples (ensembles) and the validation split for one ``train`` call (jittable).

    The valid stored pairs (``buffer_mask``) are the ``N`` training items. For
    an ensemble with ``bagging`` each member draws ``N`` of them with
    replacement; with a lambda updater each member's items are then split at
    random into ``N - int(N * val_split)`` training and ``int(N * val_split)``
    validation pairs (imitation splits every member's bootstrap sample).
    """
    key = as_key(key)
    cap = buffer.capacity
    mask = buffer_mask(buffer)
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

    if config.ensemble:
        train_idx, val_idx = jax.vmap(member)(jax.random.split(key, config.num_members))
    else:
        train_idx, val_idx = member(key)
    return TrainData(train_idx=train_idx, n_train=n_train, val_idx=val_idx, n_val=n_val)


# ------------------------------------------------------------------ epochs
def _interval_update(config, hp, lam, train_loss, val_loss):
    eps = jnp.float32(_EPS64)
    up = lam * (1.0 + hp.reg_scaling_factor)
    down = lam * (1.0 - hp.reg_scaling_factor)
    ratio = val_loss / jnp.where(train_loss < eps, 1.0, train_loss)
    scaled = jnp.where(ratio > hp.reg_interval_high, up, jnp.where(ratio < hp.reg_interval_low, down, lam))
    out = jnp.where(train_loss < eps, jnp.where(val_loss < eps, lam, up), scaled)
    return out.astype(jnp.float32)


def train_epoch(
    config: TrainerConfig, state: TrainerState, key: Any, buffer: PreferenceBuffer, data: TrainData
) -> tuple[TrainerState, dict[str, Array]]:
    """One epoch over the prepared data (jittable; ``config`` static).

    Returns:
      ``(state, metrics)``; metric values are ``f32[]`` (``f32[M]`` for
      ensembles): ``train/loss``, ``train/accuracy``, ``train/gt_reward_loss``,
      and with a regulariser ``train/regularized_loss`` (Lp),
      ``regularization_lambda``, and with a lambda updater ``val/loss``,
      ``val/accuracy``, ``val/gt_reward_loss``.
    """
    key = as_key(key)
    cap = buffer.capacity
    b, mb = config.batch_size, config.minibatch_size
    n_steps = -(-cap // b)
    hp = state.hparams
    k_perm, k_val = jax.random.split(key)
    mkeys = jax.random.split(k_perm, config.num_members) if config.ensemble else k_perm

    def order_items(k, idx):
        items = idx[_masked_permutation(k, data.n_train, cap)]
        return jnp.pad(items, (0, n_steps * b - cap))

    items = _vm(config, order_items)(mkeys, data.train_idx)  # [(M,) S*B]
    zero_stats = {name: jnp.zeros((config.num_members,) if config.ensemble else (), jnp.float32)
                  for name in (*TRAIN_METRICS, "regularized_loss", "minibatches", "scaled_loss", "loss_sum", "count")}

    def active(carry):
        return carry[0] * b < data.n_train

    def step(carry):
        s, params, opt_state, sums = carry

        def member(p, o, lam, it):
            idx = jax.lax.dynamic_slice_in_dim(it, s * b, b)
            mask = s * b + jnp.arange(b) < data.n_train
            return _member_step(config, hp, p, o, lam, _gather(buffer.pairs, idx), buffer.prefs[idx], mask)

        params, opt_state, st = _vm(config, member)(params, opt_state, state.reg_lambda, items)
        return s + 1, params, opt_state, jax.tree.map(jnp.add, sums, st)

    # a while loop over the ceil(N / B) steps with data: steps without data never run
    # (lax.cond inside a scan would copy the buffer operand on every step on CPU)
    _, params, opt_state, sums = jax.lax.while_loop(
        active, step, (jnp.zeros((), jnp.int32), state.params, state.opt_state, zero_stats)
    )
    n_mb = jnp.maximum(sums["minibatches"], 1.0)
    metrics = {f"train/{name}": sums[name] / n_mb for name in TRAIN_METRICS}
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
    steps = state.steps + (data.n_train + b - 1) // b
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
            _, aux = _minibatch_loss(config, hp, p, _gather(buffer.pairs, idx), buffer.prefs[idx], mask, 0.0)
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
    config: TrainerConfig, state: TrainerState, key: Any, buffer: PreferenceBuffer, n_epochs: int
) -> tuple[TrainerState, dict[str, Array]]:
    """A whole ``train`` call as one jittable function (``n_epochs`` static).

    Same keys and results as :meth:`RewardTrainer.train` (which runs the epochs
    one by one to drive its progress bar); metric values gain a leading epoch
    axis: ``f32[E]`` or ``f32[E, M]``. Jit it with ``static_argnums=(0, 4)``
    and vmap it over states / keys / buffers for many seeds at once.
    """
    n_epochs = check_static_int(n_epochs, "n_epochs", 1)
    k_prep, k_epochs = _epoch_keys(key)
    data = prepare_data(config, k_prep, buffer)

    def body(st, e):
        return train_epoch(config, st, jax.random.fold_in(k_epochs, e), buffer, data)

    return jax.lax.scan(body, state, jnp.arange(n_epochs, dtype=jnp.int32))


# ------------------------------------------------------------ host wrapper
def epoch_metrics_dict(metrics: Sequence[dict[str, Any]], ensemble: bool) -> dict[str, float]:
    """imitation-style flat metric dict from per-epoch metrics (host helper).

    ``reward/epoch-{k}/{name}`` for every epoch, the last epoch again as
    ``reward/final/{name}``; for ensembles every value is the member mean and
    ``{key}_std`` the member std (ddof 0).
    """
    out: dict[str, float] = {}
    host = jax.device_get(list(metrics))
    last = len(host) - 1
    for k, m in enumerate(host):
        for name, v in m.items():
            v = np.asarray(v, np.float64)
            for prefix in (f"reward/epoch-{k}",) + (("reward/final",) if k == last else ()):
                key = f"{prefix}/{name}"
                if ensemble:
                    out[key] = float(v.mean())
                    out[f"{key}_std"] = float(v.std())
                else:
                    out[key] = float(v)
    return out


_train_epoch_jit = jax.jit(train_epoch, static_argnums=0)
_prepare_jit = jax.jit(prepare_data, static_argnums=0)


class RewardTrainer:
    """imitation's ``BasicRewardTrainer`` / ``EnsembleTrainer`` with an explicit-key, pure core.

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
      progress: show a tqdm bar for multi-epoch ``train`` calls.

    The pure pieces (:func:`train_epoch`, :func:`train_epochs`, :func:`train_step`,
    :func:`minibatch_grad`) take ``trainer.config`` as their static first argument.

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
        progress: bool = True,
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
        n = int(jax.device_get(jnp.sum(buffer_mask(buffer))))
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
        data = _prepare_jit(self.config, k_prep, buffer)
        show = (self.progress if progress is None else progress) and n > 1
        history = []
        for e in tqdm(range(n), desc="Training reward model", disable=not show, leave=False):
            state, m = _train_epoch_jit(self.config, state, jax.random.fold_in(k_epochs, e), buffer, data)
            history.append(m)
        return state, epoch_metrics_dict(history, self.config.ensemble)

    def train_epochs(self, state: TrainerState, key: Any, buffer: PreferenceBuffer, n_epochs: int):
        """:func:`train_epochs` with this trainer's config (not jitted; wrap in ``jax.jit`` as needed)."""
        return train_epochs(self.config, state, key, buffer, n_epochs)

    def step(self, state: TrainerState, pairs: FragmentPairs, prefs: Array, mask: Array | None = None):
        """:func:`train_step` with this trainer's config."""
        return train_step(self.config, state, pairs, prefs, mask)
