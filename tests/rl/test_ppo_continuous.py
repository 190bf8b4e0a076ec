"""The loop's PPO for continuous control: observation statistics kept in the agent state, reward scaling;
off by default (the built-in environments' programs and fingerprints are what they were)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight.rl.envs import make_env
from jaxweight.preference.generators import AgentGenerator
from jaxweight.rl.normalization import OBS_CLIP, obs_norm_apply, obs_norm_init, obs_norm_update
from jaxweight.rl.ppo import PPOConfig, PPOHParams, Transition, gae, split_unrolls

TINY = dict(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1, hidden_sizes=(8,))


def test_running_statistics_match_numpy():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3.0, 2.0, size=(n, 5, 3)).astype(np.float32) for n in (4, 7, 1)]
    norm = obs_norm_init((3,))
    for c in chunks:
        norm = obs_norm_update(norm, c)
    x = np.concatenate([c.reshape(-1, 3) for c in chunks])
    np.testing.assert_allclose(float(norm.count), x.shape[0] + 1e-4, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(norm.mean), x.mean(0), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(norm.m2 / norm.count), x.var(0), rtol=1e-3)
    z = np.asarray(obs_norm_apply(norm, x))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-3)
    np.testing.assert_allclose(z.std(0), 1.0, rtol=1e-3)
    assert float(jnp.max(obs_norm_apply(norm, jnp.full((3,), 1e6)))) == OBS_CLIP
    assert obs_norm_apply(None, x) is x


def test_off_by_default_and_recorded_only_when_on():
    env, p = make_env("pendulum")
    plain = AgentGenerator(env, p, config=PPOConfig(**TINY))
    assert plain.init(jax.random.key(0)).ppo.obs_norm is None
    fp = plain.fingerprint()
    assert "ppo/normalize_observations" not in fp and "ppo/reward_scaling" not in fp
    on = AgentGenerator(env, p, config=PPOConfig(**TINY, normalize_observations=True, reward_scaling=5.0))
    assert on.fingerprint()["ppo/normalize_observations"] is True and on.fingerprint()["ppo/reward_scaling"] == 5.0
    assert "ppo/init_log_std" not in fp
    std = AgentGenerator(env, p, config=PPOConfig(**TINY, init_log_std=-0.5))
    assert std.fingerprint()["ppo/init_log_std"] == -0.5
    np.testing.assert_array_equal(np.asarray(std.init(jax.random.key(0)).ppo.params["params"]["log_std"]), [-0.5])
    with pytest.raises(ValueError, match="config.reward_scaling"):
        AgentGenerator(env, p, config=PPOConfig(**TINY, reward_scaling=0.0))


@pytest.mark.slow
def test_statistics_follow_training_and_rewards_scale():
    env, p = make_env("pendulum")
    cfg = PPOConfig(**TINY, normalize_observations=True, reward_scaling=10.0)
    gen = AgentGenerator(env, p, config=cfg)
    states = jax.jit(jax.vmap(gen.init))(jax.random.split(jax.random.key(0), 2))   # vmapped over seeds
    assert states.ppo.obs_norm.mean.shape == (2, 3)
    trained = jax.jit(jax.vmap(lambda s, k: gen.train(s, k, 2 * cfg.batch_size)))(
        states, jax.random.split(jax.random.key(1), 2))
    np.testing.assert_allclose(np.asarray(trained.ppo.obs_norm.count), 2 * cfg.batch_size + 1e-4, rtol=1e-6)
    assert np.all(np.asarray(trained.ppo.obs_norm.m2) > 0)
    # the rollout's rewards are the environment's times reward_scaling (same key, same actions)
    one = jax.tree.map(lambda x: x[0], states)
    unscaled = gen.replace(config=PPOConfig(**TINY, normalize_observations=True))
    _, _, t10, true10 = jax.jit(gen.rollout)(one.ppo, jax.random.key(2))
    _, _, t1, true1 = jax.jit(unscaled.rollout)(one.ppo, jax.random.key(2))
    np.testing.assert_array_equal(np.asarray(t1.reward), np.asarray(true1))
    np.testing.assert_array_equal(np.asarray(t10.reward), np.float32(10.0) * np.asarray(t1.reward))
    # sampling and evaluation act through the same statistics
    ret = jax.jit(lambda s, k: gen.evaluate(s, k, 2))(jax.tree.map(lambda x: x[0], trained), jax.random.key(3))
    assert ret.shape == (2,) and bool(jnp.all(jnp.isfinite(ret)))


@pytest.mark.slow
def test_absorbing_bootstrap_ends_and_resets_with_the_value_of_absorbing():
    """Training rollouts on a FixedHorizon env: an env that terminates ends its PPO episode there, with the
    discounted value of absorbing forever (gamma r_abs / (1 - gamma), r_abs the learned reward of an absorbing
    step) added, and starts afresh; steps before that keep their reward."""
    from jaxweight.rl.ppo import PPOHParams

    env, p = make_env("gymnax:CartPole-v1", horizon=50)
    gamma = 0.9
    cfg = PPOConfig(num_envs=8, num_steps=64, num_minibatches=2, update_epochs=1, hidden_sizes=(8,),
                    absorbing_bootstrap=True)
    gen = AgentGenerator(env, p, lambda c, o, a, o2, d: c, config=cfg, hparams=PPOHParams.create(gamma=gamma))
    state = gen.init(jax.random.key(0))
    _, _, traj, true_r = jax.jit(gen.rollout)(state.ppo, jax.random.key(1), jnp.float32(2.0))
    done, r = np.asarray(traj.done), np.asarray(traj.reward)
    assert done.sum() >= 8  # an untrained agent drops the pole within ~20 steps, long before step 50
    np.testing.assert_allclose(r[done], 2.0 + gamma * 2.0 / (1 - gamma), rtol=1e-6)
    np.testing.assert_array_equal(r[~done], 2.0)
    # the step after an end is a fresh reset (gymnax draws every entry in +-0.05), never an absorbing repeat
    t, e = np.nonzero(done[:-1])
    assert np.all(np.abs(np.asarray(traj.obs)[t + 1, e]) <= 0.05)
    # the true reward of the step is recorded as the environment gave it (1 a step, 0 while absorbing: never here)
    assert np.all(np.asarray(true_r) == 1.0)
    with pytest.raises(ValueError, match="absorbing_bootstrap needs a FixedHorizon environment"):
        AgentGenerator(*make_env("cartpole"), config=cfg)


@pytest.mark.slow
def test_tanh_squash_maps_into_the_box_and_trains():
    """PPOConfig.tanh_squash: off by default (not in the fingerprint); on, the environment gets the squashed
    pre-tanh sample rescaled to the action box, and training runs with the entropy's tanh Jacobian term."""
    env, p = make_env("pendulum")
    assert "ppo/tanh_squash" not in AgentGenerator(env, p, config=PPOConfig(**TINY)).fingerprint()
    gen = AgentGenerator(env, p, config=PPOConfig(**TINY, tanh_squash=True))
    assert gen.fingerprint()["ppo/tanh_squash"] is True
    u = jnp.asarray([[-50.0], [0.0], [0.3], [50.0]])
    low, high = np.asarray(gen._low), np.asarray(gen._high)
    np.testing.assert_allclose(np.asarray(gen._env_action(u)),
                               low + (np.tanh(np.asarray(u)) + 1) * (high - low) / 2, rtol=1e-6)
    s = gen.init(jax.random.key(0))
    s = jax.jit(lambda s, k: gen.train(s, k, 2 * gen.config.batch_size))(s, jax.random.key(1))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(s.ppo.params))


