"""Fixed-horizon environments, the learned-reward wrapper and the demo reward net."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control import cartpole as gx_cartpole
from gymnax.environments.classic_control import pendulum as gx_pendulum

from jaxweight.rl.envs import (
    FixedHorizonCartPole,
    FixedHorizonPendulum,
    LearnedRewardEnv,
    LearnedRewardParams,
    env_step,
    make_env,
    oracle_reward,
)
from jaxweight.preference.env_rewards import MirroredReward, reward_net


def _rollout(env, params, key, actions):
    """Step ``env.step_env`` (no auto-reset) through ``actions``; returns obs [T+1], rewards [T], dones [T], states."""
    k0, ks = jax.random.split(key)
    obs0, s0 = env.reset_env(k0, params)

    def step(carry, xs):
        s, _ = carry
        k, a = xs
        o, s2, r, d, _ = env.step_env(k, s, a, params)
        return (s2, o), (o, r, d, s2)

    _, (obs, rews, dones, states) = jax.lax.scan(step, (s0, obs0), (jax.random.split(ks, len(actions)), actions))
    return jnp.concatenate([obs0[None], obs]), rews, dones, states


@pytest.mark.fast
def test_cartpole_fixed_horizon_and_upright_reward():
    env, p = make_env("cartpole")
    assert env.horizon == 500 and p.max_steps_in_episode == 500 and env.fixed_horizon
    actions = jax.random.bernoulli(jax.random.key(1), 0.5, (500,)).astype(jnp.int32)
    obs, rews, dones, states = jax.jit(_rollout, static_argnums=0)(env, p, jax.random.key(0), actions)
    dones = np.asarray(dones)
    # no early termination: done exactly at step 500
    assert not dones[:-1].any() and dones[-1]
    up = (np.abs(np.asarray(states.x)) <= p.x_threshold) & (np.abs(np.asarray(states.theta)) <= p.theta_threshold_radians)
    np.testing.assert_array_equal(np.asarray(rews), up.astype(np.float32))
    # a random policy falls: the reward turns 0 and the physics keeps running
    assert 0 < rews.sum() < 100 and rews[-1] == 0.0
    assert np.abs(np.asarray(obs[-1, 2])) > p.theta_threshold_radians
    assert states.time.dtype == jnp.int32


def test_cartpole_physics_is_gymnax():
    env, p = make_env("cartpole")
    ref = gx_cartpole.CartPole()
    key = jax.random.key(3)
    o1, s1 = env.reset_env(key, p)
    o2, s2 = ref.reset_env(key, p)
    np.testing.assert_array_equal(o1, o2)
    for t, a in enumerate([1, 1, 0, 1, 0, 0, 0, 1]):
        o1, s1, r1, d1, _ = env.step_env(key, s1, a, p)
        o2, s2, r2, d2, _ = ref.step_env(key, s2, a, p)
        np.testing.assert_allclose(o1, o2, rtol=0, atol=0, err_msg=f"step {t}")
        assert float(r1) == 1.0 and not bool(d1)


def test_pendulum_reward_and_horizon():
    env, p = make_env("pendulum")
    ref = gx_pendulum.Pendulum()
    assert env.horizon == 200
    actions = jax.random.uniform(jax.random.key(2), (200, 1), minval=-3.0, maxval=3.0)
    obs, rews, dones, _ = jax.jit(_rollout, static_argnums=0)(env, p, jax.random.key(0), actions)
    assert not np.asarray(dones)[:-1].any() and bool(dones[-1])
    # the same rewards as gymnax (which takes a scalar torque)
    _, s = ref.reset_env(jax.random.split(jax.random.key(0))[0], p)
    for t in range(5):
        _, s, r, _, _ = ref.step_env(jax.random.key(0), s, actions[t, 0], p)
        np.testing.assert_allclose(rews[t], r, rtol=1e-6)
    # the observation-only true reward used by the oracle
    f = oracle_reward(env, p)
    r2 = jax.vmap(lambda o, a, o2: f(None, o, a, o2, False))(obs[:-1], actions, obs[1:])
    np.testing.assert_allclose(r2, rews, rtol=1e-5, atol=1e-5)


def test_cartpole_oracle_reward_matches_env():
    env, p = make_env("cartpole")
    actions = jax.random.bernoulli(jax.random.key(5), 0.5, (200,)).astype(jnp.int32)
    obs, rews, _, _ = _rollout(env, p, jax.random.key(4), actions)
    f = oracle_reward(env, p)
    r2 = jax.vmap(lambda o, a, o2: f(None, o, a, o2, False))(obs[:-1], actions, obs[1:])
    np.testing.assert_array_equal(r2, rews)


@pytest.mark.fast
def test_bad_arguments():
    with pytest.raises(ValueError, match="horizon"):
        FixedHorizonCartPole(horizon=0)
    with pytest.raises(ValueError, match="horizon"):
        FixedHorizonPendulum(horizon=2.5)
    with pytest.raises(ValueError, match="unknown environment 'acrobot'"):
        make_env("acrobot")
    with pytest.raises(ValueError, match="reward_apply must be callable"):
        LearnedRewardEnv(FixedHorizonCartPole(), 3)
    with pytest.raises(ValueError, match="no transition_reward"):
        oracle_reward(gx_cartpole.CartPole(), gx_cartpole.EnvParams())
    with pytest.raises(ValueError, match="obs_scale"):
        reward_net(gx_cartpole.CartPole())
    env, p = make_env("cartpole", horizon=20)
    assert env.horizon == 20 and p.max_steps_in_episode == 20


@pytest.mark.fast
def test_learned_reward_env_returns_learned_reward_and_keeps_true_one():
    """The agent-facing reward is reward_apply's; the true reward is in info only."""
    env, p = make_env("cartpole")

    def reward_apply(rp, obs, action, next_obs, done):
        return rp["w"] @ obs + rp["b"] * action + 10.0 * done

    wrapped = LearnedRewardEnv(env, reward_apply)
    rp = {"w": jnp.array([1.0, -2.0, 3.0, 0.5]), "b": jnp.asarray(7.0)}
    params = LearnedRewardParams(p, rp)
    obs, state = wrapped.reset(jax.random.key(0), params)
    base_state = state.env_state
    for t, a in enumerate([1, 0, 1, 1]):
        k = jax.random.key(10 + t)
        obs2, state, r, done, info = env_step(wrapped, k, state, a, params)
        _, base_state, r_true, _, _ = env.step_env(jax.random.split(k)[0], base_state, a, p)
        np.testing.assert_allclose(r, rp["w"] @ obs + 7.0 * a, rtol=1e-6)
        assert float(info["true_reward"]) == float(r_true) == 1.0
        assert float(r) != float(r_true)
        obs = obs2
    assert wrapped.fixed_horizon and wrapped.num_actions == 2
    with pytest.raises(ValueError, match="no default params"):
        wrapped.default_params


