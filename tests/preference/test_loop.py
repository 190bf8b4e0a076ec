"""PreferenceComparisons: round accounting, buffer queue, resume after a kill, vmap over seeds,
the learned-reward wrapper inside the loop, the variable-horizon guard, an end-to-end reward fit."""

import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import checkpoint
from jaxweight import preference as pf
from jaxweight.preference import driver as dr
from jaxweight.preference import loop as lp
from jaxweight.preference.evaluation import preference_accuracy, reward_correlation
from jaxweight.rl.envs import make_env
from jaxweight.preference.env_rewards import reward_net
from jaxweight.preference.datasets import DatasetGenerator
from jaxweight.preference.generators import AgentGenerator, HostGenerator
from jaxweight.rl.ppo import PPOConfig
from tests.contracts import assert_trees_close

REPO = Path(__file__).resolve().parents[2]
T, C, SEED = 1_000, 40, 3
TINY_PPO = PPOConfig(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, hidden_sizes=(16, 16))


def make_tiny() -> dr.PreferenceComparisons:
    """A small agent loop: CartPole with horizon 40, 3 iterations, 5-step fragments, 2 reward nets."""
    env, p = make_env("cartpole", horizon=40)
    net = reward_net(env, p, hidden_sizes=(8,))
    return dr.PreferenceComparisons(
        AgentGenerator(env, p, config=TINY_PPO), net, num_iterations=3, fragment_length=5,
        reward_trainer=pf.RewardTrainer(net, num_members=2, progress=False), initial_epoch_multiplier=4.0,
        eval_episodes=2, progress=False,
    )