@pytest.mark.slow
def test_max_grad_norm_none_is_no_clipping():
    """PPOConfig.max_grad_norm=None (brax's PPO, the brax demo's default) trains exactly as a clip at a norm that
    is never reached, differs from a clip that is, and is recorded in the fingerprint as None."""
    env, p = make_env("pendulum")

    def trained(max_grad_norm):
        gen = AgentGenerator(env, p, config=PPOConfig(**TINY, max_grad_norm=max_grad_norm))
        s = jax.jit(lambda k: gen.train(gen.init(k), jax.random.fold_in(k, 1), 2 * gen.config.batch_size))(
            jax.random.key(0))
        return gen, np.concatenate([np.ravel(x) for x in jax.tree.leaves(s.ppo.params)])

    gen, none = trained(None)
    assert gen.fingerprint()["ppo/max_grad_norm"] is None
    _, never = trained(1e30)
    _, tight = trained(1e-3)
    np.testing.assert_allclose(none, never, rtol=1e-6, atol=1e-7)
    assert np.max(np.abs(none - tight)) > 1e-4


@pytest.mark.slow
def test_state_dependent_std_is_brax_softplus_scale_and_trains():
    """PPOConfig.state_dependent_std: the output layer gives mean and std per state (softplus(raw) + 0.001,
    ~0.69 at the start), the log-probability and entropy use the per-state std, and training runs; off by
    default and recorded only when on."""
    from jaxweight.rl.ppo import _log_prob_entropy

    env, p = make_env("pendulum")
    assert "ppo/state_dependent_std" not in AgentGenerator(env, p, config=PPOConfig(**TINY)).fingerprint()
    gen = AgentGenerator(env, p, config=PPOConfig(**TINY, state_dependent_std=True, tanh_squash=True))
    assert gen.fingerprint()["ppo/state_dependent_std"] is True
    s = gen.init(jax.random.key(0))
    assert "log_std" not in s.ppo.params["params"]
    obs = jax.random.normal(jax.random.key(1), (5,) + gen.obs_shape)
    out, log_std, _ = gen.network.apply(s.ppo.params, obs)
    assert out.shape == log_std.shape == (5, gen.action_dim)
    np.testing.assert_allclose(np.exp(np.asarray(log_std)), np.log(2.0) + 0.001, atol=0.02)  # raw ~ 0 at init
    a = jnp.asarray(np.random.default_rng(0).normal(size=(5, gen.action_dim)), jnp.float32)
    logp, ent = _log_prob_entropy(out, log_std, a, False)
    sd = np.exp(np.asarray(log_std))
    ref = -0.5 * np.sum(((np.asarray(a) - np.asarray(out)) / sd) ** 2 + 2 * np.log(sd) + np.log(2 * np.pi), -1)
    np.testing.assert_allclose(np.asarray(logp), ref, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np.sum(0.5 + 0.5 * np.log(2 * np.pi) + np.log(sd), -1), rtol=1e-5)
    s = jax.jit(lambda s, k: gen.train(s, k, 2 * gen.config.batch_size))(s, jax.random.key(2))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(s.ppo.params))


