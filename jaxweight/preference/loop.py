"""The preference-comparisons loop, pure core (imitation ``PreferenceComparisons``): one component.

Round ``i`` of ``K + 1`` samples ``ceil(oversampling * 2 * n_i * L)``
transitions from the generator, cuts ``n_i`` fragment pairs (random or
active), asks the synthetic teacher, pushes them into the FIFO buffer, trains
the reward model (``epochs x initial_epoch_multiplier`` on round 0) and trains
the agent on the learned reward. :func:`config` holds everything (the static
plan of the run; the teacher's and the trainer's hyperparameters as array
leaves), :func:`init` builds the state, :func:`step` runs one round with an
explicit key and :func:`run` the remaining rounds in one program (round ``i``
uses ``round_key(key, i)``). The round's counts are traced, so every round
shares one compiled program. The host driver (resume, fingerprints, progress)
is :class:`~jaxweight.preference.driver.PreferenceComparisons`; it compiles the
four phases of :func:`step` as separate programs. The first phase, collect, is
two pure halves, ``_push(_collect_pairs(...), synthetic_preferences(...))``: with
a host teacher (a person, ``driver.train(..., teacher=)``) the driver compiles the
halves apart and the teacher answers between them, its labels reaching the same
buffer ``step``.

Example::

    import jax, numpy as np
    from jaxweight.preference import Box, Discrete, RewardMLP, loop, trajectories_from_arrays
    from jaxweight.preference.datasets import DatasetGenerator
    rng = np.random.default_rng(0)
    trajs = trajectories_from_arrays([rng.normal(size=(9, 2)) for _ in range(4)],
                                     [rng.integers(0, 2, 8) for _ in range(4)], [rng.normal(size=8)] * 4)
    net = RewardMLP(hidden_sizes=(4,), observation_space=Box((2,)), action_space=Discrete(2))
    cfg = loop.config(DatasetGenerator(trajs), net, 1, 0, 20, fragment_length=3, initial_epoch_multiplier=1.0)
    state = loop.init(cfg, 0)
    new, out = jax.eval_shape(loop.step, state, jax.random.key(1), cfg)   # jax.jit(loop.step) runs it
    assert set(out) == set(loop.ROUND_METRICS)
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import as_key, check_choice, check_static_int, check_value, masked_mean
from . import buffer as pbuf
from . import training
from ._training_config import _known
from .buffer import PreferenceBuffer
from .buffer import mask as buffer_mask
from .data import FragmentPairs, Trajectories, _discounted_returns, example_inputs
from .evaluation import preference_accuracy
from .fragments import active_selection, random_fragments
from .gatherers import synthetic_preferences
from .model import binary_entropy
from .reward_nets import _ensemble_reward
from .schedules import allocate_comparisons
from .training import TrainerConfig, TrainerState, num_epochs

__all__ = [
    "LoopConfig", "LoopPlan", "LoopState", "AgentReward", "config", "init", "step", "run", "round_key",
    "metrics_dict", "make_plan", "learned_reward_fn", "ROUND_METRICS", "MEASURED_BY", "VARIABLE_HORIZON_MESSAGE",
]

Array = jax.Array
logger = logging.getLogger("jaxweight.preference")

VARIABLE_HORIZON_MESSAGE = (
    "Episodes of different length detected: {horizons}. Variable horizon environments are discouraged -- "
    "termination conditions leak information about reward. See "
    "https://imitation.readthedocs.io/en/latest/getting-started/variable-horizon.html for more information. "
    "If you are SURE you want to run imitation on a variable horizon task, then please pass in the flag: "
    "`allow_variable_horizon=True`."
)


# ------------------------------------------------------------ agent reward
@struct.dataclass
class AgentReward:
    """The reward params an agent's environment carries (``LearnedRewardParams.reward_params``).

    The agent's reward of a transition is ``(r - shift) * scale`` with
    ``r = mean + alpha * std`` over the ensemble members (imitation's
    ``AddSTDRewardWrapper``; the plain net's output for a single net).

    Attributes:
      params: reward-net params (leading member axis ``M`` for ensembles).
      alpha: ``f32[]`` exploration bonus (ensembles only).
      shift: ``f32[]`` subtracted from the reward (0 without normalisation).
      scale: ``f32[]`` multiplies the shifted reward (1 without normalisation).
    """

    params: Any
    alpha: Array
    shift: Array
    scale: Array


def learned_reward_fn(module: nn.Module, ensemble: bool) -> Callable[..., Array]:
    """``reward_apply(AgentReward, obs, action, next_obs, done) -> f32[]`` of ``module`` for one transition.

    Args:
      module: the reward module (``module.apply(p, state, action, next_state, done)``).
      ensemble: whether the params carry a leading member axis (then the
        reward is ``mean + alpha * std`` over members, :func:`ensemble_reward`).
    """
    return _ModuleReward(module, ensemble)


@dataclasses.dataclass(frozen=True)
class _ModuleReward:
    """Hashable ``reward_apply`` (equal modules -> equal callables, so jit caches hit)."""

    module: nn.Module
    ensemble: bool

    def __call__(self, rp: AgentReward, obs, action, next_obs, done):
        inputs = (obs, action, next_obs, jnp.asarray(done, bool))
        r = _ensemble_reward(self.module, rp.params, inputs, rp.alpha, self.ensemble)  # alpha checked in config
        return (r - rp.shift) * rp.scale


# ------------------------------------------------------------ plan / config
@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """The schedule of a run (static; fixes the shapes of the compiled round).

    Attributes:
      schedule: comparisons per round (``K + 1`` ints, the first the initial ones).
      sample_steps: transitions sampled per round, ``ceil(oversampling * 2 * n * L)``.
      agent_steps: agent steps per round (``total_timesteps // K``, plus the remainder on round ``K - 1``).
      epochs: reward-training epochs per round.
      capacity: buffer capacity (``comparison_queue_size`` or ``total_comparisons``).
    """

    schedule: tuple[int, ...]
    sample_steps: tuple[int, ...]
    agent_steps: tuple[int, ...]
    epochs: tuple[int, ...]
    capacity: int

    @property
    def num_rounds(self) -> int:
        return len(self.schedule)

    @property
    def max_pairs(self) -> int:
        return max(self.schedule)

    @property
    def max_sample_steps(self) -> int:
        return max(self.sample_steps)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_STATIC = ("num_iterations", "fragment_length", "transition_oversampling", "initial_comparison_frac",
           "initial_epoch_multiplier", "comparison_queue_size", "query_schedule", "allow_variable_horizon",
           "fragmenter", "active_sample_factor", "uncertainty_on", "sample", "normalize_agent_reward",
           "eval_episodes")
_HPARAMS = {"temperature": dict(ge=0.0), "discount": dict(ge=0.0, le=1.0), "threshold": dict(gt=0.0), "alpha": {}}


def _static(default: Any = None) -> Any:
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class LoopConfig:
    """Every setting of a run. Build with :func:`config` (or the driver); static fields fix the program.

    Attributes:
      num_iterations: ``K``, rounds after the initial one.
      fragment_length: ``L``.
      transition_oversampling: transitions sampled per fragment transition (>= 1).
      initial_comparison_frac: share of comparisons asked before the agent trains, in ``[0, 1]``.
      initial_epoch_multiplier: epoch multiplier of the first reward training (>= 0).
      comparison_queue_size: buffer capacity (``None``: ``total_comparisons``).
      query_schedule: a name of :data:`~jaxweight.preference.QUERY_SCHEDULES` or a callable.
      allow_variable_horizon: accept terminal episodes of different lengths.
      fragmenter: ``"random"`` or ``"active"``; active_sample_factor: candidates per pair (>= 1);
        uncertainty_on: ``"logit"``, ``"probability"`` or ``"label"``.
      sample: the teacher draws Bernoulli labels (else answers with the probability).
      normalize_agent_reward: standardise the agent's reward over the buffer.
      eval_episodes: ground-truth evaluation episodes per round (0: none).
      generator, reward_module: the pure trajectory generator and the reward net (static).
      plan: the :class:`LoopPlan` of the run (static; ``None`` in the driver's settings).
      trainer: the reward trainer's :class:`~jaxweight.preference.TrainerConfig` (array leaves).
      agent_hparams: the agent's continuous hyperparameters (array leaves, e.g. a
        :class:`~jaxweight.rl.ppo.PPOHParams`; the generator's ``hparams``
        by default, ``None`` for generators without), passed to every
        ``generator.train`` call: the agent state holds none.
      temperature, discount, threshold: the synthetic teacher; alpha: the agent's
        exploration bonus ``mean + alpha * std`` (``f32[]`` leaves).
    """

    num_iterations: int = _static(1)
    fragment_length: int = _static(100)
    transition_oversampling: float = _static(1.0)
    initial_comparison_frac: float = _static(0.1)
    initial_epoch_multiplier: float = _static(200.0)
    comparison_queue_size: int | None = _static(None)
    query_schedule: Any = _static("hyperbolic")
    allow_variable_horizon: bool = _static(False)
    fragmenter: str = _static("random")
    active_sample_factor: float = _static(4.0)
    uncertainty_on: str = _static("logit")
    sample: bool = _static(True)
    normalize_agent_reward: bool = _static(True)
    eval_episodes: int = _static(8)
    generator: Any = _static(None)
    reward_module: Any = _static(None)
    plan: LoopPlan | None = _static(None)
    trainer: TrainerConfig | None = None
    agent_hparams: Any = None
    temperature: Any = 1.0
    discount: Any = 1.0
    threshold: Any = 50.0
    alpha: Any = 0.0

    def __post_init__(self):
        check_static_int(self.num_iterations, "num_iterations", 1)
        check_static_int(self.fragment_length, "fragment_length", 1)
        check_value(self.transition_oversampling, "transition_oversampling", ge=1.0, static=True)
        check_value(self.initial_comparison_frac, "initial_comparison_frac", ge=0.0, le=1.0, static=True)
        check_value(self.initial_epoch_multiplier, "initial_epoch_multiplier", ge=0.0, static=True)
        if self.comparison_queue_size is not None:
            check_static_int(self.comparison_queue_size, "comparison_queue_size", 1)
        allocate_comparisons(10, 1, 0.5, self.query_schedule)  # "Unknown query schedule: ..." up front
        check_choice(self.fragmenter, "fragmenter", ("random", "active"))
        check_value(self.active_sample_factor, "active_sample_factor", ge=1.0, static=True)
        check_choice(self.uncertainty_on, "uncertainty_on", ("logit", "probability", "label"))
        check_static_int(self.eval_episodes, "eval_episodes", 0)
        if self.trainer is not None and not isinstance(self.trainer, TrainerConfig):
            raise ValueError(f"trainer must be a TrainerConfig (training.config(...)), got {type(self.trainer).__name__}")
        if self.fragmenter == "active" and self.trainer is not None and not self.trainer.ensemble:
            raise ValueError("fragmenter='active' needs an ensemble reward_trainer (num_members >= 2)")
        for name, rng in _HPARAMS.items():
            v = getattr(self, name)
            if _known(v):
                check_value(v, name, **rng)

    @property
    def ensemble(self) -> bool:
        return self.trainer is not None and self.trainer.ensemble

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{field: value}`` of the static settings (a callable schedule by its qualified name)."""
        return {name: _jsonable(getattr(self, name)) for name in _STATIC}


def _jsonable(x: Any) -> Any:
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        return np.asarray(jax.device_get(x)).tolist()
    if isinstance(x, tuple | list):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if callable(x) and hasattr(x, "__qualname__"):
        return f"{getattr(x, '__module__', '')}.{x.__qualname__}"
    return repr(x)


def make_plan(cfg: LoopConfig, total_timesteps: int, total_comparisons: int) -> LoopPlan:
    """The per-round schedule of a run (host; imitation's arithmetic).

    Raises:
      ValueError: negative totals or ``total_comparisons < 1``; a round with
        0 comparisons ("the schedule gives round i 0 comparisons"); an agent
        that would train 0 steps per round (``0 < total_timesteps <
        num_iterations``); too little data for the trainer's validation split.
    """
    total_timesteps = check_static_int(total_timesteps, "total_timesteps", 0)
    total_comparisons = check_static_int(total_comparisons, "total_comparisons", 1)
    k = cfg.num_iterations
    schedule = allocate_comparisons(total_comparisons, k, cfg.initial_comparison_frac, cfg.query_schedule)
    zero = [i for i, n in enumerate(schedule) if n == 0]
    if zero:
        raise ValueError(
            f"the query schedule gives round {zero[0]} 0 comparisons (schedule {schedule}): raise "
            f"total_comparisons ({total_comparisons}) or initial_comparison_frac, or lower num_iterations"
        )
    tpi, extra = divmod(total_timesteps, k)
    if 0 < total_timesteps < k:
        raise ValueError(
            f"total_timesteps {total_timesteps} < num_iterations {k}: the agent would train 0 steps per round; "
            f"use total_timesteps >= {k} (or 0 to never train the agent)"
        )
    agent = [tpi + (extra if i == k - 1 else 0) for i in range(k + 1)]
    samples = [math.ceil(cfg.transition_oversampling * 2 * n * cfg.fragment_length) for n in schedule]
    tcfg = cfg.trainer
    epochs = [num_epochs(tcfg.epochs, cfg.initial_epoch_multiplier if i == 0 else 1.0) for i in range(k + 1)]
    cap = cfg.comparison_queue_size if cfg.comparison_queue_size is not None else total_comparisons
    if tcfg.has_updater:
        for n in np.minimum(np.cumsum(schedule), cap):
            val = int(int(n) * tcfg.val_split)
            if val < 1 or int(n) - val < 1:
                raise ValueError(
                    "Not enough data samples to split into training and validation, or the validation "
                    "split is too large/small. Make sure you've generated enough initial preference data. "
                    "You can adjust this through initial_comparison_frac in PreferenceComparisons."
                )
    return LoopPlan(tuple(schedule), tuple(samples), tuple(agent), tuple(epochs), int(cap))


def config(
    generator: Any, reward_module: nn.Module, num_iterations: int, total_timesteps: int, total_comparisons: int,
    *, trainer: TrainerConfig | None = None, temperature: Any = 1.0, discount: Any = 1.0, threshold: Any = 50.0,
    alpha: Any = 0.0, **settings: Any,
) -> LoopConfig:
    """Validate and build the :class:`LoopConfig` of a run of ``total_timesteps`` agent steps and
    ``total_comparisons`` comparisons.

    Args:
      generator: a pure generator (``init(key)``, ``sample(state, key, steps, max_steps=)``,
        ``train(state, key, steps, reward_params)``), e.g. ``AgentGenerator`` bound to the
        learned reward (:func:`learned_reward_fn`) or ``DatasetGenerator``.
      reward_module: the reward net.
      num_iterations, total_timesteps, total_comparisons: ``K`` and the run's totals.
      trainer: the reward trainer's config (default ``training.config(reward_module)``).
      temperature, discount, threshold: the synthetic teacher (imitation defaults 1, 1, 50).
      alpha: exploration bonus of the agent's reward for ensembles.
      **settings: the other static fields of :class:`LoopConfig` (``fragment_length``, ...).

    Raises:
      ValueError: naming the setting, its value and its range; the errors of :func:`make_plan`.
    """
    unknown = set(settings) - set(_STATIC)
    if unknown:
        raise ValueError(f"unknown loop settings {sorted(unknown)}; accepted: {list(_STATIC)}")
    for name, rng in _HPARAMS.items():
        check_value(locals()[name], name, **rng)
    trainer = training.config(reward_module) if trainer is None else trainer
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    cfg = LoopConfig(num_iterations=num_iterations, generator=generator, reward_module=reward_module,
                     trainer=trainer, agent_hparams=getattr(generator, "hparams", None),
                     temperature=f32(temperature), discount=f32(discount), threshold=f32(threshold),
                     alpha=f32(alpha), **settings)
    return cfg.replace(plan=make_plan(cfg, total_timesteps, total_comparisons))


# ------------------------------------------------------------ state
@struct.dataclass
class LoopState:
    """The full state of a run (everything a checkpoint needs; no key, no settings).

    Attributes:
      gen: the trajectory generator's state (the PPO agent, its optimiser and envs).
      reward: :class:`~jaxweight.preference.TrainerState` of the reward model(s).
      buffer: the :class:`~jaxweight.preference.PreferenceBuffer` of comparisons.
      reward_shift, reward_scale: ``f32[]`` normalisation of the agent's reward
        (set after every reward training from the buffer's transitions).
      round: ``i32[]`` finished rounds.
    """

    gen: Any
    reward: TrainerState
    buffer: PreferenceBuffer
    reward_shift: Array
    reward_scale: Array
    round: Array


def _example_pairs(cfg: LoopConfig) -> FragmentPairs:
    def make(key):
        st = cfg.generator.init(key)
        trajs = cfg.generator.sample(st, key, 1, max_steps=1)
        return random_fragments(key, trajs, cfg.fragment_length, 1)

    shapes = jax.eval_shape(make, jax.random.key(0))
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def init(cfg: LoopConfig, key: Any = None) -> LoopState:
    """A fresh run: generator, reward model(s) and an empty buffer of ``cfg.plan.capacity`` pairs (jittable, vmappable).

    ``key`` is split in three: the generator's, the reward nets' and a third
    that the host driver uses as the run key of :func:`run`.
    """
    if not isinstance(cfg, LoopConfig) or cfg.plan is None:
        raise ValueError("cfg must be a LoopConfig with a plan (loop.config(...))")
    k_gen, k_reward, _ = jax.random.split(as_key(0 if key is None else key), 3)
    example = _example_pairs(cfg)
    return LoopState(
        gen=cfg.generator.init(k_gen),
        reward=training.init(cfg.trainer, k_reward, example_inputs(example)),
        buffer=pbuf.init(pbuf.config(cfg.plan.capacity), None, example),
        reward_shift=jnp.zeros((), jnp.float32),
        reward_scale=jnp.ones((), jnp.float32),
        round=jnp.zeros((), jnp.int32),
    )


# ------------------------------------------------------------ one round
_I32, _F32, _BOOL = jnp.int32, jnp.float32, jnp.bool_
#: name -> dtype of every per-round metric (all scalars per seed)
ROUND_METRICS: dict[str, Any] = {
    "round": _I32, "num_pairs": _I32, "buffer_size": _I32, "stored_valid": _I32, "sample_steps": _I32,
    "agent_steps": _I32, "agent_steps_trained": _I32, "reward_loss": _F32, "reward_accuracy": _F32,
    "teacher_entropy": _F32, "fresh_accuracy": _F32, "fresh_decided": _I32, "sample_return": _F32,
    "gt_return": _F32, "gt_episodes": _I32, "variable_horizon": _BOOL, "horizon_min": _I32, "horizon_max": _I32,
    "n_invalid": _I32, "n_nonfinite": _I32,
}
#: metric -> the count that says whether it was measured (0: not measured, the metric is 0; no NaN sentinel)
MEASURED_BY: dict[str, str] = {"fresh_accuracy": "fresh_decided", "gt_return": "gt_episodes"}


def agent_reward(state: LoopState, cfg: LoopConfig) -> AgentReward:
    """The :class:`AgentReward` the agent trains on after the last finished round."""
    return AgentReward(state.reward.params, cfg.alpha, state.reward_shift, state.reward_scale)


def _fragments(key, cfg: LoopConfig, state: LoopState, trajs: Trajectories, num_pairs: int) -> FragmentPairs:
    if cfg.fragmenter == "random":
        return random_fragments(key, trajs, cfg.fragment_length, num_pairs, warning_threshold=0)
    t = cfg.trainer
    return active_selection(
        key, state.reward.params, cfg.reward_module, trajs, cfg.fragment_length, num_pairs,
        cfg.active_sample_factor, cfg.uncertainty_on, noise_prob=t.noise_prob, discount=t.discount,
        threshold=t.threshold, warning_threshold=0,
    )


def _reward_stats(cfg: LoopConfig, params: Any, buffer: PreferenceBuffer) -> tuple[Array, Array]:
    """Mean and ``1 / std`` of the learned reward over every (finite) transition stored in the buffer.

    The buffer holds fragments from every round's policy, so these statistics
    move slowly; those of the latest samples alone collapse once the agent
    is good and would blow its rewards up. Non-finite rewards are left out.
    """
    if not cfg.normalize_agent_reward:
        return jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
    r = _ensemble_reward(cfg.reward_module, params, buffer.pairs.transitions(), None, cfg.ensemble)  # [cap, 2, L]
    ok = jnp.broadcast_to(buffer_mask(buffer)[:, None, None], r.shape) & jnp.isfinite(r)
    r = jnp.where(ok, r, 0.0)
    mask = ok.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    mean = jnp.sum(r * mask) / n
    std = jnp.sqrt(jnp.sum(jnp.square(r - mean) * mask) / n)
    return mean.astype(jnp.float32), (1.0 / jnp.maximum(std, 1e-6)).astype(jnp.float32)


def _counts(state: LoopState, cfg: LoopConfig) -> tuple[Array, Array, Array, Array]:
    """``(num_pairs, sample_steps, agent_steps, epochs)`` of round ``state.round`` (``i32[]`` each)."""
    plan = cfg.plan
    counts = [jnp.asarray(v, jnp.int32) for v in (plan.schedule, plan.sample_steps, plan.agent_steps, plan.epochs)]
    i = jnp.clip(state.round, 0, plan.num_rounds - 1)
    return tuple(c[i] for c in counts)


def _round_keys(key: Any) -> Array:
    """The six keys of a round: sample, fragments, teacher, reward training, agent training, evaluation."""
    return jax.random.split(as_key(key), 6)


def _collect_pairs(state: LoopState, key: Any, cfg: LoopConfig) -> tuple[FragmentPairs, Array, dict[str, Array]]:
    """Phase 1, first half: sample, cut the round's pairs, judge them with the model trained so far.

    Returns:
      ``(pairs, predicted, out)``: ``P_max = cfg.plan.max_pairs`` pairs, of
      which the first ``num_pairs`` are the round's (the rest ``valid=False``);
      ``predicted f32[P_max]``, the reward model's probability that the first
      fragment of each pair is preferred (``sigmoid`` of the difference of the
      member-mean discounted returns, so ``> 0.5`` where
      ``fresh_accuracy`` ranks the first fragment higher); and the round's
      sampling metrics. The state does not change (sampling does not move the generator).
    """
    for name, rng in _HPARAMS.items():  # traced values: checked under jaxweight.checked only
        if isinstance(getattr(cfg, name), jax.core.Tracer):
            check_value(getattr(cfg, name), name, **rng)
    gen, plan = cfg.generator, cfg.plan
    num_pairs, sample_steps, _, _ = _counts(state, cfg)
    k_sample, k_frag, *_ = _round_keys(key)
    p_max = plan.max_pairs

    trajs = gen.sample(state.gen, k_sample, sample_steps, max_steps=plan.max_sample_steps)
    lengths = jnp.asarray(trajs.lengths, jnp.int32)
    term = jnp.asarray(trajs.terminal, bool) & (lengths > 0)
    big = jnp.iinfo(jnp.int32).max
    h_min = jnp.min(jnp.where(term, lengths, big))
    h_max = jnp.max(jnp.where(term, lengths, -1))
    any_term = jnp.sum(term) > 0
    step_mask = trajs.step_mask()
    obs = jnp.asarray(trajs.obs, jnp.float32)
    obs_ok = jnp.all(jnp.isfinite(obs.reshape(obs.shape[:2] + (-1,))), axis=-1)  # [N, T+1]
    step_ok = jnp.isfinite(trajs.rews) & obs_ok[:, :-1] & obs_ok[:, 1:]

    pairs = _fragments(k_frag, cfg, state, trajs, p_max)
    pairs = pairs.replace(valid=pairs.valid & (jnp.arange(p_max) < num_pairs))
    fresh_acc, fresh_decided = preference_accuracy(
        cfg.reward_module, state.reward.params, pairs, discount=cfg.discount, ensemble=cfg.ensemble
    )
    r = _ensemble_reward(cfg.reward_module, state.reward.params, pairs.transitions(), None, cfg.ensemble)
    ret = _discounted_returns(r, cfg.discount)  # [P_max, 2], as preference_accuracy ranks them
    finite = jnp.isfinite(ret[:, 0] - ret[:, 1])
    predicted = jnp.where(finite, jax.nn.sigmoid(jnp.where(finite, ret[:, 0] - ret[:, 1], 0.0)), 0.5)
    used = lengths > 0
    ep_returns = jnp.sum(jnp.where(step_mask & step_ok, trajs.rews, 0.0), axis=1)
    out = {
        "num_pairs": num_pairs, "sample_steps": sample_steps,
        "fresh_accuracy": fresh_acc, "fresh_decided": fresh_decided,
        "sample_return": jnp.sum(jnp.where(used, ep_returns, 0.0)) / jnp.maximum(jnp.sum(used), 1),
        "variable_horizon": any_term & (h_min != h_max),
        "horizon_min": jnp.where(any_term, h_min, 0), "horizon_max": jnp.where(any_term, h_max, 0),
        "n_nonfinite": jnp.sum(step_mask & ~step_ok, dtype=jnp.int32),
    }
    return pairs, predicted.astype(jnp.float32), out


def _push(state: LoopState, pairs: FragmentPairs, prefs: Array, valid: Array | None,
          cfg: LoopConfig) -> tuple[LoopState, dict[str, Array]]:
    """Phase 1, second half: push the round's first ``num_pairs`` pairs with their preferences.

    Args:
      pairs: the ``P_max`` pairs of :func:`_collect_pairs`.
      prefs: ``f32[P_max]`` probability that the first fragment is preferred
        (entries past ``num_pairs`` are not stored).
      valid: ``bool[P_max]`` the teacher's answered pairs (a skipped pair is
        stored with ``valid=False``, kept out of training), or None (``pairs.valid``).

    Returns:
      ``(state, {"teacher_entropy": mean binary entropy of prefs over the stored valid pairs})``.
    """
    num_pairs = _counts(state, cfg)[0]
    if valid is not None:
        pairs = pairs.replace(valid=pairs.valid & jnp.asarray(valid, bool))
    buffer = pbuf.step(state.buffer, pairs, prefs, pbuf.config(cfg.plan.capacity), count=num_pairs)
    entropy = masked_mean(binary_entropy(jnp.where(pairs.valid, prefs, 0.5)), pairs.valid)
    return state.replace(buffer=buffer), {"teacher_entropy": entropy}


def _collect(state: LoopState, key: Any, cfg: LoopConfig) -> tuple[LoopState, dict[str, Array]]:
    """Phase 1: sample, cut pairs, ask the synthetic teacher, push into the buffer (``state.buffer`` replaced).

    ``_push(_collect_pairs(...), synthetic_preferences(...))``: a host teacher
    (the driver's ``teacher=``) answers between the two halves instead.
    """
    pairs, _, out = _collect_pairs(state, key, cfg)
    k_pref = _round_keys(key)[2]
    prefs, entropy = synthetic_preferences(
        k_pref, pairs, temperature=cfg.temperature, discount=cfg.discount, sample=cfg.sample,
        threshold=cfg.threshold,
    )
    state, _ = _push(state, pairs, prefs, None, cfg)
    # the synthetic teacher's entropy: of its probabilities, not of its Bernoulli draws
    return state, {**out, "teacher_entropy": entropy}


def _fit_reward(state: LoopState, key: Any, cfg: LoopConfig) -> tuple[LoopState, dict[str, Array]]:
    """Phase 2: train the reward model(s) on the buffer and renormalise the agent's reward."""
    _, _, _, epochs = _counts(state, cfg)
    k_reward = _round_keys(key)[3]
    reward, rm = training.epoch(state.reward, k_reward, state.buffer, cfg.trainer, epochs=epochs)
    shift, scale = _reward_stats(cfg, reward.params, state.buffer)
    out = {"reward_loss": jnp.mean(rm["train/loss"]), "reward_accuracy": jnp.mean(rm["train/accuracy"]),
           "n_invalid": rm.get("n_invalid", jnp.zeros((), jnp.int32))}
    return state.replace(reward=reward, reward_shift=shift, reward_scale=scale), out


def _fit_agent(state: LoopState, key: Any, cfg: LoopConfig) -> tuple[LoopState, dict[str, Array]]:
    """Phase 3: train the agent on the learned reward (``agent_steps`` of the round)."""
    gen = cfg.generator
    _, _, agent_steps, _ = _counts(state, cfg)
    k_agent = _round_keys(key)[4]
    agent = {} if cfg.agent_hparams is None else {"hparams": cfg.agent_hparams}
    gen_state = gen.train(state.gen, k_agent, agent_steps, agent_reward(state, cfg), **agent)
    trained = gen.trained_steps(gen_state) if hasattr(gen, "trained_steps") else jnp.zeros((), jnp.int32)
    return state.replace(gen=gen_state), {"agent_steps": agent_steps, "agent_steps_trained": trained}


def _finish(state: LoopState, key: Any, cfg: LoopConfig, parts: dict[str, Array]) -> tuple[LoopState, dict[str, Array]]:
    """Phase 4: evaluate the agent, count the buffer, close the round (``round + 1``) and shape the metrics."""
    gen = cfg.generator
    if cfg.eval_episodes and hasattr(gen, "evaluate"):
        gt_return = jnp.mean(gen.evaluate(state.gen, _round_keys(key)[5], cfg.eval_episodes))
        gt_episodes = cfg.eval_episodes
    else:  # not measured: 0, and gt_episodes says so
        gt_return, gt_episodes = jnp.zeros((), jnp.float32), 0
    out = dict(parts, round=state.round, buffer_size=state.buffer.size, gt_return=gt_return,
               gt_episodes=gt_episodes, stored_valid=jnp.sum(buffer_mask(state.buffer), dtype=jnp.int32))
    out = {k: jnp.reshape(jnp.asarray(out[k]), ()).astype(d) for k, d in ROUND_METRICS.items()}
    return state.replace(round=state.round + 1), out


#: the phases of a round, in order (the host driver compiles each as its own program)
_PHASES: dict[str, Callable[..., tuple[LoopState, dict[str, Array]]]] = {
    "collect": _collect, "fit_reward": _fit_reward, "fit_agent": _fit_agent,
}


def step(state: LoopState, key: Any, cfg: LoopConfig) -> tuple[LoopState, dict[str, Array]]:
    """Round ``state.round`` of the plan (pure; jittable, vmappable over states and keys).

    The round runs in four phases, each a function of the state and the
    round's key: collect (sample, pairs, synthetic teacher, buffer), fit the reward
    model, fit the agent, finish (evaluate, count). The host driver compiles
    the phases as separate programs; here they trace into one.

    Returns:
      ``(state, out)`` with the scalar metrics of :data:`ROUND_METRICS`:
      ``reward_loss`` / ``reward_accuracy`` (final epoch, member mean),
      ``fresh_accuracy`` / ``fresh_decided`` (the previous round's reward model
      on this round's new pairs, before training on them: a held-out accuracy;
      0 when no new pair is decided), ``sample_return`` (true return of the
      sampled episodes), ``gt_return`` / ``gt_episodes`` (mean true return of
      ``gt_episodes`` evaluation episodes; 0 and 0 without evaluation), the terminal
      horizons, ``n_invalid`` (stored pairs left out of reward training for
      bad data), ``n_nonfinite`` (sampled transitions with a non-finite reward
      or observation), and the round's counts.
    """
    parts: dict[str, Array] = {}
    for phase in _PHASES.values():
        state, out = phase(state, key, cfg)
        parts.update(out)
    return _finish(state, key, cfg, parts)


def round_key(key: Any, i: Any) -> Array:
    """The key of round ``i`` of a run with run key ``key`` (every round splits the chain once)."""
    chain = jax.lax.fori_loop(0, jnp.asarray(i, jnp.int32), lambda _, k: jax.random.split(k)[0], as_key(key))
    return jax.random.split(chain)[1]


def rounds(state: LoopState, key: Any, cfg: LoopConfig, start: Any, stop: Any) -> tuple[LoopState, dict]:
    """Rounds ``start .. stop - 1`` in one ``fori_loop`` with traced bounds (the driver's compiled program).

    Returns ``(state, out)`` with ``out`` ``[K + 1]`` per name (rows outside ``[start, stop)`` are zeros).
    """
    n = cfg.plan.num_rounds
    zeros = {k: jnp.zeros((n,), d) for k, d in ROUND_METRICS.items()}
    key = as_key(key)

    def body(i, carry):
        st, rows = carry
        st, m = step(st.replace(round=jnp.asarray(i, jnp.int32)), round_key(key, i), cfg)
        return st, {k: rows[k].at[i].set(m[k]) for k in rows}

    return jax.lax.fori_loop(jnp.asarray(start, jnp.int32), jnp.asarray(stop, jnp.int32), body, (state, zeros))


def run(state: LoopState, key: Any, cfg: LoopConfig) -> tuple[LoopState, dict[str, Array]]:
    """All remaining rounds (``state.round .. K``) as one pure function (jittable, vmappable over seeds).

    Returns:
      ``(state, out)``, every metric with a leading round axis ``K + 1`` (rows of rounds done before are 0).
    """
    return rounds(state, key, cfg, state.round, cfg.plan.num_rounds)


def metrics_dict(out: dict[str, Any], cfg: LoopConfig | None = None) -> dict[str, float]:
    """Flat ``{"preference/loop/<name>": float}`` of a round's ``out`` (host side; mean over seeds).

    A metric of :data:`MEASURED_BY` is averaged over the seeds where its count
    is positive (0.0 where no seed measured it); other values NaN-aware.
    """
    host = jax.device_get(dict(out))
    flat = {}
    for name, v in host.items():
        a = np.asarray(v, np.float64)
        count = MEASURED_BY.get(name)
        keep = np.isfinite(a)
        if count in host:
            keep &= np.broadcast_to(np.asarray(host[count]) > 0, a.shape)
        fin = a[keep]
        flat[f"preference/loop/{name}"] = float(fin.mean()) if fin.size else (0.0 if count in host else float("nan"))
    return flat