def test_new_reward_params_never_recompile():
    env, p = make_env("cartpole")
    traces = []

    def reward_apply(rp, obs, action, next_obs, done):
        return jnp.sum(rp * next_obs)

    wrapped = LearnedRewardEnv(env, reward_apply)

    @jax.jit
    def run(rp, key):
        traces.append(1)
        params = LearnedRewardParams(p, rp)
        obs, s = wrapped.reset(key, params)

        def step(carry, k):
            s = carry
            _, s, r, _, _ = env_step(wrapped, k, s, 0, params)
            return s, r

        return jax.lax.scan(step, s, jax.random.split(key, 10))[1]

    r1 = run(jnp.ones(4), jax.random.key(0))
    r2 = run(2 * jnp.ones(4), jax.random.key(0))
    np.testing.assert_allclose(r2, 2 * r1, rtol=1e-6)
    assert len(traces) == 1


def test_reward_net_is_bounded_and_state_only():
    env, p = make_env("cartpole")
    net = reward_net(env, p, hidden_sizes=(16,))
    o = jnp.zeros((2, 4))
    params = net.init(jax.random.key(0), o, jnp.zeros(2, jnp.int32), o, jnp.zeros(2, bool))
    # make every weight large: a bounded input still gives a bounded reward
    params = jax.tree.map(lambda w: 5.0 * jnp.sign(w) + 1.0, params)
    far = jnp.array([[1e3, -1e4, 50.0, 1e5], [1e6, 1e6, 1e6, 1e6]])
    r_far = net.apply(params, far, jnp.array([0, 1]), far, jnp.zeros(2, bool))
    bound = sum(float(jnp.sum(jnp.abs(w))) for w in jax.tree.leaves(params))
    assert np.all(np.isfinite(r_far)) and np.all(np.abs(r_far) < bound)
    # the action does not enter
    x = jax.random.normal(jax.random.key(1), (5, 4))
    r0 = net.apply(params, x, jnp.zeros(5, jnp.int32), x, jnp.zeros(5, bool))
    r1 = net.apply(params, x, jnp.ones(5, jnp.int32), x, jnp.zeros(5, bool))
    np.testing.assert_array_equal(r0, r1)
    # with the action enabled it does; pendulum actions are Box(1)
    env2, p2 = make_env("pendulum")
    net2 = reward_net(env2, p2, use_action=True)
    o2 = jnp.zeros((3, 3))
    prm = net2.init(jax.random.key(0), o2, jnp.zeros((3, 1)), o2, jnp.zeros(3, bool))
    assert prm["params"]["net"]["dense0"]["kernel"].shape == (4, 32)