def _random_policy_trajs(key, n_steps, horizon=100):
    """Episodes of a uniformly random CartPole policy (horizon 100) with the true rewards."""
    env, p = make_env("cartpole", horizon=horizon)
    n = -(-n_steps // horizon)

    def episode(k):
        k0, ka, ks = jax.random.split(k, 3)
        obs0, s0 = env.reset_env(k0, p)
        acts = jax.random.bernoulli(ka, 0.5, (horizon,)).astype(jnp.int32)

        def step(s, xs):
            kk, a = xs
            o, s, r, _, _ = env.step_env(kk, s, a, p)
            return s, (o, r)

        _, (obs, rews) = jax.lax.scan(step, s0, (jax.random.split(ks, horizon), acts))
        return jnp.concatenate([obs0[None], obs]), acts, rews

    obs, acts, rews = jax.jit(jax.vmap(episode))(jax.random.split(key, n))
    return pf.Trajectories(obs=obs, acts=acts, rews=rews, lengths=jnp.full((n,), horizon, jnp.int32),
                           terminal=jnp.ones((n,), bool))


def make_dataset_loop(trajs, **kw) -> dr.PreferenceComparisons:
    net = reward_net(make_env("cartpole")[0], hidden_sizes=(16,))
    args = dict(num_iterations=3, fragment_length=10, initial_epoch_multiplier=10.0, progress=False, sample=False,
                reward_trainer=pf.RewardTrainer(net, num_members=2, epochs=10, progress=False))
    args.update(kw)
    return dr.PreferenceComparisons(DatasetGenerator(trajs), net, **args)


@pytest.fixture(scope="module")
def dataset_trajs():
    return _random_policy_trajs(jax.random.key(0), 3_000)


# ------------------------------------------------------------------ pure pieces
def test_plan_is_imitations_arithmetic():
    pc = make_tiny()
    plan = pc.plan(T, C)
    assert list(plan.schedule) == pf.allocate_comparisons(C, 3, 0.1, "hyperbolic") == [4, 17, 11, 8]
    tpi, extra = divmod(T, 3)
    assert plan.agent_steps == (tpi, tpi, tpi + extra, tpi)  # the remainder on round K - 1, K + 1 rounds
    assert plan.sample_steps == tuple(2 * n * 5 for n in plan.schedule)
    assert plan.epochs == (4, 1, 1, 1) and plan.capacity == C and plan.max_pairs == 17
    pc2 = make_tiny()
    pc2.transition_oversampling = 1.5
    assert pc2.plan(T, C).sample_steps == tuple(math.ceil(1.5 * 2 * n * 5) for n in plan.schedule)
    with pytest.raises(ValueError, match=r"gives round 0 0 comparisons \(schedule \[0, 1, 1, 0\]\)"):
        pc.plan(T, 2)
    q = make_tiny()
    q.comparison_queue_size = 10
    assert q.plan(T, C).capacity == 10


@pytest.mark.slow
def test_loop_contract_and_donation(dataset_trajs, tmp_path):
    """The pure component: config / init / step (one round, key explicit) / run / metrics_dict."""
    from tests.contracts import check_state_contract

    pc = make_dataset_loop(dataset_trajs, num_iterations=1)
    cfg = pc.config_for(0, 30)
    cfg_alt = cfg.replace(temperature=jnp.float32(0.5), trainer=cfg.trainer.replace(learning_rate=jnp.float32(0.01)))
    check_state_contract(
        init=lambda: lp.init(cfg, 0),
        update=lp.step,
        update_args=(jax.random.key(1), cfg),
        update_args_alt=(jax.random.key(2), cfg_alt),
        batched_init=lambda: jax.vmap(lambda k: lp.init(cfg, k))(jax.random.split(jax.random.key(0), 2)),
        batched_update_in_axes=(0, None),
        batched_update_args=(jax.random.split(jax.random.key(3), 2), cfg),
        tmp_path=tmp_path, rtol=1e-4, atol=1e-5,
    )
    state = lp.init(cfg, 0)
    one, out = jax.jit(lp.step)(state, jax.random.key(1), cfg)
    assert set(out) == set(lp.ROUND_METRICS) and int(one.round) == 1 and int(out["num_pairs"]) == cfg.plan.schedule[0]
    flat = lp.metrics_dict(out, cfg)
    assert flat["preference/loop/num_pairs"] == float(cfg.plan.schedule[0])
    # run = the remaining rounds, round i with round_key(key, i)
    done, rows = jax.jit(lp.run)(one, jax.random.key(1), cfg)
    ref, last = jax.jit(lp.step)(one, lp.round_key(jax.random.key(1), 1), cfg)
    assert_trees_close(done, ref, rtol=1e-5, atol=1e-6)
    assert float(rows["reward_loss"][1]) == pytest.approx(float(last["reward_loss"]), rel=1e-5)
    # donation
    donated = lp.init(cfg, 0)
    jax.jit(lp.step, donate_argnums=0)(donated, jax.random.key(1), cfg)
    # (reward_shift / reward_scale are only written, never read: jit prunes them as inputs)
    assert all(x.is_deleted() for x in jax.tree.leaves((donated.buffer, donated.reward, donated.gen)))


class _CountingDataset(DatasetGenerator):
    """A dataset 'agent' with one hyperparameter: ``train`` adds ``hparams["step"]`` to its counter."""

    def __init__(self, trajectories, step):
        super().__init__(trajectories)
        self.hparams = {"step": jnp.asarray(step, jnp.int32)}

    def train(self, state, key, steps, reward_params=None, *, hparams=None):
        return state.replace(num_samples=state.num_samples + hparams["step"])


def test_agent_hyperparameters_are_config_leaves(dataset_trajs):
    """The agent's hyperparameters ride in the config, not the state: every round passes them to
    ``generator.train``, and a new value changes the result without a new compilation."""
    gen = _CountingDataset(dataset_trajs, 2)
    net = reward_net(make_env("cartpole")[0], hidden_sizes=(8,))
    pc = dr.PreferenceComparisons(gen, net, num_iterations=1, fragment_length=10, initial_epoch_multiplier=1.0,
                                  progress=False, sample=False)
    cfg = pc.config_for(0, 30)
    assert int(cfg.agent_hparams["step"]) == 2
    assert int(lp.config(gen, net, 1, 0, 30, fragment_length=10).agent_hparams["step"]) == 2
    traces = []

    def step(st, k, c):
        traces.append(1)
        return lp.step(st, k, c)

    step = jax.jit(step)
    state = lp.init(cfg, 0)
    a, _ = step(state, jax.random.key(1), cfg)
    b, _ = step(state, jax.random.key(1), cfg.replace(agent_hparams={"step": jnp.asarray(5, jnp.int32)}))
    assert int(a.gen.num_samples) == 2 and int(b.gen.num_samples) == 5 and len(traces) == 1
    # a generator without hyperparameters gets none
    assert make_dataset_loop(dataset_trajs).config_for(0, 30).agent_hparams is None


def test_config_is_the_one_place_for_static_settings(dataset_trajs):
    pc = make_dataset_loop(dataset_trajs)
    assert isinstance(pc.config, lp.LoopConfig) and pc.fragment_length == pc.config.fragment_length == 10
    pc.transition_oversampling = 2.0  # validated, goes into the config
    assert pc.config.transition_oversampling == 2.0
    with pytest.raises(ValueError, match="transition_oversampling must be finite and >= 1"):
        pc.transition_oversampling = 0.5
    assert pc.config.transition_oversampling == 2.0
    assert lp.LoopConfig(3).to_dict()["query_schedule"] == "hyperbolic"
    pc.temperature = 0.5  # hyperparameters too: f32[] leaves of the config
    assert pc.config.temperature.dtype == jnp.float32 and float(pc.temperature) == 0.5
    with pytest.raises(ValueError, match="temperature must be finite and >= 0.0"):
        pc.temperature = -1.0


# ------------------------------------------------------------------ the agent loop
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One uninterrupted 2-seed run of the tiny loop, with checkpoints."""
    pc = make_tiny()
    ckpt = tmp_path_factory.mktemp("tiny")
    calls = []
    res = pc.train(SEED, T, C, calls.append, num_seeds=2, checkpoint_dir=ckpt)
    return pc, pc.state, list(pc.history), res, calls, ckpt


@pytest.mark.slow
def test_loop_accounting_per_round(tiny_run):
    pc, state, hist, res, calls, ckpt = tiny_run
    plan = pc.plan(T, C)
    assert calls == [0, 1, 2, 3] and pc._iteration == 4
    b = TINY_PPO.batch_size
    trained = 0
    for i, h in enumerate(hist):
        assert h["round"] == [i, i]
        assert h["num_pairs"] == [plan.schedule[i]] * 2                       # comparisons per round
        assert h["buffer_size"] == [sum(plan.schedule[: i + 1])] * 2          # no queue limit: keeps all
        assert h["stored_valid"] == h["buffer_size"]
        assert h["sample_steps"] == [2 * plan.schedule[i] * 5] * 2
        assert h["agent_steps"] == [plan.agent_steps[i]] * 2
        trained += -(-plan.agent_steps[i] // b) * b                          # whole PPO updates
        assert h["agent_steps_trained"] == [trained] * 2
        assert h["horizon_min"] == h["horizon_max"] == [40, 40] and h["variable_horizon"] == [False, False]
        assert all(0.0 <= g <= 40.0 for g in h["gt_return"])
        assert all(np.isfinite(h["reward_loss"]))
    assert int(state.round[0]) == 4 and state.buffer.prefs.shape == (2, C)
    assert res["reward_loss"].shape == (2,) and res["reward_accuracy"].dtype == np.float32
    np.testing.assert_array_equal(res["reward_loss"], np.asarray(hist[-1]["reward_loss"], np.float32))
    # the two seeds are different runs
    assert not np.array_equal(state.reward.params["params"]["net"]["dense0"]["kernel"][0],
                              state.reward.params["params"]["net"]["dense0"]["kernel"][1])
    assert pc.dataset is state.buffer
    meta = checkpoint.load_metadata(ckpt / dr.CHECKPOINT_NAME)
    assert meta["rounds_done"] == 4 and meta["history"] == hist


@pytest.mark.slow
def test_agent_trains_on_the_learned_reward_in_the_loop(tiny_run):
    """The loop binds the ensemble to the agent: rollouts carry (mean - shift) * scale, never the true reward."""
    pc, state, *_ = tiny_run
    assert isinstance(pc.generator.reward_apply, lp._ModuleReward) and pc.generator.reward_apply.ensemble
    one = jax.tree.map(lambda x: x[0], state)
    rp = pc.agent_reward(one)
    assert float(rp.scale) != 1.0 and float(rp.shift) != 0.0
    _, _, traj, true_r = pc.generator.rollout(one.gen.ppo, jax.random.key(0), rp)
    # rewards of the transitions obs[t] -> obs[t + 1] (skip the last step, whose next obs is not stored)
    obs, nxt = traj.obs[:-1], traj.obs[1:]
    member = pf.ensemble_apply(pc.reward_module, one.reward.params, obs, traj.action[:-1], nxt, traj.done[:-1])
    expected = (member.mean(-1) - rp.shift) * rp.scale
    ok = ~np.asarray(traj.done[:-1])  # after a reset obs[t + 1] is the new episode's first observation
    np.testing.assert_allclose(np.asarray(traj.reward[:-1])[ok], np.asarray(expected)[ok], rtol=1e-4, atol=1e-4)
    assert not np.allclose(traj.reward, true_r)
    # the normalisation is the buffer's: standardised learned rewards over the stored transitions
    inputs = one.buffer.pairs.transitions()
    r = (pf.ensemble_apply(pc.reward_module, one.reward.params, *inputs).mean(-1) - rp.shift) * rp.scale
    np.testing.assert_allclose([float(r.mean()), float(r.std())], [0.0, 1.0], atol=1e-3)  # the buffer is full


@pytest.mark.slow
def test_train_and_run_give_identical_metrics(tiny_run):
    """train (round by round) and run (all rounds in one call) run the same compiled phase programs:
    four rounds, two seeds, same keys -> bit-identical metrics and states."""
    pc, state, hist, *_ = tiny_run
    states, metrics = pc.run(SEED, T, C, num_seeds=2)
    for i, h in enumerate(hist):
        for k, v in h.items():
            np.testing.assert_array_equal(np.asarray(metrics[k])[:, i], np.asarray(v), err_msg=f"round {i} {k}")
    assert_trees_close(states, state, rtol=0, atol=0)


@pytest.mark.slow
def test_driver_phases_agree_with_the_pure_loop(tiny_run):
    """The driver compiles the four phases of loop.step as separate programs (at its own XLA
    options); they give the pure one-program loop.run's metrics and state for the same keys."""
    pc, state, hist, *_ = tiny_run
    cfg = pc.config_for(T, C)
    keys, run_keys = pc._keys(SEED, 2)
    states, metrics = jax.jit(jax.vmap(lambda k, rk: lp.run(lp.init(cfg, k), rk, cfg)))(keys, run_keys)
    for i, h in enumerate(hist):
        for k, v in h.items():
            np.testing.assert_allclose(np.asarray(metrics[k])[:, i], np.asarray(v, np.float64), rtol=1e-5, atol=1e-6,
                                       err_msg=f"round {i} {k}")
    # The Bradley-Terry loss sees only differences of fragment returns, so the reward nets' output
    # bias has a zero gradient up to round-off, which AdamW normalises into full-size steps: it
    # differs between programs compiled differently, and the agent's reward shift absorbs it
    # (shift = mean reward = mean of the nets' outputs, biases included). Everything else agrees.
    def bias(st):
        return np.asarray(st.reward.params["params"]["net"]["dense_final"]["bias"], np.float64)

    def without_bias(st):
        params = jax.tree.map(lambda x: x, st.reward.params)
        params["params"]["net"]["dense_final"]["bias"] = jnp.zeros_like(params["params"]["net"]["dense_final"]["bias"])
        return st.replace(reward=st.reward.replace(params=params), reward_shift=jnp.zeros_like(st.reward_shift))

    assert_trees_close(without_bias(states), without_bias(state), rtol=1e-5, atol=1e-6)
    unbiased = lambda st: np.asarray(st.reward_shift, np.float64) - bias(st).mean(axis=(1, 2))  # noqa: E731
    np.testing.assert_allclose(unbiased(states), unbiased(state), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_driver_compiles_five_programs_once(dataset_trajs):
    """init and the four phase programs compile once (ahead of round 0, on a background thread);
    a second run with other keys compiles nothing."""
    from jax._src import monitoring  # noqa: PLC0415 - JAX's own compile event (no public alias)

    pc = make_dataset_loop(dataset_trajs)
    events = []
    listen = lambda name, *_, **__: events.append(name)  # noqa: E731
    monitoring.register_event_duration_secs_listener(listen)
    try:
        pc.compile(0, 60, num_seeds=2)
        programs = {n for (kind, n, *_) in pc._jit if kind == "aot"}
        assert programs == {"init", "collect", "fit_reward", "fit_agent", "finish"}
        pc.train(0, 0, 60, num_seeds=2)
        n = events.count("/jax/core/compile/backend_compile_duration")
        pc.train(1, 0, 60, num_seeds=2)
        assert events.count("/jax/core/compile/backend_compile_duration") == n
    finally:
        monitoring.unregister_event_duration_listener(listen)


@pytest.mark.slow
def test_resume_with_a_changed_learning_rate_is_refused(tiny_run, tmp_path):
    pc, state, hist, res, calls, ckpt = tiny_run
    env, p = make_env("cartpole", horizon=40)
    net = reward_net(env, p, hidden_sizes=(8,))

    def changed(**kw):
        args = dict(num_members=2, learning_rate=1e-3)
        args.update(kw)
        return dr.PreferenceComparisons(
            AgentGenerator(env, p, config=TINY_PPO), net, num_iterations=3, fragment_length=5,
            reward_trainer=pf.RewardTrainer(net, **{k: v for k, v in args.items()}), initial_epoch_multiplier=4.0,
            eval_episodes=2,
        )

    assert changed().fingerprint(pc.plan(T, C), 2) == pc.fingerprint(pc.plan(T, C), 2)
    other = changed(learning_rate=5e-3)
    with pytest.raises(ValueError, match=r"settings differ: reward/learning_rate \(checkpoint 0\.001"):
        other.train(SEED, T, C, num_seeds=2, checkpoint_dir=ckpt, resume=True)
    assert other.state is None


@pytest.mark.slow
def test_resume_after_kill_is_identical(tiny_run, tmp_path):
    """Kill a run (SIGKILL) after 2 rounds in a subprocess, resume it, compare to the uninterrupted run."""
    pc, state, hist, res, _, _ = tiny_run
    script = (
        "import os, signal, sys\n"
        "from tests.preference.test_loop import make_tiny, T, C, SEED\n"
        "def cb(i):\n"
        "    if i == 1:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "make_tiny().train(SEED, T, C, cb, num_seeds=2, checkpoint_dir=sys.argv[1])\n"
        "print('not killed')\n"
    )
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == -9, r.stderr[-2000:]
    assert "not killed" not in r.stdout
    assert checkpoint.load_metadata(tmp_path / dr.CHECKPOINT_NAME)["rounds_done"] == 2
    rounds = []
    res2 = pc.train(SEED, T, C, rounds.append, num_seeds=2, checkpoint_dir=tmp_path, resume=True)
    assert rounds == [2, 3]
    assert_trees_close(pc.state, state, err="resumed vs uninterrupted: ")
    assert pc.history == hist
    np.testing.assert_array_equal(res2["reward_accuracy"], res["reward_accuracy"])
    # a finished run resumes to itself without training; another run's checkpoint is refused
    assert pc.train(SEED, T, C, rounds.append, num_seeds=2, checkpoint_dir=tmp_path, resume=True) and rounds == [2, 3]
    with pytest.raises(ValueError, match="belongs to another run.*num_seeds"):
        pc.train(SEED, T, C, num_seeds=3, checkpoint_dir=tmp_path, resume=True)
    # a changed teacher temperature is refused, and accepted (logged, applied) with allow_changed
    hot = make_tiny()
    hot.temperature = 2.0
    with pytest.raises(ValueError, match=r"loop/temperature \(checkpoint 1\.0, now 2\.0\)"):
        hot.train(SEED, T, C, num_seeds=2, checkpoint_dir=tmp_path, resume=True)
    hot.train(SEED, T, C, num_seeds=2, checkpoint_dir=tmp_path, resume=True, allow_changed=True)
    assert hot.overrides and "loop/temperature" in hot.overrides[-1]["changed"][0]


# ------------------------------------------------------------------ dataset loops (no agent)
@pytest.mark.slow
def test_run_is_jittable_and_vmaps_over_seeds(dataset_trajs):
    pc = make_dataset_loop(dataset_trajs)
    cfg = pc.config_for(0, 60)
    run = lambda k: lp.run(lp.init(cfg, k), k, cfg)  # noqa: E731
    keys = jax.random.split(jax.random.key(1), 2)
    states, metrics = jax.jit(jax.vmap(run))(keys)
    assert metrics["reward_loss"].shape == (2, 4) and states.round.tolist() == [4, 4]
    for i in range(2):
        s_i, m_i = jax.jit(run)(keys[i])
        assert_trees_close(jax.tree.map(lambda x: x[i], metrics), m_i, rtol=2e-4, atol=1e-5)
        assert_trees_close(jax.tree.map(lambda x: x[i], states.reward.params), s_i.reward.params, rtol=2e-4, atol=1e-5)


@pytest.mark.slow
def test_end_to_end_reward_fit_with_a_queue_limit(dataset_trajs):
    """Comparisons of random-policy CartPole fragments teach the upright reward (Pearson > 0.8 on held-out
    episodes), with a buffer that keeps only the newest 250 of the 600 comparisons."""
    pc = make_dataset_loop(dataset_trajs, num_iterations=3, comparison_queue_size=250)
    pc.train(0, 0, 600)
    plan = pc.plan(0, 600)
    assert plan.capacity == 250
    assert [h["num_pairs"] for h in pc.history] == list(plan.schedule)
    assert [h["buffer_size"] for h in pc.history] == [min(sum(plan.schedule[: i + 1]), 250) for i in range(4)]
    assert int(pc.state.buffer.next) == sum(plan.schedule) % 250  # the ring wrapped around
    # no evaluation without an agent: gt_episodes says so, and gt_return is 0 (no NaN sentinel)
    assert all(h["agent_steps_trained"] == 0 and h["gt_episodes"] == 0 and h["gt_return"] == 0.0
               for h in pc.history)
    held_out = _random_policy_trajs(jax.random.key(77), 3_000)
    corr = reward_correlation(pc.reward_module, pc.state.reward.params, held_out)
    pairs = pf.random_fragments(5, held_out, 10, 500)
    acc, decided = preference_accuracy(pc.reward_module, pc.state.reward.params, pairs)
    assert float(corr) > 0.8, float(corr)
    assert int(decided) > 20 and float(acc) > 0.9
    # the reward model of round 0 is judged on round 1's new pairs: better than chance by the end
    assert pc.history[-1]["fresh_accuracy"] > 0.8
    # an untrained model does not correlate
    fresh = pc.reward_trainer.init(1, pf.example_inputs(pairs)).params
    assert abs(float(reward_correlation(pc.reward_module, fresh, held_out))) < 0.8


# ------------------------------------------------------------------ variable horizons and errors
class _VariableGenerator:
    """A pure generator whose terminal episodes have lengths 6 and 9."""

    def init(self, key):
        return jnp.zeros((), jnp.int32)

    def sample(self, state, key, steps, *, max_steps=None):
        obs = jax.random.normal(key, (4, 10, 4))
        return pf.Trajectories(obs=obs, acts=jnp.zeros((4, 9), jnp.int32), rews=jnp.ones((4, 9)),
                               lengths=jnp.array([6, 9, 6, 9], jnp.int32), terminal=jnp.ones(4, bool))

    def train(self, state, key, steps, reward_params=None):
        return state


@pytest.mark.slow
def test_variable_horizons_are_refused(dataset_trajs, caplog):
    net = reward_net(make_env("cartpole")[0], hidden_sizes=(8,))
    pc = dr.PreferenceComparisons(_VariableGenerator(), net, num_iterations=1, fragment_length=3, progress=False,
                                  initial_epoch_multiplier=1.0)
    with pytest.raises(ValueError, match=r"Episodes of different length detected: \[6, 9\]"):
        pc.train(0, 10, 10)
    assert pc.state is None and pc.history == []  # nothing committed
    with caplog.at_level(logging.WARNING, logger="jaxweight.preference"):
        dr.PreferenceComparisons(_VariableGenerator(), net, num_iterations=1, fragment_length=3,
                                 allow_variable_horizon=True)
    assert "allow_variable_horizon" in caplog.text
    pc.allow_variable_horizon = True  # the check is on the host: the rounds now go through
    pc.train(0, 10, 10)
    assert pc.history[-1]["variable_horizon"] and pc.history[-1]["buffer_size"] == 10
    # a dataset whose terminal episodes differ is refused up front
    mixed = dataset_trajs.replace(lengths=dataset_trajs.lengths.at[0].set(50))
    with pytest.raises(ValueError, match="allow_variable_horizon=True"):
        make_dataset_loop(mixed)


def test_bad_arguments(dataset_trajs):
    net = reward_net(make_env("cartpole")[0], hidden_sizes=(8,))
    gen = DatasetGenerator(dataset_trajs)
    with pytest.raises(ValueError, match="pure generator"):
        dr.PreferenceComparisons(object(), net, 2)
    with pytest.raises(ValueError, match="not a HostGenerator"):
        dr.PreferenceComparisons(HostGenerator(gen, 0), net, 2)
    with pytest.raises(ValueError, match="another module"):
        dr.PreferenceComparisons(gen, net, 2, reward_trainer=pf.RewardTrainer(reward_net(make_env("cartpole")[0])))
    with pytest.raises(ValueError, match="needs an ensemble"):
        dr.PreferenceComparisons(gen, net, 2, fragmenter="active")
    with pytest.raises(ValueError, match="Unknown query schedule"):
        dr.PreferenceComparisons(gen, net, 2, query_schedule="cubic")
    with pytest.raises(ValueError, match="num_iterations must be >= 1"):
        dr.PreferenceComparisons(gen, net, 0)
    with pytest.raises(ValueError, match="fragment_length must be >= 1"):
        dr.PreferenceComparisons(gen, net, 2, fragment_length=0)
    with pytest.raises(ValueError, match="initial_comparison_frac"):
        dr.PreferenceComparisons(gen, net, 2, initial_comparison_frac=1.5)
    reg = pf.RewardTrainer(net, regularizer=pf.lp_regularizer(
        0.1, lambda_updater=pf.IntervalParamScaler(0.1, (0.9, 1.1)), val_split=0.1))
    with pytest.raises(ValueError, match="Not enough data samples"):
        dr.PreferenceComparisons(gen, net, 2, reward_trainer=reg).plan(0, 20)
