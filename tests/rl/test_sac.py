"""SACGenerator: the replay buffer, the targets (relabelled with the reward params of each call, the
absorbing bootstrap), learning the pendulum, the preference loop with it, bad settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

from jaxweight import checkpoint
from jaxweight import preference as pf
from jaxweight.preference import driver as dr
from jaxweight.rl.envs import make_env
from jaxweight.preference.env_rewards import reward_net
from jaxweight.rl.sac import SACConfig, SACHParams, squashed_sample
from jaxweight.preference.generators import SACGenerator

TINY = dict(num_envs=4, buffer_size=64, batch_size=16, updates_per_step=2, learning_starts=0, hidden_sizes=(8,))


@struct.dataclass
class _State:
    x: jax.Array
    time: jax.Array


@struct.dataclass
class _Params:
    max_steps_in_episode: int = 20


class Line(environment.Environment):
    """x += 0.5 a on a line, a in [-1, 1]; reward 1 - |x|; |x| >= 1 ends it (then absorbing under FixedHorizon)."""

    @property
    def default_params(self):
        return _Params()

    def reset_env(self, key, params):
        s = _State(jnp.zeros(()), jnp.asarray(0, jnp.int32))
        return self.get_obs(s), s

    def step_env(self, key, s, action, params):
        s = _State(s.x + 0.5 * action[0], s.time + 1)
        return self.get_obs(s), s, 1.0 - jnp.abs(s.x), jnp.abs(s.x) >= 1.0, {}

    def get_obs(self, s, params=None, key=None):
        return jnp.stack([s.x, jnp.float32(1.0)])

    def action_space(self, params=None):
        return spaces.Box(-1.0, 1.0, (1,), jnp.float32)

    def observation_space(self, params):
        return spaces.Box(-10.0, 10.0, (2,), jnp.float32)


def test_squashed_sample_density_matches_the_change_of_variables():
    """log p(a) = log N(u) - sum log(1 - tanh(u)^2), checked against a direct evaluation."""
    mean = jnp.array([[0.3, -1.2], [2.0, 0.0]])
    log_std = jnp.array([[-0.5, 0.4], [0.0, -2.0]])
    a, logp = squashed_sample(jax.random.key(0), mean, log_std)
    u = jnp.arctanh(a)
    direct = (jnp.sum(jax.scipy.stats.norm.logpdf(u, mean, jnp.exp(log_std)), axis=-1)
              - jnp.sum(jnp.log1p(-jnp.tanh(u) ** 2), axis=-1))
    np.testing.assert_allclose(logp, direct, rtol=1e-3, atol=1e-3)
    assert a.shape == (2, 2) and np.all(np.abs(a) < 1)


def test_buffer_rows_are_the_steps_taken_and_wrap_around():
    env, p = make_env("pendulum", horizon=5)
    gen = SACGenerator(env, p, config=SACConfig(**TINY))
    s = gen.init(0)
    s1 = jax.jit(gen.train)(s, jax.random.key(1), 4 * 3)  # 3 vectorised steps: 12 rows
    rb = s1.replay
    assert int(rb.size) == 12 and int(rb.ptr) == 12 and int(s1.steps) == 12
    obs, nxt = np.asarray(rb.obs), np.asarray(rb.next_obs)
    np.testing.assert_array_equal(obs[:4], np.asarray(s.obs))          # the first rows start at the reset
    np.testing.assert_array_equal(obs[4:12], nxt[:8])                   # each next_obs is where the env went on
    assert np.all(np.abs(np.asarray(rb.action[:12])) <= 1.0)
    # the stored reward is the environment's: pendulum's cost of (obs, action) recomputed from the rows
    th = np.arctan2(obs[:12, 1], obs[:12, 0])
    u = 2.0 * np.asarray(rb.action[:12, 0])
    want = -(((th + np.pi) % (2 * np.pi) - np.pi) ** 2 + 0.1 * obs[:12, 2] ** 2 + 0.001 * u ** 2)
    np.testing.assert_allclose(np.asarray(rb.reward[:12]), want, rtol=1e-4, atol=1e-4)
    s2 = jax.jit(gen.train)(s1, jax.random.key(2), 4 * 16)  # 76 rows into 64: the oldest are overwritten
    assert int(s2.replay.size) == 64 and int(s2.replay.ptr) == 76 % 64 and int(s2.steps) == 76
    # the horizon (5) resets the envs: 76 steps of 4 envs is 3 whole episodes each
    assert int(s2.episodes) == 4 * 3


def test_every_gradient_step_relabels_with_the_reward_params_of_the_call():
    """The buffer holds the true reward; the targets use reward_apply with the params passed to train."""
    env, p = make_env("pendulum", horizon=10)
    seen = lambda c, o, a, o2, d: c * (o2[0] - o[0]) + 0.0 * a[0]  # noqa: E731
    gen = SACGenerator(env, p, seen, config=SACConfig(**TINY))
    s = jax.jit(gen.train)(gen.init(0), jax.random.key(1), 32, jnp.float32(1.0))
    batch = s.replay.replace(ptr=None, size=None)
    r, r_abs = gen._rewards(jnp.float32(3.0), batch)
    np.testing.assert_allclose(r, 3.0 * (batch.next_obs[:, 0] - batch.obs[:, 0]), rtol=1e-6)
    assert np.all(np.asarray(r_abs) == 0.0)
    truth = SACGenerator(env, p, config=SACConfig(**TINY))._rewards(None, batch)[0]
    np.testing.assert_array_equal(truth, batch.reward)
    # the same state and keys with other reward params: other critics (reward params never recompile)
    traces = []

    def counted(*args):
        traces.append(1)  # runs once per trace
        return gen.train(*args)

    train = jax.jit(counted)
    a = train(s, jax.random.key(2), 8, jnp.float32(1.0))
    b = train(s, jax.random.key(2), 8, jnp.float32(-5.0))
    assert not np.allclose(jax.tree.leaves(a.critic)[0], jax.tree.leaves(b.critic)[0])
    np.testing.assert_array_equal(a.replay.reward, b.replay.reward)  # what is stored does not depend on them
    assert len(traces) == 1


def test_absorbing_bootstrap_ends_the_episode_with_the_value_of_absorbing():
    env, p = make_env(Line(), horizon=20)
    gamma = 0.9
    cfg = SACConfig(**{**TINY, "buffer_size": 4 * 40}, absorbing_bootstrap=True)
    gen = SACGenerator(env, p, lambda c, o, a, o2, d: c + 0.0 * o[0], config=cfg,
                       hparams=SACHParams.create(gamma=gamma))
    s = jax.jit(gen.train)(gen.init(0), jax.random.key(1), 4 * 40, jnp.float32(2.0))
    rb = s.replay
    absorbed = np.asarray(rb.absorbed)
    nxt, obs = np.asarray(rb.next_obs), np.asarray(rb.obs)
    assert absorbed.sum() >= 4 and np.all(np.abs(nxt[absorbed, 0]) >= 1.0)
    assert np.all(np.abs(nxt[~absorbed, 0]) < 1.0)
    # the row after an absorbed one in the same env starts afresh (x = 0), never an absorbing repeat
    rows = np.nonzero(absorbed[:-4])[0]
    np.testing.assert_array_equal(obs[rows + 4, 0], 0.0)
    # the target of an absorbed row is r + gamma * r_abs / (1 - gamma) (the learned reward is 2 everywhere)
    batch = rb.replace(ptr=None, size=None)
    r, r_abs = gen._rewards(jnp.float32(2.0), batch)
    np.testing.assert_allclose(r_abs, 2.0)
    y = np.asarray(gen.targets(s, jax.random.key(3), batch, jnp.float32(2.0), gen.hparams))
    np.testing.assert_allclose(y[absorbed], 2.0 + gamma * 2.0 / (1 - gamma), rtol=1e-6)
    # other rows bootstrap from the critics: not that constant
    assert not np.allclose(y[~absorbed], 2.0 + gamma * 2.0 / (1 - gamma), rtol=1e-3)
    with pytest.raises(ValueError, match="absorbing_bootstrap needs a FixedHorizon"):
        SACGenerator(*make_env("pendulum"), config=cfg)


@pytest.mark.slow
def test_learns_the_pendulum_on_the_true_reward():
    """4,000 steps lift the pendulum's return from about -1,200 (random) to above -500 (swinging up)."""
    env, p = make_env("pendulum")
    cfg = SACConfig(num_envs=4, buffer_size=8_000, batch_size=128, updates_per_step=4, learning_starts=1_000,
                    hidden_sizes=(64, 64))
    gen = SACGenerator(env, p, config=cfg, hparams=dict(learning_rate=1e-3))
    s = gen.init(0)
    evaluate = jax.jit(gen.evaluate, static_argnums=2)
    before = float(jnp.mean(evaluate(s, jax.random.key(7), 8)))
    s = jax.jit(gen.train)(s, jax.random.key(1), 4_000)
    after = float(jnp.mean(evaluate(s, jax.random.key(7), 8)))
    assert before < -900 and after > -500, (before, after)
    assert float(jnp.exp(s.log_alpha)) < 1.0  # the temperature fell towards the target entropy


