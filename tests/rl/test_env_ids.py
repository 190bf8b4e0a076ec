"""make_env's ids: any gymnax environment at a fixed horizon (absorbing after termination, as seals),
a user's own environment, the errors of bad ids, and one preference loop on a generic gymnax env."""

import importlib.util
import re

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

from jaxweight import preference as pf
from jaxweight._install import install_hint
from jaxweight.preference import driver as dr
from jaxweight.rl.env_ids import known_ids
from jaxweight.rl.envs import FixedHorizonCartPole, env_step, make_env, oracle_reward
from jaxweight.preference.env_rewards import reward_net
from jaxweight.preference.evaluation import preference_accuracy
from jaxweight.rl.fixed_horizon import FixedHorizon, default_horizon
from jaxweight.preference.generators import AgentGenerator
from jaxweight.rl.ppo import PPOConfig

TINY_PPO = PPOConfig(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, hidden_sizes=(16, 16))


# ------------------------------------------------------------------ a user's environment
@struct.dataclass
class WalkState:
    x: jax.Array
    time: jax.Array


@struct.dataclass
class WalkParams:
    max_steps_in_episode: int = 30


class Walk(environment.Environment):
    """Steps of +-0.25 on a line, reward -|x - 1|; terminates at the goal x >= 1."""

    @property
    def default_params(self):
        return WalkParams()

    def reset_env(self, key, params):
        s = WalkState(jnp.zeros(()), jnp.asarray(0, jnp.int32))
        return self.get_obs(s), s

    def step_env(self, key, s, action, params):
        s = WalkState(s.x + jnp.where(action == 1, 0.25, -0.25), s.time + 1)
        return self.get_obs(s), s, -jnp.abs(s.x - 1.0), s.x >= 1.0, {}

    def get_obs(self, s, params=None, key=None):
        return s.x[None]

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(-10.0, 10.0, (1,), jnp.float32)


@struct.dataclass
class EndlessParams:
    max_steps_in_episode: float = float("inf")


class Endless(Walk):
    """A Walk without a finite horizon in its params."""

    @property
    def default_params(self):
        return EndlessParams()


def _rollout(env, params, key, actions):
    """``env.step_env`` (no auto-reset) over ``actions``: obs [T+1], rewards [T], dones [T], infos, states."""
    k0, ks = jax.random.split(key)
    obs0, s0 = env.reset_env(k0, params)

    def step(s, xs):
        k, a = xs
        o, s2, r, d, info = env.step_env(k, s, a, params)
        return s2, (o, r, d, info, s2)

    _, (obs, rews, dones, infos, states) = jax.lax.scan(step, s0, (jax.random.split(ks, len(actions)), actions))
    return jnp.concatenate([obs0[None], obs]), rews, dones, infos, states


def _random_actions(env, params, key, n):
    space = env.action_space(params)
    if isinstance(space, spaces.Discrete):
        return jax.random.randint(key, (n,), 0, int(space.n))
    return jax.random.uniform(key, (n,) + tuple(space.shape), minval=space.low, maxval=space.high)


# ------------------------------------------------------------------ fixed horizon
@pytest.mark.parametrize("env_id", ["gymnax:Acrobot-v1", "gymnax:CartPole-v1", "gymnax:MountainCar-v0",
                                    "gymnax:Pendulum-v1", "gymnax:MountainCarContinuous-v0"])
def test_gymnax_ids_run_exactly_the_horizon(env_id):
    """Random actions for 2 horizons with auto-reset: done exactly at steps H and 2H, the counter back to 0."""
    h = 25
    env, p = make_env(env_id, horizon=h)
    assert isinstance(env, FixedHorizon) and env.fixed_horizon and env.horizon == p.max_steps_in_episode == h
    assert env.obs_shape == gymnax.make(env_id.split(":")[1])[0].observation_space(p.env_params).shape
    actions = _random_actions(env, p, jax.random.key(1), 2 * h)

    @jax.jit
    def run(key):
        _, s0 = env.reset(key, p)

        def step(s, xs):
            k, a = xs
            _, s, r, d, _ = env_step(env, k, s, a, p)
            return s, (d, s.time, r)

        return jax.lax.scan(step, s0, (jax.random.split(key, 2 * h), actions))[1]

    dones, times, rews = run(jax.random.key(0))
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(dones)), [h - 1, 2 * h - 1])
    np.testing.assert_array_equal(np.asarray(times), np.tile(np.r_[np.arange(1, h), 0], 2))
    assert times.dtype == jnp.int32 and rews.dtype == jnp.float32 and np.all(np.isfinite(rews))


