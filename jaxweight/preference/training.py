"""The reward trainer, pure core (imitation ``BasicRewardTrainer`` / ``EnsembleTrainer``).

One component: :func:`config` (structure and every hyperparameter; continuous
ones are ``f32[]`` leaves, so sweeps vmap and nothing recompiles; it and
:class:`TrainerConfig` live in ``_training_config``, shared with the data splits), :func:`init`,
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

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from .._util import as_key, check_value, varying
from ._training_config import TrainerConfig, _check_traced, _vm, config
from .buffer import PreferenceBuffer
from .data import FragmentPairs, Trajectories, example_inputs
from .model import _preference_probabilities, binary_cross_entropy
from .regularization import interval_update, lp_penalty
from .reward_nets import check_inputs, ensemble_init
from .splits import TrainData, _filled, _masked_permutation, _pair_ok, prepare

Array = jax.Array

__all__ = ["TrainerConfig", "TrainerState", "config", "init", "step", "epoch", "num_epochs", "metrics_dict",
           "TRAIN_METRICS"]

TRAIN_METRICS = ("loss", "accuracy", "gt_reward_loss")


# ------------------------------------------------------------ state
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


def _check_batch(pairs: FragmentPairs, prefs: Any, lead: tuple[int, ...]) -> None:
    """Refuse a batch whose pairs or preferences do not have the step's leading shape ``lead``
    (static shapes only: free under ``jit``)."""
    want = (*lead, 2)
    for name, x, rest in (("rews", pairs.rews, "L"), ("obs", pairs.obs, "L+1, ..."), ("acts", pairs.acts, "L, ...")):
        got = tuple(np.shape(x))
        if got[: len(want)] != want or len(got) <= len(want):
            raise ValueError(f"pairs.{name} must have shape ({', '.join(map(str, want))}, {rest}) "
                             f"(the step's batch of pairs, two fragments each), got {got}")
    if isinstance(prefs, FragmentPairs | Trajectories):
        raise ValueError(f"prefs must be f32{list(lead)} preferences, got a {type(prefs).__name__}")
    if tuple(np.shape(prefs)) != lead:
        raise ValueError(f"prefs must have shape {lead}, got {tuple(np.shape(prefs))}")


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

    Raises:
      ValueError: ``pairs`` not a :class:`FragmentPairs`; ``pairs`` or ``prefs`` without
        the step's batch shape (each named); concrete ``pairs.acts`` / ``pairs.obs``
        (masked in) outside the net's discrete space, naming the index, value and space
        (traced ones are left out and counted).
    """
    if not isinstance(pairs, FragmentPairs):
        got = f"an array of shape {np.shape(pairs)}" if hasattr(pairs, "shape") else type(pairs).__name__
        raise ValueError(f"pairs must be a FragmentPairs (e.g. from fragment_pairs_from_arrays), got {got}")
    check_inputs(cfg.module, pairs.obs, pairs.acts, names=("pairs.obs", "pairs.acts"), where=mask)
    if mesh is not None:
        from jax.sharding import PartitionSpec as P  # noqa: PLC0415

        axis = axis_name or "data"
        b = _local_batch(cfg, int(mesh.shape[axis]), axis) * int(mesh.shape[axis])
        lead = (cfg.num_members, b) if cfg.ensemble else (b,)
        _check_batch(pairs, prefs, lead)
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
    _check_batch(pairs, prefs, lead)
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
        ``jaxweight.checked``); a batch that does not tile the mesh; a concrete
        stored action / observation outside the net's discrete space (naming
        ``buffer.pairs.acts`` / ``buffer.pairs.obs``; traced ones are left out and counted).
    """
    if not isinstance(cfg, TrainerConfig):
        raise ValueError(f"cfg must be a TrainerConfig (training.config(...)), got {type(cfg).__name__}")
    check_inputs(cfg.module, buffer.pairs.obs, buffer.pairs.acts, names=("buffer.pairs.obs", "buffer.pairs.acts"),
                 where=_filled(buffer))
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
