"""MaxEnt-GRPO reward weighting and its tau / beta / meta controllers on dense masked ``[P, G]`` arrays.

Next to group advantages, maxent_grpo builds a listwise target ``q`` (a softmax of each
group's rewards) and sequence weights ``w ~ q^(1/tau) * pi_ref^(beta/tau)`` whose entropy
a controller steers to a target. Every quantity here is one vectorised function of
``f32[P, G]`` arrays with a validity ``mask``; an entry is valid iff masked in with finite
inputs, invalid entries never affect others and get 0. The component: ``config`` (every
setting, checked), ``init`` (the controller state), ``step`` (weights + controllers) and
``metrics_dict``. Files: ``advantages.py``, ``weights.py``, ``seed.py`` (SEED-GRPO),
``controllers.py``, ``settings.py`` (config, init), ``pipeline.py``, ``loss.py`` (the learner's loss),
``aggregation.py`` (xDr.GRPO candidate weights for the loss), host helpers ``answers.py``, ``batch.py``.

Example::

    import jax, jax.numpy as jnp
    from jaxweight import maxent

    rewards, mask = maxent.pad_groups([[1., 0., 0., 1.], [2., 0.]])   # ragged -> [2, 4] + mask
    ref_logp = jnp.array([[-1.2, -0.4, -2.0, -0.9], [-0.3, -1.0, 0.0, 0.0]])
    cfg = maxent.config(tau=0.5, beta=0.04,
                        schedule=maxent.TauSchedule(target_entropy=0.5, learning_rate=0.1))
    state = maxent.init(cfg)
    state, out = jax.jit(maxent.step)(state, rewards, ref_logp, cfg, mask=mask, global_step=1)
    logs = maxent.metrics_dict(out, cfg)             # {"maxent/weight_entropy": ..., ...}
    assert out.weights.shape == (2, 4) and "maxent/tau" in logs

References: maxent-grpo (https://github.com/liv-daliberti/maxent-grpo); GRPO arXiv:2402.03300;
Dr.GRPO arXiv:2503.20783; xDr.GRPO (maxent-grpo ``paper/main.tex``); RLOO arXiv:2402.14740; SEED-GRPO arXiv:2505.12346.
"""

from ._common import BASELINES, SCALES
from .advantages import group_advantages, reward_moments, zero_truncated
from .answers import NO_ANSWER, cluster_ids, extract_answer
from .batch import pad_groups, truncation_flags
from .settings import MaxEntConfig, config, init
from .controllers import (
    ENTROPY_EMA_DECAY,
    META_METHODS,
    ControllerState,
    KLController,
    MetaController,
    MetaGrads,
    TauSchedule,
    analytic_meta_grads,
    meta_should_update,
    meta_update,
    target_entropy_at,
    update_beta,
    update_tau,
)
from .pipeline import MaxEntStepOutput, RewardStatistics, compute_reward_statistics, metrics_dict, step
from .seed import seed_grpo_scale, semantic_entropy
from .loss import NORMALIZATIONS, k3_kl, policy_loss
from .dynamic import GroupSelection, select_groups
from .aggregation import AggregationDiagnostics, aggregation_diagnostics, candidate_weights, positive_class_weights
from .weights import (
    WeightEntropy,
    effective_sample_size,
    q_distribution,
    uniform_weights,
    weight_entropy,
    weight_matrix,
)

__all__ = [
    # the component
    "MaxEntConfig",
    "ControllerState",
    "MaxEntStepOutput",
    "config",
    "init",
    "step",
    "metrics_dict",
    # controller settings and rules
    "TauSchedule",
    "KLController",
    "MetaController",
    "META_METHODS",
    "ENTROPY_EMA_DECAY",
    "MetaGrads",
    "update_tau",
    "update_beta",
    "meta_update",
    "target_entropy_at",
    "analytic_meta_grads",
    "meta_should_update",
    # stateless math
    "SCALES",
    "BASELINES",
    "group_advantages",
    "reward_moments",
    "zero_truncated",
    "q_distribution",
    "weight_matrix",
    "uniform_weights",
    "WeightEntropy",
    "weight_entropy",
    "effective_sample_size",
    "semantic_entropy",
    "seed_grpo_scale",
    "RewardStatistics",
    "compute_reward_statistics",
    # host helpers
    "NO_ANSWER",
    "extract_answer",
    "cluster_ids",
    "pad_groups",
    "truncation_flags",
    # the learner's policy loss and dynamic sampling
    "NORMALIZATIONS",
    "policy_loss",
    "k3_kl",
    "candidate_weights",
    "positive_class_weights",
    "AggregationDiagnostics",
    "aggregation_diagnostics",
    "GroupSelection",
    "select_groups",
]