def test_default_horizon_is_gymnax_max_steps():
    for env_id, h in [("gymnax:Acrobot-v1", 500), ("gymnax:MountainCar-v0", 200), ("gymnax:Pendulum-v1", 200),
                      ("gymnax:MountainCarContinuous-v0", 999)]:
        env, p = make_env(env_id)
        assert env.horizon == p.max_steps_in_episode == h
        # the inner env must not truncate before the horizon: its own limit is the horizon too
        assert p.env_params.max_steps_in_episode == h
    env, p = make_env("gymnax:MountainCar-v0", horizon=300)
    assert p.env_params.max_steps_in_episode == 300
    assert default_horizon(Walk()) == 30 and default_horizon(Endless()) is None


def test_mountain_car_absorbs_at_the_goal_as_seals():
    """seals' MountainCar: -1 per step until the goal, then the final observation repeats with reward 0,
    and done only at step 200. Up to the goal the steps are gymnax's own."""
    env, p = make_env("gymnax:MountainCar-v0")
    inner, ip = gymnax.make("MountainCar-v0")
    key = jax.random.key(0)

    def energy_pump(step_fn, params):  # push along the velocity: reaches the goal in about 120 steps
        def step(carry, k):
            s, obs = carry
            a = jnp.where(obs[1] >= 0, 2, 0)
            o, s, r, d, info = step_fn(k, s, a, params)
            return (s, o), (o, r, d, info)
        return step

    obs0, s0 = env.reset_env(key, p)
    keys = jax.random.split(jax.random.key(1), 200)
    _, (obs, rews, dones, info) = jax.lax.scan(energy_pump(env.step_env, p), (s0, obs0), keys)
    rews, dones, obs = np.asarray(rews), np.asarray(dones), np.asarray(obs)
    goal = int(np.argmax(obs[:, 0] >= ip.goal_position))  # the step that reaches the goal
    assert 50 < goal < 199 and obs[goal, 0] >= ip.goal_position
    np.testing.assert_array_equal(rews, np.where(np.arange(200) <= goal, -1.0, 0.0))
    np.testing.assert_array_equal(obs[goal + 1:], np.broadcast_to(obs[goal], obs[goal + 1:].shape))
    np.testing.assert_array_equal(np.asarray(info["absorbing"]), np.arange(200) > goal)
    np.testing.assert_array_equal(np.flatnonzero(dones), [199])
    # before absorbing, the same transitions as the plain gymnax env (same keys)
    i0, is0 = inner.reset_env(key, ip)
    _, (iobs, irews, idones, _) = jax.lax.scan(energy_pump(inner.step_env, ip), (is0, i0), keys)
    np.testing.assert_array_equal(obs[: goal + 1], np.asarray(iobs)[: goal + 1])
    assert bool(idones[goal]) and not np.asarray(idones)[:goal].any()


def test_cartpole_v1_absorbs_after_a_fall():
    """gymnax CartPole-v1 terminates on a fall: the state freezes, the observation repeats, the reward is 0."""
    env, p = make_env("gymnax:CartPole-v1", horizon=100)
    actions = jnp.ones((100,), jnp.int32)  # always push right: falls within ~10 steps
    obs, rews, dones, info, states = jax.jit(_rollout, static_argnums=0)(env, p, jax.random.key(0), actions)
    rews, absorbing = np.asarray(rews), np.asarray(info["absorbing"])
    first = int(np.argmax(absorbing))
    assert 3 < first < 30 and absorbing[first:].all() and not absorbing[:first].any()
    np.testing.assert_array_equal(rews, np.where(absorbing, 0.0, 1.0))
    np.testing.assert_array_equal(np.asarray(obs[first + 1:]), np.broadcast_to(obs[first], obs[first + 1:].shape))
    np.testing.assert_array_equal(np.asarray(states.env_state.x[first:]), np.asarray(states.env_state.x[first]))
    np.testing.assert_array_equal(np.asarray(states.time), np.arange(1, 101))
    assert np.flatnonzero(np.asarray(dones)).tolist() == [99]


