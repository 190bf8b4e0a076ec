"""Demo ``preferences``: learn a reward from synthetic comparisons and train a PPO agent on it only.

The main job of jaxweight (imitation's preference comparisons, Christiano et
al. 2017), on gymnax environments built in (no download):

- ``cartpole`` (default): CartPole with seals' fixed horizon. Every episode
  lasts 500 steps; the true reward is 1 while the pole is upright and the cart
  in bounds and 0 otherwise; nothing terminates early. (With CartPole-v1 every
  step pays 1, so fragments tie and carry no information, and the episode
  length leaks the reward; the loop refuses variable horizons.)
- ``pendulum``: Pendulum-v1 (continuous torque, horizon 200, dense negative reward).
- ``gymnax:<id>``: any gymnax environment (``gymnax:Acrobot-v1``,
  ``gymnax:MountainCar-v0``, ``gymnax:MountainCarContinuous-v0``...) at its own
  horizon, absorbing after termination (seals); generic settings by action space
  (:func:`settings`).
- ``brax:<name>``: a brax task (``brax:inverted_pendulum``,
  ``brax:inverted_double_pendulum``, ``brax:reacher``; the ``brax`` extra) at
  horizon 1000, absorbing after termination, with the agent and budget
  measured best per task (:data:`BRAX_DEFAULTS`).

``--agent sac`` trains SAC instead of PPO on the ``gymnax:`` and ``brax:`` ids
with continuous actions (:class:`~jaxweight.preference.generators.SACGenerator`,
PEBBLE's agent: a replay buffer relabelled with every new reward model;
:data:`SAC_SETTINGS`), and the true-reward baseline is SAC too. Without
``--agent`` each brax task gets the agent and budget that measured best on
this loop (:data:`BRAX_DEFAULTS`: SAC on the pendulums, HalfCheetah and the
other locomotion tasks, PPO on Reacher); a run that would pass an hour on a
2-core CPU says so before it starts.

For several seeds at once (``jax.vmap``; the same four compiled programs every round) the
loop asks a synthetic teacher to compare short fragments of the agent's
episodes, fits an ensemble of reward nets to the answers and trains PPO on
the ensemble's reward; the agent never sees the true reward. The loop state
is checkpointed after every round (``--resume`` continues a killed run).

Reported per seed and across seeds:

- the agent's ground-truth return (32 evaluation episodes, stochastic policy);
- the reward ensemble's accuracy on *held-out* comparisons: 2,000 fresh
  fragment pairs cut from episodes of the final agent, of the final agent with
  random-action exploration and of an untrained agent, judged against the
  noiseless teacher (pairs whose true returns tie carry no preference and are
  left out);
- the Pearson correlation of learned and true rewards on the transitions of
  those episodes;
- PPO trained on the true reward with the same number of agent steps.

Quality goals of the default (``cartpole``, 4 seeds): mean return >= 450 of
500, held-out accuracy >= 90%, wall time <= 10 minutes on a 2-core CPU.

With ``--teacher human`` a person gives the preferences instead, on a labelling
page (:mod:`jaxweight.label`, the ``label`` extra): the demo prints its URL
(with a secret token) and every round waits until the person has compared the
round's pairs, then goes on with its compiled phases. One seed, and a run
sized for a person: 300 comparisons over 16 rounds, 30 in the first, then 26
down to 13 (quick: 80; on CartPole 24 in the first round, episodes of 100
steps and exploring episodes, so that about 20 pairs with something to judge
come in the first two minutes). Every label
is in ``checkpoints/<env>[_quick]/labels.jsonl``, next to the checkpoint, before
the page hears OK; ``--resume`` after a kill goes on from the last finished
round and reuses the labels already given for the next one.

Run ``python -m jaxweight demo preferences [--quick] [--resume] [--out DIR]
[--env cartpole|pendulum|gymnax:<id>|brax:<name>] [--agent ppo|sac] [--teacher synthetic|human] [--port P]
[--seeds N] [--rounds K]
[--comparisons N] [--timesteps N] [--fragment-length L] [--members M] [--reward-lr X] [--agent-lr X]
[--strict] [--tensorboard DIR]`` (``--help`` lists every flag). Outputs go under ``--out`` (default
``jaxweight-out/preferences/``): ``metrics.jsonl`` (one line per round,
``preference/...`` keys), ``<env>.json`` (results), ``<env>.png`` (plot) and
the checkpoints (``<env>`` with ``:`` written ``-``, and ``_sac`` after it with SAC:
``gymnax-Acrobot-v1.json``, ``brax-halfcheetah_sac.json``). Compilation and running are timed apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxweight import StateFileError, checkpoint, metrics
from jaxweight.demos import _args
from jaxweight.demos import _common as C
from jaxweight.demos._args import AGENTS, TEACHERS
from jaxweight.preference import RewardTrainer, concatenate_trajectories, random_fragments

if TYPE_CHECKING:  # the driver needs gymnax (the rl extra): imported where it is used
    from jaxweight.preference.driver import PreferenceComparisons

DEFAULT_OUT = "jaxweight-out/preferences/"
GOAL_RETURN = {"cartpole": 450.0}
#: the goal's share of the episode when a run sets its own horizon (CartPole pays 1 a live step: 450 of 500)
GOAL_RETURN_SHARE = 0.9
GOAL_ACCURACY = 0.90
GOAL_WALL_S = 600.0
#: a full brax run's goal: (learned - random) / (true - random) at the same budget, mean over seeds
GOAL_NORMALISED = 0.8
#: the settings of a run labelled by a person, full and quick (full: 30 comparisons in round 0, then 13 to 26 a
#: round)
HUMAN_SETTINGS = {False: dict(total_comparisons=300, num_iterations=15), True: dict(total_comparisons=80)}
#: the quick CartPole run labelled by a person: two minutes of a person's time with something to judge. Its
#: episodes last 100 steps, not 500 (an untrained agent falls within ~20 steps, so at 500 nearly every 20-step
#: clip shows a fallen pole: 2 of 80 pairs had anything to judge); round 0 takes 30% of the comparisons (the
#: untrained agent's pairs, half of them with something to judge at 100 steps); half the sampled episodes
#: switch to random actions partway (imitation's exploration_frac), so a trained agent's clips still fall
HUMAN_QUICK_CARTPOLE = dict(horizon=100, initial_comparison_frac=0.3, exploration_frac=0.5)
LABELS_NAME = "labels.jsonl"
#: printed under the progress bar once the rounds are done: what its two accuracies measure
PROGRESS_LEGEND = (
    ("[preferences] acc in the bar: agreement with the training labels; a tie (fragments judged equal) counts as "
     "agreeing only when the model does not favour the first, about half the time, so acc is low when many pairs tie"),
    ("[preferences] new_acc: agreement on each round's new pairs before training on them, ties left out, like the "
     "held-out acc below"),
)


class EnvIdError(ValueError):
    """An environment id the demo cannot run (its form, or an id ``make_env`` does not know):
    the command line names ``--env`` in its one-line error."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that defines a demo run (JSON-friendly)."""

    env: str
    quick: bool
    seeds: int
    total_timesteps: int
    total_comparisons: int
    num_iterations: int
    fragment_length: int
    num_members: int
    ppo_envs: int
    ppo_steps: int
    ppo_minibatches: int
    ppo_epochs: int
    learning_rate: float
    gamma: float
    ent_coef: float
    reward_learning_rate: float = 1e-3
    teacher: str = "synthetic"
    eval_episodes: int = 8
    final_episodes: int = 32
    heldout_pairs: int = 2000
    heldout_steps: int = 5000
    horizon: int | None = None
    initial_comparison_frac: float = 0.1
    exploration_frac: float = 0.0
    use_next_state: bool = False
    use_action: bool = False
    normalize_observations: bool = False
    reward_scaling: float = 1.0
    absorbing_bootstrap: bool = False
    max_grad_norm: float | None = 0.5
    clip_eps: float = 0.2
    tanh_squash: bool = False
    init_log_std: float = 0.0
    state_dependent_std: bool = False
    skip_obs: int = 0
    reward_mirror: tuple[float, ...] | None = None
    agent: str = "ppo"
    sac_envs: int = 16
    sac_buffer: int = 1_000_000
    sac_batch: int = 256
    sac_updates_per_step: int = 16
    sac_learning_starts: int = 10_000
    sac_hidden: tuple[int, ...] = (256, 256)


