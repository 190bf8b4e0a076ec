"""The one place that knows tunix: its imports, and the internals the plug-in reads.

tunix's 0.1.x API moves; when it does, this file and :mod:`.learner` are what change.
"""

from __future__ import annotations

from typing import Any

MISSING = 'jaxweight.interop.tunix needs tunix: pip install "jaxweight[tunix]"'


def tunix_modules():
    """The tunix modules this file uses, in one place (tunix's 0.1.x API moves).

    Used: ``tunix.rl.function_registry`` (``register_advantage_estimator``,
    ``register_policy_loss_fn``), ``tunix.rl.common`` (``compute_per_token_logps``,
    ``compute_kl_divergence``, ``aggregate_loss``), ``tunix.rl.grpo.grpo_learner``
    (``GRPOLearner``, ``TrainExample``) and ``tunix.rl.rl_cluster.Mode``. Internals beyond
    those: ``learner.rl_cluster.actor_trainer.iter_steps`` (:func:`tunix_step`), and in
    :class:`MaxEntGRPOLearner` the overridden ``GRPOLearner._compute_rewards`` /
    ``_generate_and_compute_advantage`` and ``RLCluster.get_old_per_token_logps``,
    ``get_rollout_config``, ``buffer_metrics``, ``cluster_config.training_config``.
    """
    try:
        from tunix.rl import common, function_registry, rl_cluster
        from tunix.rl.grpo import grpo_learner
    except ImportError as e:  # one line, naming the extra
        raise ImportError(MISSING) from e
    return common, function_registry, grpo_learner, rl_cluster


def tunix_step(learner: Any) -> int:
    """tunix's micro-batch step counter of a learner (restored from its checkpoint at construction).

    It counts the train batches tunix has taken from its dataset: on resume tunix skips that
    many batches of a fresh iterator, which :meth:`CurriculumPromptIterator.restore` expects.
    """
    return int(learner.rl_cluster.actor_trainer.iter_steps)
