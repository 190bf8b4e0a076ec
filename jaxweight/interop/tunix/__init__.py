"""jaxweight inside tunix (``google-tunix``): advantage estimators, a policy loss, prompt curricula.

tunix is imported lazily: ``import jaxweight.interop.tunix`` works without it, and the first
call that needs it raises one ``ImportError`` naming the extra (``pip install "jaxweight[tunix]"``).

- :func:`register` adds to tunix's function registry the advantage estimators
  ``"jaxweight_grpo"`` (:class:`GroupAdvantageEstimator`) and ``"jaxweight_maxent"``
  (:class:`MaxEntAdvantageEstimator`, stateful: it holds the maxent controller state) and the
  policy loss ``"jaxweight_maxent"`` (:func:`maxent_policy_loss`, the listwise loss + KL).
- :class:`CurriculumPromptIterator`: a train dataset for tunix learners drawn by
  :mod:`jaxweight.curriculum`, updated from rewards through its ``metric_fn``, saved and
  restored with tunix's step counter (:func:`tunix_step`).
- :class:`MaxEntGRPOLearner`: a ``GRPOLearner`` that gives the weighting what the registry
  cannot (reference log-probs, completions, the measured KL, the train/eval mode); loaded,
  with tunix, on first access.

``_compat.py`` holds every tunix import; ``demo.py`` compares with tunix's ``"grpo"``
(``python -m jaxweight.interop.tunix.demo``; results in the README, "jaxweight inside tunix").

Example::

    import numpy as np
    from jaxweight.interop import tunix as jt

    reg = jt.register()          # GRPOConfig(advantage_estimator="jaxweight_maxent", policy_loss_fn="jaxweight_maxent")
    adv = reg.maxent(rewards=np.array([1., 0., 0., 1.]), num_generations=2)    # f32[4], centred per group
"""

import importlib

from ._compat import tunix_step
from .estimators import (
    ESTIMATOR_GRPO,
    ESTIMATOR_MAXENT,
    GroupAdvantageEstimator,
    MaxEntAdvantageEstimator,
    centred_from_weights,
    grouped,
)
from .loss import POLICY_LOSS_MAXENT, listwise_loss, masked_token_mean, maxent_policy_loss, weights_from_centred
from .prompts import DRAW_KEY, ITEM_ID_KEY, CurriculumPromptIterator, group_mean_scores
from .registry import Registration, register

_LAZY = {"MaxEntGRPOLearner": "learner", "MaxEntTrainExample": "learner"}

__all__ = [
    "ESTIMATOR_GRPO",
    "ESTIMATOR_MAXENT",
    "POLICY_LOSS_MAXENT",
    "ITEM_ID_KEY",
    "DRAW_KEY",
    "Registration",
    "register",
    "grouped",
    "centred_from_weights",
    "GroupAdvantageEstimator",
    "MaxEntAdvantageEstimator",
    "maxent_policy_loss",
    "listwise_loss",
    "weights_from_centred",
    "masked_token_mean",
    "CurriculumPromptIterator",
    "group_mean_scores",
    "tunix_step",
    "MaxEntGRPOLearner",
    "MaxEntTrainExample",
]


def __getattr__(name):
    # the learner subclasses a tunix class: its module imports tunix, so it loads on first access
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