#: reward-model inputs of the gymnax ids whose reward needs more than (state, next state)
GYMNAX_REWARD_INPUTS = {"MountainCarContinuous-v0": dict(use_action=True)}
#: reward-model inputs of the brax tasks: the action where the reward has a control cost; the state alone for the
#: pendulums, whose reward is a function of the state (with (state, next state) the net also keys on their
#: difference: InvertedDoublePendulum's normalised score 0.40 -> 0.78, InvertedPendulum's 0.17 -> 0.30, 4 seeds each)
BRAX_REWARD_INPUTS = {"reacher": dict(use_action=True), "inverted_pendulum": dict(use_next_state=False),
                      "inverted_double_pendulum": dict(use_next_state=False)}
#: exact mirror symmetries of the brax tasks (+-1 per observation entry; left <-> right on the track), for the
#: reward model (:class:`~jaxweight.preference.env_rewards.MirroredReward`): cart x, the angles' sines and the
#: velocities flip, the cosines stay. inverted_pendulum is not here: its pole is built 0.001 off vertical
#: (gym's model; at rest it tips one way), so its mirror image is not an exact symmetry
BRAX_REWARD_MIRROR = {
    "inverted_double_pendulum": (-1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0),
}
#: SAC's settings (Stable-Baselines3's: buffer 1e6, batch 256, lr 3e-4, gamma 0.99, 10,000 random steps first,
#: (256, 256) relu networks; 16 vmapped environments, each step followed by 16 gradient steps: one per
#: transition) and its smaller budget: SAC learns from far fewer steps than PPO, and each costs a gradient step
SAC_SETTINGS = dict(total_timesteps=300_000, learning_rate=3e-4, gamma=0.99, reward_scaling=1.0,
                    normalize_observations=False, sac_envs=16, sac_buffer=1_000_000, sac_batch=256,
                    sac_updates_per_step=16, sac_learning_starts=10_000)
#: the agent and budget of a brax task when ``agent`` is not given: the agent that measured best on the
#: learned-reward loop (SAC where SAC is better) at the budget it was measured at. The table of
#: docs/results/mujoco.md ("The demo's defaults") names the results file behind each row; ``seed_wall_s`` is that
#: file's wall time on 2 CPU cores per seed (None: never timed), from which a run that would pass an hour says so
#: before it starts. Tasks not listed, and the gymnax ids, default to PPO. walker2d and ant get SAC by analogy
#: with halfcheetah and hopper (PPO was never run on them; ant's quick run diverged before brax_envs contained
#: that, see the table).
BRAX_DEFAULTS = {
    "inverted_pendulum": dict(agent="sac", total_timesteps=100_000, seed_wall_s=1_174.0),
    "inverted_double_pendulum": dict(agent="sac", total_timesteps=100_000, seed_wall_s=1_677.0),
    "reacher": dict(agent="ppo", total_timesteps=2_000_000, seed_wall_s=434.0),
    "halfcheetah": dict(agent="sac", total_timesteps=150_000, seed_wall_s=3_640.0),
    "hopper": dict(agent="sac", total_timesteps=100_000, seed_wall_s=1_961.0),
    "walker2d": dict(agent="sac", total_timesteps=100_000, seed_wall_s=1_839.0),
    "ant": dict(agent="sac", total_timesteps=100_000, seed_wall_s=None),
}
#: quick with SAC: a smoke run of minutes (InvertedPendulum: 241 s on 2 cores), learning from the 2,000th step on
SAC_QUICK = dict(total_timesteps=10_000, sac_learning_starts=2_000)


def default_agent(env: str) -> str:
    """The agent of ``env`` when none is given: :data:`BRAX_DEFAULTS`'s for a brax task, else ``"ppo"``."""
    family, _, name = str(env).partition(":")
    return BRAX_DEFAULTS[name]["agent"] if family == "brax" and name in BRAX_DEFAULTS else "ppo"


#: brax's published PPO settings per task (brax/training/agents/ppo training configs), the rest as inverted_pendulum's
BRAX_PPO = {
    "inverted_pendulum": dict(total_timesteps=2_000_000, reward_scaling=10.0, gamma=0.97, learning_rate=3e-4,
                              ent_coef=1e-2),
    "inverted_double_pendulum": dict(total_timesteps=20_000_000, reward_scaling=10.0, gamma=0.97,
                                     learning_rate=3e-4, ent_coef=1e-2),
    "reacher": dict(total_timesteps=50_000_000, reward_scaling=5.0, gamma=0.95, learning_rate=3e-4, ent_coef=1e-3),
    "halfcheetah": dict(total_timesteps=50_000_000, reward_scaling=1.0, gamma=0.95, learning_rate=3e-4,
                        ent_coef=1e-3, ppo_steps=160, ppo_minibatches=8, ppo_epochs=8),
}


