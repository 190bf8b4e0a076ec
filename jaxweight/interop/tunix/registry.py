"""``register()``: jaxweight's estimators and policy loss in tunix's function registry."""

from __future__ import annotations

from typing import NamedTuple

from ._compat import tunix_modules
from .estimators import ESTIMATOR_GRPO, ESTIMATOR_MAXENT, GroupAdvantageEstimator, MaxEntAdvantageEstimator
from .loss import POLICY_LOSS_MAXENT, maxent_policy_loss

__all__ = ["Registration", "register"]


class Registration(NamedTuple):
    """What :func:`register` put into tunix's registry (keep it to read or save the state)."""

    grpo: GroupAdvantageEstimator
    maxent: MaxEntAdvantageEstimator


def register(grpo: GroupAdvantageEstimator | None = None, maxent_estimator: MaxEntAdvantageEstimator | None = None,
             ) -> Registration:
    """Register jaxweight's estimators and policy loss in tunix's function registry.

    Adds the advantage estimators ``"jaxweight_grpo"`` and ``"jaxweight_maxent"`` and the policy
    loss ``"jaxweight_maxent"``; a tunix learner picks them by name::

        GRPOConfig(advantage_estimator="jaxweight_maxent", policy_loss_fn="jaxweight_maxent")

    Calling it again replaces the objects (tunix logs that it overwrites).

    Args:
      grpo: the ``"jaxweight_grpo"`` estimator (default ``GroupAdvantageEstimator()``).
      maxent_estimator: the ``"jaxweight_maxent"`` estimator (default
        ``MaxEntAdvantageEstimator()``); it holds the controller state across calls.

    Returns:
      :class:`Registration` with both estimator objects.

    Raises:
      ImportError: tunix is not installed (naming the extra).
    """
    _, registry, _, _ = tunix_modules()
    grpo = GroupAdvantageEstimator() if grpo is None else grpo
    est = MaxEntAdvantageEstimator() if maxent_estimator is None else maxent_estimator
    registry.register_advantage_estimator(ESTIMATOR_GRPO)(grpo)
    registry.register_advantage_estimator(ESTIMATOR_MAXENT)(est)
    registry.register_policy_loss_fn(POLICY_LOSS_MAXENT)(maxent_policy_loss)
    return Registration(grpo=grpo, maxent=est)
