"""Reward networks for an environment: squashed observations, a mirror symmetry, the demo's net.

:func:`reward_net` builds the reward model the preference demo uses for an environment of
:func:`jaxweight.rl.make_env` (a :class:`~jaxweight.preference.RewardMLP` on squashed
observations, :class:`SquashedObsReward`, optionally made symmetric, :class:`MirroredReward`).

Example::

    from jaxweight import rl
    from jaxweight.preference.env_rewards import reward_net
    env, p = rl.make_env("cartpole")
    net = reward_net(env, p)                       # sees the state; f32[] per transition
    assert net.obs_scale == tuple(float(v) for v in env.obs_scale)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from gymnax.environments import environment, spaces

from .reward_nets import Box, Discrete, RewardMLP

__all__ = ["SquashedObsReward", "MirroredReward", "reward_net"]


class SquashedObsReward(nn.Module):
    """A reward net on bounded observation features ``tanh(obs / obs_scale)``.

    After a fall CartPole's cart and pole keep moving and their observations
    grow without bound; a reward MLP on raw observations then extrapolates
    linearly to huge rewards far from its data (the agent learns to reach
    them, and Bradley-Terry probabilities saturate). Squashing every
    observation dimension into ``(-1, 1)`` at its natural scale keeps the
    learned reward bounded and flat far away.

    Attributes:
      net: the inner reward module (e.g. :class:`~jaxweight.preference.RewardMLP`),
        called as ``net(tanh(state / s), action, tanh(next_state / s), done)``.
      obs_scale: per-dimension scale ``s`` (a tuple, static).

    Call:
      ``apply(params, state f32[..., D], action, next_state f32[..., D], done bool[...]) -> f32[...]``.
    """

    net: nn.Module
    obs_scale: tuple

    @nn.compact
    def __call__(self, state, action, next_state, done):
        scale = jnp.asarray(self.obs_scale, jnp.float32)
        squash = lambda o: jnp.tanh(jnp.asarray(o, jnp.float32) / scale)  # noqa: E731
        return self.net(squash(state), action, squash(next_state), done)


class MirroredReward(nn.Module):
    """A reward net invariant under a mirror symmetry of the task: ``(r(s, a, s') + r(M s, -a, M s')) / 2``.

    ``M`` flips the sign of some observation entries (``obs_sign``, +-1 per
    entry): for a cart-pole on a level track, mirroring left and right negates
    the cart position, the angles' sines and every velocity, keeps the
    cosines, and negates the action; the dynamics and the true reward do not
    change. Fitted on the states one agent visits, a reward net is otherwise
    free on the mirror images it never saw (on brax's InvertedDoublePendulum
    the learned reward of the mirrored states of the agent's own rollouts was
    ~11 lower, below the absorbing state's), and the agent is steered by that
    difference instead of by staying up. Averaging the net over ``s`` and
    ``M s`` makes the reward exactly symmetric; the params are the inner
    net's (called twice). Use it only where the symmetry holds: it is prior
    knowledge of the task, not learned.

    Attributes:
      net: the inner reward module, called as ``net(state, action, next_state, done)``.
      obs_sign: ``M`` as a tuple of +-1 per observation entry (static).

    Call:
      ``apply(params, state f32[..., D], action f32[..., A], next_state f32[..., D], done bool[...]) -> f32[...]``.
    """

    net: nn.Module
    obs_sign: tuple

    @nn.compact
    def __call__(self, state, action, next_state, done):
        m = jnp.asarray(self.obs_sign, jnp.float32)
        flip = lambda o: jnp.asarray(o, jnp.float32) * m  # noqa: E731
        mirrored = self.net(flip(state), -jnp.asarray(action, jnp.float32), flip(next_state), done)
        return 0.5 * (self.net(state, action, next_state, done) + mirrored)


def reward_net(
    env: environment.Environment,
    env_params: Any = None,
    *,
    hidden_sizes: tuple[int, ...] = (32, 32),
    use_action: bool = False,
    use_next_state: bool = False,
    mirror: tuple[float, ...] | None = None,
) -> nn.Module:
    """The reward network the preference demo uses for a built-in or ``"gymnax:..."`` environment.

    A :class:`~jaxweight.preference.RewardMLP` on squashed observations
    (:class:`SquashedObsReward` with the environment's ``obs_scale``; for a
    :class:`~jaxweight.rl.fixed_horizon.FixedHorizon` env, the bounds of
    its observation space). By default it sees the state only: both built-in
    true rewards are functions of the state (up to Pendulum's tiny torque
    cost), as are gymnax CartPole-v1's and MountainCar-v0's once absorbing
    (reward 0 exactly on the terminal observation), and an action input lets
    the first reward model, fitted on random-policy data, credit an action
    that merely co-occurs with good states, which a PPO agent then turns into
    a deterministic policy it cannot unlearn. Rewards paid on arrival
    (gymnax Acrobot-v1's and MountainCarContinuous-v0's goal step) need
    ``use_next_state=True`` to be represented exactly.

    Args:
      env: a built-in or ``FixedHorizon`` environment (needs ``obs_scale`` and ``obs_shape``).
      env_params: its params (default ``env.default_params``).
      hidden_sizes: MLP widths.
      use_action, use_next_state: extra inputs of the MLP.
      mirror: a mirror symmetry of the task, +-1 per observation entry: the
        net is wrapped in :class:`MirroredReward` (continuous actions only;
        ``None``: no symmetry).

    Raises:
      ValueError: an environment without ``obs_scale``; a ``mirror`` that is
        not +-1 per entry of a flat observation, or with discrete actions.
    """
    if not hasattr(env, "obs_scale"):
        raise ValueError(f"{type(env).__name__} has no obs_scale; build the reward net by hand")
    params = env.default_params if env_params is None else env_params
    space = env.action_space(params)
    act_space = Discrete(int(space.n)) if isinstance(space, spaces.Discrete) else Box(tuple(space.shape))
    mlp = RewardMLP(
        hidden_sizes=tuple(hidden_sizes), use_state=True, use_action=use_action, use_next_state=use_next_state,
        observation_space=Box(tuple(env.obs_shape)), action_space=act_space,
    )
    scale = env.obs_scale  # flat for the built-ins; FixedHorizon's is nested floats of obs_shape already
    net = SquashedObsReward(mlp, tuple(float(v) for v in scale) if np.ndim(scale) == 1 else scale)
    if mirror is None:
        return net
    try:
        sign = np.asarray(mirror, dtype=np.float64)
    except (TypeError, ValueError):
        sign = None
    shape = tuple(env.obs_shape)
    if sign is None or len(shape) != 1 or sign.shape != shape or not np.all(np.abs(sign) == 1.0):
        raise ValueError(f"mirror must be +-1 for each entry of a flat observation of shape {shape}, got {mirror!r}")
    if isinstance(space, spaces.Discrete):
        raise ValueError("mirror needs continuous actions (it negates the action); this environment's are discrete")
    return MirroredReward(net, tuple(float(v) for v in sign))
