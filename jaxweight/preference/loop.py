"""The preference-comparisons training loop (imitation ``PreferenceComparisons``), jittable and vmappable.

Round ``i`` of ``K + 1`` (``K = num_iterations``; the counts come from
:func:`~jaxweight.preference.allocate_comparisons`, ``n_0`` being the initial
comparisons) does what imitation's ``PreferenceComparisons.train`` does::

    sample ceil(transition_oversampling * 2 * n_i * fragment_length) transitions from the generator
    refuse them if terminal episodes differ in length (unless allow_variable_horizon)
    cut n_i fragment pairs, ask the synthetic teacher, push them into the FIFO buffer
    train the reward model (epochs x initial_epoch_multiplier on round 0, x 1 after)
    train the agent for total_timesteps // K steps (+ the remainder on round K - 1)

Everything in a round is array code over fixed shapes: the round's pair count
and step counts are traced integers (the fragmenter draws ``max n_i`` pairs and
marks the surplus invalid; the buffer stores only the first ``n_i``; the
epoch count is a traced loop bound too), so one compiled program serves every
round. Keys are explicit: the loop state carries a key that every round
splits. Hence

- :meth:`PreferenceComparisons.run` is the whole run as one pure function,
  ``jax.jit``-able and ``jax.vmap``-able over seeds (or over any array
  hyperparameter of the states);
- :meth:`PreferenceComparisons.train` is imitation's host-side entry point: it
  runs the same jitted round function round by round (vmapped over
  ``num_seeds`` seeds when asked), shows a progress bar with the reward loss,
  the reward accuracy and the agent's ground-truth return, calls
  ``callback(round)``, and with ``checkpoint_dir`` saves the full loop state
  (agent, reward ensemble, optimiser states, buffer, round counter, key) after
  every round with :mod:`jaxweight.checkpoint`; ``resume=True`` continues a
  killed run from its last finished round and ends bit-identical to an
  uninterrupted run.

The agent never sees the true reward: :class:`~jaxweight.preference.generators.AgentGenerator`
trains on :func:`learned_reward_fn` of the reward module, whose params
(:class:`AgentReward`) ride inside the environment params, so a new reward
model never recompiles the agent. The true reward is used only by the
synthetic teacher and for evaluation.

Example::

    env, env_params = make_env("cartpole")
    net = reward_net(env)                    # a RewardMLP on tanh-squashed states
    pc = PreferenceComparisons(
        AgentGenerator(env, env_params), net, num_iterations=10, fragment_length=20,
        reward_trainer=RewardTrainer(net, num_members=3, progress=False), sample=False,
    )
    result = pc.train(0, total_timesteps=1_000_000, total_comparisons=2_000, num_seeds=4)
    result["reward_accuracy"]          # f32[4], one per seed
    pc.history[-1]["gt_return"]        # ground-truth return of each seed's agent

References:
  imitation ``algorithms/preference_comparisons.py`` (v1.0.1);
  Christiano et al. 2017, arXiv:1706.03741; seals (fixed-horizon environments).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from tqdm import tqdm

from .. import checkpoint
from .._util import as_key, check_static_int
from .buffer import PreferenceBuffer, buffer_init, buffer_mask
from .data import FragmentPairs, Trajectories, discounted_returns, example_inputs
from .fragments import active_selection, random_fragments
from .gatherers import synthetic_preferences
from .reward_nets import ensemble_apply, ensemble_reward, num_members
from .schedules import allocate_comparisons
try:  # the agent generators need gymnax (the ``rl`` extra); datasets and the loop itself do not
    from .generators import HostGenerator
except ImportError:  # pragma: no cover - exercised only without gymnax
    HostGenerator = ()
from .training import RewardTrainer, TrainerConfig, TrainerState, num_epochs, prepare_data, train_epoch

__all__ = [
    "PreferenceComparisons",
    "LoopState",
    "LoopHParams",
    "LoopPlan",
    "RoundInput",
    "AgentReward",
    "learned_reward_fn",
    "push_first",
    "train_reward",
    "predicted_rewards",
    "reward_correlation",
    "preference_accuracy",
    "VARIABLE_HORIZON_MESSAGE",
]

Array = jax.Array
logger = logging.getLogger("jaxweight.preference")

CHECKPOINT_NAME = "loop_state.ckpt"

VARIABLE_HORIZON_MESSAGE = (
    "Episodes of different length detected: {horizons}. Variable horizon environments are discouraged -- "
    "termination conditions leak information about reward. See "
    "https://imitation.readthedocs.io/en/latest/getting-started/variable-horizon.html for more information. "
    "If you are SURE you want to run imitation on a variable horizon task, then please pass in the flag: "
    "`allow_variable_horizon=True`."
)

_ALLOW_VARIABLE_HORIZON_WARNING = (
    "Running with `allow_variable_horizon` set to True. Some algorithms are biased towards shorter or longer "
    "episodes, which may significantly confound results. Additionally, even unbiased algorithms can exploit "
    "the information leak from the termination condition, producing spuriously high performance. See "
    "https://imitation.readthedocs.io/en/latest/getting-started/variable-horizon.html for more information."
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
        if self.ensemble:
            r = ensemble_reward(self.module, rp.params, *inputs, alpha=rp.alpha)
        else:
            r = self.module.apply(rp.params, *inputs)
        return (jnp.asarray(r, jnp.float32) - rp.shift) * rp.scale


def predicted_rewards(module: nn.Module, params: Any, trajectories: Trajectories, ensemble: bool | None = None) -> Array:
    """Learned reward of every transition: ``f32[N, T]`` (the member mean for ensembles).

    Args:
      module: reward module.
      params: its params (member-stacked for ensembles).
      trajectories: padded episodes (padding steps get rewards too; mask them
        with ``trajectories.step_mask()``).
      ensemble: whether ``params`` is member-stacked (default: guessed from the
        leading axis of the first leaf against ``module.init``'s shapes).
    """
    inputs = trajectories.transitions()
    if ensemble is None:
        ensemble = _is_ensemble(module, params, trajectories)
    if ensemble:
        return jnp.mean(ensemble_apply(module, params, *inputs), axis=-1)
    return jnp.asarray(module.apply(params, *inputs), jnp.float32)


def _is_ensemble(module, params, data) -> bool:
    return num_members(module, params, example_inputs(data)) is not None


def reward_correlation(module: nn.Module, params: Any, trajectories: Trajectories, ensemble: bool | None = None) -> Array:
    """Pearson correlation ``f32[]`` of learned and true rewards over the real transitions of ``trajectories``.

    The learned reward of a preference model is only defined up to a
    positive affine map, so correlation (not error) measures its quality.
    """
    pred = predicted_rewards(module, params, trajectories, ensemble)
    mask = trajectories.step_mask().astype(jnp.float32)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    true = jnp.asarray(trajectories.rews, jnp.float32)
    mp, mt = jnp.sum(pred * mask) / n, jnp.sum(true * mask) / n
    dp, dt = (pred - mp) * mask, (true - mt) * mask
    return jnp.sum(dp * dt) / jnp.sqrt(jnp.maximum(jnp.sum(dp * dp) * jnp.sum(dt * dt), 1e-30))


def preference_accuracy(
    module: nn.Module, params: Any, pairs: FragmentPairs, *, discount: Any = 1.0, ensemble: bool | None = None
) -> tuple[Array, Array]:
    """Accuracy of the learned reward on comparisons, against the noiseless teacher.

    A pair is decided when its true (discounted) returns differ; the model is
    right when the fragment with the higher predicted return (member mean) is
    the one with the higher true return. Ties carry no preference and are
    left out (a noisy teacher labels them at random).

    Args:
      module: reward module.
      params: its params.
      pairs: ``[P, ...]`` fragment pairs (only ``valid`` ones count).
      discount: discount of both returns.
      ensemble: whether ``params`` is member-stacked (default: guessed).

    Returns:
      ``(accuracy f32[], decided i32[])``: the fraction of decided pairs ranked
      right (NaN when none is decided), and how many were decided.
    """
    inputs = pairs.transitions()
    if ensemble is None:
        ensemble = _is_ensemble(module, params, pairs)
    if ensemble:
        r = jnp.mean(ensemble_apply(module, params, *inputs), axis=-1)
    else:
        r = jnp.asarray(module.apply(params, *inputs), jnp.float32)
    pred = discounted_returns(r, discount)  # [P, 2]
    true = discounted_returns(pairs.rews, discount)
    decided = jnp.asarray(pairs.valid, bool) & (true[:, 0] != true[:, 1])
    right = (pred[:, 0] > pred[:, 1]) == (true[:, 0] > true[:, 1])
    n = jnp.sum(decided, dtype=jnp.int32)
    acc = jnp.sum(right & decided) / jnp.maximum(n, 1).astype(jnp.float32)
    return jnp.where(n > 0, acc, jnp.nan).astype(jnp.float32), n


# ------------------------------------------------------------ buffer helper
def push_first(buf: PreferenceBuffer, pairs: FragmentPairs, prefs: Array, count: Any) -> PreferenceBuffer:
    """``buffer_push(buf, pairs[:count], prefs[:count])`` with a traced ``count`` (jittable).

    The first ``count`` of the ``P`` pairs are written in order, evicting the
    oldest stored pairs; with ``count > capacity`` only the newest
    ``capacity`` of them survive, exactly as :func:`buffer_push`.

    Args:
      buf: the buffer.
      pairs: ``P`` pairs shaped like the buffer's.
      prefs: ``f32[P]``.
      count: ``i32[]`` in ``[0, P]``.
    """
    cap = buf.capacity
    p = pairs.num_pairs
    if tuple(np.shape(prefs)) != (p,):
        raise ValueError(f"Unexpected preferences shape {tuple(np.shape(prefs))}, expected {(p,)}")
    if cap == 0 or p == 0:
        return buf
    count = jnp.clip(jnp.asarray(count, jnp.int32), 0, p)
    i = jnp.arange(p, dtype=jnp.int32)
    keep = (i < count) & (i >= count - cap)
    slots = jnp.where(keep, (buf.next + i) % cap, cap)  # `cap` is out of range: dropped

    def write(store, x):
        return store.at[slots].set(jnp.asarray(x, store.dtype), mode="drop")

    return PreferenceBuffer(
        pairs=jax.tree.map(write, buf.pairs, pairs),
        prefs=write(buf.prefs, jnp.asarray(prefs, jnp.float32)),
        size=jnp.minimum(buf.size + count, cap).astype(jnp.int32),
        next=((buf.next + count) % cap).astype(jnp.int32),
    )


def train_reward(
    config: TrainerConfig, state: TrainerState, key: Any, buffer: PreferenceBuffer, n_epochs: Any
) -> tuple[TrainerState, dict[str, Array]]:
    """:func:`~jaxweight.preference.train_epochs` with a traced epoch count, returning the last epoch's metrics.

    Same keys and results as ``train_epochs(config, state, key, buffer, n)``
    (the data split and bootstrap from the first half of ``key``, epoch ``e``
    from ``fold_in(second half, e)``); a traced ``n_epochs`` lets round 0
    (``initial_epoch_multiplier`` epochs) and the later rounds share one
    compiled program.

    Args:
      config: the trainer config (static).
      state: trainer state.
      key: key of this training call.
      buffer: the comparisons.
      n_epochs: ``i32[]`` >= 1.

    Returns:
      ``(state, metrics)``: the metrics of the last epoch (``f32[]`` or ``f32[M]``).
    """
    k_prep, k_epochs = jax.random.split(as_key(key))
    data = prepare_data(config, k_prep, buffer)
    shapes = jax.eval_shape(lambda: train_epoch(config, state, k_epochs, buffer, data)[1])
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

    def body(e, carry):
        st, _ = carry
        return train_epoch(config, st, jax.random.fold_in(k_epochs, e), buffer, data)

    return jax.lax.fori_loop(0, jnp.asarray(n_epochs, jnp.int32), body, (state, zeros))


# ------------------------------------------------------------ state / plan
@struct.dataclass
class LoopHParams:
    """Continuous settings of the loop (``f32[]`` leaves: vmappable, never recompile).

    Attributes:
      temperature, discount, threshold: the synthetic teacher
        (:func:`~jaxweight.preference.synthetic_preferences`).
      alpha: the agent's exploration bonus ``mean + alpha * std`` (ensembles).
    """

    temperature: Array
    discount: Array
    threshold: Array
    alpha: Array


@struct.dataclass
class LoopState:
    """The full state of a preference-comparisons run (everything a checkpoint needs).

    Attributes:
      gen: the trajectory generator's state (the PPO agent, its optimiser and envs).
      reward: :class:`~jaxweight.preference.TrainerState` of the reward model(s).
      buffer: the :class:`~jaxweight.preference.PreferenceBuffer` of comparisons.
      hparams: :class:`LoopHParams`.
      reward_shift, reward_scale: ``f32[]`` normalisation of the agent's reward
        (set after every reward training from the buffer's transitions).
      round: ``i32[]`` finished rounds.
      key: the run's key; every round splits it.
    """

    gen: Any
    reward: TrainerState
    buffer: PreferenceBuffer
    hparams: LoopHParams
    reward_shift: Array
    reward_scale: Array
    round: Array
    key: Array


@struct.dataclass
class RoundInput:
    """Per-round counts (``i32[]``; traced, so all rounds share one program)."""

    num_pairs: Array
    sample_steps: Array
    agent_steps: Array
    epochs: Array


@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """The host-side schedule of a run (static; fixes the shapes of the compiled round).

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

    def round_input(self, i: int) -> RoundInput:
        """The counts of round ``i`` as ``i32[]`` arrays."""
        f = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
        return RoundInput(f(self.schedule[i]), f(self.sample_steps[i]), f(self.agent_steps[i]), f(self.epochs[i]))

    def round_inputs(self) -> RoundInput:
        """The counts of every round, ``i32[K + 1]`` each (the ``xs`` of a ``lax.scan`` over rounds)."""
        f = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
        return RoundInput(f(self.schedule), f(self.sample_steps), f(self.agent_steps), f(self.epochs))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ------------------------------------------------------------ the loop
class PreferenceComparisons:
    """imitation's ``PreferenceComparisons`` with explicit keys, fixed shapes and a pure round function.

    Args:
      generator: a pure trajectory generator with ``init(key)``,
        ``sample(state, key, steps, max_steps=)``, ``train(state, key, steps, reward_params)``
        and optionally ``evaluate(state, key, n)`` (true returns) and
        ``trained_steps(state)``: :class:`~jaxweight.preference.generators.AgentGenerator`
        or :class:`~jaxweight.preference.generators.DatasetGenerator`. An
        ``AgentGenerator`` built without a ``reward_apply`` is bound to the
        learned reward (:func:`learned_reward_fn`).
      reward_module: the reward network (e.g. :class:`~jaxweight.preference.RewardMLP`).
      num_iterations: ``K``, rounds after the initial one.
      fragment_length: ``L`` (default 100, as imitation).
      transition_oversampling: transitions sampled per fragment transition (default 1).
      initial_comparison_frac: share of comparisons asked before the agent trains (default 0.1).
      initial_epoch_multiplier: epoch multiplier of the first reward training (default 200).
      comparison_queue_size: buffer capacity; ``None`` keeps every comparison (capacity
        ``total_comparisons``).
      query_schedule: ``"constant"``, ``"hyperbolic"`` (default), ``"inverse_quadratic"`` or a callable.
      allow_variable_horizon: accept samples whose terminal episodes differ in
        length (default False: such samples raise ``ValueError``, as imitation).
      reward_trainer: a :class:`~jaxweight.preference.RewardTrainer` for
        ``reward_module`` (default: a single net with imitation's defaults).
      fragmenter: ``"random"`` (default) or ``"active"`` (ensemble disagreement,
        :func:`~jaxweight.preference.active_selection`).
      active_sample_factor, uncertainty_on: active-selection settings.
      temperature, discount, sample, threshold: the synthetic teacher
        (imitation ``SyntheticGatherer`` defaults 1, 1, True, 50).
      alpha: exploration bonus of the agent's reward for ensembles (default 0).
      normalize_agent_reward: standardise the agent's reward with the mean and
        std of the learned reward over the buffer's transitions (default True).
      eval_episodes: episodes of ground-truth evaluation per round (0: none).
      progress: show a progress bar in :meth:`train`.

    Raises:
      ValueError: bad sizes or fractions, a trainer for another module, a
        generator without the pure protocol.
    """

    def __init__(
        self,
        generator: Any,
        reward_module: nn.Module,
        num_iterations: int,
        fragment_length: int = 100,
        transition_oversampling: float = 1,
        initial_comparison_frac: float = 0.1,
        initial_epoch_multiplier: float = 200.0,
        comparison_queue_size: int | None = None,
        query_schedule: str | Callable[[Any], Any] = "hyperbolic",
        allow_variable_horizon: bool = False,
        *,
        reward_trainer: RewardTrainer | None = None,
        fragmenter: str = "random",
        active_sample_factor: float = 4.0,
        uncertainty_on: str = "logit",
        temperature: float = 1.0,
        discount: float = 1.0,
        sample: bool = True,
        threshold: float = 50.0,
        alpha: float = 0.0,
        normalize_agent_reward: bool = True,
        eval_episodes: int = 8,
        progress: bool = True,
    ):
        if isinstance(generator, HostGenerator):
            raise ValueError("generator must be a pure generator, not a HostGenerator (pass HostGenerator.gen)")
        for name in ("init", "sample", "train"):
            if not callable(getattr(generator, name, None)):
                raise ValueError(
                    f"generator must be a pure generator with init/sample/train (e.g. AgentGenerator), "
                    f"got {type(generator).__name__} without {name!r}"
                )
        self.num_iterations = check_static_int(num_iterations, "num_iterations", 1)
        self.fragment_length = check_static_int(fragment_length, "fragment_length", 1)
        if not float(transition_oversampling) >= 1:
            raise ValueError(f"transition_oversampling must be >= 1, got {transition_oversampling!r}")
        self.transition_oversampling = transition_oversampling
        if not 0.0 <= float(initial_comparison_frac) <= 1.0:
            raise ValueError(f"initial_comparison_frac must be in [0, 1], got {initial_comparison_frac!r}")
        self.initial_comparison_frac = float(initial_comparison_frac)
        self.initial_epoch_multiplier = float(initial_epoch_multiplier)
        if comparison_queue_size is not None:
            comparison_queue_size = check_static_int(comparison_queue_size, "comparison_queue_size", 1)
        self.comparison_queue_size = comparison_queue_size
        self.query_schedule = query_schedule
        allocate_comparisons(10, 1, 0.5, query_schedule)  # fails early on an unknown schedule
        self.allow_variable_horizon = bool(allow_variable_horizon)
        if self.allow_variable_horizon:
            logger.warning(_ALLOW_VARIABLE_HORIZON_WARNING)
        if fragmenter not in ("random", "active"):
            raise ValueError(f"fragmenter must be 'random' or 'active', got {fragmenter!r}")
        self.fragmenter = fragmenter
        self.active_sample_factor = float(active_sample_factor)
        self.uncertainty_on = uncertainty_on
        self.sample_labels = bool(sample)
        self.eval_episodes = check_static_int(eval_episodes, "eval_episodes", 0)
        self.progress = bool(progress)
        self.normalize_agent_reward = bool(normalize_agent_reward)

        self.reward_module = reward_module
        if reward_trainer is None:
            reward_trainer = RewardTrainer(reward_module, progress=False)
        if not isinstance(reward_trainer, RewardTrainer):
            raise ValueError(f"reward_trainer must be a RewardTrainer, got {type(reward_trainer).__name__}")
        if reward_trainer.module != reward_module:
            raise ValueError("reward_trainer trains another module than reward_module")
        if fragmenter == "active" and not reward_trainer.ensemble:
            raise ValueError("fragmenter='active' needs an ensemble reward_trainer (num_members >= 2)")
        self.reward_trainer = reward_trainer
        self.ensemble = reward_trainer.ensemble

        if getattr(generator, "reward_apply", "absent") is None and hasattr(generator, "with_reward"):
            generator = generator.with_reward(learned_reward_fn(reward_module, self.ensemble))
        self.generator = generator
        horizons = getattr(generator, "horizons", None)
        if horizons is not None and len(set(horizons)) > 1 and not self.allow_variable_horizon:
            raise ValueError(VARIABLE_HORIZON_MESSAGE.format(horizons=sorted(set(horizons))))

        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        self.hparams = LoopHParams(f32(temperature), f32(discount), f32(threshold), f32(alpha))
        self._compiled: dict = {}
        self.state: LoopState | None = None
        self.history: list[dict] = []
        self._iteration = 0

    # -------------------------------------------------------------- planning
    def plan(self, total_timesteps: int, total_comparisons: int) -> LoopPlan:
        """The per-round schedule of a run (host; imitation's arithmetic).

        Raises:
          ValueError: negative totals; a round with 0 comparisons ("the schedule
            gives round i 0 comparisons"); too little data for the trainer's
            validation split.
        """
        total_timesteps = check_static_int(total_timesteps, "total_timesteps", 0)
        total_comparisons = check_static_int(total_comparisons, "total_comparisons", 1)
        k = self.num_iterations
        schedule = allocate_comparisons(total_comparisons, k, self.initial_comparison_frac, self.query_schedule)
        zero = [i for i, n in enumerate(schedule) if n == 0]
        if zero:
            raise ValueError(
                f"the query schedule gives round {zero[0]} 0 comparisons (schedule {schedule}): raise "
                f"total_comparisons ({total_comparisons}) or initial_comparison_frac, or lower num_iterations"
            )
        tpi, extra = divmod(total_timesteps, k)
        agent = [tpi + (extra if i == k - 1 else 0) for i in range(k + 1)]
        samples = [math.ceil(self.transition_oversampling * 2 * n * self.fragment_length) for n in schedule]
        e = self.reward_trainer.config.epochs
        epochs = [num_epochs(e, self.initial_epoch_multiplier if i == 0 else 1.0) for i in range(k + 1)]
        cap = self.comparison_queue_size if self.comparison_queue_size is not None else total_comparisons
        cfg = self.reward_trainer.config
        if cfg.has_updater:
            stored = np.minimum(np.cumsum(schedule), cap)
            for n in stored:
                val = int(int(n) * cfg.val_split)
                if val < 1 or int(n) - val < 1:
                    raise ValueError(
                        "Not enough data samples to split into training and validation, or the validation "
                        "split is too large/small. Make sure you've generated enough initial preference data. "
                        "You can adjust this through initial_comparison_frac in PreferenceComparisons."
                    )
        return LoopPlan(tuple(schedule), tuple(samples), tuple(agent), tuple(epochs), int(cap))

    # -------------------------------------------------------------- init
    def _example_pairs(self) -> FragmentPairs:
        def make(key):
            st = self.generator.init(key)
            trajs = self.generator.sample(st, key, 1, max_steps=1)
            return random_fragments(key, trajs, self.fragment_length, 1)

        shapes = jax.eval_shape(make, jax.random.key(0))
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def init(self, key: Any, capacity: int) -> LoopState:
        """A fresh run: generator, reward model(s) and an empty buffer of ``capacity`` pairs (jittable, vmappable).

        Args:
          key: key or int seed.
          capacity: buffer capacity (static; ``plan(...).capacity``).
        """
        capacity = check_static_int(capacity, "capacity", 1)
        key = as_key(key)
        k_gen, k_reward, k_loop = jax.random.split(key, 3)
        example = self._example_pairs()
        reward = self.reward_trainer.init(k_reward, example_inputs(example))
        return LoopState(
            gen=self.generator.init(k_gen),
            reward=reward,
            buffer=buffer_init(capacity, example),
            hparams=self.hparams,
            reward_shift=jnp.zeros((), jnp.float32),
            reward_scale=jnp.ones((), jnp.float32),
            round=jnp.zeros((), jnp.int32),
            key=k_loop,
        )

    # -------------------------------------------------------------- one round
    def agent_reward(self, state: LoopState) -> AgentReward:
        """The :class:`AgentReward` the agent trains on after the last finished round."""
        return AgentReward(state.reward.params, state.hparams.alpha, state.reward_shift, state.reward_scale)

    def _fragments(self, key, state: LoopState, trajs: Trajectories, num_pairs: int) -> FragmentPairs:
        if self.fragmenter == "random":
            return random_fragments(key, trajs, self.fragment_length, num_pairs, warning_threshold=0)
        return active_selection(
            key, state.reward.params, self.reward_module, trajs, self.fragment_length, num_pairs,
            self.active_sample_factor, self.uncertainty_on, noise_prob=state.reward.hparams.noise_prob,
            discount=state.reward.hparams.discount, threshold=state.reward.hparams.threshold, warning_threshold=0,
        )

    def _reward_stats(self, params, buffer: PreferenceBuffer) -> tuple[Array, Array]:
        """Mean and ``1 / std`` of the learned reward over every transition stored in the buffer.

        The buffer holds fragments from every round's policy, so these statistics
        move slowly; those of the latest samples alone collapse once the agent
        is good (all its states look alike) and would blow the agent's rewards up.
        """
        if not self.normalize_agent_reward:
            return jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
        inputs = buffer.pairs.transitions()  # [cap, 2, L]
        if self.ensemble:
            r = jnp.mean(ensemble_apply(self.reward_module, params, *inputs), axis=-1)
        else:
            r = jnp.asarray(self.reward_module.apply(params, *inputs), jnp.float32)
        mask = jnp.broadcast_to(buffer_mask(buffer)[:, None, None], r.shape).astype(jnp.float32)
        n = jnp.maximum(jnp.sum(mask), 1.0)
        mean = jnp.sum(r * mask) / n
        std = jnp.sqrt(jnp.sum(jnp.square(r - mean) * mask) / n)
        return mean.astype(jnp.float32), (1.0 / jnp.maximum(std, 1e-6)).astype(jnp.float32)

    def round_step(self, plan: LoopPlan, state: LoopState, x: RoundInput) -> tuple[LoopState, dict]:
        """One round (pure; jit with ``plan`` static, vmap over states).

        Args:
          plan: the run's :class:`LoopPlan` (fixes the shapes).
          state: the loop state.
          x: this round's counts (traced: every round runs the same program).

        Returns:
          ``(state, metrics)`` with ``f32[]``/``i32[]``/``bool[]`` metrics:
          ``round``, ``num_pairs``, ``buffer_size``, ``sample_steps``,
          ``agent_steps``, ``agent_steps_trained`` (cumulative, whole PPO
          updates), ``reward_loss``, ``reward_accuracy`` (final epoch, member
          mean), ``teacher_entropy``, ``fresh_accuracy`` / ``fresh_decided``
          (:func:`preference_accuracy` of the previous round's reward model on
          this round's new pairs, before training on them: a held-out accuracy), ``sample_return`` (mean true return of the
          sampled episodes), ``gt_return`` (mean true return of
          ``eval_episodes`` evaluation episodes; NaN without), ``variable_horizon``,
          ``horizon_min``, ``horizon_max`` (terminal episode lengths of the samples).
        """
        gen = self.generator
        k_next, k_round = jax.random.split(state.key)
        k_sample, k_frag, k_pref, k_reward, k_agent, k_eval = jax.random.split(k_round, 6)
        p_max = plan.max_pairs

        trajs = gen.sample(state.gen, k_sample, x.sample_steps, max_steps=plan.max_sample_steps)
        lengths = jnp.asarray(trajs.lengths, jnp.int32)
        term = jnp.asarray(trajs.terminal, bool) & (lengths > 0)
        big = jnp.iinfo(jnp.int32).max
        h_min = jnp.min(jnp.where(term, lengths, big))
        h_max = jnp.max(jnp.where(term, lengths, -1))
        variable = jnp.sum(term) > 0
        variable = variable & (h_min != h_max)

        pairs = self._fragments(k_frag, state, trajs, p_max)
        pairs = pairs.replace(valid=pairs.valid & (jnp.arange(p_max) < x.num_pairs))
        # the reward model of the last round judged on this round's comparisons before it trains on
        # them: a held-out accuracy for free (noiseless teacher, ties left out)
        fresh_acc, fresh_decided = preference_accuracy(
            self.reward_module, state.reward.params, pairs, discount=state.hparams.discount, ensemble=self.ensemble
        )
        hp = state.hparams
        prefs, entropy = synthetic_preferences(
            k_pref, pairs, temperature=hp.temperature, discount=hp.discount, sample=self.sample_labels,
            threshold=hp.threshold,
        )
        buffer = push_first(state.buffer, pairs, prefs, x.num_pairs)

        reward, rm = train_reward(self.reward_trainer.config, state.reward, k_reward, buffer, x.epochs)
        loss = jnp.mean(rm["train/loss"])
        acc = jnp.mean(rm["train/accuracy"])
        shift, scale = self._reward_stats(reward.params, buffer)
        agent_reward = AgentReward(reward.params, hp.alpha, shift, scale)
        gen_state = gen.train(state.gen, k_agent, x.agent_steps, agent_reward)

        if self.eval_episodes and hasattr(gen, "evaluate"):
            gt_return = jnp.mean(gen.evaluate(gen_state, k_eval, self.eval_episodes))
        else:
            gt_return = jnp.full((), jnp.nan, jnp.float32)
        used = lengths > 0
        ep_returns = jnp.sum(jnp.where(trajs.step_mask(), trajs.rews, 0.0), axis=1)
        sample_return = jnp.sum(jnp.where(used, ep_returns, 0.0)) / jnp.maximum(jnp.sum(used), 1)
        trained = gen.trained_steps(gen_state) if hasattr(gen, "trained_steps") else jnp.zeros((), jnp.int32)

        new = state.replace(
            gen=gen_state, reward=reward, buffer=buffer, reward_shift=shift, reward_scale=scale,
            round=state.round + 1, key=k_next,
        )
        metrics = {
            "round": state.round,
            "num_pairs": x.num_pairs,
            "buffer_size": buffer.size,
            "stored_valid": jnp.sum(buffer_mask(buffer), dtype=jnp.int32),
            "sample_steps": x.sample_steps,
            "agent_steps": x.agent_steps,
            "agent_steps_trained": jnp.asarray(trained, jnp.int32),
            "reward_loss": loss.astype(jnp.float32),
            "reward_accuracy": acc.astype(jnp.float32),
            "teacher_entropy": jnp.asarray(entropy, jnp.float32),
            "fresh_accuracy": jnp.asarray(fresh_acc, jnp.float32),
            "fresh_decided": jnp.asarray(fresh_decided, jnp.int32),
            "sample_return": sample_return.astype(jnp.float32),
            "gt_return": jnp.asarray(gt_return, jnp.float32),
            "variable_horizon": variable,
            "horizon_min": jnp.where(jnp.sum(term) > 0, h_min, 0),
            "horizon_max": jnp.where(jnp.sum(term) > 0, h_max, 0),
        }
        return new, metrics

    # -------------------------------------------------------------- whole run
    def run(self, state: LoopState, total_timesteps: int, total_comparisons: int) -> tuple[LoopState, dict]:
        """The whole run as one pure function (jittable with the totals static; vmappable over states).

        All ``K + 1`` rounds run in one ``lax.scan`` over :meth:`LoopPlan.round_inputs`.
        ``state`` comes from :meth:`init` with ``plan(total_timesteps, total_comparisons).capacity``.

        Returns:
          ``(state, metrics)``, every metric with a leading round axis ``K + 1``.

        Example::

            cap = pc.plan(T, C).capacity
            run = jax.jit(jax.vmap(lambda k: pc.run(pc.init(k, cap), T, C)))
            states, metrics = run(jax.random.split(jax.random.key(0), 4))   # 4 seeds, one program
        """
        plan = self.plan(total_timesteps, total_comparisons)
        return jax.lax.scan(partial(self.round_step, plan), state, plan.round_inputs())

    # -------------------------------------------------------------- host driver
    def _round_fn(self, plan: LoopPlan, batched: bool):
        key = (plan, batched)
        if key not in self._compiled:
            fn = partial(self.round_step, plan)
            if batched:
                fn = jax.vmap(fn, in_axes=(0, None))
            self._compiled[key] = jax.jit(fn)
        return self._compiled[key]

    def _init_fn(self, capacity: int, batched: bool):
        key = ("init", capacity, batched)
        if key not in self._compiled:
            fn = partial(self.init, capacity=capacity)
            self._compiled[key] = jax.jit(jax.vmap(fn) if batched else fn)
        return self._compiled[key]

    def _fingerprint(self, plan: LoopPlan, num_seeds: int | None) -> dict:
        return {
            "plan": plan.to_dict(),
            "num_seeds": num_seeds,
            "fragment_length": self.fragment_length,
            "fragmenter": self.fragmenter,
            "ensemble": self.ensemble,
            "generator": type(self.generator).__name__,
        }

    def train(
        self,
        key: Any,
        total_timesteps: int,
        total_comparisons: int,
        callback: Callable[[int], None] | None = None,
        *,
        num_seeds: int | None = None,
        checkpoint_dir: str | Path | None = None,
        resume: bool = False,
    ) -> dict[str, Any]:
        """Run the loop on the host, round by round (imitation's ``train``).

        Args:
          key: key or int seed of the run (split into ``num_seeds`` run keys when given).
          total_timesteps: agent steps over the whole run.
          total_comparisons: comparisons over the whole run.
          callback: called as ``callback(round)`` after every round (imitation's
            signature); ``self.state`` and ``self.history`` hold the round's results.
          num_seeds: run this many independent seeds at once (one vmapped program).
          checkpoint_dir: save the loop state after every round to
            ``checkpoint_dir/loop_state.ckpt`` (atomic; the history and the plan go
            into its metadata).
          resume: continue from the checkpoint in ``checkpoint_dir`` if there is
            one (its plan and seed count must match), else start fresh.

        Every call is one run from :meth:`init` (or from the checkpoint with
        ``resume``); imitation's object instead keeps its agent and reward model
        across ``train`` calls: here the run's shapes (the buffer capacity)
        depend on ``total_comparisons``, so a longer run is a new plan.

        Returns:
          ``{"reward_loss", "reward_accuracy"}`` of the last round (floats, or
          ``f32[num_seeds]`` arrays); per-round metrics are in ``self.history``
          (one dict of host values per round, per-seed lists when vmapped).

        Raises:
          ValueError: the errors of :meth:`plan`; terminal episodes of different
            lengths without ``allow_variable_horizon`` (the round is not committed);
            a checkpoint of another run.
        """
        plan = self.plan(total_timesteps, total_comparisons)
        batched = num_seeds is not None
        if batched:
            num_seeds = check_static_int(num_seeds, "num_seeds", 1)
            keys = jax.random.split(as_key(key), num_seeds)
        else:
            keys = as_key(key)
        fingerprint = self._fingerprint(plan, num_seeds)
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / CHECKPOINT_NAME
        init = self._init_fn(plan.capacity, batched)
        history: list[dict] = []
        state = None
        if resume and ckpt is not None and ckpt.exists():
            meta = checkpoint.load_metadata(ckpt)
            if meta.get("fingerprint") != json.loads(json.dumps(fingerprint)):
                raise ValueError(
                    f"checkpoint {str(ckpt)!r} belongs to another run (plan, seeds or settings differ); "
                    "use another checkpoint_dir or resume=False"
                )
            state = checkpoint.load(ckpt, jax.eval_shape(init, keys))
            history = list(meta.get("history", []))
        if state is None:
            state = init(keys)
        start = int(np.max(np.asarray(jax.device_get(state.round))))
        self._iteration = start
        bar = tqdm(range(start, plan.num_rounds), total=plan.num_rounds, initial=start, disable=not self.progress,
                   desc="Preference comparisons", unit="round", dynamic_ncols=True)
        for i in bar:
            fn = self._round_fn(plan, batched)
            new_state, metrics = fn(state, plan.round_input(i))
            host = {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
            if bool(np.any(host["variable_horizon"])) and not self.allow_variable_horizon:
                hs = sorted({int(v) for v in np.ravel(host["horizon_min"])} | {int(v) for v in np.ravel(host["horizon_max"])})
                raise ValueError(VARIABLE_HORIZON_MESSAGE.format(horizons=hs))
            state = new_state
            history.append({k: v.tolist() for k, v in host.items()})
            if ckpt is not None:
                checkpoint.save(ckpt, state, metadata={"fingerprint": fingerprint, "history": history,
                                                       "rounds_done": i + 1})
            self.state, self.history = state, history
            self._iteration = i + 1
            bar.set_postfix(_postfix(host))
            if callback is not None:
                callback(i)
        bar.close()
        self.state, self.history = state, history
        last = history[-1] if history else {}
        pick = (lambda v: np.asarray(v, np.float32)) if batched else (lambda v: float(v))
        return {"reward_loss": pick(last.get("reward_loss", np.nan)),
                "reward_accuracy": pick(last.get("reward_accuracy", np.nan))}

    @property
    def dataset(self) -> PreferenceBuffer | None:
        """The comparison buffer of the last run (imitation's ``dataset``)."""
        return None if self.state is None else self.state.buffer


def _postfix(host: dict) -> dict[str, str]:
    out = {"loss": f"{float(np.mean(host['reward_loss'])):.3f}",
           "acc": f"{float(np.mean(host['reward_accuracy'])):.3f}"}
    fresh = np.asarray(host["fresh_accuracy"], np.float64)
    if np.any(np.isfinite(fresh)) and np.all(np.asarray(host["round"]) > 0):
        out["new_acc"] = f"{float(np.nanmean(fresh)):.3f}"
    gt = np.asarray(host["gt_return"], np.float64)
    if np.all(np.isfinite(gt)):
        out["return"] = f"{float(np.mean(gt)):.1f}"
    return out
