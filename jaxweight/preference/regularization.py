"""Regularisers of reward training (imitation ``regularization``): Lp, weight decay, the lambda scaler.

A :class:`Regularizer` is a setting of :func:`jaxweight.preference.training.config`;
the math it needs (:func:`lp_penalty`, :func:`interval_update`) is here.

Example::

    from jaxweight.preference.regularization import IntervalParamScaler, lp_regularizer
    reg = lp_regularizer(0.0, p=2, lambda_updater=IntervalParamScaler(0.1, (0.9, 1.1)), val_split=0.2)
    assert reg.kind == "lp" and reg.val_split == 0.2

References:
  imitation ``regularization/``; Loshchilov & Hutter (2019), "Decoupled weight decay regularization".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._util import check_value

Array = jax.Array

__all__ = ["IntervalParamScaler", "Regularizer", "lp_regularizer", "weight_decay_regularizer", "lp_penalty",
           "interval_update"]

_EPS64 = float(np.finfo(float).eps)


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


def lp_penalty(params: Any, p: int = 2) -> Array:
    """``sum_theta |theta|^p`` over every leaf (the Lp regulariser's penalty before ``lam``)."""
    leaves = jax.tree.leaves(params)
    if p == 2:
        return sum(jnp.sum(jnp.square(x)) for x in leaves)
    return sum(jnp.sum(jnp.abs(x) ** p) for x in leaves)


def interval_update(lam: Array, train_loss: Array, val_loss: Array, scaling_factor: Array, low: Array,
                    high: Array) -> Array:
    """imitation ``IntervalParamScaler.__call__``: the next regularisation strength ``lam``.

    ``lam * (1 + scaling_factor)`` when ``val_loss / train_loss > high``,
    ``lam * (1 - scaling_factor)`` when it is ``< low``; a train loss of ~0 grows
    ``lam`` unless the validation loss is ~0 too.
    """
    eps = jnp.float32(_EPS64)
    up = lam * (1.0 + scaling_factor)
    down = lam * (1.0 - scaling_factor)
    ratio = val_loss / jnp.where(train_loss < eps, 1.0, train_loss)
    scaled = jnp.where(ratio > high, up, jnp.where(ratio < low, down, lam))
    out = jnp.where(train_loss < eps, jnp.where(val_loss < eps, lam, up), scaled)
    return out.astype(jnp.float32)