@pytest.mark.slow
def test_skip_obs_hides_the_leading_entries_from_actor_and_critic():
    """PPOConfig.skip_obs: the networks read obs[..., k:] (the first-layer kernels have D - k rows), so the
    leading entries change nothing; training runs; recorded only when set; bad values raise."""
    env, p = make_env("pendulum")  # obs f32[3]
    assert "ppo/skip_obs" not in AgentGenerator(env, p, config=PPOConfig(**TINY)).fingerprint()
    gen = AgentGenerator(env, p, config=PPOConfig(**TINY, skip_obs=1, normalize_observations=True))
    assert gen.fingerprint()["ppo/skip_obs"] == 1
    s = gen.init(jax.random.key(0))
    kernels = [v["kernel"] for v in s.ppo.params["params"].values() if isinstance(v, dict) and "kernel" in v]
    assert sorted(k.shape[0] for k in kernels)[:2] == [2, 2]  # the first layers of actor and critic
    obs = jax.random.normal(jax.random.key(1), (5, 3))
    moved = obs.at[:, 0].add(1e3)
    for a, b in zip(gen.network.apply(s.ppo.params, obs), gen.network.apply(s.ppo.params, moved)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    s = jax.jit(lambda s, k: gen.train(s, k, 2 * gen.config.batch_size))(s, jax.random.key(2))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(s.ppo.params))
    for bad in (-1, 3, 1.5, True):
        with pytest.raises(ValueError, match=r"PPOConfig.skip_obs must be an int in \[0, D\)"):
            AgentGenerator(env, p, config=PPOConfig(**TINY, skip_obs=bad))