def test_envs_vmap_over_keys():
    env, p = make_env("cartpole")
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(0), 6), p)
    obs2, state2, r, d, _ = jax.vmap(partial(env_step, env), in_axes=(0, 0, 0, None))(
        jax.random.split(jax.random.key(1), 6), state, jnp.arange(6) % 2, p
    )
    assert obs2.shape == (6, 4) and r.shape == (6,) and r.dtype == jnp.float32 and not d.any()


def test_env_step_adapter_folds_both_gymnax_signatures():
    """One adapter for gymnax 0.0.x (5-tuple) and 1.x (6-tuple): done at the horizon, then auto-reset."""
    env, p = make_env("cartpole", horizon=3)
    obs, s = env.reset(jax.random.key(0), p)
    dones = []
    for t in range(3):
        obs, s, r, d, info = env_step(env, jax.random.key(t), s, 1, p)
        dones.append(bool(d))
        assert r.dtype == jnp.float32 and isinstance(info, dict)
    assert dones == [False, False, True] and int(s.time) == 0  # reset after the horizon

    class Weird:
        def step(self, *a):
            return (1, 2, 3)

    with pytest.raises(ValueError, match="returned 3 values"):
        env_step(Weird(), None, None, None)


def test_mirrored_reward_is_exactly_symmetric_and_refuses_bad_mirrors():
    env, p = make_env("pendulum")  # observation (cos, sin, angular velocity): the mirror keeps cos
    mirror = (1.0, -1.0, -1.0)
    net = reward_net(env, p, use_action=True, use_next_state=True, mirror=mirror)
    assert isinstance(net, MirroredReward) and net.obs_sign == mirror
    s, s2 = jax.random.normal(jax.random.key(0), (2, 6, 3))
    a = jax.random.normal(jax.random.key(1), (6, 1))
    d = jnp.zeros(6, bool)
    params = net.init(jax.random.key(2), s, a, s2, d)
    plain = reward_net(env, p, use_action=True, use_next_state=True)
    inner_params = {"params": params["params"]["net"]}  # the inner net's params, one copy
    assert jax.tree.structure(inner_params) == jax.tree.structure(plain.init(jax.random.key(2), s, a, s2, d))
    m = jnp.asarray(mirror)
    r = net.apply(params, s, a, s2, d)
    np.testing.assert_allclose(net.apply(params, s * m, -a, s2 * m, d), r, rtol=1e-6, atol=1e-6)
    # it is the inner net averaged over the state and its mirror image
    inner = plain.apply(inner_params, s, a, s2, d) + plain.apply(inner_params, s * m, -a, s2 * m, d)
    np.testing.assert_allclose(r, inner / 2, rtol=1e-6, atol=1e-6)
    assert not np.allclose(plain.apply(inner_params, s, a, s2, d), r)  # the inner net alone is not symmetric
    for bad in [(1.0, -1.0), (1.0, 0.5, -1.0), "abc", ((1.0, -1.0, -1.0),)]:
        with pytest.raises(ValueError, match="mirror must be"):
            reward_net(env, p, mirror=bad)
    with pytest.raises(ValueError, match="continuous actions"):
        reward_net(make_env("cartpole")[0], mirror=(-1.0,) * 4)


