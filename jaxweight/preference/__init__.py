"""Reward learning from preference comparisons (imitation), vectorised.

Every per-pair and per-member Python loop of imitation's preference
comparisons becomes one jittable array call:

- data: :class:`Trajectories`, :class:`FragmentPairs` and converters;
- reward nets: :class:`RewardMLP` (+ spaces, :func:`preprocess`), ensembles
  (:func:`ensemble_init` / :func:`ensemble_apply` / :func:`ensemble_moments` /
  :func:`add_std`), potential shaping, reward normalisation;
- model: Bradley-Terry :func:`probability`, :func:`cross_entropy_loss`;
- fragmenters: :func:`random_fragments`, :func:`active_selection`, :func:`variance_estimate`;
- teachers: :func:`synthetic_preferences` (with B-Pref's noisy teachers);
- :class:`PreferenceBuffer` (FIFO ring buffer);
- :class:`RewardTrainer` and its pure core (:func:`train_epoch`, :func:`train_epochs`, ...);
- query schedules: :data:`QUERY_SCHEDULES`, :func:`oric`, :func:`allocate_comparisons`;
- the loop: :class:`PreferenceComparisons` (``loop.py``), trajectory generators
  (:class:`AgentGenerator` with PPO, :class:`DatasetGenerator`, ``generators.py``)
  and fixed-horizon gymnax environments (``envs.py``). These need gymnax (the
  ``rl`` extra) and are imported on first use: ``from jaxweight.preference import
  PreferenceComparisons`` or ``from jaxweight.preference.loop import ...``.
"""

from .buffer import PreferenceBuffer, buffer_init, buffer_mask, buffer_ordered, buffer_push, buffer_size
from .data import (
    FragmentPairs,
    Trajectories,
    concatenate_pairs,
    concatenate_trajectories,
    discounted_returns,
    example_inputs,
    fragment_pairs_from_arrays,
    fragment_pairs_from_imitation,
    trajectories_from_arrays,
    trajectories_from_imitation,
)
from .fragments import (
    UNCERTAINTY_MODES,
    active_selection,
    gather_fragments,
    random_fragments,
    sample_fragment_indices,
    uncertainty_scores,
    variance_estimate,
)
from .gatherers import binary_entropy, synthetic_preferences
from .model import (
    binary_cross_entropy,
    cross_entropy_loss,
    fragment_rewards,
    preference_probabilities,
    probability,
)
from .reward_nets import (
    Box,
    Discrete,
    MultiBinary,
    MultiDiscrete,
    PotentialMLP,
    RewardMLP,
    RewardNormState,
    ShapedRewardNet,
    add_std,
    as_space,
    basic_shaped_reward_net,
    ensemble_apply,
    ensemble_init,
    ensemble_moments,
    ensemble_reward,
    flat_dim,
    is_image_space,
    normalize_rewards,
    num_members,
    preprocess,
    reward_norm_apply,
    reward_norm_init,
    reward_norm_update,
)
from .schedules import QUERY_SCHEDULES, allocate_comparisons, get_schedule, oric
from .training import (
    IntervalParamScaler,
    Regularizer,
    RewardTrainer,
    TrainData,
    TrainerConfig,
    TrainerHParams,
    TrainerState,
    epoch_metrics_dict,
    lp_regularizer,
    make_optimizer,
    minibatch_grad,
    num_epochs,
    prepare_data,
    train_epoch,
    train_epochs,
    train_step,
    trainer_config,
    trainer_hparams,
    trainer_init,
    weight_decay_regularizer,
)

__all__ = [
    # data
    "Trajectories", "FragmentPairs", "trajectories_from_arrays", "trajectories_from_imitation",
    "fragment_pairs_from_arrays", "fragment_pairs_from_imitation", "concatenate_trajectories",
    "concatenate_pairs", "discounted_returns", "example_inputs",
    # reward nets
    "Box", "Discrete", "MultiDiscrete", "MultiBinary", "as_space", "is_image_space", "flat_dim", "preprocess",
    "RewardMLP", "PotentialMLP", "ShapedRewardNet", "basic_shaped_reward_net",
    "ensemble_init", "ensemble_apply", "ensemble_moments", "add_std", "ensemble_reward", "num_members",
    "RewardNormState", "reward_norm_init", "reward_norm_update", "reward_norm_apply", "normalize_rewards",
    # model
    "probability", "fragment_rewards", "preference_probabilities", "binary_cross_entropy", "cross_entropy_loss",
    # fragments
    "random_fragments", "sample_fragment_indices", "gather_fragments", "active_selection",
    "variance_estimate", "uncertainty_scores", "UNCERTAINTY_MODES",
    # gatherers
    "synthetic_preferences", "binary_entropy",
    # buffer
    "PreferenceBuffer", "buffer_init", "buffer_push", "buffer_size", "buffer_mask", "buffer_ordered",
    # training
    "RewardTrainer", "TrainerConfig", "TrainerHParams", "TrainerState", "TrainData", "IntervalParamScaler",
    "Regularizer", "lp_regularizer", "weight_decay_regularizer", "trainer_config", "trainer_hparams",
    "trainer_init", "make_optimizer", "num_epochs", "minibatch_grad", "train_step", "prepare_data",
    "train_epoch", "train_epochs", "epoch_metrics_dict",
    # schedules
    "QUERY_SCHEDULES", "get_schedule", "oric", "allocate_comparisons",
]

# The loop, generators and environments import gymnax (the ``rl`` extra): loaded on first access.
_LAZY = {
    "loop": ("PreferenceComparisons", "LoopState", "LoopHParams", "LoopPlan", "RoundInput", "AgentReward",
             "learned_reward_fn", "push_first", "train_reward", "predicted_rewards", "reward_correlation",
             "preference_accuracy"),
    "generators": ("AgentGenerator", "AgentState", "DatasetGenerator", "DatasetState", "HostGenerator",
                   "TrajectoryGenerator", "PPOConfig", "PPOHParams", "PPOState", "ActorCritic", "take_steps"),
    "envs": ("FixedHorizonCartPole", "FixedHorizonPendulum", "LearnedRewardEnv", "LearnedRewardParams",
             "LearnedRewardState", "SquashedObsReward", "make_env", "oracle_reward", "reward_net"),
}


def __getattr__(name):
    for module, names in _LAZY.items():
        if name in names:
            import importlib

            return getattr(importlib.import_module(f".{module}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