def test_a_users_environment_is_wrapped_the_same_way():
    env, p = make_env(Walk())
    assert env.horizon == 30 and isinstance(env, FixedHorizon)
    obs, rews, dones, info, _ = _rollout(env, p, jax.random.key(0), jnp.ones((30,), jnp.int32))
    # x = 0.25, 0.5, 0.75, 1.0 (the goal, step 3), then absorbing at x = 1 with reward 0
    np.testing.assert_allclose(np.asarray(rews[:4]), [-0.75, -0.5, -0.25, 0.0])
    assert not np.asarray(rews[4:]).any() and np.asarray(info["absorbing"][4:]).all()
    np.testing.assert_array_equal(np.asarray(obs[4:, 0]), 1.0)
    assert np.flatnonzero(np.asarray(dones)).tolist() == [29]
    env2, p2 = make_env(Endless(), horizon=12)
    assert p2.max_steps_in_episode == p2.env_params.max_steps_in_episode == 12  # the inner limit is the horizon
    # the agent declares the one horizon to the loop (its sampling is the end-to-end test's)
    assert AgentGenerator(env, p, config=TINY_PPO).horizons == (30,)
    # the true reward is the step's: no transition_reward, so no oracle
    with pytest.raises(ValueError, match="no transition_reward: its true reward comes from step_env"):
        oracle_reward(env, p)
    # an object that is already fixed-horizon is returned as it is
    cp = FixedHorizonCartPole(horizon=20)
    assert make_env(cp)[0] is cp and make_env(cp, horizon=20)[1].max_steps_in_episode == 20


def test_reward_net_and_equality_of_id_envs():
    env, p = make_env("gymnax:MountainCar-v0", horizon=50)
    # squashing scales from the observation space bounds (position [-1.2, 0.6], velocity +-0.07)
    np.testing.assert_allclose(env.obs_scale, [1.2, 0.07], rtol=1e-6)
    cp, _ = make_env("gymnax:CartPole-v1")
    assert cp.obs_scale[1] == cp.obs_scale[3] == 1.0  # unbounded velocities: no squashing scale
    net = reward_net(env, p, hidden_sizes=(4,), use_next_state=True)
    o = jnp.zeros((2, 2))
    params = net.init(jax.random.key(0), o, jnp.zeros(2, jnp.int32), o, jnp.zeros(2, bool))
    assert params["params"]["net"]["dense0"]["kernel"].shape == (4, 4)
    # the same id and horizon: equal envs, so jitted programs are shared
    again, _ = make_env("gymnax:MountainCar-v0", horizon=50)
    assert again == env and hash(again) == hash(env) and again != make_env("gymnax:MountainCar-v0", horizon=60)[0]
    assert make_env(Walk())[0] != make_env(Walk())[0]  # a user's objects: equal only when the same object


# ------------------------------------------------------------------ errors
def test_unknown_ids_name_the_close_ones():
    with pytest.raises(ValueError, match=r"unknown environment 'acrobot'; did you mean 'gymnax:Acrobot-v1'"):
        make_env("acrobot")
    with pytest.raises(ValueError, match=r"unknown environment 'CartPole-v1'; did you mean 'gymnax:CartPole-v1'"):
        make_env("CartPole-v1")
    with pytest.raises(ValueError, match=r"accepted: 'cartpole', 'pendulum', 'gymnax:<name>', 'brax:<name>'"):
        make_env("mujoco:ant")
    with pytest.raises(ValueError, match=r"unknown gymnax environment 'Acrobot-v2' in 'gymnax:Acrobot-v2'; "
                                         r"did you mean 'Acrobot-v1'\?"):
        make_env("gymnax:Acrobot-v2")
    assert "gymnax:MountainCarContinuous-v0" in known_ids() and "cartpole" in known_ids(("cartpole",))