@pytest.mark.slow
def test_preference_loop_with_sac_vmaps_seeds_and_resumes(tmp_path):
    env, p = make_env("pendulum", horizon=20)
    net = reward_net(env, p, hidden_sizes=(8,))
    cfg = SACConfig(**{**TINY, "buffer_size": 128})

    def loop():
        return dr.PreferenceComparisons(
            SACGenerator(env, p, config=cfg), net, num_iterations=2, fragment_length=5,
            reward_trainer=pf.RewardTrainer(net, num_members=2, progress=False), eval_episodes=2, progress=False)

    a = loop()
    assert isinstance(a.generator, SACGenerator) and a.generator.reward_apply is not None
    state, out = a.run(jax.random.key(0), 240, 30, num_seeds=2)
    assert out["gt_return"].shape == (2, 3) and np.all(np.isfinite(np.asarray(out["gt_return"])))
    assert np.all(np.asarray(state.gen.steps) >= 240) and state.gen.replay.obs.shape == (2, 128, 3)
    fp = a.fingerprint(a.config_for(240, 30).plan)
    assert fp["generator/type"] == "SACGenerator" and fp["generator/sac/buffer_size"] == 128
    ckpt = tmp_path / "loop.ckpt"
    checkpoint.save(ckpt, state)
    back = checkpoint.load(ckpt, jax.eval_shape(lambda: state))
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(back)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kwargs, message", [
    (dict(config=SACConfig(**{**TINY, "buffer_size": 66})), "multiple of config.num_envs"),
    (dict(config=SACConfig(**{**TINY, "batch_size": 128})), "batch_size .* <= config.buffer_size"),
    (dict(config=SACConfig(**{**TINY, "num_envs": 0})), "config.num_envs"),
    (dict(config=SACConfig(**{**TINY, "learning_starts": -1})), "config.learning_starts"),
    (dict(config=SACConfig(**{**TINY, "hidden_sizes": (8, 0)})), "hidden_sizes must be ints >= 1"),
    (dict(config=SACConfig(**{**TINY, "init_alpha": 0.0})), "init_alpha"),
    (dict(config=SACConfig(**{**TINY, "skip_obs": 3})), r"skip_obs must be an int in \[0, D\)"),
    (dict(config=dict(TINY)), "config must be a SACConfig"),
    (dict(hparams=dict(gamma=1.0)), "gamma"),
    (dict(hparams=dict(tau=-0.1)), "tau"),
    (dict(hparams=dict(learning_rate=float("nan"))), "learning_rate"),
    (dict(reward_apply=3), "reward_apply must be callable"),
    (dict(exploration_frac=1.5), "exploration_frac"),
])
def test_bad_settings_one_clear_error_each(kwargs, message):
    env, p = make_env("pendulum", horizon=10)
    with pytest.raises(ValueError, match=message):
        SACGenerator(env, p, **kwargs)


def test_needs_continuous_actions_and_a_fixed_horizon():
    with pytest.raises(ValueError, match="SACGenerator needs continuous actions"):
        SACGenerator(*make_env("cartpole"))
    from gymnax.environments.classic_control import pendulum
    raw = pendulum.Pendulum()
    with pytest.raises(ValueError, match="needs a fixed-horizon environment"):
        SACGenerator(raw, raw.default_params)