def _generic_base(env: str, quick: bool, agent: str = "ppo") -> dict:
    """Settings of a ``"gymnax:<id>"`` or ``"brax:<name>"`` id (builds the environment to see its action space).

    gymnax, discrete actions: the cartpole settings; continuous: the pendulum
    ones. The reward model sees (state, next state) (a reward paid on arrival,
    as Acrobot-v1's, needs the next state), and the action where the table
    says so. brax: :data:`BRAX_PPO` (brax's minibatches of 5,120 steps, 4
    epochs, observation normalisation, reward scaling; 512 environments of 80
    steps and 8 minibatches an update instead of brax's 2048 and 32, so that a
    round of the loop is several updates, not one), PPO's
    ``absorbing_bootstrap``: without it an agent at horizon 1000 learns from
    ~10 live steps per 1000 on InvertedPendulum), 50-step fragments, horizon 1000,
    and four more of brax's PPO choices: no gradient clipping, a ratio clip
    of 0.3, the tanh-squashed Gaussian (on InvertedPendulum each of them
    helped 1.3-2x and they stack: ``bench/results/diag/ppo-diag-*``) and a std
    per state from the policy's output layer (about 3x faster again). The
    agent does not see the positions the observation keeps for the reward
    model (``skip_obs``: brax's own observation). The pendulums' reward model
    sees the state alone (:data:`BRAX_REWARD_INPUTS`), and InvertedDoublePendulum's
    is mirror-symmetric (:data:`BRAX_REWARD_MIRROR`,
    :class:`~jaxweight.preference.env_rewards.MirroredReward`). On
    InvertedDoublePendulum the two lifted the normalised score from 0.15 to
    0.40 (mirror) and on to 0.78 (state alone; 4 seeds, and 0.43 on 4 more).

    ``agent="sac"``: :data:`SAC_SETTINGS` over these (continuous actions only;
    quick: :data:`SAC_QUICK`). A task's own agent in :data:`BRAX_DEFAULTS`
    runs for the budget it was measured at there.
    """
    from jaxweight.rl.envs import make_env
    from gymnax.environments import spaces

    family, _, name = env.partition(":")
    try:
        e, p = make_env(env)  # an unknown id or a missing extra: make_env's error
    except ValueError as err:
        raise EnvIdError(str(err)) from None
    discrete = isinstance(e.action_space(p), spaces.Discrete)
    if agent == "sac" and discrete:
        raise ValueError(f"agent 'sac' needs continuous actions; {env} has {e.action_space(p).n} discrete ones "
                         f"(use the default agent, ppo)")
    if family == "brax":
        base = dict(total_timesteps=2_000_000, total_comparisons=2_000, num_iterations=10, fragment_length=50,
                    num_members=3, ppo_envs=512, ppo_steps=80, ppo_minibatches=8, ppo_epochs=4,
                    learning_rate=3e-4, gamma=0.97, ent_coef=1e-2, normalize_observations=True, reward_scaling=10.0,
                    absorbing_bootstrap=True, use_next_state=True, heldout_steps=20_000,
                    max_grad_norm=None, clip_eps=0.3, tanh_squash=True, state_dependent_std=True)
        base.update(BRAX_PPO.get(name, {}))
        base.update(BRAX_REWARD_INPUTS.get(name, {}))
        base.update(skip_obs=e.inner.positions)  # the reward model sees the positions, the agent brax's observation
        base.update(reward_mirror=BRAX_REWARD_MIRROR.get(name))
        if agent == "sac":
            base.update(SAC_SETTINGS)
        own = BRAX_DEFAULTS.get(name, {})
        if own.get("agent") == agent:  # the task's own agent: the budget it was measured at
            base.update(total_timesteps=own["total_timesteps"])
        if quick:
            base.update(total_timesteps=min(base["total_timesteps"], 500_000), total_comparisons=600,
                        num_iterations=5, ppo_envs=256, ppo_steps=40, ppo_minibatches=8)
            if agent == "sac":
                base.update(SAC_QUICK)
        return base
    if discrete:
        base = dict(total_timesteps=1_000_000, total_comparisons=2_000, num_iterations=10, fragment_length=20,
                    num_members=3, ppo_envs=8, ppo_steps=64, ppo_minibatches=4, ppo_epochs=4, learning_rate=1e-3,
                    gamma=0.99, ent_coef=0.01)
    else:
        base = dict(total_timesteps=600_000, total_comparisons=2_000, num_iterations=10, fragment_length=20,
                    num_members=3, ppo_envs=16, ppo_steps=128, ppo_minibatches=16, ppo_epochs=10,
                    learning_rate=1e-3, gamma=0.95, ent_coef=0.0)
    base.update(use_next_state=True, **GYMNAX_REWARD_INPUTS.get(name, {}))
    if quick:
        base.update(total_timesteps=base["total_timesteps"] // 3, total_comparisons=600, num_iterations=5)
    if agent == "sac":
        base.update(SAC_SETTINGS, **(SAC_QUICK if quick else {}))
    return base


def settings(env: str = "cartpole", quick: bool = False, seeds: int | None = None, teacher: str = "synthetic",
             agent: str | None = None, **overrides: Any) -> Settings:
    """The demo's settings for ``env`` (``"cartpole"``, ``"pendulum"``, ``"gymnax:<id>"``, ``"brax:<name>"``).

    ``"gymnax:<id>"`` and ``"brax:<name>"`` get generic settings
    (:func:`_generic_base`: by action space for gymnax, brax's published PPO
    settings for brax), full or ``quick``.

    Teacher: temperature 1, answering with the Bradley-Terry probability
    itself (imitation's ``sample=False``), so pairs of equal return get the
    label 0.5 instead of a coin flip. Reward model: an ensemble of 3 state-only
    MLPs on squashed observations (:func:`~jaxweight.preference.env_rewards.reward_net`).
    Short fragments (20 steps): an untrained CartPole agent stays up ~20 steps
    out of 500, and only fragments that lie inside that stretch tell "upright"
    apart from "falling".

    ``teacher="human"`` (a person on the labelling page): one seed (more are
    refused: a person labels one run) and :data:`HUMAN_SETTINGS`: 300
    comparisons over 16 rounds, 30 in round 0, then 26, 24, ..., 13 (quick: 80,
    8 to 20 a round; on CartPole :data:`HUMAN_QUICK_CARTPOLE` too: 24 in round 0,
    100-step episodes, a goal of 90). (Measured with a scripted person who always picks the
    higher true return, cartpole: 500 of 500 in 3 of 4 seeds, 20 in the
    fourth; an untrained agent falls within ~20 of the 500 steps, so most early
    pairs tie and teach nothing. 150 comparisons over 11 rounds, 10 to 19 a
    round, reached 500 in none of 2 seeds.)

    ``agent``: ``"ppo"`` or ``"sac"`` (:data:`SAC_SETTINGS`; the
    ``"gymnax:"`` and ``"brax:"`` ids with continuous actions); None (default):
    :func:`default_agent`, the agent that measured best on a brax task
    (:data:`BRAX_DEFAULTS`), PPO elsewhere.

    ``overrides`` replace fields of the result (``total_timesteps``,
    ``total_comparisons``, ``num_iterations``, ``fragment_length``,
    ``num_members``, ``learning_rate`` (PPO), ``reward_learning_rate``, ...);
    ``None`` values are ignored.

    Raises:
      ValueError: an unknown env, teacher, agent or setting; ``seeds < 1``; ``seeds > 1`` with a human
        teacher; ``agent="sac"`` on discrete actions or a built-in env.
    """
    if agent is None:
        agent = default_agent(env)
    if agent not in AGENTS:
        raise ValueError(f"agent must be one of {list(AGENTS)}, got {agent!r}")
    if agent == "sac" and env in ("cartpole", "pendulum"):
        raise ValueError(f"agent 'sac' runs on the 'gymnax:<id>' and 'brax:<name>' ids with continuous actions, "
                         f"not the built-in {env!r} (e.g. gymnax:Pendulum-v1)")
    if env == "cartpole":
        base = dict(total_timesteps=1_000_000, total_comparisons=2_000, num_iterations=10, fragment_length=20,
                    num_members=3, ppo_envs=8, ppo_steps=64, ppo_minibatches=4, ppo_epochs=4, learning_rate=1e-3,
                    gamma=0.99, ent_coef=0.01)
        if quick:
            # the full run's agent budget: with 600k steps about one seed in four (varying with the
            # float rounding of the machine) failed to learn the learned reward's policy
            base.update(total_comparisons=1_000, num_iterations=6)
    elif env == "pendulum":
        base = dict(total_timesteps=600_000, total_comparisons=2_000, num_iterations=10, fragment_length=20,
                    num_members=3, ppo_envs=16, ppo_steps=128, ppo_minibatches=16, ppo_epochs=10,
                    learning_rate=1e-3, gamma=0.95, ent_coef=0.0)
        if quick:
            base.update(total_timesteps=200_000, total_comparisons=600, num_iterations=5)
    elif isinstance(env, str) and env.partition(":")[0] in ("gymnax", "brax") and ":" in env:
        base = _generic_base(env, quick, agent)
    else:
        raise EnvIdError(f"env must be 'cartpole', 'pendulum', 'gymnax:<id>' or 'brax:<name>', got {env!r}")
    if teacher not in TEACHERS:
        raise ValueError(f"teacher must be one of {list(TEACHERS)}, got {teacher!r}")
    human = teacher == "human"
    if human:
        base.update(HUMAN_SETTINGS[bool(quick)])
        if quick and env == "cartpole":
            base.update(HUMAN_QUICK_CARTPOLE)
    n = (1 if human else 2 if quick else 4) if seeds is None else int(seeds)
    if n < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if human and n > 1:
        raise ValueError(f"a person labels one run: --teacher human takes one seed, got --seeds {n}")
    fields = {f.name for f in dataclasses.fields(Settings)} - {"env", "quick", "seeds", "teacher", "agent"}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; expected some of {sorted(fields)}")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(env=env, quick=quick, seeds=n, teacher=teacher, agent=agent, **base)


def build(s: Settings) -> PreferenceComparisons:
    """The :class:`PreferenceComparisons` loop of the settings (PPO anneals its rate over the run; SAC keeps it).

    Raises:
      ValueError: settings the loop refuses (e.g. fragments longer than the episodes).
    """
    from jaxweight.rl.envs import make_env
    from jaxweight.preference.env_rewards import reward_net
    from jaxweight.preference.driver import PreferenceComparisons
    from jaxweight.preference.generators import AgentGenerator
    from jaxweight.rl.ppo import PPOConfig, PPOHParams

    env, env_params = make_env(s.env, horizon=s.horizon)
    net = reward_net(env, env_params, use_next_state=s.use_next_state, use_action=s.use_action,
                     mirror=None if s.reward_mirror is None else tuple(s.reward_mirror))
    k = s.num_iterations
    tpi, extra = divmod(s.total_timesteps, k)
    agent_steps = (k + 1) * tpi + extra  # imitation trains the agent in K + 1 rounds
    if s.agent == "sac":
        from jaxweight.rl.sac import SACConfig, SACHParams
        from jaxweight.preference.generators import SACGenerator

        gen = SACGenerator(
            env, env_params,
            config=SACConfig(num_envs=s.sac_envs, buffer_size=s.sac_buffer, batch_size=s.sac_batch,
                             updates_per_step=s.sac_updates_per_step, learning_starts=s.sac_learning_starts,
                             hidden_sizes=tuple(s.sac_hidden), normalize_observations=s.normalize_observations,
                             reward_scaling=s.reward_scaling, absorbing_bootstrap=s.absorbing_bootstrap,
                             skip_obs=s.skip_obs),
            hparams=SACHParams.create(learning_rate=s.learning_rate, gamma=s.gamma))
    else:
        gen = AgentGenerator(
            env, env_params,
            config=PPOConfig(num_envs=s.ppo_envs, num_steps=s.ppo_steps, num_minibatches=s.ppo_minibatches,
                             update_epochs=s.ppo_epochs, normalize_observations=s.normalize_observations,
                             reward_scaling=s.reward_scaling, absorbing_bootstrap=s.absorbing_bootstrap,
                             max_grad_norm=s.max_grad_norm, tanh_squash=s.tanh_squash, init_log_std=s.init_log_std,
                             state_dependent_std=s.state_dependent_std, skip_obs=s.skip_obs),
            hparams=PPOHParams.create(learning_rate=s.learning_rate, gamma=s.gamma, ent_coef=s.ent_coef,
                                      clip_eps=s.clip_eps, anneal_steps=float(agent_steps)),
            exploration_frac=s.exploration_frac,
        )
    trainer = RewardTrainer(net, num_members=s.num_members, learning_rate=s.reward_learning_rate)
    return PreferenceComparisons(
        gen, net, num_iterations=k, fragment_length=s.fragment_length, reward_trainer=trainer,
        sample=False, eval_episodes=s.eval_episodes, initial_comparison_frac=s.initial_comparison_frac,
    )


# ---------------------------------------------------------------- evaluation
def _heldout(pc, s: Settings):
    from jaxweight.preference.evaluation import preference_accuracy, reward_correlation

    gen = pc.generator
    explore = gen.replace(exploration_frac=1.0)

    def one(gen_state, reward_params, key):
        k_init, k_a, k_b, k_c, k_pairs, k_eval = jax.random.split(key, 6)
        parts = [
            gen.sample(gen_state, k_a, s.heldout_steps),          # the final agent
            explore.sample(gen_state, k_b, s.heldout_steps),      # ... with random-action exploration
            gen.sample(gen.init(k_init), k_c, s.heldout_steps),   # an untrained agent
        ]
        trajs = concatenate_trajectories(parts)
        pairs = random_fragments(k_pairs, trajs, s.fragment_length, s.heldout_pairs)
        acc, decided = preference_accuracy(pc.reward_module, reward_params, pairs, ensemble=pc.ensemble)
        corr = reward_correlation(pc.reward_module, reward_params, trajs, ensemble=pc.ensemble)
        ret = gen.evaluate(gen_state, k_eval, s.final_episodes)
        ret_det = gen.evaluate(gen_state, k_eval, s.final_episodes, deterministic=True)
        return {"return": jnp.mean(ret), "return_deterministic": jnp.mean(ret_det), "heldout_accuracy": acc,
                "heldout_decided": decided, "pearson": corr}

    return jax.jit(jax.vmap(one))


def evaluate(pc, s: Settings, key: Any) -> dict[str, np.ndarray]:
    """Final per-seed metrics of the run in ``pc.state`` (arrays of shape ``[seeds]``)."""
    st = pc.state
    keys = jax.random.split(jax.random.key(key) if isinstance(key, int) else key, s.seeds)
    out = _heldout(pc, s)(st.gen, st.reward.params, keys)
    return {k: np.asarray(v) for k, v in jax.device_get(out).items()}


def true_reward_baseline(pc, s: Settings, key: Any, agent_steps: int) -> np.ndarray:
    """Final returns ``[seeds]`` of the same agent (PPO or SAC) trained on the true reward for ``agent_steps``."""
    gen = pc.generator.with_reward(None)

    def one(k):
        k_init, k_train, k_eval = jax.random.split(k, 3)
        state = gen.train(gen.init(k_init), k_train, agent_steps)
        return jnp.mean(gen.evaluate(state, k_eval, s.final_episodes))

    keys = jax.random.split(jax.random.key(key) if isinstance(key, int) else key, s.seeds)
    return np.asarray(jax.device_get(jax.jit(jax.vmap(one))(keys)))


def random_return(pc, s: Settings, key: Any) -> np.ndarray:
    """True returns ``[seeds]`` of a uniformly random policy (mean of ``final_episodes`` episodes each):
    the zero of the normalised score ``(learned - random) / (true - random)``."""
    gen = pc.generator
    env, params, h = gen.base_env, gen.env_params, gen.horizon

    def episode(k):
        k0, ks = jax.random.split(k)
        _, st = env.reset_env(k0, params)

        def step(carry, kk):
            st, alive = carry
            ka, ke = jax.random.split(kk)
            a = gen._random_action(ka)
            _, st, r, done, _ = env.step_env(ke, st, a, params)
            return (st, alive & ~done), jnp.where(alive, jnp.asarray(r, jnp.float32), 0.0)

        return jnp.sum(jax.lax.scan(step, (st, jnp.asarray(True)), jax.random.split(ks, h))[1])

    def one(k):
        return jnp.mean(jax.vmap(episode)(jax.random.split(k, s.final_episodes)))

    keys = jax.random.split(jax.random.key(key) if isinstance(key, int) else key, s.seeds)
    return np.asarray(jax.device_get(jax.jit(jax.vmap(one))(keys)))


# ---------------------------------------------------------------- reporting
def agent_name(res_or_settings: dict) -> str:
    """``"PPO"`` or ``"SAC"``: the agent of a results dict (or of its ``settings``); runs before ``agent``
    existed were PPO's."""
    s = res_or_settings.get("settings", res_or_settings)
    return str(s.get("agent", "ppo")).upper()


def _mean_std(x) -> tuple[float, float]:
    x = np.asarray(x, np.float64)
    return float(np.mean(x)), float(np.std(x, ddof=1)) if x.size > 1 else 0.0


def format_table(res: dict) -> str:
    """Per-seed rows, a mean +- std row (std across seeds, ddof 1) and what each column is."""
    f = res["final"]
    base = res.get("baseline_return")
    cols = ["seed", "true return", "greedy", "held-out acc", "decided", "pearson"]
    name = agent_name(res)
    if base is not None:
        cols.append(f"{name} on true r")
    w = [5, 14, 8, 13, 8, 11, 14]
    lines = ["  ".join(c.rjust(n) for c, n in zip(cols, w)), "-" * (sum(w[:len(cols)]) + 2 * (len(cols) - 1))]
    for i in range(len(f["return"])):
        row = [str(i), f"{f['return'][i]:.1f}", f"{f['return_deterministic'][i]:.1f}",
               f"{100 * f['heldout_accuracy'][i]:.1f}%", str(int(f['heldout_decided'][i])), f"{f['pearson'][i]:.3f}"]
        if base is not None:
            row.append(f"{base[i]:.1f}")
        lines.append("  ".join(c.rjust(n) for c, n in zip(row, w)))
    lines.append("-" * len(lines[1]))

    def ms(x, pct=False, digits=1):
        m, sd = _mean_std(x)
        k = 100.0 if pct else 1.0
        return f"{k * m:.{digits}f}+-{k * sd:.{digits}f}" + ("%" if pct else "")

    row = ["mean", ms(f["return"]), ms(f["return_deterministic"], digits=0), ms(f["heldout_accuracy"], True),
           f"{np.mean(f['heldout_decided']):.0f}", ms(f["pearson"], digits=2)]
    if base is not None:
        row.append(ms(base))
    lines.append("  ".join(c.rjust(n) for c, n in zip(row, w)))
    pairs = res.get("settings", {}).get("heldout_pairs", Settings.heldout_pairs)
    legend = [("true return", "ground-truth return of the agent trained on the learned reward only "
                              "(sampled actions; the agent never sees the true reward)"),
              ("greedy", "the same agent's ground-truth return with greedy actions"),
              ("held-out acc", f"the share of {pairs:,} fresh fragment pairs (final, exploring and untrained "
                               "agents) that the reward ensemble orders as the noiseless teacher does, ties left out"),
              ("decided", f"how many of those {pairs:,} pairs are not ties: the pairs counted"),
              ("pearson", "correlation of the learned and the true reward per transition")]
    if base is not None:
        legend.append((f"{name} on true r", f"the same {name}, same steps, trained on the true reward"))
    legend.append(("mean", "mean +- std across seeds"))
    width = max(len(k) for k, _ in legend)
    lines.append("")
    lines += [textwrap.fill(text, width=100, initial_indent=f"  {k.ljust(width)}  ",
                            subsequent_indent=" " * (width + 4)) for k, text in legend]
    return "\n".join(lines)


def goals(res: dict) -> list[tuple[str, bool]]:
    """The quality goals of the default run: ``[(description, met)]``; a full brax run with its baseline: the
    mean normalised score >= :data:`GOAL_NORMALISED`; empty for other envs."""
    s = res["settings"]
    if s["env"].startswith("brax:") and not s["quick"]:
        score = normalised_score(res)
        if score is None:
            return []
        mean = float(np.nanmean(score))
        return [(f"mean normalised score {mean:.2f} >= {GOAL_NORMALISED}", mean >= GOAL_NORMALISED)]
    goal = goal_return(s)
    if goal is None:
        return []
    ret = float(np.mean(res["final"]["return"]))
    acc = float(np.mean(res["final"]["heldout_accuracy"]))
    out = [(f"mean ground-truth return {ret:.1f} >= {goal:.0f}", ret >= goal),
           (f"mean held-out accuracy {100 * acc:.1f}% >= {100 * GOAL_ACCURACY:.0f}%", acc >= GOAL_ACCURACY)]
    if not s["quick"] and s.get("teacher", "synthetic") == "synthetic":  # a person's pace is not the library's
        out.append((f"wall time {res['wall_s']:.0f} s <= {GOAL_WALL_S:.0f} s", res["wall_s"] <= GOAL_WALL_S))
    return out


def goal_return(settings: dict) -> float | None:
    """The run's ground-truth return goal (:data:`GOAL_RETURN`; :data:`GOAL_RETURN_SHARE` of the
    horizon where the settings set one), or None for an env without one."""
    if settings["env"] not in GOAL_RETURN:
        return None
    h = settings.get("horizon")
    return GOAL_RETURN[settings["env"]] if h is None else GOAL_RETURN_SHARE * h


def make_figure(plt: Any, res: dict) -> Any:
    """Ground-truth return and reward-model accuracy per round, across seeds (a matplotlib Figure)."""
    hist = res["history"]
    steps = np.cumsum([np.mean(h["agent_steps"]) for h in hist]) / 1e3
    gt = np.array([np.asarray(h["gt_return"], np.float64).reshape(-1) for h in hist])        # [R, S]
    acc = np.array([np.asarray(h["reward_accuracy"], np.float64).reshape(-1) for h in hist])
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for i in range(gt.shape[1]):
        ax[0].plot(steps, gt[:, i], color="tab:blue", alpha=0.3, lw=1)
    ax[0].plot(steps, gt.mean(1), color="tab:blue", lw=2, label=f"learned reward (mean of {gt.shape[1]} seeds)")
    ax[0].fill_between(steps, gt.min(1), gt.max(1), color="tab:blue", alpha=0.12, label="min-max over seeds")
    if res.get("baseline_return") is not None:
        b = float(np.mean(res["baseline_return"]))
        ax[0].axhline(b, color="tab:green", ls="--",
                      label=f"{agent_name(res)} on the true reward, same steps ({b:.0f})")
    if goal_return(res["settings"]) is not None:
        ax[0].axhline(goal_return(res["settings"]), color="k", ls=":", lw=1, label="goal")
    ax[0].set_xlabel("agent steps (thousands)")
    ax[0].set_ylabel("ground-truth return")
    ax[0].set_title(f"{res['settings']['env']}: agent trained on the learned reward only")
    ax[0].legend(loc="lower right", fontsize=8)
    fresh = np.array([np.asarray(h["fresh_accuracy"], np.float64).reshape(-1) for h in hist])   # [R, S]
    decided = np.array([np.asarray(h["fresh_decided"]).reshape(-1) for h in hist])
    fresh = np.where(decided > 0, fresh, np.nan)  # 0 where no new pair was decided (all tied): not measured
    for i in range(fresh.shape[1]):
        ax[1].plot(steps, fresh[:, i], color="tab:orange", alpha=0.3, lw=1)
    with np.errstate(all="ignore"):
        fresh_mean = np.array([np.nanmean(r) if np.isfinite(r).any() else np.nan for r in fresh])
    ax[1].plot(steps, fresh_mean, color="tab:orange", lw=2, marker=".",
               label="on each round's new comparisons, before training on them")
    ax[1].plot(steps, acc.mean(1), color="tab:gray", lw=1, ls="--",
               label="train accuracy (ties are labelled 0.5)")
    ho = np.asarray(res["final"]["heldout_accuracy"], np.float64)
    ax[1].errorbar([steps[-1]], [ho.mean()], yerr=[[ho.mean() - ho.min()], [ho.max() - ho.mean()]], fmt="o",
                   color="tab:red", capsize=3, label="held-out set after the run (min-max over seeds)")
    ax[1].axhline(GOAL_ACCURACY, color="k", ls=":", lw=1)
    ax[1].set_ylim(0.3, 1.02)
    ax[1].set_xlabel("agent steps (thousands)")
    ax[1].set_ylabel("accuracy vs the noiseless teacher (ties left out)")
    ax[1].set_title("reward ensemble")
    ax[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def plot(res: dict, path: str | os.PathLike) -> Path | None:
    """Write :func:`make_figure` as a PNG to ``path`` (skipped with a note without matplotlib)."""
    return C.save_plot(lambda plt: make_figure(plt, res), path)


def _json_ready(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_ready(v) for v in x]
    if isinstance(x, np.ndarray | np.generic):
        return x.tolist()
    return x


# ---------------------------------------------------------------- run
def _checkpoint_status(ckpt_dir: Path, resume: bool, num_rounds: int) -> str:
    """One line saying whether the run resumes a checkpoint, starts afresh over one, or starts anew.

    Rounds are counted from 1 here, as a person reads them ("2 of 7 rounds done; continuing with round 3").
    """
    from jaxweight.preference.driver import CHECKPOINT_NAME

    path = Path(ckpt_dir) / CHECKPOINT_NAME
    if not path.exists():
        return "[preferences] starting a new run" + (" (no checkpoint to resume)" if resume else "")
    try:
        done = int(checkpoint.load_metadata(path).get("rounds_done", 0))
    except (ValueError, OSError) as e:  # a damaged file: say so; train() raises if it is resumed
        return f"[preferences] the checkpoint {path} cannot be read ({e})"
    if resume:
        if done >= num_rounds:
            return f"[preferences] resuming: all {num_rounds} rounds are done already ({path}); evaluating it"
        return (f"[preferences] resuming: {done} of {num_rounds} rounds done; continuing with round {done + 1} of "
                f"{num_rounds} from {path}")
    return (f"[preferences] starting afresh: the checkpoint of an earlier run ({done} of {num_rounds} rounds done) "
            f"in {path} is moved aside, never resumed by this run (pass --resume to continue it instead)")


def finished_results(ckpt_dir: Path, results: Path, num_rounds: int, settings: dict) -> Path | None:
    """``results`` when it is the evaluation of the finished run in ``ckpt_dir``, else None.

    Finished: the checkpoint has every round done, and the results JSON, written after it, holds the
    same settings. ``--resume`` of such a run says so and exits instead of evaluating it again."""
    from jaxweight.preference.driver import CHECKPOINT_NAME

    path = Path(ckpt_dir) / CHECKPOINT_NAME
    try:
        done = int(checkpoint.load_metadata(path).get("rounds_done", 0))
        res = json.loads(Path(results).read_text("utf-8"))
        newer = Path(results).stat().st_mtime >= path.stat().st_mtime
    except (OSError, ValueError, TypeError, AttributeError):  # no checkpoint or results, or a damaged one
        return None
    if done >= num_rounds and newer and isinstance(res, dict) and res.get("settings") == _json_ready(settings):
        return Path(results)
    return None


def _move_aside(path: Path) -> Path | None:
    """Rename an earlier run's file to ``<stem>-<time><suffix>`` (nothing is deleted); its new path or None."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.stem}-{stamp}{path.suffix}")
    k = 1
    while target.exists():
        target = path.with_name(f"{path.stem}-{stamp}-{k}{path.suffix}")
        k += 1
    path.rename(target)
    return target


def _archive_labels(path: Path) -> Path | None:
    """Move an earlier run's label log aside (a fresh run asks anew; nothing is deleted); its new path or None."""
    return _move_aside(path)


def _label_lines(log: Any, num_rounds: int | None = None) -> Any:
    """A ``progress(round, labelled, requested)`` for :class:`~jaxweight.label.HumanTeacher`: two lines a round
    (rounds counted from 1, as the page counts them)."""
    said: dict[int, int] = {}
    of = "" if num_rounds is None else f" of {num_rounds}"

    def progress(i: int, labelled: int, requested: int) -> None:
        if i not in said:
            said[i] = labelled
            log(f"[label] round {i + 1}{of}: {labelled}/{requested} pairs answered; waiting for the rest on the page")
        if labelled >= requested and said.get(i) != -1:
            said[i] = -1
            log(f"[label] round {i + 1}{of}: {labelled}/{requested} pairs answered")
        _flush()

    return progress


def _flush() -> None:
    sys.stdout.flush()  # the URL and the waits must show at once, also through a pipe


def human_teacher(s: Settings, log_path: str | os.PathLike, *, port: int = 0, progress: bool = True,
                  log: Any = print, num_rounds: int | None = None, idle: str = "equal") -> Any:
    """The :class:`~jaxweight.label.HumanTeacher` of a run (not started): its label log, the env's clips.

    ``progress``: a tqdm bar of labelled/requested pairs per round (else a line when a round opens and one when
    it is done). The URL line goes to ``log`` (flushed). The page's token and port are kept beside the label
    log (``keep_address``): a resumed run serves the same URL, so an open tab goes on. ``idle``: what pairs with
    nothing to judge get (:data:`jaxweight.label.board.IDLE_RULES`: answered ``"equal"``, ``"skip"``-ped or ``"ask"``-ed).
    """
    from jaxweight.label import HumanTeacher, tqdm_progress

    def announce(line: str) -> None:
        log(line)
        _flush()

    return HumanTeacher(log_path, s.env, port=port, announce=announce, keep_address=True, idle=idle,
                        progress=tqdm_progress("labels") if progress else _label_lines(log, num_rounds))


#: the first compile of a run, in seconds, that the page announces before a run of this output folder has one
#: on record (quick human run, 2-core CPU: ~40 s)
COMPILE_GUESS_S = 45.0


def _measured(results: Path, key: str) -> float | None:
    """A time the last run written to ``results`` (its JSON) measured (``"compile_s"``, ``"evaluate_s"``), or None."""
    try:
        return float(json.loads(Path(results).read_text("utf-8"))[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _compile_guess(results: Path) -> float:
    """The compile time of the last run written to ``results`` (its JSON), else :data:`COMPILE_GUESS_S`."""
    t = _measured(results, "compile_s")
    return COMPILE_GUESS_S if t is None else t


def _rounds_done(ckpt_dir: Path) -> int:
    """The rounds the checkpoint in ``ckpt_dir`` finished (0 without a readable one)."""
    from jaxweight.preference.driver import CHECKPOINT_NAME

    try:
        return int(checkpoint.load_metadata(Path(ckpt_dir) / CHECKPOINT_NAME).get("rounds_done", 0))
    except (OSError, ValueError, TypeError):
        return 0


def run(env: str = "cartpole", quick: bool = False, seeds: int | None = None, out: str | os.PathLike | None = None,
        resume: bool = False, progress: bool = True, baseline: bool | None = None, seed: int = 0, *,
        tensorboard: str | os.PathLike | None = None, resume_override: bool = False,
        log: Any = print, teacher: str = "synthetic", port: int = 0, agent: str | None = None, idle: str = "equal",
        **overrides: Any) -> dict:
    """Run the demo; returns the results dict (also written to ``out/<env>[_quick].json`` with a PNG plot).

    Args:
      env: ``"cartpole"``, ``"pendulum"``, ``"gymnax:<id>"`` or ``"brax:<name>"``.
      quick: the small version.
      seeds: number of seeds run at once (default 4, quick 2).
      out: output folder (checkpoints, ``metrics.jsonl``, JSON, plot); ``None`` writes nothing.
      resume: continue from the checkpoint in ``out`` if there is one.
      progress: show the progress bar.
      baseline: also train the agent (PPO or SAC) on the true reward with the same number of
        agent steps (default: yes, except for ``quick`` runs).
      seed: the run's key.
      tensorboard: also write TensorBoard event files there (needs tensorboardX).
      resume_override: resume even if settings differ from the checkpoint's (the
        changes are printed and stored in the results).
      log: where the progress lines go.
      teacher: ``"synthetic"`` or ``"human"`` (a person on the labelling page;
        needs ``out`` for the label log ``out/checkpoints/<tag>/labels.jsonl``).
      port: the labelling page's port with ``teacher="human"`` (0: any free one).
      idle: with ``teacher="human"``, what pairs with nothing to judge get (both clips up for as many steps,
        e.g. both fallen all along, or identical): ``"equal"`` (the noiseless teacher's tie), ``"skip"`` or ``"ask"``.
      agent: ``"ppo"`` or ``"sac"``; None: the env's default (see :func:`settings`).
      **overrides: settings fields (see :func:`settings`).

    Raises:
      ValueError: settings the loop refuses; a checkpoint of other settings;
        ``teacher="human"`` without ``out``, with more than one seed, or on a port that is taken.
      jaxweight.StateFileError: a damaged checkpoint or label log with ``resume``.
    """
    t0 = time.perf_counter()
    commit = C.provenance()["commit"]  # the code this run imported: a commit made while it runs is not it
    s = settings(env, quick, seeds, teacher, agent, **overrides)
    human = s.teacher == "human"
    if human and out is None:
        raise ValueError("--teacher human needs an output folder (out=...) to keep the label log in")
    pc = build(s)
    tag = file_tag(env, quick, s.agent)
    ckpt = None if out is None else Path(out) / "checkpoints" / tag
    plan = pc.plan(s.total_timesteps, s.total_comparisons)
    per_round = f" ({min(plan.schedule)} to {max(plan.schedule)} a round)" if human else ""
    log(f"[preferences] {env}: {s.seeds} seed{'s' if s.seeds > 1 else ''} x {plan.num_rounds} rounds, {s.total_comparisons} comparisons"
        f"{per_round} of {s.fragment_length}-step fragments by the {s.teacher} teacher, "
        f"{sum(plan.agent_steps):,} agent steps per seed" + (f"; checkpoints in {ckpt}" if ckpt else ""))
    hours = cpu_hours(s)
    if hours is not None and jax.default_backend() == "cpu":
        log(f"[preferences] {hours}")
    labeller = labels = None
    if ckpt is not None and resume and not resume_override:
        done = finished_results(ckpt, Path(out) / f"{tag}.json", plan.num_rounds, dataclasses.asdict(s))
        if done is not None:  # nothing to run: say where the results are (remove them to evaluate again)
            log(f"[preferences] this run is finished: all {plan.num_rounds} rounds done; results in {done} "
                "(remove that file to evaluate the checkpoint again)")
            return {**json.loads(done.read_text("utf-8")), "json": str(done), "finished_earlier": True}
    if ckpt is not None:
        log(_checkpoint_status(ckpt, resume, plan.num_rounds))
        if not resume:  # a fresh run: a later --resume must never continue the earlier run
            from jaxweight.preference.driver import CHECKPOINT_NAME

            moved = _move_aside(ckpt / CHECKPOINT_NAME)
            if moved is not None:
                log(f"[preferences] the earlier run's checkpoint is kept in {moved}")
    if human:
        labels = ckpt / LABELS_NAME
        if not resume:
            moved = _archive_labels(labels)
            if moved is not None:
                log(f"[preferences] starting afresh: the earlier run's labels are kept in {moved}")
            from jaxweight.label.address import address_path

            address_path(labels).unlink(missing_ok=True)  # a new token: an old tab says the server restarted
        labeller = human_teacher(s, labels, port=port, progress=progress, log=log, num_rounds=plan.num_rounds,
                                 idle=idle)
        labeller.set_plan(plan.schedule, rounds_done=_rounds_done(ckpt) if resume else 0,
                          tail_s=_measured(Path(out) / f"{tag}.json", "evaluate_s"))
        given = len(labeller.log.records)
        log(f"[preferences] labels are saved to {labels}" + (f" ({given} lines given before)" if given else ""))
    try:
        return _run(pc, s, plan, env, quick, out, ckpt, tag, resume, progress, baseline, seed, tensorboard,
                    resume_override, log, port, labeller, labels, t0, commit)
    except KeyboardInterrupt:
        if labeller is not None:
            labeller.stopped(f"run stopped (Ctrl-C): labels kept in {labels}; run again with --resume to continue")
        raise
    finally:
        if labeller is not None:
            labeller.close()  # every label is on disk already


def _run(pc, s, plan, env, quick, out, ckpt, tag, resume, progress, baseline, seed, tensorboard, resume_override,
         log, port, labeller, labels, t0, commit=None) -> dict:
    """The body of :func:`run` once the teacher is made (the page, if any, is closed by the caller)."""
    timer = C.Timer()
    writer = None
    try:
        if ckpt is not None and resume:  # refuse a damaged checkpoint or changed settings before compiling anything
            pc.check_checkpoint(ckpt, s.total_timesteps, s.total_comparisons, num_seeds=s.seeds,
                                allow_changed=bool(resume_override), teacher=labeller)
        if labeller is not None:
            try:
                labeller.start()  # the URL first: the page waits for round 0 while the loop compiles
            except OSError as e:
                raise ValueError(f"the labelling page cannot listen on 127.0.0.1:{port} ({e}); "
                                 "choose another --port") from None
            labeller.board.set_phase("preparing", eta_s=_compile_guess(Path(out) / f"{tag}.json"))
        with timer.section("compile"):
            pc.compile(s.total_timesteps, s.total_comparisons, num_seeds=s.seeds, teacher=labeller)
        log(f"[preferences] compiled the loop in {timer['compile']:.1f} s")
        bar = None
        if progress:
            from jaxweight.preference.driver import tqdm_progress

            bar = tqdm_progress()
        if out is not None:
            writer = metrics.open_writers(out, tensorboard, append=resume)

        def on_round(i: int, n: int, host: dict) -> None:
            if writer is not None:
                asked = {} if labeller is None else {f"label/{k}": float(v) for k, v in labeller.rounds.get(i, {}).items()}
                writer.write(i, {**metrics.flatten(host, "preference"), **asked})
            if bar is not None:
                bar(i, n, host)

        with timer.section("run"):
            pc.train(seed, s.total_timesteps, s.total_comparisons, num_seeds=s.seeds, checkpoint_dir=ckpt,
                     resume=resume, allow_changed=bool(resume_override), progress=on_round, teacher=labeller)
        if bar is not None:
            for line in PROGRESS_LEGEND:
                log(line)
    finally:
        if writer is not None:
            writer.close()
    if labeller is not None:
        labeller.board.set_phase("evaluating", eta_s=_measured(Path(out) / f"{tag}.json", "evaluate_s"))
    for note in pc.overrides:
        log(f"[preferences] resumed after round {note['round']} with changed settings (--resume-override): "
            + "; ".join(note["changed"]))
    t_loop = time.perf_counter() - t0
    if baseline is None:
        baseline = not quick
    with timer.section("evaluate"):
        final = evaluate(pc, s, jax.random.fold_in(jax.random.key(seed), 1))
        base = None
        if baseline:
            log(f"[preferences] {s.agent.upper()} on the true reward, {sum(plan.agent_steps):,} steps per seed ...")
            base = true_reward_baseline(pc, s, jax.random.fold_in(jax.random.key(seed), 2), sum(plan.agent_steps))
        # the random policy's return for the id environments (the built-in runs stay what they were)
        rnd = None if env in GOAL_RETURN or env == "pendulum" else random_return(
            pc, s, jax.random.fold_in(jax.random.key(seed), 3))
    wall = time.perf_counter() - t0
    res = {
        "settings": dataclasses.asdict(s),
        "plan": plan.to_dict(),
        "history": pc.history,
        "overrides": pc.overrides,
        "final": final,
        "baseline_return": base,
        "random_return": rnd,
        "labels": None if labels is None else str(labels),
        # per round: pairs, asked (shown to the person), by_rule (nothing to judge: answered by the rule), skipped
        "label_rounds": None if labeller is None else {str(k): v for k, v in sorted(labeller.rounds.items())},
        "wall_s": wall,
        "loop_s": t_loop,
        "compile_s": timer["compile"],
        "run_s": timer["run"],
        "evaluate_s": timer["evaluate"],
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "device": str(jax.devices()[0]),
        "jax_version": jax.__version__,
        **C.provenance(),
    }
    if commit is not None and commit != res["commit"]:  # the checkout changed while the run ran
        res.update(commit=commit, commit_at_end=res["commit"])
    if out is not None:
        out = Path(out)
        res["json"] = str(out / f"{tag}.json")
        checkpoint.save_json(res["json"], _json_ready(res))   # results first: never lost to a plot error
        png = plot(res, out / f"{tag}.png")
        res["plot"] = None if png is None else str(png)
        if labeller is not None:
            labeller.finish(f"run finished: results in {res['json']}")
    return res


def cpu_hours(s: Settings) -> str | None:
    """One line when a brax run at the task's measured settings (:data:`BRAX_DEFAULTS`) passes an hour on 2 CPU
    cores, or when such a run was never timed; None for a quick run, other settings and other envs."""
    family, _, name = s.env.partition(":")
    own = BRAX_DEFAULTS.get(name) if family == "brax" else None
    if s.quick or own is None or own["agent"] != s.agent or own["total_timesteps"] != s.total_timesteps:
        return None
    seeds = f"{s.seeds} seed{'s' if s.seeds > 1 else ''}"
    fewer = f"--seeds 1 about 1/{s.seeds} of it, " if s.seeds > 1 else ""
    if own["seed_wall_s"] is None:
        return (f"{s.env} with {s.agent.upper()} at {s.total_timesteps:,} steps was never timed on a CPU: expect "
                f"hours on 2 cores for {seeds} (a GPU, {fewer}or --quick for a smoke run of minutes)")
    est = own["seed_wall_s"] * s.seeds
    if est <= 3600:
        return None
    return (f"{s.env} at these settings took {own['seed_wall_s'] / 60:.0f} min per seed on 2 CPU cores: about "
            f"{est / 3600:.1f} h for {seeds}. It needs a GPU to fit in an hour ({fewer}--quick a smoke run of "
            f"minutes)")


def file_tag(env: str, quick: bool = False, agent: str | None = None) -> str:
    """The name of a run's files and checkpoint folder: ``env`` with ``:`` as ``-``, ``_sac`` with SAC
    (``agent`` None: :func:`default_agent`'s), ``_quick`` when quick."""
    agent = default_agent(env) if agent is None else agent
    tag = env.replace(":", "-").replace("/", "-") + ("" if agent == "ppo" else f"_{agent}")
    return f"{tag}_quick" if quick else tag


def normalised_score(res: dict) -> np.ndarray | None:
    """Per seed ``(learned - random) / (true - random)`` (the issue's goal: >= 0.8), or None without a
    baseline or a random return."""
    if res.get("baseline_return") is None or res.get("random_return") is None:
        return None
    learned = np.asarray(res["final"]["return"], np.float64)
    true = np.asarray(res["baseline_return"], np.float64)
    rnd = np.asarray(res["random_return"], np.float64)
    return (learned - rnd) / np.where(true - rnd == 0, np.nan, true - rnd)


def report(res: dict) -> str:
    """The printed summary: table, wall time, files (the goals are printed by :func:`main`)."""
    lines = ["", format_table(res), ""]
    score = normalised_score(res)
    if score is not None:
        lines.append(f"  normalised score (learned - random) / ({agent_name(res)} on true r - random): "
                     f"{', '.join(f'{x:.2f}' for x in score)} (mean {np.mean(score):.2f}); random policy "
                     f"{np.mean(res['random_return']):.1f}")
    load = res.get("load_avg")
    lines.append(f"  wall time {res['wall_s']:.0f} s: compile {res.get('compile_s', 0):.1f} s, "
                 f"run {res.get('run_s', 0):.1f} s, evaluation {res.get('evaluate_s', 0):.1f} s"
                 + (f"; load average {load[0]:.2f} (1 min) on {os.cpu_count()} CPUs" if load else ""))
    if res.get("json"):
        lines.append(f"  results: {res['json']}")
    if res.get("labels"):
        lines.append(f"  labels: {res['labels']}")
    if res.get("plot"):
        lines.append(f"  plot: {res['plot']}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The demo's command line (:mod:`jaxweight.demos._args`: built without jax; every value checked by
    argparse: one line and exit code 2 when bad)."""
    return _args.parser("preferences")


def _fail(message: str) -> int:
    print(f"python -m jaxweight demo preferences: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _args.parse("preferences", argv)  # bad values and refused combinations: one line, exit 2
    C.require_extra("gymnax", "rl", "the preferences demo")
    overrides = dict(num_iterations=args.rounds, total_comparisons=args.comparisons,
                     total_timesteps=args.timesteps, fragment_length=args.fragment_length,
                     num_members=args.members, reward_learning_rate=args.reward_lr, learning_rate=args.agent_lr)
    try:
        res = run(args.env, quick=args.quick, seeds=args.seeds, out=args.out, resume=args.resume,
                  progress=not args.no_progress, baseline=args.baseline, seed=args.seed,
                  tensorboard=args.tensorboard, resume_override=args.resume_override, teacher=args.teacher,
                  port=args.port or 0, agent=args.agent, idle=args.idle or "equal", **overrides)
    except StateFileError as e:  # a damaged or foreign checkpoint or label log
        return _fail(str(e).splitlines()[0])
    except EnvIdError as e:  # named as argparse names a bad value: "argument --env: ..."
        msg = " ".join(str(e).split())
        return _fail(f"argument --env: {msg[len('env '):] if msg.startswith('env must') else msg}")
    except (ValueError, ImportError) as e:  # settings the loop refuses, a checkpoint of other settings, an
        return _fail(" ".join(str(e).split()))  # unknown env id or the missing extra of one
    except KeyboardInterrupt:  # one line, no traceback: what is kept and how to go on
        ckpt = Path(args.out) / "checkpoints" / file_tag(args.env, args.quick, args.agent)
        kept = (f"labels kept in {ckpt / LABELS_NAME}" if args.teacher == "human"
                else f"the checkpoint of the last finished round is in {ckpt}")
        print(f"\n[preferences] stopped: {kept}; run again with --resume to continue", file=sys.stderr)
        return 130
    if res.get("finished_earlier"):
        print(f"[preferences] finished earlier: results in {res['json']}")
        return 0
    print(report(res))
    sys.stdout.flush()
    return C.finish(goals(res), args.strict)


__all__ = ["EnvIdError", "Settings", "settings", "goal_return", "default_agent", "cpu_hours", "file_tag", "build", "human_teacher", "evaluate", "true_reward_baseline",
           "random_return", "normalised_score", "format_table",
           "goals", "make_figure", "plot", "run", "report", "parser", "main"]
