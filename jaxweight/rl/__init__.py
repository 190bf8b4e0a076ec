"""Environments and agents in JAX: fixed-horizon gymnax and brax environments, PPO and SAC.

Environments (:mod:`.envs`, :mod:`.fixed_horizon`, :mod:`.env_ids`, :mod:`.brax_envs`):
:func:`make_env` is the one factory (``"cartpole"``, ``"pendulum"``, ``"gymnax:<id>"``,
``"brax:<name>"`` or a user's gymnax ``Environment``), every environment it returns runs exactly
``horizon`` steps (:class:`FixedHorizon` absorbs after a termination); :func:`env_step` steps any
gymnax version; :class:`LearnedRewardEnv` replaces the reward with a reward function whose params
ride in the env params. Agents (:mod:`.ppo`, :mod:`.ppo_agent`, :mod:`.sac`, :mod:`.rollout`,
:mod:`.normalization`): :class:`PPOAgent` and :class:`SACAgent` (``init`` / ``train`` /
``sample_episodes`` / ``evaluate``, pure functions over an explicit state: they jit and vmap
over seeds), their configs (static) and hyperparameters (array leaves), the running observation
normaliser. Needs gymnax (the ``rl`` extra); ``brax:`` ids need the ``brax`` extra.

Example::

    from jaxweight import rl
    env, params = rl.make_env("cartpole", horizon=50)
    agent = rl.PPOAgent(env, params, config=rl.PPOConfig(num_envs=2, num_steps=16, num_minibatches=2,
                                                         update_epochs=1, hidden_sizes=(16,)))
    state = agent.train(agent.init(0), 1, 64)
    returns = agent.evaluate(state, 2, 4)          # f32[4], true returns
    assert returns.shape == (4,)
"""

from .envs import (
    ENVS,
    FixedHorizonCartPole,
    FixedHorizonPendulum,
    LearnedRewardEnv,
    LearnedRewardParams,
    LearnedRewardState,
    RewardFn,
    env_step,
    make_env,
    oracle_reward,
)
from .fixed_horizon import FixedHorizon, FixedHorizonParams, FixedHorizonState
from .normalization import ObsNorm, obs_norm_apply, obs_norm_init, obs_norm_update
from .ppo import ActorCritic, PPOConfig, PPOHParams, PPOState, Transition, gae, ppo_loss, ppo_loss_fresh_gae
from .ppo_agent import PPOAgent, PPOAgentState
from .rollout import Episodes, EpisodeSampler
from .sac import SACAgent, SACConfig, SACHParams, SACReplay, SACState

__all__ = [
    # environments
    "make_env", "env_step", "ENVS", "FixedHorizonCartPole", "FixedHorizonPendulum",
    "FixedHorizon", "FixedHorizonParams", "FixedHorizonState",
    "LearnedRewardEnv", "LearnedRewardParams", "LearnedRewardState", "RewardFn", "oracle_reward",
    # observation normalisation
    "ObsNorm", "obs_norm_init", "obs_norm_update", "obs_norm_apply",
    # PPO
    "PPOConfig", "PPOHParams", "PPOState", "ActorCritic", "Transition", "gae", "ppo_loss", "ppo_loss_fresh_gae",
    "PPOAgent", "PPOAgentState",
    # SAC
    "SACConfig", "SACHParams", "SACState", "SACReplay", "SACAgent",
    # rollouts
    "Episodes", "EpisodeSampler",
]
