"""The reward trainer, pure core (imitation ``BasicRewardTrainer`` / ``EnsembleTrainer``).

One component: :func:`config` (structure and every hyperparameter; continuous
ones are ``f32[]`` leaves, so sweeps vmap and nothing recompiles), :func:`init`,
:func:`step` (one optimiser step on a batch) and :func:`epoch` (the epoch driver:
shuffle, bootstrap, minibatches, validation; ``epochs`` may be traced), plus
:func:`metrics_dict`. Ensembles and single nets share one path (members are
``vmap``-ed); ``axis_name=`` (inside ``shard_map``) or ``mesh=`` splits every
batch over devices and adds the gradients with ``lax.psum``. Pairs with bad
data (non-finite inputs, preferences outside ``[0, 1]``) are left out and
counted in ``n_invalid``; a batch without a valid pair changes nothing. The
host wrapper with progress and imitation's metric names is
:class:`jaxweight.preference.trainer.RewardTrainer`.

Example::

    import jax, numpy as np
    from jaxweight.preference import Box, Discrete, RewardMLP, buffer, fragment_pairs_from_arrays, training
    pairs = fragment_pairs_from_arrays(np.random.rand(8, 2, 4, 3), np.random.randint(0, 2, (8, 2, 3)))
    bcfg = buffer.config(16)
    buf = buffer.step(buffer.init(bcfg, None, pairs), pairs, np.ones(8, np.float32), bcfg)
    cfg = training.config(RewardMLP(observation_space=Box((3,)), action_space=Discrete(2)), batch_size=4)
    state = training.init(cfg, 0, pairs)
    state, out = jax.jit(training.epoch)(state, jax.random.key(1), buf, cfg, epochs=2)
    assert "preference/loss" in training.metrics_dict(out, cfg)

References:
  imitation ``algorithms/preference_comparisons.py``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from .._util import as_key, check_static_int, check_value, varying
from .buffer import PreferenceBuffer
from .data import FragmentPairs, Trajectories, example_inputs
from .model import _preference_probabilities, binary_cross_entropy
from .regularization import Regularizer, interval_update, lp_penalty
from .reward_nets import ensemble_init
from .splits import TrainData, _masked_permutation, _pair_ok, _vm, prepare

Array = jax.Array

__all__ = ["TrainerConfig", "TrainerState", "config", "init", "step", "epoch", "num_epochs", "metrics_dict",
           "TRAIN_METRICS"]

TRAIN_METRICS = ("loss", "accuracy", "gt_reward_loss")

# name -> accepted range (check_value keywords) of every continuous hyperparameter
_RANGES = {
    "learning_rate": dict(ge=0.0),
    "weight_decay": dict(ge=0.0),
    "b1": dict(ge=0.0, lt=1.0),
    "b2": dict(ge=0.0, lt=1.0),
    "eps": dict(ge=0.0),
    "noise_prob": dict(ge=0.0, le=1.0),
    "discount": dict(ge=0.0, le=1.0),
    "threshold": dict(gt=0.0),
    "initial_lambda": dict(ge=0.0),
    "reg_scaling_factor": dict(ge=0.0, le=1.0),
    "reg_interval_low": dict(ge=0.0),
    "reg_interval_high": dict(ge=0.0),
}


def _known(v: Any) -> bool:
    """A concrete number or array (not a tracer, nor a placeholder of a tree utility)."""
    if isinstance(v, jax.core.Tracer) or isinstance(v, bool):
        return False
    return isinstance(v, int | float | np.ndarray | np.generic | jax.Array)


# ------------------------------------------------------------ config/state
@struct.dataclass
class TrainerConfig:
    """Settings of reward training: static structure and ``f32[]`` hyperparameters. Build with :func:`config`.

    Attributes:
      module: the reward module, ``module.apply(p, state, action, next_state, done)`` (static).
      batch_size, minibatch_size: pairs per optimiser step / per gradient evaluation (static).
      epochs: base number of epochs per host ``train`` call (static).
      num_members: ``None`` for a single net, else ``M >= 2`` (params stacked on axis 0; static).
      bagging: bootstrap-resample the data for every member (ensembles; static).
      reg_kind: ``None``, ``"lp"`` or ``"weight_decay"``; reg_p: Lp exponent; val_split:
        validation fraction (with a lambda updater); reg_loss_ratio: ``"sum"`` or ``"mean"`` (static).
      learning_rate, weight_decay, b1, b2, eps: AdamW (torch semantics, as imitation).
      noise_prob, discount, threshold: the Bradley-Terry model of the loss.
      initial_lambda: starting regularisation strength.
      reg_scaling_factor, reg_interval_low, reg_interval_high: the lambda updater.
    """

    module: nn.Module = struct.field(pytree_node=False)
    batch_size: int = struct.field(pytree_node=False, default=32)
    minibatch_size: int = struct.field(pytree_node=False, default=32)
    epochs: int = struct.field(pytree_node=False, default=1)
    num_members: int | None = struct.field(pytree_node=False, default=None)
    bagging: bool = struct.field(pytree_node=False, default=True)
    reg_kind: str | None = struct.field(pytree_node=False, default=None)
    reg_p: int = struct.field(pytree_node=False, default=2)
    val_split: float | None = struct.field(pytree_node=False, default=None)
    reg_loss_ratio: str = struct.field(pytree_node=False, default="sum")
    learning_rate: Any = 1e-3
    weight_decay: Any = 0.01
    b1: Any = 0.9
    b2: Any = 0.999
    eps: Any = 1e-8
    noise_prob: Any = 0.0
    discount: Any = 1.0
    threshold: Any = 50.0
    initial_lambda: Any = 0.0
    reg_scaling_factor: Any = 0.0
    reg_interval_low: Any = 0.0
    reg_interval_high: Any = 0.0

    def __post_init__(self):
        if not isinstance(self.module, nn.Module):
            raise ValueError(f"module must be a flax.linen Module (e.g. RewardMLP), got {type(self.module).__name__}")
        b = check_static_int(self.batch_size, "batch_size", 1)
        mb = check_static_int(self.minibatch_size, "minibatch_size", 1)
        if mb > b:
            raise ValueError(f"minibatch_size must be <= batch_size ({b}), got {mb}")
        if b % mb != 0:
            raise ValueError("Batch size must be a multiple of minibatch size.")
        check_static_int(self.epochs, "epochs", 1)
        if self.num_members is not None and check_static_int(self.num_members, "num_members", 0) < 2:
            raise ValueError("Must be at least 2 member in the ensemble.")
        if self.reg_kind not in (None, "lp", "weight_decay"):
            raise ValueError(f"reg_kind must be None, 'lp' or 'weight_decay', got {self.reg_kind!r}")
        if self.reg_loss_ratio not in ("sum", "mean"):
            raise ValueError(f"reg_loss_ratio must be 'sum' or 'mean', got {self.reg_loss_ratio!r}")
        for name, rng in _RANGES.items():
            v = getattr(self, name)
            if _known(v):
                check_value(v, name, **rng)

    @property
    def ensemble(self) -> bool:
        return self.num_members is not None

    @property
    def has_updater(self) -> bool:
        return self.val_split is not None


@struct.dataclass
class TrainerState:
    """Everything that changes during reward training.

    Attributes:
      params: reward-net params (leading member axis ``M`` for ensembles).
      opt_state: AdamW state (per member for ensembles).
      reg_lambda: ``f32[]`` (``f32[M]``) current regularisation strength (0 without a regulariser).
      steps: ``i32[]`` optimiser steps taken (steps on a batch without a valid pair do not count).
    """

    params: Any
    opt_state: Any
    reg_lambda: Array
    steps: Array


def config(
    module: nn.Module,
    *,
    batch_size: int = 32,
    minibatch_size: int | None = None,
    epochs: int = 1,
    num_members: int | None = None,
    bagging: bool = True,
    regularizer: Regularizer | None = None,
    learning_rate: Any = 1e-3,
    weight_decay: Any = 0.01,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    noise_prob: Any = 0.0,
    discount: Any = 1.0,
    threshold: Any = 50.0,
) -> TrainerConfig:
    """Validate and build a :class:`TrainerConfig` (defaults: torch AdamW as imitation uses it).

    Raises:
      ValueError: "Batch size must be a multiple of minibatch size."; sizes or
        epochs < 1; ``minibatch_size > batch_size``; ``num_members < 2``; a
        hyperparameter outside its range (``learning_rate``, ``weight_decay``,
        ``eps >= 0``; ``b1``, ``b2`` in ``[0, 1)``; ``noise_prob``, ``discount``
        in ``[0, 1]``; ``threshold > 0``; all finite), naming it and its value.
    """
    batch_size = check_static_int(batch_size, "batch_size", 1)
    minibatch_size = batch_size if minibatch_size is None else check_static_int(minibatch_size, "minibatch_size", 1)
    if regularizer is not None and not isinstance(regularizer, Regularizer):
        raise ValueError(f"regularizer must be a Regularizer (lp_regularizer / weight_decay_regularizer), got {regularizer!r}")
    upd = None if regularizer is None else regularizer.lambda_updater
    values = dict(learning_rate=learning_rate, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps,
                  noise_prob=noise_prob, discount=discount, threshold=threshold)
    for name, v in values.items():
        check_value(v, name, **_RANGES[name])
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    return TrainerConfig(
        module=module, batch_size=batch_size, minibatch_size=minibatch_size, epochs=epochs,
        num_members=num_members, bagging=bool(bagging),
        reg_kind=None if regularizer is None else regularizer.kind,
        reg_p=2 if regularizer is None else int(regularizer.p),
        val_split=None if regularizer is None else regularizer.val_split,
        reg_loss_ratio="sum" if upd is None else upd.loss_ratio,
        **{k: f32(v) for k, v in values.items()},
        initial_lambda=f32(0.0 if regularizer is None else regularizer.initial_lambda),
        reg_scaling_factor=f32(0.0 if upd is None else upd.scaling_factor),
        reg_interval_low=f32(0.0 if upd is None else upd.tolerable_interval[0]),
        reg_interval_high=f32(0.0 if upd is None else upd.tolerable_interval[1]),
    )


def _check_traced(cfg: TrainerConfig) -> None:
    """Traced hyperparameters become ``checkify`` checks (raised by ``jaxweight.checked``); concrete
    ones were checked when the config was built."""
    for name, rng in _RANGES.items():
        v = getattr(cfg, name)
        if isinstance(v, jax.core.Tracer):
            check_value(v, name, **rng)


def _optimizer(cfg: TrainerConfig) -> optax.GradientTransformation:
    """AdamW with torch semantics: ``p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)``."""
    return optax.adamw(learning_rate=cfg.learning_rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                       weight_decay=cfg.weight_decay)


def init(cfg: TrainerConfig, key: Any = None, example: Any = None, *, params: Any = None) -> TrainerState:
    """Fresh net(s) from ``key`` (one key per member) and a fresh optimiser state.

    Args:
      cfg: the trainer config.
      key: key or int seed of the net initialisation.
      example: ``FragmentPairs`` / ``Trajectories`` or a tuple of example reward-net inputs (shapes only).
      params: existing params (member-stacked for ensembles) to use instead of ``key``/``example``.
    """
    if not isinstance(cfg, TrainerConfig):
        raise ValueError(f"cfg must be a TrainerConfig (training.config(...)), got {type(cfg).__name__}")
    if params is None:
        if example is None:
            raise ValueError("init needs example inputs (FragmentPairs, Trajectories or a tuple) or params=")
        inputs = example_inputs(example) if isinstance(example, FragmentPairs | Trajectories) else tuple(example)
        key = as_key(0 if key is None else key)
        if cfg.ensemble:
            params = ensemble_init(key, cfg.module, inputs, cfg.num_members)
        else:
            params = cfg.module.init(key, *inputs)
    shape = (cfg.num_members,) if cfg.ensemble else ()
    lam = jnp.zeros(shape, jnp.float32) + jnp.asarray(cfg.initial_lambda, jnp.float32)  # a new buffer
    return TrainerState(params=params, opt_state=_vm(cfg, _optimizer(cfg).init)(params), reg_lambda=lam,
                        steps=jnp.zeros((), jnp.int32))


def num_epochs(epochs: int, epoch_multiplier: float = 1.0) -> int:
    """``round(epochs * epoch_multiplier)`` (Python round-half-even).

    Raises:
      ValueError: "Must train for at least one epoch." when the result is < 1;
        ``epoch_multiplier`` negative, NaN or traced (it sets a loop count on the host).
    """
    check_value(epoch_multiplier, "epoch_multiplier", ge=0.0, static=True)
    n = round(epochs * float(epoch_multiplier))
    if n < 1:
        raise ValueError("Must train for at least one epoch.")
    return int(n)


# ---------------------------------------------------------------- the math
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


def _loss_terms(cfg: TrainerConfig, params: Any, pairs: FragmentPairs, prefs: Array, mask: Array):
    """THE reward loss of one net: per-pair masked BCE ``f32[b]``, model and ground-truth probabilities."""
    probs, gt = _preference_probabilities(cfg.module, params, pairs, cfg.noise_prob, cfg.discount, cfg.threshold,
                                          False)
    return jnp.where(mask, binary_cross_entropy(probs, prefs), 0.0), probs, gt


def _sums(prefs: Array, mask: Array, li: Array, probs: Array, gt: Array) -> Array:
    """``f32[4]``: loss sum, correct answers, ground-truth loss sum, count of the masked-in pairs."""
    correct = jnp.where(mask, (probs > 0.5) == (prefs > 0.5), False)
    gt_loss = binary_cross_entropy(gt, prefs)
    gt_loss = jnp.where(mask & jnp.isfinite(gt_loss), gt_loss, 0.0)  # NaN ground truth: a metric only
    return jnp.stack([jnp.sum(li), jnp.sum(correct, dtype=jnp.float32), jnp.sum(gt_loss),
                      jnp.sum(mask, dtype=jnp.float32)])


def _piece(cfg: TrainerConfig, params: Any, pairs: FragmentPairs, prefs: Array, mask: Array) -> tuple[Any, Array]:
    """Gradient of ``sum_i mask_i * BCE_i / batch_size`` over some rows of one minibatch (pairs already
    cleaned) and their :func:`_sums`."""

    def loss(p):
        li, probs, gt = _loss_terms(cfg, p, pairs, prefs, mask)
        return jnp.sum(li) / cfg.batch_size, (li, probs, gt)

    grads, aux = jax.grad(loss, has_aux=True)(params)
    return grads, _sums(prefs, mask, *aux)


# ------------------------------------------------------------- one step
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


def _member_step(config, axis_name, params, opt_state, lam, pairs, prefs, mask):
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
    decay = lam * config.learning_rate
    wd = config.reg_kind == "weight_decay"
    scales = ((1.0 - decay) ** (jnp.cumsum(nonempty) - nonempty))[ids] if wd else jnp.ones((pieces,), jnp.float32)
    local = varying(params, axis_name)  # per-device gradients, added by the psum below

    def one(acc, xs):
        p_, r_, m_, s_ = xs
        p_now = jax.tree.map(lambda x: x * s_.astype(x.dtype), local) if wd else local
        g, sums = _piece(config, p_now, p_, r_, m_)
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
        pen, pen_grad = jax.value_and_grad(partial(lp_penalty, p=config.reg_p))(params)
        grads = jax.tree.map(lambda g, q: g + n_ne * lam * q, grads, pen_grad)
    base = params
    if wd:
        base = jax.tree.map(lambda x: x * ((1.0 - decay) ** n_ne).astype(x.dtype), params)
    updates, new_opt = _optimizer(config).update(grads, opt_state, base)
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


def step(
    state: TrainerState, pairs: FragmentPairs, prefs: Array, cfg: TrainerConfig, *, mask: Array | None = None,
    axis_name: str | None = None, mesh: Any = None,
) -> tuple[TrainerState, dict[str, Array]]:
    """One optimiser step on an explicit batch (jittable).

    Gradients of the ``batch_size / minibatch_size`` minibatches are accumulated
    to the full-batch gradient (imitation's scaling), then one AdamW step.

    Args:
      state: trainer state.
      pairs: ``[B, ...]`` pairs (``[M, B, ...]``: one batch per member for ensembles).
      prefs: ``f32[B]`` (``[M, B]``).
      cfg: trainer config.
      mask: ``bool[B]`` (``[M, B]``), default all True.
      axis_name: inside ``jax.shard_map`` over this axis, ``pairs`` / ``prefs`` /
        ``mask`` are this device's rows ``B / n_devices`` of the global batch
        (contiguous blocks in device order); gradients and metrics are summed
        over the axis, so every device applies the one-device update.
      mesh: a ``jax.sharding.Mesh``: split the batch along ``B`` over its
        ``axis_name`` (default ``"data"``) axis and run the above; the result
        is replicated and equals the one-device step.

    Returns:
      ``(state, out)``: mean ``loss`` / ``accuracy`` / ``gt_reward_loss`` over
      the step's non-empty minibatches (``f32[]`` or ``f32[M]``) and ``n_invalid``
      (masked-in pairs left out for bad data).
    """
    if mesh is not None:
        from jax.sharding import PartitionSpec as P  # noqa: PLC0415

        axis = axis_name or "data"
        b = _local_batch(cfg, int(mesh.shape[axis]), axis) * int(mesh.shape[axis])
        lead = (cfg.num_members, b) if cfg.ensemble else (b,)
        if tuple(np.shape(prefs)) != lead:
            raise ValueError(f"prefs must have shape {lead}, got {tuple(np.shape(prefs))}")
        mask = jnp.ones(lead, bool) if mask is None else jnp.asarray(mask, bool)
        rows = P(None, axis) if cfg.ensemble else P(axis)
        fn = jax.shard_map(
            lambda st, p, y, c, m: step(st, p, y, c, mask=m, axis_name=axis),
            mesh=mesh, in_specs=(P(), rows, rows, P(), rows), out_specs=(P(), P()),
        )
        return fn(state, pairs, jnp.asarray(prefs, jnp.float32), cfg, mask)
    _check_traced(cfg)
    b = _local_batch(cfg, _n_dev(axis_name), axis_name)
    lead = (cfg.num_members, b) if cfg.ensemble else (b,)
    if tuple(np.shape(prefs)) != lead:
        raise ValueError(f"prefs must have shape {lead}, got {tuple(np.shape(prefs))}")
    mask = jnp.ones(lead, bool) if mask is None else jnp.asarray(mask, bool)
    fn = partial(_member_step, cfg, axis_name)
    params, opt_state, stats = _vm(cfg, fn)(
        state.params, state.opt_state, state.reg_lambda, pairs, jnp.asarray(prefs, jnp.float32), mask
    )
    steps = state.steps + jnp.any(stats["applied"]).astype(jnp.int32)
    return state.replace(params=params, opt_state=opt_state, steps=steps), _step_metrics(stats)


# ------------------------------------------------------------------ epochs
_SUMS = (*TRAIN_METRICS, "regularized_loss", "minibatches", "scaled_loss", "loss_sum", "count")


def _one_epoch(
    state: TrainerState, key: Any, buffer: PreferenceBuffer, data: TrainData, config: TrainerConfig,
    axis_name: str | None,
) -> tuple[TrainerState, dict[str, Array]]:
    """One epoch over the prepared data; metrics as :func:`epoch`."""
    key = as_key(key)
    cap = buffer.capacity
    b = config.batch_size
    lb = _local_batch(config, _n_dev(axis_name), axis_name)
    dev = 0 if axis_name is None else jax.lax.axis_index(axis_name)
    n_steps = -(-cap // b)
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
            return _member_step(config, axis_name, p, o, lam, _gather(buffer.pairs, idx), buffer.prefs[idx], mask)

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
        val = _validation(config, params, k_val, buffer, data)
        metrics.update({f"val/{name}": val[name] for name in TRAIN_METRICS})
        if config.reg_loss_ratio == "sum":
            tl, vl = sums["scaled_loss"], val["sum_of_means"]
        else:
            tl = sums["loss_sum"] / jnp.maximum(sums["count"], 1.0)
            vl = val["item_mean"]
        enough = (data.n_train >= 1) & (data.n_val >= 1)
        lam = jnp.where(enough, interval_update(lam, tl, vl, config.reg_scaling_factor, config.reg_interval_low,
                                                          config.reg_interval_high), lam)
    if config.reg_kind is not None:
        metrics["regularization_lambda"] = lam
    steps = state.steps + jnp.max(sums["applied"])
    return state.replace(params=params, opt_state=opt_state, reg_lambda=lam, steps=steps), metrics


_one_epoch_jit = jax.jit(_one_epoch, static_argnums=(5,))


def _validation(config, params, key, buffer, data):
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
            pairs, prefs = _clean(_gather(buffer.pairs, idx), jnp.asarray(buffer.prefs[idx], jnp.float32), mask)
            s = _sums(prefs, mask, *_loss_terms(config, p, pairs, prefs, mask))
            safe = jnp.maximum(s[3], 1.0)
            return {"loss": s[0] / safe, "accuracy": s[1] / safe, "gt_reward_loss": s[2] / safe,
                    "minibatches": (s[3] > 0).astype(jnp.float32), "loss_sum": s[0]}

        return j + 1, jax.tree.map(jnp.add, sums, _vm(config, member)(params, items))

    _, sums = jax.lax.while_loop(active, one, (jnp.zeros((), jnp.int32), zeros))
    n = jnp.maximum(sums["minibatches"], 1.0)
    out = {name: sums[name] / n for name in TRAIN_METRICS}
    out["sum_of_means"] = sums["loss"]
    out["item_mean"] = sums["loss_sum"] / jnp.maximum(data.n_val, 1).astype(jnp.float32)
    return out


def epoch(
    state: TrainerState, key: Any, buffer: PreferenceBuffer, cfg: TrainerConfig, *, epochs: Any = 1,
    start: Any = 0, axis_name: str | None = None, mesh: Any = None,
) -> tuple[TrainerState, dict[str, Array]]:
    """THE epoch driver: epochs ``start .. start + epochs - 1`` of one training call (jittable).

    The data (bootstrap per member, validation split) come from the first half
    of ``key``, epoch ``e`` shuffles with ``fold_in(second half, e)``; so
    ``epochs=n`` in one call equals ``n`` calls with ``epochs=1, start=e`` (what
    the host :class:`~jaxweight.preference.trainer.RewardTrainer` does for its
    per-epoch metrics). ``epochs`` and ``start`` may be traced (one program
    for every round of the preference loop).

    Args:
      state: trainer state.
      key: key of this training call.
      buffer: the comparisons.
      cfg: trainer config.
      epochs: ``int`` or ``i32[]`` >= 1 (a traced count below 1 trains zero epochs).
      start: index of the first epoch (its shuffling key).
      axis_name: inside ``jax.shard_map`` over this axis (state, key and buffer
        replicated): every device computes the gradient of its rows of every batch.
      mesh: a ``jax.sharding.Mesh``: run the data-parallel version over its
        ``axis_name`` (default ``"data"``) axis; the result is replicated.

    Returns:
      ``(state, out)`` with the last epoch's metrics, ``f32[]`` (``f32[M]`` for
      ensembles): ``train/loss``, ``train/accuracy``, ``train/gt_reward_loss``,
      ``n_invalid`` (stored pairs left out for bad data), and with a regulariser
      ``train/regularized_loss`` (Lp), ``regularization_lambda``, with a lambda
      updater ``val/loss``, ``val/accuracy``, ``val/gt_reward_loss``.

    Raises:
      ValueError: concrete ``epochs < 1``; a bad hyperparameter (also under
        ``jaxweight.checked``); a batch that does not tile the mesh.
    """
    if not isinstance(cfg, TrainerConfig):
        raise ValueError(f"cfg must be a TrainerConfig (training.config(...)), got {type(cfg).__name__}")
    if mesh is not None:
        from jax.sharding import PartitionSpec as P  # noqa: PLC0415

        axis = axis_name or "data"
        _local_batch(cfg, int(mesh.shape[axis]), axis)
        fn = jax.shard_map(
            lambda st, k, buf, c, e, s: epoch(st, k, buf, c, epochs=e, start=s, axis_name=axis),
            mesh=mesh, in_specs=(P(),) * 6, out_specs=(P(), P()),
        )
        return fn(state, as_key(key), buffer, cfg, jnp.asarray(epochs, jnp.int32), jnp.asarray(start, jnp.int32))
    check_value(epochs, "epochs", ge=1, integer=True)
    _check_traced(cfg)
    k_prep, k_epochs = jax.random.split(as_key(key))
    data = prepare(k_prep, buffer, cfg)
    # _one_epoch is jitted so the shapes' trace is reused by the loop body (traced once, not twice)
    shapes = jax.eval_shape(lambda: _one_epoch_jit(state, k_epochs, buffer, data, cfg, axis_name)[1])
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

    def body(e, carry):
        return _one_epoch_jit(carry[0], jax.random.fold_in(k_epochs, e), buffer, data, cfg, axis_name)

    first = jnp.asarray(start, jnp.int32)
    return jax.lax.fori_loop(first, first + jnp.asarray(epochs, jnp.int32), body, (state, zeros))


def metrics_dict(out: dict[str, Any], cfg: TrainerConfig | None = None, *,
                 prefix: str = "preference") -> dict[str, float]:
    """Flat ``{"preference/loss": float, "preference/accuracy": ..., "preference/n_invalid": ...}`` (host side).

    Takes the ``out`` of :func:`step` or :func:`epoch` (``train/`` is dropped from
    the names; ``val/...`` and ``regularization_lambda`` keep theirs). Per-member
    and per-seed values are averaged (NaN-aware) into one float.
    """
    from .. import metrics as _metrics  # noqa: PLC0415

    host = jax.device_get(dict(out))
    flat = {}
    for name, v in host.items():
        name = name[len("train/"):] if name.startswith("train/") else name
        a = np.asarray(v, np.float64)
        fin = a[np.isfinite(a)]
        flat[name] = float(fin.mean()) if a.ndim and fin.size else (float(a.mean()) if a.size else float("nan"))
    return _metrics.flatten(flat, prefix=prefix)