# ------------------------------------------------------------------ a diverging simulation (brax's Ant)
from flax import struct  # noqa: E402

from jaxweight.rl.brax_envs import DIVERGED, BraxEnv  # noqa: E402  (brax itself is not imported)
from jaxweight.rl.fixed_horizon import FixedHorizon  # noqa: E402


@struct.dataclass
class _SimState:
    """The fields of a brax ``State`` that :class:`BraxEnv` reads."""

    pipeline_state: jax.Array
    obs: jax.Array
    reward: jax.Array
    done: jax.Array
    metrics: dict
    info: dict


class _Unstable:
    """A brax-like env whose state grows tenfold a step (plus the action): it passes ``DIVERGED`` on the
    seventh step of full pushes; with ``nan_above`` its observation turns NaN past that value instead."""

    observation_size, action_size = 2, 1

    def __init__(self, nan_above=None):
        self.nan_above = nan_above

    def reset(self, key):
        z = jnp.zeros(2)
        return _SimState(z, z, jnp.zeros(()), jnp.zeros(()), {"speed": jnp.zeros(()), "fell": jnp.zeros(())},
                         {"steps": jnp.zeros((), jnp.int32)})

    def step(self, s, a):
        q = s.pipeline_state * 10.0 + a[0]
        obs = q if self.nan_above is None else jnp.where(q > self.nan_above, jnp.nan, q)
        s.metrics.update(speed=q[1], fell=0.0)  # in place, a Python float among them: as brax's envs do
        return s.replace(pipeline_state=q, obs=obs, reward=obs[0], info={"steps": s.info["steps"] + 1})


@pytest.mark.fast
@pytest.mark.parametrize("nan_above", [None, 1e3])
def test_a_diverged_simulation_absorbs_in_its_last_finite_state(nan_above):
    env = FixedHorizon(BraxEnv(_Unstable(nan_above), "unstable"), horizon=10, env_id="test:unstable")
    p = env.default_params
    _, s = env.reset_env(jax.random.key(0), p)

    def step(s, k):
        o, s, r, d, info = env.step_env(k, s, jnp.ones(1), p)
        return s, (o, r, info["diverged"], info["absorbing"])

    _, (obs, rew, diverged, absorbing) = jax.jit(lambda s: jax.lax.scan(step, s, jax.random.split(jax.random.key(1), 10)))(s)
    last = 111111.0 if nan_above is None else 111.0  # 1, 11, 111, ...: the last entry below the bound
    n = 6 if nan_above is None else 3  # finite steps before the one that diverges
    assert np.all(np.isfinite(obs)) and np.all(np.isfinite(rew))
    np.testing.assert_allclose(rew[:n], [float("1" * (i + 1)) for i in range(n)])
    assert np.all(rew[n:] == 0.0)  # the diverged step pays nothing, nor do the absorbing ones after it
    np.testing.assert_allclose(obs[n - 1:], last)  # the last finite observation, repeated
    assert diverged.tolist() == [False] * n + [True] + [False] * (9 - n)  # marked once, not while absorbing
    assert absorbing.tolist() == [False] * (n + 1) + [True] * (9 - n)
    assert nan_above is not None or last < DIVERGED <= 10 * last + 1  # the bound the values above assume
