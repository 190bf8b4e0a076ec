"""Reward learning from preference comparisons (imitation), vectorised.

Every per-pair and per-member Python loop of imitation's preference
comparisons becomes one jittable array call:

- data: :class:`Trajectories`, :class:`FragmentPairs` and converters;
- reward nets: :class:`RewardMLP` (+ spaces, :func:`preprocess`), ensembles
  (:func:`ensemble_init` / :func:`ensemble_apply` / :func:`ensemble_moments` /
  :func:`add_std`), potential shaping, reward normalisation;
- model: Bradley-Terry :func:`probability`, :func:`cross_entropy_loss`;
- fragmenters: :func:`random_fragments`, :func:`active_selection`, :func:`variance_estimate`;
- teachers: :func:`synthetic_preferences` / :func:`synthetic_teacher` (with B-Pref's noisy teachers);
- :class:`PreferenceBuffer` (FIFO ring buffer; :func:`buffer_push` with an optional traced ``count``);
- :class:`RewardTrainer` and its pure core: ONE train step used by the trainer,
  the loop and the data-parallel path (:func:`train_reward`, :func:`train_epoch`,
  :func:`train_step`, ``axis_name=`` / ``mesh=`` for data parallelism);
- query schedules: :data:`QUERY_SCHEDULES`, :func:`oric`, :func:`allocate_comparisons`;
- the loop: :class:`PreferenceComparisons` (``loop.py``), trajectory generators
  (:class:`AgentGenerator` with PPO, :class:`DatasetGenerator`, ``generators.py``)
  and fixed-horizon gymnax environments (``envs.py``). These need gymnax (the
  ``rl`` extra) and are imported on first use: ``from jaxweight.preference import
  PreferenceComparisons`` or ``from jaxweight.preference.loop import ...``.

Building blocks not listed in ``__all__`` (e.g. ``training.trainer_hparams``,
``reward_nets.as_space``, ``fragments.sample_fragment_indices``) live in the
submodules; their old package-level spellings still work with a
``DeprecationWarning``.
"""

from .buffer import PreferenceBuffer, buffer_init, buffer_mask, buffer_push, buffer_size
from .data import (
    FragmentPairs,
    Trajectories,
    concatenate_trajectories,
    discounted_returns,
    example_inputs,
    fragment_pairs_from_arrays,
    trajectories_from_arrays,
)
from .fragments import active_selection, active_selection_scored, random_fragments, variance_estimate
from .gatherers import TeacherOutput, synthetic_preferences, synthetic_teacher
from .model import cross_entropy_loss, fragment_rewards, preference_probabilities, probability
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
    basic_shaped_reward_net,
    ensemble_apply,
    ensemble_init,
    ensemble_moments,
    ensemble_reward,
    normalize_rewards,
    preprocess,
    reward_norm_init,
    reward_norm_update,
)
from .schedules import QUERY_SCHEDULES, allocate_comparisons, get_schedule, oric
from .training import (
    IntervalParamScaler,
    RewardTrainer,
    TrainerConfig,
    TrainerHParams,
    TrainerState,
    lp_regularizer,
    metrics_dict,
    minibatch_grad,
    prepare_data,
    train_epoch,
    train_epochs,
    train_reward,
    train_step,
    weight_decay_regularizer,
)

__all__ = [
    # data
    "Trajectories", "FragmentPairs", "trajectories_from_arrays", "fragment_pairs_from_arrays",
    "concatenate_trajectories", "discounted_returns", "example_inputs",
    # reward nets
    "Box", "Discrete", "MultiDiscrete", "MultiBinary", "preprocess",
    "RewardMLP", "PotentialMLP", "ShapedRewardNet", "basic_shaped_reward_net",
    "ensemble_init", "ensemble_apply", "ensemble_moments", "add_std", "ensemble_reward",
    "RewardNormState", "reward_norm_init", "reward_norm_update", "normalize_rewards",
    # model
    "probability", "fragment_rewards", "preference_probabilities", "cross_entropy_loss",
    # fragments
    "random_fragments", "active_selection", "active_selection_scored", "variance_estimate",
    # teachers
    "synthetic_preferences", "synthetic_teacher", "TeacherOutput",
    # buffer
    "PreferenceBuffer", "buffer_init", "buffer_push", "buffer_size", "buffer_mask",
    # training
    "RewardTrainer", "TrainerConfig", "TrainerHParams", "TrainerState", "IntervalParamScaler",
    "lp_regularizer", "weight_decay_regularizer", "train_reward", "train_epoch", "train_epochs", "train_step",
    "prepare_data", "minibatch_grad", "metrics_dict",
    # schedules
    "QUERY_SCHEDULES", "get_schedule", "oric", "allocate_comparisons",
]

# The loop, generators and environments import gymnax (the ``rl`` extra): loaded on first access.
_LAZY = {
    "loop": ("PreferenceComparisons", "LoopConfig", "loop_config", "LoopState", "LoopHParams", "LoopPlan",
             "RoundInput", "AgentReward", "learned_reward_fn", "predicted_rewards", "reward_correlation",
             "preference_accuracy", "tqdm_progress", "ROUND_METRICS"),
    "generators": ("AgentGenerator", "AgentState", "DatasetGenerator", "DatasetState", "HostGenerator",
                   "TrajectoryGenerator", "PPOConfig", "PPOHParams", "PPOState", "ActorCritic", "take_steps"),
    "envs": ("FixedHorizonCartPole", "FixedHorizonPendulum", "LearnedRewardEnv", "LearnedRewardParams",
             "LearnedRewardState", "SquashedObsReward", "make_env", "oracle_reward", "reward_net", "env_step"),
}

# Names that were exported here before and now live only in their submodule (deprecated here).
_MOVED = {
    "as_space": "reward_nets", "is_image_space": "reward_nets", "flat_dim": "reward_nets",
    "num_members": "reward_nets", "binary_cross_entropy": "model", "binary_entropy": "gatherers",
    "sample_fragment_indices": "fragments", "gather_fragments": "fragments", "UNCERTAINTY_MODES": "fragments",
    "Regularizer": "training", "TrainData": "training", "trainer_config": "training",
    "trainer_hparams": "training", "trainer_init": "training", "make_optimizer": "training",
    "num_epochs": "training", "epoch_metrics_dict": "training", "uncertainty_scores": "fragments",
    "concatenate_pairs": "data", "reward_norm_apply": "reward_nets", "buffer_ordered": "buffer",
    "push_first": "loop",  # replaced by buffer_push(buf, pairs, prefs, count=n)
}

# imitation converters: moving to jaxweight.interop.imitation (helper E); found wherever they live now.
_IMITATION = ("trajectories_from_imitation", "fragment_pairs_from_imitation")


def __getattr__(name):
    import importlib

    for module, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(f".{module}", __name__), name)
    if name in _MOVED:
        from .._util import warn_deprecated

        warn_deprecated(f"jaxweight.preference.{name}", f"jaxweight.preference.{_MOVED[name]}.{name}")
        return getattr(importlib.import_module(f".{_MOVED[name]}", __name__), name)
    if name in _IMITATION:
        from . import data

        if hasattr(data, name):
            return getattr(data, name)
        return getattr(importlib.import_module("jaxweight.interop.imitation"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