@pytest.mark.slow
def test_gae_per_minibatch_recomputes_advantages_with_the_current_critic():
    """PPOConfig.gae_per_minibatch (brax's PPO): with one minibatch and one epoch the single gradient step
    sees the rollout's own critic, so it is the step of the default path (the same transitions, in another
    order); with more steps the two differ (the critic moves between them). Recorded only when set;
    num_envs must split into whole unrolls."""
    env, p = make_env("pendulum")
    one = dict(TINY, num_minibatches=1, update_epochs=1)
    plain = AgentGenerator(env, p, config=PPOConfig(**one))
    fresh = AgentGenerator(env, p, config=PPOConfig(**one, gae_per_minibatch=True))
    assert "ppo/gae_per_minibatch" not in plain.fingerprint() and fresh.fingerprint()["ppo/gae_per_minibatch"]
    s = plain.init(jax.random.key(0))
    key = jax.random.key(1)
    a = jax.jit(lambda s: plain.train(s, key, plain.config.batch_size))(s)
    b = jax.jit(lambda s: fresh.train(s, key, fresh.config.batch_size))(s)
    moved = [float(jnp.max(jnp.abs(x - y)))
             for x, y in zip(jax.tree.leaves(a.ppo.params), jax.tree.leaves(s.ppo.params))]
    assert max(moved) > 1e-4  # the step changed the params
    for x, y in zip(jax.tree.leaves(a.ppo.params), jax.tree.leaves(b.ppo.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
    many = dict(TINY, num_minibatches=2, update_epochs=3)
    c = jax.jit(lambda s: AgentGenerator(env, p, config=PPOConfig(**many)).train(s, key, 32))(s)
    d = jax.jit(lambda s: AgentGenerator(env, p, config=PPOConfig(**many, gae_per_minibatch=True)).train(s, key, 32))(s)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(d.ppo.params))
    assert not all(np.allclose(x, y) for x, y in zip(jax.tree.leaves(c.ppo.params), jax.tree.leaves(d.ppo.params)))
    with pytest.raises(ValueError, match=r"gae_per_minibatch takes whole unrolls per minibatch: num_envs \* "
                                         r"num_steps / unroll_length \(4 \* 8 / 8 = 4\) must be a multiple of "
                                         r"config.num_minibatches \(8\)"):
        AgentGenerator(env, p, config=PPOConfig(**dict(TINY, num_minibatches=8), gae_per_minibatch=True))


def test_split_unrolls_cuts_each_environments_rollout_in_order():
    """split_unrolls: [T, E] -> [K * E, L] with unroll k of environment e at row k * E + e, each followed by
    the observation after it (the next unroll's first, or the rollout's last_obs)."""
    t, e, length = 6, 3, 2
    code = (10 * jnp.arange(t)[:, None] + jnp.arange(e)[None, :]).astype(jnp.float32)  # 10 * step + env
    traj = Transition(code[..., None], code[..., None], code, code, code, jnp.zeros((t, e), bool))
    last_obs = (10 * t + jnp.arange(e, dtype=jnp.float32))[:, None]
    unrolls, after = split_unrolls(traj, last_obs, length)
    assert unrolls.obs.shape == (9, 2, 1) and unrolls.reward.shape == (9, 2) and after.shape == (9, 1)
    for k in range(t // length):
        for j in range(e):
            row = k * e + j
            np.testing.assert_array_equal(unrolls.reward[row], 10 * np.arange(k * length, (k + 1) * length) + j)
            assert float(after[row, 0]) == 10 * (k + 1) * length + j  # obs at step (k+1)L, or last_obs
    whole, after1 = split_unrolls(traj, last_obs, t)  # one unroll per environment: the env-major rollout
    np.testing.assert_array_equal(whole.reward, code.T)
    np.testing.assert_array_equal(after1, last_obs)


@pytest.mark.slow
def test_unroll_length_cuts_the_rollout_for_gae_per_minibatch():
    """PPOConfig.unroll_length: num_steps gives the update of None exactly; shorter unrolls (each bootstrapped
    from the critic) give another update, finite; recorded only when set; and one clear error each for use
    without gae_per_minibatch, a length that does not divide num_steps, and unrolls that do not split into
    the minibatches."""
    env, p = make_env("pendulum")
    cfg = dict(TINY, num_minibatches=2, update_epochs=2, gae_per_minibatch=True)
    gens = [AgentGenerator(env, p, config=PPOConfig(**cfg, unroll_length=u)) for u in (None, 8, 2)]
    assert "ppo/unroll_length" not in gens[0].fingerprint() and gens[2].fingerprint()["ppo/unroll_length"] == 2
    s = gens[0].init(jax.random.key(0))
    key = jax.random.key(1)
    none, whole, short = (jax.jit(lambda s, g=g: g.train(s, key, 32))(s).ppo.params for g in gens)
    for x, y in zip(jax.tree.leaves(none), jax.tree.leaves(whole)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(short))
    assert not all(np.allclose(x, y) for x, y in zip(jax.tree.leaves(none), jax.tree.leaves(short)))
    with pytest.raises(ValueError, match=r"config.unroll_length cuts the rollout into unrolls for "
                                         r"config.gae_per_minibatch"):
        AgentGenerator(env, p, config=PPOConfig(**TINY, unroll_length=4))
    with pytest.raises(ValueError, match=r"config.num_steps \(8\) must be a multiple of config.unroll_length \(3\)"):
        AgentGenerator(env, p, config=PPOConfig(**cfg, unroll_length=3))
    with pytest.raises(ValueError, match=r"config.unroll_length must be"):
        AgentGenerator(env, p, config=PPOConfig(**cfg, unroll_length=0))
    with pytest.raises(ValueError, match=r"\(4 \* 8 / 4 = 8\) must be a multiple of config.num_minibatches \(16\)"):
        AgentGenerator(env, p, config=PPOConfig(**dict(cfg, num_minibatches=16), unroll_length=4))
    AgentGenerator(env, p, config=PPOConfig(**dict(cfg, num_minibatches=8), unroll_length=4))  # 8 unrolls: fine


def test_lambda_return_advantage_is_braxs_formula():
    """PPOConfig.advantage="lambda_return": A_t = r_t + gamma (1 - done_t) G_{t+1} - V_t with G the
    lambda-returns (G_T the bootstrap value), the value targets unchanged; equal to GAE at lambda = 1 and
    not at 0.9. An unknown name is one clear error; the setting is recorded only when not "gae"."""
    t, e = 7, 3
    ks = jax.random.split(jax.random.key(3), 3)
    value = jax.random.normal(ks[0], (t, e))
    reward = jax.random.normal(ks[1], (t, e))
    done = jnp.zeros((t, e), bool).at[3, 1].set(True).at[5, 0].set(True)
    traj = Transition(jnp.zeros((t, e, 1)), jnp.zeros((t, e, 1)), jnp.zeros((t, e)), value, reward, done)
    last = jax.random.normal(ks[2], (e,))
    hp = PPOHParams.create(gamma=0.9, gae_lambda=0.9)
    adv_g, tg_g = gae(traj, last, hp)
    adv_l, tg_l = gae(traj, last, hp, "lambda_return")
    np.testing.assert_array_equal(tg_g, tg_l)
    g_next = np.concatenate([np.asarray(tg_g)[1:], np.asarray(last)[None]])
    want = np.asarray(reward) + 0.9 * (1.0 - np.asarray(done)) * g_next - np.asarray(value)
    np.testing.assert_allclose(adv_l, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(adv_l, adv_g, atol=1e-3)
    one = PPOHParams.create(gamma=0.9, gae_lambda=1.0)
    np.testing.assert_allclose(gae(traj, last, one, "lambda_return")[0], gae(traj, last, one)[0], rtol=1e-5,
                               atol=1e-5)
    env, p = make_env("pendulum")
    assert "ppo/advantage" not in AgentGenerator(env, p, config=PPOConfig(**TINY)).fingerprint()
    lam = AgentGenerator(env, p, config=PPOConfig(**TINY, advantage="lambda_return"))
    assert lam.fingerprint()["ppo/advantage"] == "lambda_return"
    assert all(bool(jnp.all(jnp.isfinite(x)))
               for x in jax.tree.leaves(jax.jit(lambda s: lam.train(s, jax.random.key(1), 32))(
                   lam.init(jax.random.key(0))).ppo.params))
    with pytest.raises(ValueError, match=r"config.advantage must be one of \('gae', 'lambda_return'\), got 'vtrace'"):
        AgentGenerator(env, p, config=PPOConfig(**TINY, advantage="vtrace"))
