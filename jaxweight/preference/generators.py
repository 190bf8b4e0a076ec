"""Trajectory generators for preference comparisons: the protocol and the agents of :mod:`jaxweight.rl`.

imitation's ``TrajectoryGenerator`` (``sample(steps)``, ``train(steps)``) as pure
functions over an explicit state, so a whole run jits and vmaps over seeds:
``gen.init(key)``, ``gen.sample(state, key, steps, max_steps=cap)`` (fixed
shapes), ``gen.train(state, key, steps, reward_params)`` and, for agents,
``gen.evaluate(state, key, n)`` (true returns).
:class:`~jaxweight.preference.datasets.DatasetGenerator` (its own module) is a
fixed, shuffled set of trajectories (``TrajectoryDataset``);
:class:`AgentGenerator` the PPO agent (:class:`jaxweight.rl.PPOAgent`) and
:class:`SACGenerator` the SAC agent (:class:`jaxweight.rl.SACAgent`) on a gymnax
environment rewarded by the learned model, with ``AgentTrainer``'s exploration:
their samples are :class:`~jaxweight.preference.data.Trajectories` that record
the true reward for the teacher. :class:`HostGenerator` is a thin stateful
wrapper with imitation's methods.

References:
  imitation ``algorithms/preference_comparisons.py`` (``TrajectoryDataset``,
  ``AgentTrainer``) and ``policies/exploration_wrapper.py``;
  Schulman et al. 2017 (PPO, arXiv:1707.06347); purejaxrl (Lu et al. 2022).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from .._util import as_key, check_static_int
from ..rl.ppo_agent import PPOAgent
from ..rl.sac import SACAgent
from .data import Trajectories

__all__ = [
    "TrajectoryGenerator",
    "HostGenerator",
    "AgentGenerator",
    "SACGenerator",
]

Array = jax.Array


# ------------------------------------------------------------------ protocol
class TrajectoryGenerator(Protocol):
    """imitation's protocol: ``sample(key, steps)`` and ``train(key, steps, reward_params)``."""

    def sample(self, key: Any, steps: int) -> Trajectories:  # pragma: no cover - protocol
        ...

    def train(self, key: Any, steps: int, reward_params: Any = None) -> None:  # pragma: no cover
        ...


class HostGenerator:
    """Stateful host-side view of a pure generator (imitation's ``TrajectoryGenerator``).

    Args:
      gen: a pure generator (:class:`~jaxweight.preference.datasets.DatasetGenerator` or :class:`AgentGenerator`).
      key: key or int seed for ``gen.init``.

    Attributes:
      state: the current generator state (replaced by ``train``).

    For instance ``host = HostGenerator(AgentGenerator.from_name("cartpole"), 0)``,
    then ``host.sample(1, 1000)`` (>= 1000 transitions) and ``host.train(2, 10_000, reward_params)``.
    """

    def __init__(self, gen, key: Any):
        self.gen = gen
        self.state = gen.init(as_key(key))
        self._sample = jax.jit(gen.sample, static_argnames=("steps",))
        self._train = jax.jit(gen.train)

    def sample(self, key: Any, steps: int) -> Trajectories:
        """Trajectories with ``sum(lengths) >= steps`` (padding trajectories have length 0)."""
        steps = check_static_int(steps, "steps", minimum=0)
        return self._sample(self.state, as_key(key), steps=steps)

    def train(self, key: Any, steps: int, reward_params: Any = None) -> None:
        """Train the agent for ``steps`` environment steps on ``reward_params`` (no-op for datasets)."""
        steps = check_static_int(steps, "steps", minimum=0)
        self.state = self._train(self.state, as_key(key), jnp.asarray(steps, jnp.int32), reward_params)


# ------------------------------------------------------------------ the agents as generators
class _Sampling:
    """``sample``: an agent's :meth:`~jaxweight.rl.rollout.EpisodeSampler.sample_episodes` as ``Trajectories``."""

    def sample(self, state: Any, key: Any, steps: Any, *, max_steps: int | None = None) -> Trajectories:
        """:meth:`~jaxweight.rl.rollout.EpisodeSampler.sample_episodes` (same arguments: imitation's
        ``AgentTrainer.sample`` with its exploration episodes) as preference ``Trajectories``.

        Returns:
          ``Trajectories(obs f32[N, H+1, D], acts [N, H, ...], rews f32[N, H],
          lengths i32[N], terminal bool[N])`` with ``N = episodes_for(max_steps)``;
          unused episodes have length 0.
        """
        e = self.sample_episodes(state, key, steps, max_steps=max_steps)
        return Trajectories(obs=e.obs, acts=e.acts, rews=e.rews, lengths=e.lengths, terminal=e.terminal)


class AgentGenerator(_Sampling, PPOAgent):
    """A gymnax + PPO agent (:class:`jaxweight.rl.PPOAgent`) trained on a learned reward; samples are
    ``Trajectories`` that record the true reward.

    The constructor is :class:`~jaxweight.rl.ppo_agent.PPOAgent`'s: ``(env, env_params,
    reward_apply=None, *, config, hparams, exploration_frac, switch_prob, random_prob)``;
    :class:`~jaxweight.preference.driver.PreferenceComparisons` binds its learned reward to a
    generator built with ``reward_apply=None`` (``with_reward``). The state is
    :class:`~jaxweight.rl.ppo_agent.PPOAgentState`.

    For instance, with ``env, p = rl.make_env("cartpole")``:
    ``gen = AgentGenerator(env, p, reward_apply, exploration_frac=0.05)``, ``s = gen.init(0)``,
    ``s = gen.train(s, key, 50_000, reward_params)`` and ``gen.sample(s, key, 2_000)`` (obs
    ``f32[N, 501, 4]`` with the true rewards).
    """


class SACGenerator(_Sampling, SACAgent):
    """A SAC agent (:class:`jaxweight.rl.SACAgent`, continuous actions, reward relabelling) as a
    generator: samples are ``Trajectories`` that record the true reward.

    The constructor is :class:`~jaxweight.rl.sac.SACAgent`'s: ``(env, env_params,
    reward_apply=None, *, config, hparams, exploration_frac, switch_prob, random_prob)``; the
    state is :class:`~jaxweight.rl.sac.SACState`.
    """
