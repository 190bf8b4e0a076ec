"""The reward trainer's settings: :class:`TrainerConfig` and :func:`config` (every check runs here).

Static structure (module, batch sizes, ensemble size, regulariser kind) and
``f32[]`` hyperparameters (AdamW, the Bradley-Terry loss, the lambda updater),
so sweeps vmap and nothing recompiles. Shared by the pure trainer
(:mod:`jaxweight.preference.training`, which exports both names), its data
splits (:mod:`jaxweight.preference.splits`), the host wrapper and the loop.

Example::

    from jaxweight.preference import Box, Discrete, RewardMLP, training
    cfg = training.config(RewardMLP(observation_space=Box((3,)), action_space=Discrete(2)), num_members=3)
    assert cfg.ensemble and cfg.minibatch_size == cfg.batch_size == 32
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import check_static_int, check_value
from .regularization import Regularizer

__all__ = ["TrainerConfig", "config"]

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


def _vm(config: TrainerConfig, fn: Any, in_axes: Any = 0) -> Any:
    """THE ensemble branch: ``fn`` of one member, vmapped over the leading member axis for ensembles."""
    return jax.vmap(fn, in_axes=in_axes) if config.ensemble else fn
