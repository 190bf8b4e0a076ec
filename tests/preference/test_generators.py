"""Trajectory generators: take_steps, the fixed dataset, the PPO agent (sampling, training, exploration)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import checkpoint
from jaxweight.preference import trajectories_from_arrays
from jaxweight.rl.envs import make_env, oracle_reward
from jaxweight.preference.datasets import DatasetGenerator, take_steps
from jaxweight.preference.generators import AgentGenerator, HostGenerator
from jaxweight.rl.ppo import PPOConfig, PPOHParams, orthogonal

TINY = PPOConfig(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, hidden_sizes=(16, 16))


def _trajs(lengths, terminal=True, horizon=None):
    rng = np.random.default_rng(0)
    return trajectories_from_arrays(
        obs=[rng.normal(size=(n + 1, 3)) for n in lengths], acts=[rng.integers(0, 2, n) for n in lengths],
        rews=[np.full(n, float(i)) for i, n in enumerate(lengths)], terminal=terminal, horizon=horizon,
    )


def test_take_steps_is_imitations_get_trajectories():
    t = _trajs([4, 3, 5, 2])
    # imitation: keep trajectories[: idx + 1] with idx the first index where the cumulative length >= steps
    for steps, keep in [(0, 0), (1, 1), (4, 1), (5, 2), (7, 2), (8, 3), (12, 3), (13, 4), (14, 4), (99, 4)]:
        out = take_steps(t, steps)
        np.testing.assert_array_equal(out.lengths, [4, 3, 5, 2][:keep] + [0] * (4 - keep), err_msg=str(steps))
        np.testing.assert_array_equal(out.terminal, [True] * keep + [False] * (4 - keep))
    # traced steps
    out = jax.jit(take_steps)(t, jnp.int32(8))
    np.testing.assert_array_equal(out.lengths, [4, 3, 5, 0])


def test_dataset_generator_shuffles_with_the_key():
    t = _trajs([5] * 12)
    gen = DatasetGenerator(t)
    s = gen.init(0)
    a = gen.sample(s, 1, 20)
    b = gen.sample(s, 1, 20)
    c = gen.sample(s, 2, 20)
    np.testing.assert_array_equal(a.rews, b.rews)          # same key, same order
    assert not np.array_equal(a.rews[:, 0], c.rews[:, 0])   # another key, another order
    assert int(a.lengths.sum()) == 20 and int((a.lengths > 0).sum()) == 4
    # every trajectory appears once (a permutation)
    assert sorted(np.asarray(a.rews[:, 0]).tolist()) == list(range(12))
    assert gen.train(s, 3, 100, None) is s and int(gen.trained_steps(s)) == 0
    assert gen.horizons == (5,)
    with pytest.raises(ValueError, match="Asked for 61 transitions but only 60 available"):
        gen.sample(s, 0, 61)
    with pytest.raises(ValueError, match="lengths must have shape"):
        DatasetGenerator(t.replace(lengths=t.lengths[None]))
    assert DatasetGenerator(_trajs([5, 7, 5], terminal=[True, True, False])).horizons == (5, 7)


def test_orthogonal_initializer_without_lapack():
    for shape in [(4, 64), (64, 64), (64, 2), (3, 5, 7)]:
        w = np.asarray(orthogonal(2.0)(jax.random.key(1), shape)).reshape(-1, shape[-1])
        g = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
        np.testing.assert_allclose(g, 4.0 * np.eye(len(g)), atol=1e-5)
    # batched under vmap inside jit (the jaxlib LAPACK kernel can deadlock there on 2 threads)
    ws = jax.jit(jax.vmap(lambda k: orthogonal()(k, (8, 8))))(jax.random.split(jax.random.key(0), 3))
    assert ws.shape == (3, 8, 8) and not np.allclose(ws[0], ws[1])


@pytest.fixture(scope="module")
def cartpole_agent():
    env, p = make_env("cartpole", horizon=50)
    return AgentGenerator(env, p, config=TINY, exploration_frac=0.5)


def test_agent_sample_shapes_true_rewards_and_exploration(cartpole_agent):
    gen = cartpole_agent
    env, p = gen.base_env, gen.env_params
    s = gen.init(0)
    assert gen.episodes_for(120) == 3 + 1 and gen.horizons == (50,)
    sample = jax.jit(lambda k, n: gen.sample(s, k, n, max_steps=120))  # one program for any traced n <= 120
    t = sample(jax.random.key(1), jnp.int32(120))
    assert t.obs.shape == (4, 51, 4) and t.acts.shape == (4, 50) and t.acts.dtype == jnp.int32
    # e = int(0.5 * 120) = 60 exploration steps -> 2 episodes; 60 agent steps -> 2 episodes
    np.testing.assert_array_equal(t.lengths, [50, 50, 50, 50])
    assert bool(t.terminal.all())
    np.testing.assert_array_equal(sample(jax.random.key(1), jnp.int32(40)).lengths, [50, 50, 0, 0])   # 20 + 20
    np.testing.assert_array_equal(sample(jax.random.key(1), jnp.int32(70)).lengths, [50, 50, 0, 0])   # 35 + 35
    t3 = sample(jax.random.key(1), jnp.int32(110))                                                   # 55 + 55
    np.testing.assert_array_equal(t3.lengths, [50, 50, 50, 50])
    t4 = sample(jax.random.key(1), jnp.int32(10))
    np.testing.assert_array_equal(t4.lengths, [50, 50, 0, 0])
    np.testing.assert_array_equal(t4.rews[2:], 0.0)
    assert not bool(t4.terminal[2:].any())
    # the recorded rewards are the true ones
    f = oracle_reward(env, p)
    r = jax.vmap(jax.vmap(lambda o, a, o2: f(None, o, a, o2, False)))(t.obs[:, :-1], t.acts, t.obs[:, 1:])
    np.testing.assert_array_equal(r, t.rews)


def test_training_sees_the_learned_reward_and_evaluation_the_true_one(cartpole_agent):
    """Reward wrapper: PPO's rollouts carry reward_apply's values; sample/evaluate the environment's."""
    base = cartpole_agent

    def reward_apply(rp, obs, action, next_obs, done):
        return rp["c"] + rp["w"] @ next_obs

    gen = base.with_reward(reward_apply)
    rp = {"c": jnp.asarray(7.0), "w": jnp.array([0.0, 0.0, -3.0, 0.0])}
    s = gen.init(0)
    _, _, traj, true_r = jax.jit(gen.rollout)(s.ppo, jax.random.key(2), rp)
    # obs[t+1] of the rollout is the next observation except after an auto-reset
    expected = 7.0 - 3.0 * traj.obs[1:, :, 2]
    np.testing.assert_allclose(traj.reward[:-1], expected, rtol=1e-5, atol=1e-5)
    assert set(np.unique(np.asarray(true_r)).tolist()) <= {0.0, 1.0}
    assert not np.allclose(traj.reward, true_r)
    # evaluation ignores the learned reward: true returns in [0, horizon], the same for any reward params
    s2 = gen.train(s, 0, 64, rp)
    e1 = gen.evaluate(s2, 5, 4)
    e_true = base.evaluate(s2, 5, 4)  # the same policy through the base generator
    np.testing.assert_array_equal(e1, e_true)
    assert np.all((np.asarray(e1) >= 0) & (np.asarray(e1) <= 50)) and np.all(np.asarray(e1) == np.round(e1))


