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
splits.

The component shape: static settings in a frozen :class:`LoopConfig`
(``pc.config``), continuous hyperparameters as ``f32[]`` leaves of the state
(:class:`LoopHParams` for the teacher, the trainer's and the PPO agent's
hyperparameters in their states), ``pc.init(key, capacity)`` and pure
functions ``pc.round_step(state, x, plan)`` / ``pc.run(state, T, C)``.

ONE compiled program runs the rounds: ``rounds(state, xs, start, stop)``, a
``fori_loop`` over rounds ``start..stop-1`` with traced bounds (jitted once
per plan and seed batching).

- :meth:`PreferenceComparisons.run` calls it once for all rounds: the whole
  run as one pure function, ``jax.jit``-able and ``jax.vmap``-able over seeds
  (or over any array hyperparameter of the states);
- :meth:`PreferenceComparisons.train` (imitation's host-side entry point)
  calls the same compiled program for one round at a time (vmapped over
  ``num_seeds`` seeds when asked), so ``train`` and ``run`` give bit-identical
  metrics for the same keys. Between rounds it checks the horizons, reports
  through ``callback(round)`` and ``progress(round, num_rounds, metrics)``
  (no printing otherwise), and with ``checkpoint_dir`` saves the full loop
  state after every round with :mod:`jaxweight.checkpoint`; ``resume=True``
  continues a killed run from its last finished round and ends bit-identical
  to an uninterrupted run. Every setting that changes results is
  fingerprinted in the checkpoint (:meth:`PreferenceComparisons.fingerprint`);
  resuming with a different one is refused with the list of differing fields
  unless ``allow_changed`` is passed (the change is then logged and stored).

The agent never sees the true reward: :class:`~jaxweight.preference.generators.AgentGenerator`
trains on :func:`learned_reward_fn` of the reward module, whose params
(:class:`AgentReward`) ride inside the environment params, so a new reward
model never recompiles the agent. The true reward is used only by the
synthetic teacher and for evaluation. Non-finite rewards or observations in
the samples are counted (``n_nonfinite``), the pairs they reach are left out
of reward training (``n_invalid``) and of the agent's reward normalisation.

Example::

    env, env_params = make_env("cartpole")
    net = reward_net(env)                    # a RewardMLP on tanh-squashed states
    pc = PreferenceComparisons(
        AgentGenerator(env, env_params), net, num_iterations=10, fragment_length=20,
        reward_trainer=RewardTrainer(net, num_members=3), sample=False,
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
import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import checkpoint
from .._util import StateFileError, as_key, check_choice, check_static_int, check_value, progress_bar, warn_deprecated
from .buffer import PreferenceBuffer, buffer_init, buffer_mask, buffer_push
from .data import FragmentPairs, Trajectories, _discounted_returns, example_inputs
from .fragments import active_selection, random_fragments
from .gatherers import synthetic_preferences
from .reward_nets import _ensemble_reward, ensemble_apply, num_members
from .schedules import allocate_comparisons
try:  # the agent generators need gymnax (the ``rl`` extra); datasets and the loop itself do not
    from .generators import HostGenerator
except ImportError:  # pragma: no cover - exercised only without gymnax
    HostGenerator = ()
from .training import RewardTrainer, TrainerConfig, TrainerState, num_epochs
from .training import train_reward as _train_reward

__all__ = [
    "PreferenceComparisons",
    "LoopConfig",
    "loop_config",
    "LoopState",
    "LoopHParams",
    "LoopPlan",
    "RoundInput",
    "AgentReward",
    "learned_reward_fn",
    "predicted_rewards",
    "reward_correlation",
    "preference_accuracy",
    "tqdm_progress",
    "ROUND_METRICS",
    "VARIABLE_HORIZON_MESSAGE",
    "CHECKPOINT_NAME",
]

Array = jax.Array
logger = logging.getLogger("jaxweight.preference")

CHECKPOINT_NAME = "loop_state.ckpt"
_FINGERPRINT_VERSION = 2

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
            r = _ensemble_reward(self.module, rp.params, inputs, rp.alpha)  # alpha checked by _loop_hparams
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
      discount: discount of both returns, in ``[0, 1]`` (may be traced).
      ensemble: whether ``params`` is member-stacked (default: guessed).

    Returns:
      ``(accuracy f32[], decided i32[])``: the fraction of decided pairs ranked
      right (NaN when none is decided), and how many were decided.

    Raises:
      ValueError: ``discount`` outside ``[0, 1]`` or NaN (eagerly, or through
        ``jaxweight.checked`` when traced).
    """
    check_value(discount, "discount", ge=0.0, le=1.0)
    inputs = pairs.transitions()
    if ensemble is None:
        ensemble = _is_ensemble(module, params, pairs)
    if ensemble:
        r = jnp.mean(ensemble_apply(module, params, *inputs), axis=-1)
    else:
        r = jnp.asarray(module.apply(params, *inputs), jnp.float32)
    pred = _discounted_returns(r, discount)  # [P, 2]
    true = _discounted_returns(pairs.rews, discount)
    decided = jnp.asarray(pairs.valid, bool) & (true[:, 0] != true[:, 1])
    right = (pred[:, 0] > pred[:, 1]) == (true[:, 0] > true[:, 1])
    n = jnp.sum(decided, dtype=jnp.int32)
    acc = jnp.sum(right & decided) / jnp.maximum(n, 1).astype(jnp.float32)
    return jnp.where(n > 0, acc, jnp.nan).astype(jnp.float32), n


# ------------------------------------------------------------ deprecated helpers
def push_first(buf: PreferenceBuffer, pairs: FragmentPairs, prefs: Array, count: Any) -> PreferenceBuffer:
    """Deprecated: ``buffer_push(buf, pairs, prefs, count=count)`` (the one buffer push)."""
    warn_deprecated("loop.push_first(buf, pairs, prefs, count)", "buffer_push(buf, pairs, prefs, count=count)")
    return buffer_push(buf, pairs, prefs, count=count)


def train_reward(
    config: TrainerConfig, state: TrainerState, key: Any, buffer: PreferenceBuffer, n_epochs: Any
) -> tuple[TrainerState, dict[str, Array]]:
    """Deprecated: ``training.train_reward(state, key, buffer, config, epochs=n_epochs)`` (the one train step)."""
    warn_deprecated("loop.train_reward(config, state, key, buffer, n_epochs)",
                    "preference.train_reward(state, key, buffer, config, epochs=n_epochs)")
    return _train_reward(state, key, buffer, config, epochs=n_epochs)


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

    @classmethod
    def create(cls, temperature: Any = 1.0, discount: Any = 1.0, threshold: Any = 50.0,
               alpha: Any = 0.0) -> LoopHParams:
        """Validated hyperparameters (may be traced, e.g. built inside a jitted sweep).

        Raises:
          ValueError: naming the value and its range: ``temperature >= 0``,
            ``discount`` in ``[0, 1]``, ``threshold > 0``, ``alpha`` finite; eagerly,
            or through ``jaxweight.checked`` when traced.
        """
        check_value(temperature, "temperature", ge=0.0)
        check_value(discount, "discount", ge=0.0, le=1.0)
        check_value(threshold, "threshold", gt=0.0)
        check_value(alpha, "alpha")
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(f32(temperature), f32(discount), f32(threshold), f32(alpha))


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


# ------------------------------------------------------------ static config
@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Static settings of the loop (hashable; part of the compiled program). Build with :func:`loop_config`.

    Attributes:
      num_iterations: ``K``, rounds after the initial one.
      fragment_length: ``L``.
      transition_oversampling: transitions sampled per fragment transition (>= 1).
      initial_comparison_frac: share of comparisons asked before the agent trains, in ``[0, 1]``.
      initial_epoch_multiplier: epoch multiplier of the first reward training (>= 0).
      comparison_queue_size: buffer capacity (``None``: ``total_comparisons``).
      query_schedule: a name of :data:`~jaxweight.preference.QUERY_SCHEDULES` or a callable.
      allow_variable_horizon: accept terminal episodes of different lengths.
      fragmenter: ``"random"`` or ``"active"``.
      active_sample_factor: candidates per pair of active selection (>= 1).
      uncertainty_on: ``"logit"``, ``"probability"`` or ``"label"``.
      sample: the teacher draws Bernoulli labels (else answers with the probability).
      normalize_agent_reward: standardise the agent's reward over the buffer.
      eval_episodes: ground-truth evaluation episodes per round (0: none).
    """

    num_iterations: int
    fragment_length: int = 100
    transition_oversampling: float = 1.0
    initial_comparison_frac: float = 0.1
    initial_epoch_multiplier: float = 200.0
    comparison_queue_size: int | None = None
    query_schedule: Any = "hyperbolic"
    allow_variable_horizon: bool = False
    fragmenter: str = "random"
    active_sample_factor: float = 4.0
    uncertainty_on: str = "logit"
    sample: bool = True
    normalize_agent_reward: bool = True
    eval_episodes: int = 8

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{field: value}`` (a callable schedule by its qualified name)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(LoopConfig))


def loop_config(
    num_iterations: int,
    fragment_length: int = 100,
    transition_oversampling: float = 1.0,
    initial_comparison_frac: float = 0.1,
    initial_epoch_multiplier: float = 200.0,
    comparison_queue_size: int | None = None,
    query_schedule: str | Callable[[Any], Any] = "hyperbolic",
    allow_variable_horizon: bool = False,
    *,
    fragmenter: str = "random",
    active_sample_factor: float = 4.0,
    uncertainty_on: str = "logit",
    sample: bool = True,
    normalize_agent_reward: bool = True,
    eval_episodes: int = 8,
) -> LoopConfig:
    """Validate and build a :class:`LoopConfig`.

    Raises:
      ValueError: naming the argument, its value and the accepted range (sizes
        < 1, fractions outside [0, 1], oversampling < 1, NaN, an unknown
        schedule, fragmenter or uncertainty mode), or a traced number (the
        config is static).
    """
    num_iterations = check_static_int(num_iterations, "num_iterations", 1)
    fragment_length = check_static_int(fragment_length, "fragment_length", 1)
    # LoopConfig is static (a hashable part of the compiled round): its numbers cannot be traced
    check_value(transition_oversampling, "transition_oversampling", ge=1.0, static=True)
    check_value(initial_comparison_frac, "initial_comparison_frac", ge=0.0, le=1.0, static=True)
    check_value(initial_epoch_multiplier, "initial_epoch_multiplier", ge=0.0, static=True)
    if comparison_queue_size is not None:
        comparison_queue_size = check_static_int(comparison_queue_size, "comparison_queue_size", 1)
    allocate_comparisons(10, 1, 0.5, query_schedule)  # "Unknown query schedule: ..." up front
    check_choice(fragmenter, "fragmenter", ("random", "active"))
    check_value(active_sample_factor, "active_sample_factor", ge=1.0, static=True)
    check_choice(uncertainty_on, "uncertainty_on", ("logit", "probability", "label"))
    eval_episodes = check_static_int(eval_episodes, "eval_episodes", 0)
    return LoopConfig(
        num_iterations=num_iterations, fragment_length=fragment_length,
        transition_oversampling=float(transition_oversampling), initial_comparison_frac=float(initial_comparison_frac),
        initial_epoch_multiplier=float(initial_epoch_multiplier), comparison_queue_size=comparison_queue_size,
        query_schedule=query_schedule, allow_variable_horizon=bool(allow_variable_horizon), fragmenter=fragmenter,
        active_sample_factor=float(active_sample_factor), uncertainty_on=uncertainty_on, sample=bool(sample),
        normalize_agent_reward=bool(normalize_agent_reward), eval_episodes=eval_episodes,
    )


def _loop_hparams(temperature: Any, discount: Any, threshold: Any, alpha: Any) -> LoopHParams:
    return LoopHParams.create(temperature, discount, threshold, alpha)


# ------------------------------------------------------------ fingerprints
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


def _fields(prefix: str, obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``{prefix/field: json value}`` of a dataclass (flax struct or plain)."""
    return {f"{prefix}/{f.name}": _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
            if f.name not in skip}


def _fingerprint_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``["name (checkpoint X, now Y)", ...]`` for every field that differs (sorted by name)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if a != b:
            out.append(f"{k} (checkpoint {a!r}, now {b!r})")
    return out


# ------------------------------------------------------------ metrics of one round
_I32, _F32, _BOOL = jnp.int32, jnp.float32, jnp.bool_
#: name -> dtype of every per-round metric (all scalars per seed)
ROUND_METRICS: dict[str, Any] = {
    "round": _I32, "num_pairs": _I32, "buffer_size": _I32, "stored_valid": _I32, "sample_steps": _I32,
    "agent_steps": _I32, "agent_steps_trained": _I32, "reward_loss": _F32, "reward_accuracy": _F32,
    "teacher_entropy": _F32, "fresh_accuracy": _F32, "fresh_decided": _I32, "sample_return": _F32,
    "gt_return": _F32, "variable_horizon": _BOOL, "horizon_min": _I32, "horizon_max": _I32,
    "n_invalid": _I32, "n_nonfinite": _I32,
}


def tqdm_progress(desc: str = "Preference comparisons") -> Callable[[int, int, dict], None]:
    """A ``progress(round, num_rounds, metrics)`` for :meth:`PreferenceComparisons.train`: a tqdm bar
    with the reward loss, accuracy and the agent's true return (host side; needs tqdm)."""
    bar = None

    def progress(i: int, n: int, host: dict) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(n, desc, initial=i, unit="round", dynamic_ncols=True)
        bar.update(1)
        bar.set_postfix(_postfix(host))
        if i + 1 >= n:
            bar.close()

    return progress


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
      num_iterations ... allow_variable_horizon, fragmenter, active_sample_factor,
        uncertainty_on, sample, normalize_agent_reward, eval_episodes: the static
        settings, see :class:`LoopConfig` (``pc.config``).
      reward_trainer: a :class:`~jaxweight.preference.RewardTrainer` for
        ``reward_module`` (default: a single net with imitation's defaults).
      temperature, discount, threshold: the synthetic teacher
        (imitation ``SyntheticGatherer`` defaults 1, 1, 50; :class:`LoopHParams` leaves).
      alpha: exploration bonus of the agent's reward for ensembles (default 0).
      progress: ``progress(round, num_rounds, metrics)`` called by :meth:`train`
        after every round, ``True`` for a tqdm bar (:func:`tqdm_progress`), or
        ``False``/``None`` (default: the loop prints nothing).

    Raises:
      ValueError: bad sizes or fractions, a trainer for another module, a
        generator without the pure protocol, fragments longer than every
        episode (no comparison possible).
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
        progress: bool | Callable[[int, int, dict], Any] | None = None,
    ):
        if isinstance(generator, HostGenerator):
            raise ValueError("generator must be a pure generator, not a HostGenerator (pass HostGenerator.gen)")
        for name in ("init", "sample", "train"):
            if not callable(getattr(generator, name, None)):
                raise ValueError(
                    f"generator must be a pure generator with init/sample/train (e.g. AgentGenerator), "
                    f"got {type(generator).__name__} without {name!r}"
                )
        cfg = loop_config(
            num_iterations, fragment_length, transition_oversampling, initial_comparison_frac,
            initial_epoch_multiplier, comparison_queue_size, query_schedule, allow_variable_horizon,
            fragmenter=fragmenter, active_sample_factor=active_sample_factor, uncertainty_on=uncertainty_on,
            sample=sample, normalize_agent_reward=normalize_agent_reward, eval_episodes=eval_episodes,
        )
        object.__setattr__(self, "config", cfg)
        if cfg.allow_variable_horizon:
            logger.warning(_ALLOW_VARIABLE_HORIZON_WARNING)
        self.progress = progress

        self.reward_module = reward_module
        if reward_trainer is None:
            reward_trainer = RewardTrainer(reward_module)
        if not isinstance(reward_trainer, RewardTrainer):
            raise ValueError(f"reward_trainer must be a RewardTrainer, got {type(reward_trainer).__name__}")
        if reward_trainer.module != reward_module:
            raise ValueError("reward_trainer trains another module than reward_module")
        if cfg.fragmenter == "active" and not reward_trainer.ensemble:
            raise ValueError("fragmenter='active' needs an ensemble reward_trainer (num_members >= 2)")
        self.reward_trainer = reward_trainer
        self.ensemble = reward_trainer.ensemble

        if getattr(generator, "reward_apply", "absent") is None and hasattr(generator, "with_reward"):
            generator = generator.with_reward(learned_reward_fn(reward_module, self.ensemble))
        self.generator = generator
        self._check_generator()
        self.hparams = _loop_hparams(temperature, discount, threshold, alpha)
        self._compiled: dict = {}
        self.state: LoopState | None = None
        self.history: list[dict] = []
        self.overrides: list[dict] = []
        self._iteration = 0

    # -------------------------------------------------------------- config access
    def __getattr__(self, name: str) -> Any:
        # the static settings live in ONE place, self.config; read them as attributes
        if name in _CONFIG_FIELDS:
            return getattr(self.__dict__["config"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _CONFIG_FIELDS:  # validated, and the compiled rounds of the old config are dropped
            cfg = self.__dict__["config"]
            args = {f: getattr(cfg, f) for f in _CONFIG_FIELDS}
            args[name] = value
            pos = {k: args.pop(k) for k in ("num_iterations",)}
            object.__setattr__(self, "config", loop_config(**pos, **args))
            self.__dict__.get("_compiled", {}).clear()
            if name == "fragment_length":
                self._check_generator()
            return
        object.__setattr__(self, name, value)

    @property
    def sample_labels(self) -> bool:
        """Whether the teacher samples Bernoulli labels (``config.sample``)."""
        return self.config.sample

    def _check_generator(self) -> None:
        """No empty work: fragments must fit in the generator's episodes."""
        gen, cfg = self.generator, self.config
        horizons = getattr(gen, "horizons", None)
        if horizons is not None and len(set(horizons)) > 1 and not cfg.allow_variable_horizon:
            raise ValueError(VARIABLE_HORIZON_MESSAGE.format(horizons=sorted(set(horizons))))
        longest = getattr(gen, "max_length", None)
        if longest is None:
            longest = getattr(gen, "horizon", None)
        if longest is not None and cfg.fragment_length > int(longest):
            raise ValueError(
                f"fragment_length {cfg.fragment_length} is longer than the generator's episodes (at most "
                f"{int(longest)} steps): no fragment fits, so there would be no comparisons; use "
                f"fragment_length <= {int(longest)}"
            )

    # -------------------------------------------------------------- planning
    def plan(self, total_timesteps: int, total_comparisons: int) -> LoopPlan:
        """The per-round schedule of a run (host; imitation's arithmetic).

        Raises:
          ValueError: negative totals or ``total_comparisons < 1``; a round with
            0 comparisons ("the schedule gives round i 0 comparisons"); an agent
            that would train 0 steps per round (``0 < total_timesteps <
            num_iterations``); too little data for the trainer's validation split.
        """
        total_timesteps = check_static_int(total_timesteps, "total_timesteps", 0)
        total_comparisons = check_static_int(total_comparisons, "total_comparisons", 1)
        cfg = self.config
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
        tcfg = self.reward_trainer.config
        epochs = [num_epochs(tcfg.epochs, cfg.initial_epoch_multiplier if i == 0 else 1.0) for i in range(k + 1)]
        cap = cfg.comparison_queue_size if cfg.comparison_queue_size is not None else total_comparisons
        if tcfg.has_updater:
            stored = np.minimum(np.cumsum(schedule), cap)
            for n in stored:
                val = int(int(n) * tcfg.val_split)
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
            return random_fragments(key, trajs, self.config.fragment_length, 1)

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
        cfg = self.config
        if cfg.fragmenter == "random":
            return random_fragments(key, trajs, cfg.fragment_length, num_pairs, warning_threshold=0)
        return active_selection(
            key, state.reward.params, self.reward_module, trajs, cfg.fragment_length, num_pairs,
            cfg.active_sample_factor, cfg.uncertainty_on, noise_prob=state.reward.hparams.noise_prob,
            discount=state.reward.hparams.discount, threshold=state.reward.hparams.threshold, warning_threshold=0,
        )

    def _reward_stats(self, params, buffer: PreferenceBuffer) -> tuple[Array, Array]:
        """Mean and ``1 / std`` of the learned reward over every (finite) transition stored in the buffer.

        The buffer holds fragments from every round's policy, so these statistics
        move slowly; those of the latest samples alone collapse once the agent
        is good (all its states look alike) and would blow the agent's rewards up.
        Non-finite rewards (from non-finite observations) are left out.
        """
        if not self.config.normalize_agent_reward:
            return jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
        inputs = buffer.pairs.transitions()  # [cap, 2, L]
        if self.ensemble:
            r = jnp.mean(ensemble_apply(self.reward_module, params, *inputs), axis=-1)
        else:
            r = jnp.asarray(self.reward_module.apply(params, *inputs), jnp.float32)
        ok = jnp.broadcast_to(buffer_mask(buffer)[:, None, None], r.shape) & jnp.isfinite(r)
        r = jnp.where(ok, r, 0.0)
        mask = ok.astype(jnp.float32)
        n = jnp.maximum(jnp.sum(mask), 1.0)
        mean = jnp.sum(r * mask) / n
        std = jnp.sqrt(jnp.sum(jnp.square(r - mean) * mask) / n)
        return mean.astype(jnp.float32), (1.0 / jnp.maximum(std, 1e-6)).astype(jnp.float32)

    def round_step(self, state: LoopState, x: RoundInput, plan: LoopPlan) -> tuple[LoopState, dict]:
        """One round (pure; jit with ``plan`` static, vmap over states).

        The old order ``round_step(plan, state, x)`` still works (deprecated).

        Args:
          state: the loop state.
          x: this round's counts (traced: every round runs the same program).
          plan: the run's :class:`LoopPlan` (fixes the shapes).

        Returns:
          ``(state, metrics)`` with the scalar metrics of :data:`ROUND_METRICS`:
          ``round``, ``num_pairs``, ``buffer_size``, ``stored_valid``, ``sample_steps``,
          ``agent_steps``, ``agent_steps_trained`` (cumulative, whole PPO
          updates), ``reward_loss``, ``reward_accuracy`` (final epoch, member
          mean), ``teacher_entropy``, ``fresh_accuracy`` / ``fresh_decided``
          (:func:`preference_accuracy` of the previous round's reward model on
          this round's new pairs, before training on them: a held-out accuracy),
          ``sample_return`` (mean true return of the sampled episodes, finite
          rewards only), ``gt_return`` (mean true return of ``eval_episodes``
          evaluation episodes; NaN without), ``variable_horizon``,
          ``horizon_min``, ``horizon_max`` (terminal episode lengths of the
          samples), ``n_invalid`` (stored pairs left out of reward training for
          bad data) and ``n_nonfinite`` (sampled transitions with a non-finite
          reward or observation).
        """
        if isinstance(state, LoopPlan):  # old order (plan, state, x)
            warn_deprecated("PreferenceComparisons.round_step(plan, state, x)",
                            "PreferenceComparisons.round_step(state, x, plan)")
            state, x, plan = x, plan, state
        return self._round(state, x, plan)

    def _round(self, state: LoopState, x: RoundInput, plan: LoopPlan) -> tuple[LoopState, dict]:
        gen, cfg = self.generator, self.config
        k_next, k_round = jax.random.split(state.key)
        k_sample, k_frag, k_pref, k_reward, k_agent, k_eval = jax.random.split(k_round, 6)
        p_max = plan.max_pairs

        trajs = gen.sample(state.gen, k_sample, x.sample_steps, max_steps=plan.max_sample_steps)
        lengths = jnp.asarray(trajs.lengths, jnp.int32)
        term = jnp.asarray(trajs.terminal, bool) & (lengths > 0)
        big = jnp.iinfo(jnp.int32).max
        h_min = jnp.min(jnp.where(term, lengths, big))
        h_max = jnp.max(jnp.where(term, lengths, -1))
        variable = (jnp.sum(term) > 0) & (h_min != h_max)
        step_mask = trajs.step_mask()
        obs = jnp.asarray(trajs.obs, jnp.float32)
        obs_ok = jnp.all(jnp.isfinite(obs.reshape(obs.shape[:2] + (-1,))), axis=-1)  # [N, T+1]
        step_ok = jnp.isfinite(trajs.rews) & obs_ok[:, :-1] & obs_ok[:, 1:]
        n_nonfinite = jnp.sum(step_mask & ~step_ok, dtype=jnp.int32)

        pairs = self._fragments(k_frag, state, trajs, p_max)
        pairs = pairs.replace(valid=pairs.valid & (jnp.arange(p_max) < x.num_pairs))
        # the reward model of the last round judged on this round's comparisons before it trains on
        # them: a held-out accuracy for free (noiseless teacher, ties left out)
        fresh_acc, fresh_decided = preference_accuracy(
            self.reward_module, state.reward.params, pairs, discount=state.hparams.discount, ensemble=self.ensemble
        )
        hp = state.hparams
        prefs, entropy = synthetic_preferences(
            k_pref, pairs, temperature=hp.temperature, discount=hp.discount, sample=cfg.sample,
            threshold=hp.threshold,
        )
        buffer = buffer_push(state.buffer, pairs, prefs, count=x.num_pairs)

        reward, rm = _train_reward(state.reward, k_reward, buffer, self.reward_trainer.config, epochs=x.epochs)
        shift, scale = self._reward_stats(reward.params, buffer)
        agent_reward = AgentReward(reward.params, hp.alpha, shift, scale)
        gen_state = gen.train(state.gen, k_agent, x.agent_steps, agent_reward)

        if cfg.eval_episodes and hasattr(gen, "evaluate"):
            gt_return = jnp.mean(gen.evaluate(gen_state, k_eval, cfg.eval_episodes))
        else:
            gt_return = jnp.full((), jnp.nan, jnp.float32)
        used = lengths > 0
        ep_returns = jnp.sum(jnp.where(step_mask & step_ok, trajs.rews, 0.0), axis=1)
        sample_return = jnp.sum(jnp.where(used, ep_returns, 0.0)) / jnp.maximum(jnp.sum(used), 1)
        trained = gen.trained_steps(gen_state) if hasattr(gen, "trained_steps") else jnp.zeros((), jnp.int32)

        new = state.replace(
            gen=gen_state, reward=reward, buffer=buffer, reward_shift=shift, reward_scale=scale,
            round=state.round + 1, key=k_next,
        )
        any_term = jnp.sum(term) > 0
        metrics = {
            "round": state.round,
            "num_pairs": x.num_pairs,
            "buffer_size": buffer.size,
            "stored_valid": jnp.sum(buffer_mask(buffer), dtype=jnp.int32),
            "sample_steps": x.sample_steps,
            "agent_steps": x.agent_steps,
            "agent_steps_trained": trained,
            "reward_loss": jnp.mean(rm["train/loss"]),
            "reward_accuracy": jnp.mean(rm["train/accuracy"]),
            "teacher_entropy": entropy,
            "fresh_accuracy": fresh_acc,
            "fresh_decided": fresh_decided,
            "sample_return": sample_return,
            "gt_return": gt_return,
            "variable_horizon": variable,
            "horizon_min": jnp.where(any_term, h_min, 0),
            "horizon_max": jnp.where(any_term, h_max, 0),
            "n_invalid": rm.get("n_invalid", jnp.zeros((), jnp.int32)),
            "n_nonfinite": n_nonfinite,
        }
        metrics = {k: jnp.reshape(jnp.asarray(metrics[k]), ()).astype(d) for k, d in ROUND_METRICS.items()}
        return new, metrics

    def _rounds(self, state: LoopState, xs: RoundInput, start: Array, stop: Array, plan: LoopPlan):
        """Rounds ``start .. stop - 1`` in one ``fori_loop`` with traced bounds: THE compiled program.

        Returns ``(state, metrics)`` with metrics ``[K + 1]`` per name (rows
        outside ``[start, stop)`` are zeros).
        """
        n = plan.num_rounds
        zeros = {k: jnp.zeros((n,), d) for k, d in ROUND_METRICS.items()}

        def body(i, carry):
            st, rows = carry
            st, m = self._round(st, jax.tree.map(lambda a: a[i], xs), plan)
            return st, {k: rows[k].at[i].set(m[k]) for k in rows}

        return jax.lax.fori_loop(jnp.asarray(start, jnp.int32), jnp.asarray(stop, jnp.int32), body, (state, zeros))

    def _rounds_fn(self, plan: LoopPlan, batched: bool):
        key = ("rounds", plan, batched)
        if key not in self._compiled:
            fn = partial(self._rounds, plan=plan)
            if batched:
                fn = jax.vmap(fn, in_axes=(0, None, None, None))
            self._compiled[key] = jax.jit(fn)
        return self._compiled[key]

    def _call_rounds(self, plan: LoopPlan, batched: bool, state, xs, start, stop):
        aot = self._compiled.get(("aot", plan, batched))
        args = (state, xs, jnp.asarray(start, jnp.int32), jnp.asarray(stop, jnp.int32))
        if aot is not None and not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
            try:
                return aot(*args)
            except TypeError:  # e.g. weak-typed leaves of a hand-built state: let jit specialise
                pass
        return self._rounds_fn(plan, batched)(*args)

    def compile(self, total_timesteps: int, total_comparisons: int, *, num_seeds: int | None = None) -> None:
        """Compile the run's programs ahead of time (``init`` and the rounds program; ``jax.jit(...).lower().compile()``).

        :meth:`train` and :meth:`run` then start without compiling, so a caller can
        time compilation apart from running. Optional: without it the first round compiles.
        """
        plan = self.plan(total_timesteps, total_comparisons)
        batched = num_seeds is not None
        keys = jax.random.split(as_key(0), check_static_int(num_seeds, "num_seeds", 1)) if batched else as_key(0)
        self._compile(plan, batched, keys)

    def _compile(self, plan: LoopPlan, batched: bool, keys: Any) -> None:
        """AOT-compile ``init`` and the rounds program, the two XLA compilations side by side (threads)."""
        k_init, k_rounds = ("aot-init", plan.capacity, batched), ("aot", plan, batched)
        todo = []
        init = self._init_fn(plan.capacity, batched)
        if k_init not in self._compiled:
            todo.append((k_init, init.lower(keys)))
        if k_rounds not in self._compiled:
            i32 = jax.ShapeDtypeStruct((), jnp.int32)
            state = jax.eval_shape(init, keys)
            todo.append((k_rounds, self._rounds_fn(plan, batched).lower(state, jax.eval_shape(plan.round_inputs),
                                                                         i32, i32)))
        if len(todo) == 2:  # XLA compiles outside the GIL: overlap the small init with the rounds program
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

            with ThreadPoolExecutor(2) as ex:
                done = list(ex.map(lambda kv: (kv[0], kv[1].compile()), todo))
        else:
            done = [(k, lowered.compile()) for k, lowered in todo]
        self._compiled.update(done)

    # -------------------------------------------------------------- whole run
    def run(self, state: LoopState, total_timesteps: int, total_comparisons: int) -> tuple[LoopState, dict]:
        """The whole run as one pure function (jittable with the totals static; vmappable over states).

        All ``K + 1`` rounds run in the compiled program that :meth:`train`
        runs one round at a time, so the metrics of ``run`` and ``train`` agree
        bit for bit for the same keys. ``state`` comes from :meth:`init` with
        ``plan(total_timesteps, total_comparisons).capacity`` (a state with a
        leading seed axis, from ``jax.vmap(init)``, runs all seeds at once).

        Returns:
          ``(state, metrics)``, every metric with a leading round axis ``K + 1``
          (after the seed axis for a batched state).

        Example::

            cap = pc.plan(T, C).capacity
            run = jax.jit(jax.vmap(lambda k: pc.run(pc.init(k, cap), T, C)))
            states, metrics = run(jax.random.split(jax.random.key(0), 4))   # 4 seeds, one program
        """
        plan = self.plan(total_timesteps, total_comparisons)
        batched = jnp.ndim(state.round) == 1
        return self._call_rounds(plan, batched, state, plan.round_inputs(), 0, plan.num_rounds)

    # -------------------------------------------------------------- fingerprint / resume
    def fingerprint(self, plan: LoopPlan, num_seeds: int | None = None) -> dict[str, Any]:
        """Every setting that changes a run's results, as a flat JSON-ready ``{name: value}``.

        The plan, the seed count, the loop config, the teacher's and the
        agent reward's hyperparameters (:class:`LoopHParams`), the reward model
        (module, trainer config and hyperparameters: learning rate, weight
        decay, noise, discount, ...) and the generator (its ``fingerprint()``:
        environment, PPO config and hyperparameters, exploration; a dataset's
        content hash). Stored in every checkpoint; :meth:`train` compares it on resume.
        """
        fp: dict[str, Any] = {"version": _FINGERPRINT_VERSION, "num_seeds": num_seeds}
        fp.update(_fields("plan", plan))
        fp.update(_fields("loop", self.config))
        fp.update(_fields("hparams", self.hparams))
        fp.update(_fields("reward", self.reward_trainer.config, skip=("module",)))
        fp["reward/module"] = repr(self.reward_module)
        fp.update(_fields("reward", self.reward_trainer.hparams))
        reg = getattr(self.reward_trainer, "regularizer", None)
        fp["reward/regularizer"] = None if reg is None else repr(reg)
        gen_fp = self.generator.fingerprint() if hasattr(self.generator, "fingerprint") else {}
        fp["generator/type"] = type(self.generator).__name__
        fp.update({f"generator/{k}": _jsonable(v) for k, v in gen_fp.items()})
        return json.loads(json.dumps(fp))

    def _with_current_hparams(self, state: LoopState) -> LoopState:
        """``state`` with this loop's hyperparameter leaves (teacher, trainer, agent), broadcast to its seeds."""
        def put(old, new):
            return jax.tree.map(lambda o, n: jnp.broadcast_to(jnp.asarray(n, o.dtype), o.shape), old, new)

        reward = state.reward.replace(hparams=put(state.reward.hparams, self.reward_trainer.hparams))
        state = state.replace(hparams=put(state.hparams, self.hparams), reward=reward)
        gen_hp = getattr(self.generator, "hparams", None)
        ppo = getattr(state.gen, "ppo", None)
        if gen_hp is not None and ppo is not None and hasattr(ppo, "hparams"):
            state = state.replace(gen=state.gen.replace(ppo=ppo.replace(hparams=put(ppo.hparams, gen_hp))))
        return state

    def _init_fn(self, capacity: int, batched: bool):
        key = ("init", capacity, batched)
        if key not in self._compiled:
            fn = partial(self.init, capacity=capacity)
            self._compiled[key] = jax.jit(jax.vmap(fn) if batched else fn)
        return self._compiled[key]

    def _call_init(self, capacity: int, batched: bool, keys):
        aot = self._compiled.get(("aot-init", capacity, batched))
        if aot is not None:
            try:
                return aot(keys)
            except TypeError:  # keys of another shape or impl
                pass
        return self._init_fn(capacity, batched)(keys)

    def init_run(self, key: Any, total_timesteps: int, total_comparisons: int, *,
                 num_seeds: int | None = None) -> LoopState:
        """The state :meth:`train` starts from: ``init`` (jitted) of ``key``, or of ``num_seeds`` keys split from it.

        ``pc.run(pc.init_run(key, T, C, num_seeds=n), T, C)`` gives the metrics of
        ``pc.train(key, T, C, num_seeds=n)`` bit for bit.
        """
        plan = self.plan(total_timesteps, total_comparisons)
        if num_seeds is None:
            return self._call_init(plan.capacity, False, as_key(key))
        num_seeds = check_static_int(num_seeds, "num_seeds", 1)
        return self._call_init(plan.capacity, True, jax.random.split(as_key(key), num_seeds))

    def check_checkpoint(
        self, checkpoint_dir: str | Path, total_timesteps: int, total_comparisons: int, *,
        num_seeds: int | None = None, allow_changed: bool | Iterable[str] = False,
    ) -> list[str]:
        """What ``train(..., checkpoint_dir=..., resume=True)`` would say about the checkpoint, without training.

        Reads the checkpoint (if any) and compares its fingerprint, tracing but
        not compiling anything, so a caller can refuse a bad resume before compiling.

        Returns:
          The differing fields (``[]``: none, or no checkpoint), allowed by ``allow_changed``.

        Raises:
          ValueError: differing settings not allowed by ``allow_changed`` (listed).
          jaxweight.StateFileError: a corrupted, truncated or foreign checkpoint file.
        """
        ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME
        if not ckpt.exists():
            return []
        plan = self.plan(total_timesteps, total_comparisons)
        batched = num_seeds is not None
        if batched:
            num_seeds = check_static_int(num_seeds, "num_seeds", 1)
            keys = jax.random.split(as_key(0), num_seeds)
        else:
            keys = as_key(0)
        target = jax.eval_shape(self._init_fn(plan.capacity, batched), keys)
        _, _, note = self._load(ckpt, self.fingerprint(plan, num_seeds), target, allow_changed, quiet=True)
        return [] if note is None else list(note["changed"])

    def _load(self, ckpt: Path, fingerprint: dict, target: Any, allow_changed: bool | Iterable[str],
              quiet: bool = False):
        try:
            state, meta = checkpoint.load_with_metadata(ckpt, target)
            failed = None
        except checkpoint.CheckpointError as e:  # may be a shape change: report the fingerprint first
            state, failed = None, e
            meta = checkpoint.load_metadata(ckpt)
        old = meta.get("fingerprint")
        if not isinstance(old, dict) or "version" not in old:
            raise StateFileError(
                f"checkpoint {str(ckpt)!r} has no preference-loop fingerprint (written by something else or by an "
                "older jaxweight); use another checkpoint_dir or resume=False"
            )
        diff = _fingerprint_diff(old, fingerprint)
        changed = [d.split(" (", 1)[0] for d in diff]
        if diff:
            allowed = set(changed) if allow_changed is True else set(allow_changed or ())
            refused = [d for d, c in zip(diff, changed) if c not in allowed]
            if refused or failed is not None:
                hint = ("these change the shapes of the saved state, so it cannot be resumed; "
                        if failed is not None and not refused else "")
                raise ValueError(
                    f"checkpoint {str(ckpt)!r} belongs to another run: settings differ: {'; '.join(refused or diff)}. "
                    + hint + "Use another checkpoint_dir, resume=False, or allow_changed=True (demo: "
                    "--resume-override) to continue with the new values"
                )
            note = {"round": int(meta.get("rounds_done", 0)), "changed": diff}
            if quiet:
                return None, meta, note
            logger.warning("resuming %s with changed settings: %s", ckpt, "; ".join(diff))
            state = self._with_current_hparams(state)
            return state, meta, note
        if failed is not None:
            raise failed
        return state, meta, None

    # -------------------------------------------------------------- host driver
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
        allow_changed: bool | Iterable[str] = False,
        progress: bool | Callable[[int, int, dict], Any] | None = None,
    ) -> dict[str, Any]:
        """Run the loop on the host, one compiled round at a time (imitation's ``train``).

        Args:
          key: key or int seed of the run (split into ``num_seeds`` run keys when given).
          total_timesteps: agent steps over the whole run.
          total_comparisons: comparisons over the whole run.
          callback: called as ``callback(round)`` after every round (imitation's
            signature); ``self.state`` and ``self.history`` hold the round's results.
          num_seeds: run this many independent seeds at once (one vmapped program).
          checkpoint_dir: save the loop state after every round to
            ``checkpoint_dir/loop_state.ckpt`` (atomic; the history, the
            fingerprint and any overrides go into its metadata).
          resume: continue from the checkpoint in ``checkpoint_dir`` if there is
            one, else start fresh.
          allow_changed: resume even though these fingerprint fields (``True``:
            any) differ from the checkpoint's; the new hyperparameter values
            replace the saved ones, and the change is logged (``logging``
            warning) and kept in ``self.overrides`` and the checkpoint.
          progress: ``progress(round, num_rounds, metrics)`` after every round
            (default: the constructor's; ``True``: a tqdm bar).

        Returns:
          ``{"reward_loss", "reward_accuracy"}`` of the last round (floats, or
          ``f32[num_seeds]`` arrays); per-round metrics are in ``self.history``
          (one dict of host values per round, per-seed lists when vmapped).

        Raises:
          ValueError: the errors of :meth:`plan`; terminal episodes of different
            lengths without ``allow_variable_horizon`` (the round is not committed);
            a checkpoint whose fingerprint differs (the differing fields are listed).
          jaxweight.StateFileError: a corrupted, truncated or foreign checkpoint file.
        """
        plan = self.plan(total_timesteps, total_comparisons)
        batched = num_seeds is not None
        if batched:
            num_seeds = check_static_int(num_seeds, "num_seeds", 1)
            keys = jax.random.split(as_key(key), num_seeds)
        else:
            keys = as_key(key)
        progress = self.progress if progress is None else progress
        if progress is True:
            progress = tqdm_progress()
        fingerprint = self.fingerprint(plan, num_seeds)
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / CHECKPOINT_NAME
        init = self._init_fn(plan.capacity, batched)
        history: list[dict] = []
        overrides: list[dict] = []
        state = None
        if resume and ckpt is not None and ckpt.exists():
            state, meta, note = self._load(ckpt, fingerprint, jax.eval_shape(init, keys), allow_changed)
            history = list(meta.get("history", []))
            overrides = list(meta.get("overrides", [])) + ([note] if note else [])
        self._compile(plan, batched, keys)  # no-op when compile() ran already
        if state is None:
            state = self._call_init(plan.capacity, batched, keys)
        self.overrides = overrides
        start = int(np.max(np.asarray(jax.device_get(state.round))))
        self._iteration = start
        xs = plan.round_inputs()
        for i in range(start, plan.num_rounds):
            new_state, rows = self._call_rounds(plan, batched, state, xs, i, i + 1)
            host = {k: np.asarray(v)[..., i] for k, v in jax.device_get(rows).items()}
            if bool(np.any(host["variable_horizon"])) and not self.config.allow_variable_horizon:
                hs = sorted({int(v) for v in np.ravel(host["horizon_min"])} | {int(v) for v in np.ravel(host["horizon_max"])})
                raise ValueError(VARIABLE_HORIZON_MESSAGE.format(horizons=hs))
            state = new_state
            history.append({k: v.tolist() for k, v in host.items()})
            if ckpt is not None:
                checkpoint.save(ckpt, state, metadata={"fingerprint": fingerprint, "history": history,
                                                       "rounds_done": i + 1, "overrides": overrides})
            self.state, self.history = state, history
            self._iteration = i + 1
            if progress:
                progress(i, plan.num_rounds, host)
            if callback is not None:
                callback(i)
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
