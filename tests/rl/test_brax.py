"""brax ids in the preference loop (needs the ``brax`` extra; CI runs this file in its own step, where nothing
may skip): the fixed-horizon wrapping with an absorbing end, seals' observations, clear errors, the
continuous-control PPO (observation normalisation, reward scaling) and one tiny loop on a short horizon."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.slow

from jaxweight import preference as pf
from jaxweight.preference import driver as dr
from jaxweight.rl.brax_envs import BraxEnv, brax_names
from jaxweight.rl.env_ids import known_ids
from jaxweight.rl.envs import make_env
from jaxweight.preference.env_rewards import MirroredReward, reward_net
from jaxweight.preference.generators import AgentGenerator
from jaxweight.rl.ppo import PPOConfig

H = 16


def test_names_and_errors():
    assert {"inverted_pendulum", "inverted_double_pendulum", "reacher", "halfcheetah", "hopper"} <= set(brax_names())
    assert "brax:inverted_pendulum" in known_ids()
    with pytest.raises(ValueError, match=r"unknown brax environment 'invertedpendulum' in 'brax:invertedpendulum'; "
                                         r"did you mean 'inverted_pendulum'"):
        make_env("brax:invertedpendulum")
    with pytest.raises(ValueError, match=r"brax:reacher does not take the arguments \['bogus'\]"):
        make_env("brax:reacher", bogus=1)
    with pytest.raises(ValueError, match=r"horizon must be an int >= 1, got 0"):
        make_env("brax:inverted_pendulum", horizon=0)


def test_positions_stay_in_the_observation_as_seals():
    seals, _ = make_env("brax:halfcheetah", horizon=H)
    assert seals.obs_shape == (18,)  # brax's own halfcheetah observation has 17 values: + the x position
    assert seals.env_id == "brax:halfcheetah" and seals.inner.positions == 1
    own, _ = make_env("brax:halfcheetah", horizon=H, exclude_current_positions_from_observation=True)
    assert own.obs_shape == (17,) and own.inner.positions == 0
    env, p = make_env("brax:inverted_pendulum")
    assert env.horizon == 1000 and p.max_steps_in_episode == 1000  # brax's episode_length, seals' horizon
    assert isinstance(env.inner, BraxEnv) and env.action_space(p).shape == (1,)
    assert float(env.action_space(p).low) == -1.0 and float(env.action_space(p).high) == 1.0


def test_inverted_pendulum_absorbs_after_it_tips_over():
    """Full push: brax says done after a few steps; from then on the observation repeats, the reward is 0,
    and the episode still lasts exactly the horizon."""
    env, p = make_env("brax:inverted_pendulum", horizon=H)

    @jax.jit
    def roll(key):
        obs0, s0 = env.reset_env(key, p)

        def step(s, k):
            o, s2, r, d, info = env.step_env(k, s, jnp.ones(1), p)
            return s2, (o, r, d, info["absorbing"])

        return jax.lax.scan(step, s0, jax.random.split(key, H))[1]

    obs, rew, done, absorbing = jax.device_get(roll(jax.random.key(0)))
    assert done.tolist() == [False] * (H - 1) + [True]
    first = int(np.argmax(absorbing))           # the first step taken in the absorbing state
    assert 1 <= first < H - 2, absorbing
    assert np.all(rew[:first] == 1.0) and np.all(rew[first:] == 0.0)  # brax pays 1 a step while upright
    assert np.all(obs[first:] == obs[first - 1])                         # the terminal observation repeats
    assert abs(obs[first - 1][1]) > 0.2                                  # brax's done: the pole past 0.2 rad


def test_no_early_termination_as_seals():
    """hopper, walker2d, ant: built with terminate_when_unhealthy=False (seals' ``_no_early_termination``); a
    fallen hopper goes on with no healthy reward and is never absorbing. The pendulums keep brax's ``done``."""
    assert not make_env("brax:hopper")[0].inner.brax_env._terminate_when_unhealthy
    assert make_env("brax:hopper", terminate_when_unhealthy=True)[0].inner.brax_env._terminate_when_unhealthy
    env, p = make_env("brax:hopper", horizon=3 * H)

    @jax.jit
    def roll(key):
        _, s0 = env.reset_env(key, p)

        def step(s, k):  # full torque on every joint: the hopper tips over within a few dozen steps
            o, s2, r, d, info = env.step_env(k, s, jnp.ones(3), p)
            return s2, (r, info["absorbing"], s2.env_state.metrics["reward_healthy"])

        return jax.lax.scan(step, s0, jax.random.split(key, 3 * H))[1]

    rew, absorbing, healthy = jax.device_get(roll(jax.random.key(0)))
    assert not absorbing.any() and np.all(np.isfinite(rew))
    assert healthy[0] == 1.0 and healthy[-1] == 0.0  # unhealthy by brax's measure (z or angle out of range): unpaid


def test_a_step_leaves_the_callers_state_as_it_was():
    """brax's hopper updates ``state.metrics`` in place (with a Python float when it ends episodes on a fall):
    the wrapper steps a copy, so the state passed in is unchanged and the next step (the absorbing select) sees
    arrays only."""
    env, p = make_env("brax:hopper", horizon=H, terminate_when_unhealthy=True)

    """brax's hopper updates ``state.metrics`` in place (with a Python float when it ends episodes on a fall):
    the wrapper steps a copy, so the state passed in is unchanged and the next step (the absorbing select) sees
    arrays only."""
    env, p = make_env("brax:hopper", horizon=H, terminate_when_unhealthy=True)
    _, s0 = env.reset_env(jax.random.key(0), p)
    before = jax.tree.map(np.asarray, s0.env_state.metrics)
    _, s1, _, _, _ = env.step_env(jax.random.key(1), s0, jnp.ones(3), p)
    assert jax.tree.map(np.asarray, s0.env_state.metrics) == before
    assert all(isinstance(v, jax.Array) for v in jax.tree.leaves(s0.env_state))
    _, s2, r, _, _ = env.step_env(jax.random.key(2), s1, jnp.ones(3), p)  # the step after: its state was a step's
    assert np.isfinite(float(r)) and int(s2.time) == 2


def test_demo_settings_for_brax_ids():
    from jaxweight.demos import preferences as demo

    r = demo.settings("brax:reacher")
    assert r.use_action and r.use_next_state and r.normalize_observations and r.reward_scaling == 5.0
    assert r.absorbing_bootstrap
    assert (r.gamma, r.ent_coef, r.ppo_envs * r.ppo_steps // r.ppo_minibatches) == (0.95, 1e-3, 5120)
    ip = demo.settings("brax:inverted_pendulum", quick=True, agent="ppo")
    assert ip.reward_scaling == 10.0 and ip.fragment_length <= 1000 and not ip.use_action
    assert not ip.use_next_state and not demo.settings("brax:inverted_double_pendulum").use_next_state  # the state
    assert demo.file_tag("brax:inverted_pendulum", agent="ppo") == "brax-inverted_pendulum"
    # brax's PPO choices (no gradient clipping, ratio clip 0.3, tanh-squashed Gaussian, std per state) reach the agent
    assert (ip.max_grad_norm, ip.clip_eps, ip.tanh_squash, ip.state_dependent_std) == (None, 0.3, True, True)
    gen = demo.build(demo.settings("brax:inverted_pendulum", quick=True, agent="ppo", horizon=H,
                                   fragment_length=4)).generator
    assert (gen.config.max_grad_norm, gen.config.tanh_squash, gen.config.state_dependent_std) == (None, True, True)
    assert float(gen.hparams.clip_eps) == pytest.approx(0.3)
    hc = demo.settings("brax:halfcheetah", agent="ppo")  # brax's halfcheetah: unroll 20 x 8, minibatches of 10,240, 8 epochs
    assert (hc.gamma, hc.reward_scaling, hc.ppo_epochs, hc.ppo_envs * hc.ppo_steps // hc.ppo_minibatches) == (
        0.95, 1.0, 8, 10240)
    assert hc.skip_obs == 1 and ip.skip_obs == 0  # the agent sees brax's observation, the reward model the x too
    assert hc.reward_mirror is ip.reward_mirror is r.reward_mirror is None  # a mirror only where the table has one
    # --agent sac: SAC's settings over the task's (reward inputs, skip_obs, mirror), the budget measured with
    # the task's own agent (BRAX_DEFAULTS), quick or not
    sac = demo.settings("brax:inverted_double_pendulum", agent="sac")
    assert (sac.agent, sac.total_timesteps, sac.sac_buffer, sac.sac_batch, sac.learning_rate) == (
        "sac", 100_000, 1_000_000, 256, 3e-4)
    assert demo.settings("brax:reacher", agent="sac").total_timesteps == demo.SAC_SETTINGS["total_timesteps"]
    assert (sac.gamma, sac.reward_scaling, sac.normalize_observations) == (0.99, 1.0, False)
    assert sac.sac_envs * 1 == sac.sac_updates_per_step == 16  # one gradient step per transition
    assert sac.reward_mirror == demo.BRAX_REWARD_MIRROR["inverted_double_pendulum"] and not sac.use_next_state
    assert demo.settings("brax:halfcheetah", agent="sac").skip_obs == 1
    assert demo.settings("brax:hopper", agent="sac", quick=True).total_timesteps == demo.SAC_QUICK["total_timesteps"]


def test_demo_defaults_per_brax_task():
    """Without ``agent`` each brax task gets the agent and budget of :data:`BRAX_DEFAULTS` (SAC where it measured
    better), the gymnax ids PPO; a given agent overrides it, and a run past an hour on 2 CPU cores says so."""
    from jaxweight.demos import preferences as demo

    for name, own in demo.BRAX_DEFAULTS.items():
        s = demo.settings(f"brax:{name}")
        assert (s.agent, s.total_timesteps) == (own["agent"], own["total_timesteps"]), name
        assert demo.file_tag(f"brax:{name}") == f"brax-{name}" + ("_sac" if own["agent"] == "sac" else "")
    assert demo.default_agent("brax:reacher") == "ppo" and demo.default_agent("brax:humanoid") == "ppo"
    assert demo.default_agent("gymnax:Pendulum-v1") == demo.default_agent("cartpole") == "ppo"
    # --agent overrides: PPO on InvertedPendulum is brax's published budget, not SAC's
    ppo = demo.settings("brax:inverted_pendulum", agent="ppo")
    assert (ppo.agent, ppo.total_timesteps) == ("ppo", demo.BRAX_PPO["inverted_pendulum"]["total_timesteps"])
    assert demo.settings("brax:inverted_pendulum", total_timesteps=7_000).total_timesteps == 7_000
    # quick: a smoke run of minutes with either agent
    q = demo.settings("brax:halfcheetah", quick=True)
    assert (q.agent, q.total_timesteps, q.sac_learning_starts) == ("sac", 10_000, 2_000)
    assert demo.settings("brax:reacher", quick=True).total_timesteps == 500_000
    # the hour line: measured HalfCheetah (61 min a seed) passes an hour with 4 seeds, Reacher does not
    line = demo.cpu_hours(demo.settings("brax:halfcheetah"))
    assert line is not None and "needs a GPU to fit in an hour" in line and "4.0 h for 4 seeds" in line
    assert demo.cpu_hours(demo.settings("brax:reacher")) is None
    assert demo.cpu_hours(demo.settings("brax:halfcheetah", quick=True)) is None
    assert demo.cpu_hours(demo.settings("brax:halfcheetah", total_timesteps=1_000)) is None  # not the measured one
    assert "never timed" in demo.cpu_hours(demo.settings("brax:ant"))


@pytest.mark.filterwarnings("ignore:Accessing `:DeprecationWarning")  # mujoco's, while brax's own step is traced
def test_the_demos_reward_mirror_is_a_symmetry_of_the_brax_task():
    """From the mirrored state (every joint negated) with negated actions, brax's observations are the
    mirror table times the originals and its rewards are equal: the symmetry the reward model is given holds."""
    from jaxweight.demos import preferences as demo

    assert sorted(demo.BRAX_REWARD_MIRROR) == ["inverted_double_pendulum"]
    name = "inverted_double_pendulum"
    m = jnp.asarray(demo.BRAX_REWARD_MIRROR[name])
    ours = make_env(f"brax:{name}", horizon=H)[0]
    assert ours.obs_shape == m.shape and ours.inner.positions == 0  # brax's observation, as the table's
    env = ours.inner.brax_env
    acts = jax.random.uniform(jax.random.key(1), (H, 1), minval=-1.0, maxval=1.0)

    @jax.jit
    def roll(state, sign):
        def step(s, a):
            s2 = env.step(s, sign * a)
            return s2, (s2.obs, s2.reward)

        return jax.lax.scan(step, state, acts)[1]

    st = env.reset(jax.random.key(0))
    mirrored = st.replace(pipeline_state=env.pipeline_init(-st.pipeline_state.q, -st.pipeline_state.qd),
                          obs=m * st.obs)
    (o, r), (om, rm) = roll(st, 1.0), roll(mirrored, -1.0)
    assert float(jnp.max(jnp.abs(o))) > 0.05  # it moved
    np.testing.assert_allclose(om, m * o, atol=1e-4)
    np.testing.assert_allclose(rm, r, atol=1e-4)
    idp = demo.settings(f"brax:{name}", quick=True)
    assert idp.reward_mirror == tuple(m.tolist())
    net = demo.build(dataclasses.replace(idp, horizon=H, fragment_length=4)).reward_module
    assert isinstance(net, MirroredReward) and net.obs_sign == idp.reward_mirror


def test_preference_loop_on_a_short_brax_horizon():
    """The loop end to end on brax:inverted_pendulum at horizon 16, with the PPO of MuJoCo-class tasks
    (observation statistics in the agent state, reward scaling, the absorbing bootstrap on the learned reward):
    full-horizon samples with the true reward,
    a filled buffer, and the agent's observation statistics counting every trained step."""
    env, p = make_env("brax:inverted_pendulum", horizon=H)
    cfg = PPOConfig(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1, hidden_sizes=(16,),
                    normalize_observations=True, reward_scaling=10.0, absorbing_bootstrap=True)
    net = reward_net(env, p, hidden_sizes=(8,), use_next_state=True)
    gen = AgentGenerator(env, p, config=cfg)
    pc = dr.PreferenceComparisons(
        gen, net, num_iterations=1, fragment_length=4,
        reward_trainer=pf.RewardTrainer(net, num_members=2, epochs=2, progress=False),
        initial_comparison_frac=0.5, sample=False, eval_episodes=0, progress=False,
    )
    pc.train(0, 128, 40)
    last = pc.history[-1]
    assert last["stored_valid"] == last["buffer_size"] == 40
    assert all(r["horizon_min"] == r["horizon_max"] == H and not r["variable_horizon"] for r in pc.history)
    assert all(0 < r["sample_return"] <= H for r in pc.history)   # 1 a step while upright, then 0
    norm = pc.state.gen.ppo.obs_norm
    trained = int(pc.state.gen.ppo.steps)
    assert trained >= 128 and float(norm.count) == pytest.approx(trained + 1e-4)
    assert np.all(np.isfinite(np.asarray(norm.mean))) and gen.fingerprint()["ppo/reward_scaling"] == 10.0


@pytest.mark.parametrize("lam,advantage", [(1.0, "gae"), (0.95, "lambda_return")])
def test_ppo_loss_with_gae_per_minibatch_is_braxs(lam, advantage):
    """Differential: ``ppo_loss_fresh_gae`` (``PPOConfig.gae_per_minibatch``: advantages and value targets
    recomputed with the current critic in every minibatch of whole unrolls) against brax's own
    ``compute_ppo_loss`` on the same unrolls, parameters and observation statistics: the loss and every
    gradient agree to float32 rounding. Terminations inside the unrolls, the tanh-squashed Gaussian with a
    std per state, the entropy's tanh log-Jacobian (the same key draws the same sample) and reward scaling
    all take part. At ``gae_lambda = 1`` brax's advantage ``r_t + gamma * vs_{t+1} - V_t`` equals GAE's; at
    0.95 it is ``PPOConfig.advantage="lambda_return"`` (GAE would weigh ``delta_{t+1}`` by gamma * lambda
    instead of gamma)."""
    import functools

    from brax.training import types as btypes
    from brax.training.acme import running_statistics
    from brax.training.agents.ppo import losses as blosses
    from brax.training.agents.ppo import networks as bnet
    from flax import linen

    from jaxweight.rl.ppo import (
        ActorCritic,
        PPOHParams,
        Transition,
        _log_prob_entropy,
        _tanh_log_det_jacobian,
        ppo_loss_fresh_gae,
    )
    from jaxweight.rl.normalization import ObsNorm

    e, t, d, a = 8, 12, 5, 2
    scale = 10.0
    net = ActorCritic(action_dim=a, discrete=False, hidden_sizes=(16, 16), activation="swish",
                      value_hidden_sizes=(32, 32, 32), policy_head_scale=1.0, state_dependent_std=True)
    ks = jax.random.split(jax.random.key(0), 8)
    params = net.init(ks[0], jnp.zeros((d,)))
    mean = jax.random.normal(ks[1], (d,))
    var = jnp.exp(jax.random.normal(ks[2], (d,)))
    norm = ObsNorm(mean, var * 500.0, jnp.asarray(500.0, jnp.float32))
    obs = mean + jnp.sqrt(var) * jax.random.normal(ks[3], (t + 1, e, d))  # [T+1, E, D]: the last one bootstraps
    out, log_std, value = net.apply(params, (obs[:-1] - mean) / jnp.sqrt(var + 1e-8))
    u = out + jnp.exp(log_std) * jax.random.normal(ks[4], out.shape)  # raw (pre-tanh) actions
    logp_old = (_log_prob_entropy(out, log_std, u, False)[0]
                + 0.1 * jax.random.normal(ks[5], (t, e)))  # a behaviour policy a little off the current one
    done = jax.random.uniform(ks[6], (t, e)) < 0.08
    assert 0 < int(done.sum()) < t * e
    reward = jax.random.normal(ks[7], (t, e))
    hp = PPOHParams.create(learning_rate=3e-4, gamma=0.97, gae_lambda=lam, clip_eps=0.3, ent_coef=0.01)
    traj = Transition(obs[:-1], u, logp_old, value, reward * scale, done)
    key = jax.random.key(5)
    loss, grads = jax.value_and_grad(ppo_loss_fresh_gae, argnums=2)(net, False, params, traj, obs[-1], hp, norm,
                                                                    key, advantage)

    bnets = bnet.make_ppo_networks(d, a, preprocess_observations_fn=running_statistics.normalize,
                                   policy_hidden_layer_sizes=(16, 16), value_hidden_layer_sizes=(32, 32, 32),
                                   activation=linen.swish)
    p = params["params"]
    names = sorted(p, key=lambda n: int(n.split("_")[1]))  # Dense_0..2: policy; Dense_3..6: value
    bparams = blosses.PPONetworkParams(policy={"params": {f"hidden_{i}": p[names[i]] for i in range(3)}},
                                       value={"params": {f"hidden_{i}": p[names[3 + i]] for i in range(4)}})
    bnorm = running_statistics.RunningStatisticsState(count=norm.count, mean=mean, summed_variance=norm.m2,
                                                      std=jnp.sqrt(var + 1e-8))
    bt = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731  [T, E] -> brax's [E, T]
    data = btypes.Transition(
        observation=bt(obs[:-1]), action=bt(jnp.tanh(u)), reward=bt(reward), discount=bt(1.0 - done),
        next_observation=bt(obs[1:]),
        extras={"policy_extras": {"raw_action": bt(u),  # brax's log-prob includes the tanh Jacobian
                                  "log_prob": bt(logp_old - jnp.sum(_tanh_log_det_jacobian(u), -1)),
                                  "distribution_params": bt(jnp.concatenate([out, log_std], -1))},
                "state_extras": {"truncation": bt(jnp.zeros((t, e)))}})
    loss_fn = functools.partial(blosses.compute_ppo_loss, ppo_network=bnets, entropy_cost=0.01, discounting=0.97,
                                reward_scaling=scale, gae_lambda=lam, clipping_epsilon=0.3,
                                normalize_advantage=True, vf_coefficient=0.5)
    (bloss, metrics), bgrads = jax.value_and_grad(loss_fn, has_aux=True)(bparams, bnorm, data, key)
    assert float(metrics["policy_loss"]) != 0.0 and float(metrics["entropy_loss"]) != 0.0
    np.testing.assert_allclose(float(loss), float(bloss), rtol=1e-5)
    back = {**{names[i]: bgrads.policy["params"][f"hidden_{i}"] for i in range(3)},
            **{names[3 + i]: bgrads.value["params"][f"hidden_{i}"] for i in range(4)}}
    for n in names:
        for k in ("kernel", "bias"):
            np.testing.assert_allclose(grads["params"][n][k], back[n][k], rtol=1e-4, atol=1e-7, err_msg=f"{n}.{k}")