def test_brax_ids_name_the_missing_extra():
    if importlib.util.find_spec("brax") is None:
        with pytest.raises(ImportError, match=re.escape(f"'brax:halfcheetah' needs brax: {install_hint('brax')}")):
            make_env("brax:halfcheetah")
    else:  # installed: brax's names (the ids themselves are tested in test_brax.py, the brax CI step)
        with pytest.raises(ValueError, match=r"unknown brax environment 'halfcheeta' in 'brax:halfcheeta'; "
                                             r"did you mean 'halfcheetah'"):
            make_env("brax:halfcheeta")


@pytest.mark.parametrize(("make", "match"), [
    (lambda: make_env(Endless()), r"horizon=None but Endless has no finite horizon \(default_params"
                                  r"\.max_steps_in_episode = inf\); pass horizon="),
    (lambda: make_env("gymnax:Acrobot-v1", horizon=0), r"horizon must be an int >= 1, got 0"),
    (lambda: make_env("gymnax:Acrobot-v1", horizon=2.5), r"horizon must be an int >= 1, got 2.5"),
    (lambda: make_env(Walk(), horizon=-3), r"horizon must be an int >= 1, got -3"),
    (lambda: make_env("cartpole", horizon=0), r"horizon must be an int >= 1, got 0"),
    (lambda: make_env(Walk(), dt=0.1), r"keyword arguments \['dt'\] go to the constructor of an environment id"),
    (lambda: make_env(3), r"env must be an environment id \('cartpole', 'pendulum', 'gymnax:<id>'"),
    (lambda: make_env(FixedHorizonCartPole(), horizon=20), r"horizon=20 but FixedHorizonCartPole already has "
                                                            r"the fixed horizon 500"),
    (lambda: make_env("gymnax:Acrobot-v1", bogus=1), r"gymnax:Acrobot-v1 does not take the arguments \['bogus'\]"),
])
def test_bad_input_is_one_clear_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------------------------ the loop on a generic env
@pytest.mark.slow
def test_preference_loop_learns_on_a_gymnax_id():
    """Sampling, fragments, the synthetic teacher, reward learning and PPO on "gymnax:CartPole-v1" (absorbing
    after a fall). The buffer fills with valid pairs of full-horizon episodes, and the learned reward ranks
    held-out pairs by their true return far better than chance (a wrapper whose absorbing steps kept the
    env's reward, or that ended episodes early, fails this)."""
    h, comparisons = 40, 200
    env, p = make_env("gymnax:CartPole-v1", horizon=h)
    net = reward_net(env, p, hidden_sizes=(16,))
    pc = dr.PreferenceComparisons(
        AgentGenerator(env, p, config=TINY_PPO), net, num_iterations=2, fragment_length=5,
        reward_trainer=pf.RewardTrainer(net, num_members=2, epochs=5, progress=False), initial_epoch_multiplier=4.0,
        initial_comparison_frac=0.5, sample=False, eval_episodes=0, progress=False,
    )
    pc.train(0, 600, comparisons)
    last = pc.history[-1]
    assert last["stored_valid"] == last["buffer_size"] == comparisons
    assert all(r["horizon_min"] == r["horizon_max"] == h and not r["variable_horizon"] for r in pc.history)
    assert last["agent_steps_trained"] >= 600
    # a random policy falls within the horizon: returns below h, so fragments differ
    assert all(0 < r["sample_return"] < h for r in pc.history)
    # held out: fresh episodes of the trained agent
    trajs = jax.jit(pc.generator.sample, static_argnames="steps")(pc.state.gen, jax.random.key(7), steps=40 * h)
    pairs = pf.random_fragments(jax.random.key(8), trajs, 5, 300, warning_threshold=0)
    acc, decided = preference_accuracy(net, pc.state.reward.params, pairs)
    assert int(decided) >= 100 and float(acc) >= 0.8, (float(acc), int(decided))
