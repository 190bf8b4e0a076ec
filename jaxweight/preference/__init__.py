"""Reward learning from preference comparisons (imitation), vectorised.

Every per-pair and per-member loop of imitation's preference comparisons is
one jittable array call. Stateless parts: data (:class:`Trajectories`,
:class:`FragmentPairs`), reward nets and ensembles (:func:`ensemble_apply`),
the Bradley-Terry model, fragmenters, synthetic teachers, query schedules.
Three components of one shape (``config`` / ``init`` / ``step`` /
``metrics_dict``): :mod:`.buffer` (FIFO of comparisons), :mod:`.training` (the
reward trainer; ``epoch`` is its epoch driver, :class:`RewardTrainer` the host
wrapper) and :mod:`.loop` (one round per ``step``; the host driver with resume
is ``driver.PreferenceComparisons``). The generators (the agents of :mod:`jaxweight.rl`, PPO's
and SAC's, as trajectory generators) and the environment reward nets need gymnax (the ``rl``
extra) and load on first use; environments and agents themselves are :mod:`jaxweight.rl`.

Example::

    import numpy as np
    from jaxweight import preference as pf
    pairs = pf.fragment_pairs_from_arrays(np.zeros((2, 2, 4, 3)), np.zeros((2, 2, 3), np.int32))
    cfg = pf.buffer.config(8)
    state = pf.buffer.step(pf.buffer.init(cfg, None, pairs), pairs, np.ones(2, np.float32), cfg)
    assert int(state.size) == 2
"""

from . import buffer, normalization, training
from .buffer import BufferConfig, PreferenceBuffer
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
    ShapedRewardNet,
    add_std,
    basic_shaped_reward_net,
    ensemble_apply,
    ensemble_init,
    ensemble_moments,
    ensemble_reward,
    preprocess,
)
from .schedules import QUERY_SCHEDULES, allocate_comparisons, get_schedule, oric
from .regularization import IntervalParamScaler, Regularizer, lp_regularizer, weight_decay_regularizer
from .trainer import RewardTrainer
from .training import TrainerConfig, TrainerState

__all__ = [
    # data
    "Trajectories", "FragmentPairs", "trajectories_from_arrays", "fragment_pairs_from_arrays",
    "concatenate_trajectories", "discounted_returns", "example_inputs",
    # reward nets
    "Box", "Discrete", "MultiDiscrete", "MultiBinary", "preprocess",
    "RewardMLP", "PotentialMLP", "ShapedRewardNet", "basic_shaped_reward_net",
    "ensemble_init", "ensemble_apply", "ensemble_moments", "add_std", "ensemble_reward",
    # model
    "probability", "fragment_rewards", "preference_probabilities", "cross_entropy_loss",
    # fragments
    "random_fragments", "active_selection", "active_selection_scored", "variance_estimate",
    # teachers
    "synthetic_preferences", "synthetic_teacher", "TeacherOutput",
    # components: the buffer and the reward trainer (config / init / step / epoch / metrics_dict)
    "buffer", "BufferConfig", "PreferenceBuffer", "normalization",
    "training", "TrainerConfig", "TrainerState", "RewardTrainer",
    "Regularizer", "IntervalParamScaler", "lp_regularizer", "weight_decay_regularizer",
    # schedules
    "QUERY_SCHEDULES", "get_schedule", "oric", "allocate_comparisons",
]

# The loop, generators and environment reward nets import gymnax (the ``rl`` extra): loaded on first access.
_LAZY = {
    "loop": ("LoopConfig", "LoopState", "LoopPlan", "AgentReward", "learned_reward_fn", "ROUND_METRICS",
             "MEASURED_BY"),
    "driver": ("PreferenceComparisons", "tqdm_progress"),
    "evaluation": ("predicted_rewards", "reward_correlation", "preference_accuracy"),
    "generators": ("AgentGenerator", "SACGenerator", "HostGenerator", "TrajectoryGenerator"),
    "datasets": ("DatasetGenerator", "DatasetState", "take_steps"),
    "env_rewards": ("SquashedObsReward", "MirroredReward", "reward_net"),
}


def __getattr__(name):
    import importlib

    for module, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(f".{module}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