@pytest.mark.slow
def test_train_accounting_and_no_recompile(cartpole_agent):
    gen = cartpole_agent.with_reward(oracle_reward(cartpole_agent.base_env, cartpole_agent.env_params))
    traces = []

    def train(s, k, n, hparams=None):
        traces.append(1)
        return gen.train(s, k, n, None, hparams=hparams)

    train = jax.jit(train)
    s = gen.init(1)
    b = TINY.batch_size
    for steps in (1, b, b + 1, 3 * b):
        before = int(s.ppo.steps)
        s = train(s, jax.random.key(steps), jnp.int32(steps))
        assert int(s.ppo.steps) - before == -(-steps // b) * b
    s0 = s
    s = train(s, jax.random.key(9), jnp.int32(0))
    assert int(s.ppo.steps) == int(s0.ppo.steps)
    assert len(traces) == 1
    assert s.ppo.steps.dtype == jnp.int32 and s.ppo.obs.dtype == jnp.float32
    # new hyperparameter values are array leaves of the call, not of the state: no recompile either
    assert not hasattr(s.ppo, "hparams")
    s = train(s, jax.random.key(1), jnp.int32(64), hparams=PPOHParams.create(learning_rate=3e-4))
    s = train(s, jax.random.key(1), jnp.int32(64), hparams=PPOHParams.create(learning_rate=1e-4))
    assert len(traces) == 2  # once without hparams=, once with
    # the hyperparameters are used: another learning rate trains other params
    a = train(s0, jax.random.key(3), jnp.int32(64), hparams=PPOHParams.create(learning_rate=1e-3))
    b = train(s0, jax.random.key(3), jnp.int32(64), hparams=PPOHParams.create(learning_rate=1e-2))
    assert not np.allclose(jax.tree.leaves(a.ppo.params)[0], jax.tree.leaves(b.ppo.params)[0])
    assert len(traces) == 2


@pytest.mark.slow
def test_agent_state_vmaps_and_checkpoints(cartpole_agent, tmp_path):
    gen = cartpole_agent
    keys = jax.random.split(jax.random.key(0), 3)
    states = jax.jit(jax.vmap(gen.init))(keys)
    assert states.ppo.obs.shape == (3, 4, 4) and not np.array_equal(states.ppo.obs[0], states.ppo.obs[1])
    checkpoint.save(tmp_path / "agent.ckpt", states)
    back = checkpoint.load(tmp_path / "agent.ckpt", jax.eval_shape(jax.vmap(gen.init), keys))
    for a, b in zip(jax.tree.leaves(states), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)


def test_pendulum_agent_continuous_actions():
    gen = AgentGenerator.from_name("pendulum", config=TINY, horizon=20)
    s = gen.init(0)
    t = gen.sample(s, 1, 30)
    assert t.acts.shape == (2, 20, 1) and t.acts.dtype == jnp.float32
    assert np.all(np.abs(np.asarray(t.acts)) <= 2.0)
    np.testing.assert_array_equal(t.lengths, [20, 20])
    assert float(t.rews.max()) <= 0.0
    s = gen.train(s, 2, 64)
    assert int(gen.trained_steps(s)) == 64 and "log_std" in s.ppo.params["params"]


def test_host_generator_protocol(cartpole_agent):
    host = HostGenerator(cartpole_agent, 0)
    t = host.sample(1, 70)
    assert int(np.sum(t.lengths)) >= 70
    before = int(host.state.ppo.steps)
    host.train(2, 64, None)
    assert int(host.state.ppo.steps) == before + 64


def test_bad_arguments(cartpole_agent):
    env, p = make_env("cartpole")
    with pytest.raises(ValueError, match="multiple of config.num_minibatches"):
        AgentGenerator(env, p, config=PPOConfig(num_envs=3, num_steps=5, num_minibatches=2))
    with pytest.raises(ValueError, match=r"exploration_frac must be finite and in \[0.0, 1.0\], got 1.5"):
        AgentGenerator(env, p, exploration_frac=1.5)
    with pytest.raises(ValueError, match="reward_apply must be callable"):
        AgentGenerator(env, p, "reward")
    with pytest.raises(ValueError, match="hparams must be"):
        AgentGenerator(env, p, hparams=3)
    with pytest.raises(ValueError, match="unknown AgentGenerator arguments"):
        cartpole_agent.replace(gamma=0.9)
    with pytest.raises(ValueError, match="steps must be a static Python int"):
        cartpole_agent.sample(cartpole_agent.init(0), 0, jnp.int32(5))
    assert PPOHParams.create(anneal_steps=100.0).current_learning_rate(jnp.int32(25)) == pytest.approx(0.75e-3)
    assert PPOHParams.create().current_learning_rate(jnp.int32(10**6)) == pytest.approx(1e-3)
