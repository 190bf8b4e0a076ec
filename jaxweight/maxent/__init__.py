"""MaxEnt-GRPO reward weighting on dense masked ``[P, G]`` arrays.

maxent_grpo trains a policy with GRPO over ``G`` completions per prompt. Next
to group-normalised advantages it builds a listwise target ``q`` (a softmax of
the rewards of each group) and maximum-entropy sequence weights

    w  ~  q^(1/tau) * pi_ref^(beta/tau)        (one softmax per group)

whose entropy a controller (:mod:`jaxweight.controllers`) steers toward a
target. The original walks over groups in Python; here every quantity is one
vectorised function of ``f32[P, G]`` arrays with a validity ``mask`` (ragged
groups are padding), so a whole batch, a batch of sweeps or a gradient with
respect to ``tau``/``beta`` is one compiled call.

Conventions:

- An entry is *valid* iff it is masked in and its inputs are finite. Invalid
  entries never affect other entries and get 0 in every output; ``n`` is the
  number of valid entries of a row. Non-finite inputs are counted
  (``n_nonfinite`` / ``n_invalid``), never propagated; rewards up to the
  float32 range (3e38) give finite outputs.
- Math in float32; outputs are float32.
- Continuous hyperparameters (``tau``, ``beta``, ``denom``, ``temperature``,
  ``epsilon``, ``eps``) may be traced arrays: new values never recompile and
  can be ``jax.vmap``-ed over. Modes (``scale``, ``baseline``, ``ddof``,
  token normalisation) are static.

The one-call training step is :func:`maxent_step` (advantages, ``q``,
weights, entropy statistics, diagnostics and the controller update),
composed from the public functions.

Files: ``advantages.py`` (advantages, moments), ``weights.py`` (q, weights,
entropy, ESS), ``seed.py`` (SEED-GRPO), ``step.py`` (reward statistics and the
step), ``answers.py`` / ``batch.py`` (host helpers: answers and clusters,
padding and truncation flags).

Example::

    import jax.numpy as jnp
    from jaxweight import maxent, controllers

    rewards, mask = maxent.pad_groups([[1., 0., 0., 1.], [2., 0.]])   # ragged -> [2, 4] + mask
    ref_logp = jnp.array([[-1.2, -0.4, -2.0, -0.9], [-0.3, -1.0, 0.0, 0.0]])
    adv = maxent.group_advantages(rewards, mask)              # f32[2, 4]
    q = maxent.q_distribution(rewards, mask, temperature=0.5)
    w = maxent.weight_matrix(q, ref_logp, mask=mask, tau=0.5, beta=0.04)
    ent = maxent.weight_entropy(w, mask)

    # or all of it, plus the tau controller, in one jitted call:
    cfg = controllers.config(tau=0.5, beta=0.04,
                             schedule=controllers.TauSchedule(target_entropy=0.5, learning_rate=0.1))
    state = controllers.init(cfg)
    out = maxent.maxent_step(state, rewards, ref_logp, None, mask, cfg, global_step=1)
    state, logs = out.state, out.to_dict()      # logs: {"maxent/weight_entropy": ..., ...}

References:
  maxent-grpo, ``maxent_grpo.rewards.maxent`` / ``maxent_grpo.training``,
  https://github.com/liv-daliberti/maxent-grpo ;
  Shao et al., "DeepSeekMath" (GRPO), arXiv:2402.03300 ;
  Liu et al., "Understanding R1-Zero-Like Training" (Dr.GRPO), arXiv:2503.20783 ;
  Ahmadian et al., "Back to Basics" (RLOO), arXiv:2402.14740 ;
  Chen et al., "SEED-GRPO", arXiv:2505.12346.
"""

from .advantages import group_advantages, reward_moments, zero_truncated
from .answers import NO_ANSWER, cluster_ids, extract_answer
from .batch import pad_groups, truncation_flags
from ._common import BASELINES, SCALES
from .seed import seed_grpo_scale, semantic_entropy
from .step import MaxEntStepOutput, RewardStatistics, compute_reward_statistics, maxent_step
from .weights import (
    WeightEntropy,
    effective_sample_size,
    q_distribution,
    uniform_weights,
    weight_entropy,
    weight_matrix,
)

__all__ = [
    "SCALES",
    "BASELINES",
    "NO_ANSWER",
    "group_advantages",
    "reward_moments",
    "zero_truncated",
    "truncation_flags",
    "q_distribution",
    "weight_matrix",
    "uniform_weights",
    "WeightEntropy",
    "weight_entropy",
    "effective_sample_size",
    "semantic_entropy",
    "seed_grpo_scale",
    "extract_answer",
    "cluster_ids",
    "pad_groups",
    "RewardStatistics",
    "compute_reward_statistics",
    "MaxEntStepOutput",
    "maxent_step",
]
