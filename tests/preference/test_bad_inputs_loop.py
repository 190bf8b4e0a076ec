"""Bad inputs on the loop side of jaxweight.preference: configuration errors, empty work, honest resume,
damaged checkpoints and the preferences demo's command line. Each case asserts the specific outcome."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxweight
from jaxweight import StateFileError, checkpoint
from jaxweight import preference as pf
from jaxweight.demos import preferences as demo
from jaxweight.preference import driver as dr
from jaxweight.preference import loop as lp
from jaxweight.preference.evaluation import preference_accuracy
from jaxweight.rl.envs import make_env
from jaxweight.preference.env_rewards import reward_net
from jaxweight.preference.datasets import DatasetGenerator
from jaxweight.preference.generators import AgentGenerator
from jaxweight.rl.ppo import PPOConfig, PPOHParams


def _trajs(n=6, horizon=30, seed=0):
    rng = np.random.default_rng(seed)
    return pf.Trajectories(
        obs=jnp.asarray(rng.normal(size=(n, horizon + 1, 4)), jnp.float32),
        acts=jnp.asarray(rng.integers(0, 2, (n, horizon)), jnp.int32),
        rews=jnp.asarray(rng.normal(size=(n, horizon)), jnp.float32),
        lengths=jnp.full((n,), horizon, jnp.int32), terminal=jnp.ones((n,), bool))


NET = reward_net(make_env("cartpole")[0], hidden_sizes=(4,))


def _loop(trajs=None, **kw):
    args = dict(num_iterations=2, fragment_length=5, initial_epoch_multiplier=2.0, sample=False,
                reward_trainer=pf.RewardTrainer(NET, num_members=2))
    args.update(kw)
    return dr.PreferenceComparisons(DatasetGenerator(_trajs() if trajs is None else trajs), NET, **args)


# ------------------------------------------------------------------ configuration
CONFIG_CASES = [
    (dict(num_iterations=0), "num_iterations must be >= 1"),
    (dict(fragment_length=0), "fragment_length must be >= 1"),
    (dict(transition_oversampling=0.5), "transition_oversampling must be finite and >= 1"),
    (dict(transition_oversampling=float("nan")), "transition_oversampling must be finite"),
    (dict(initial_comparison_frac=1.5), "initial_comparison_frac must be finite and in [0.0, 1.0], got 1.5"),
    (dict(initial_comparison_frac=-0.1), "initial_comparison_frac"),
    (dict(initial_epoch_multiplier=-1.0), "initial_epoch_multiplier"),
    (dict(comparison_queue_size=0), "comparison_queue_size must be >= 1"),
    (dict(query_schedule="cubic"), "Unknown query schedule: cubic"),
    (dict(fragmenter="greedy"), "fragmenter"),
    (dict(active_sample_factor=0.5), "active_sample_factor"),
    (dict(uncertainty_on="entropy"), "uncertainty_on"),
    (dict(eval_episodes=-1), "eval_episodes must be >= 0"),
    (dict(temperature=-1.0), "temperature must be finite and >= 0.0"),
    (dict(temperature=float("inf")), "temperature must be finite"),
    (dict(discount=1.5), "discount must be finite and in [0.0, 1.0], got 1.5"),
    (dict(threshold=0.0), "threshold must be finite and > 0.0"),
    (dict(alpha=float("nan")), "alpha must be finite"),
    (dict(fragment_length=31), "fragment_length 31 is longer than the generator's episodes (at most 30 steps)"),
]


@pytest.mark.parametrize("kw,match", CONFIG_CASES, ids=[next(iter(c[0])) + str(i) for i, c in enumerate(CONFIG_CASES)])
def test_bad_loop_settings_are_refused_at_configuration(kw, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        _loop(**kw)


AGENT_CASES = [
    (lambda: PPOHParams.create(learning_rate=-1e-3), "learning_rate must be finite and >= 0.0"),
    (lambda: PPOHParams.create(gamma=1.5), "gamma must be finite and in [0.0, 1.0], got 1.5"),
    (lambda: PPOHParams.create(clip_eps=float("nan")), "clip_eps must be finite"),
    (lambda: PPOHParams.create(anneal_steps=-1), "anneal_steps"),
    (lambda: AgentGenerator(*make_env("cartpole", horizon=20), exploration_frac=1.5), "exploration_frac"),
    (lambda: AgentGenerator(*make_env("cartpole", horizon=20), config=PPOConfig(num_envs=2, num_steps=5,
                                                                               num_minibatches=3)),
     "must be a multiple of config.num_minibatches"),
    (lambda: AgentGenerator(*make_env("cartpole", horizon=20), config=PPOConfig(num_envs=0)), "num_envs must be >= 1"),
    (lambda: dr.PreferenceComparisons(AgentGenerator(*make_env("cartpole", horizon=20)), NET, 2, fragment_length=21),
     "fragment_length 21 is longer than the generator's episodes (at most 20 steps)"),
]


@pytest.mark.parametrize("make,match", AGENT_CASES, ids=[f"agent{i}" for i in range(len(AGENT_CASES))])
def test_bad_agent_settings_are_refused(make, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        make()


def _message(fn, *args):
    with pytest.raises(ValueError) as info:
        fn(*args)
    return str(info.value).split(" (`check` failed)")[0].strip()


# the loop's hyperparameters are array leaves of its config (sweepable): the same message eagerly
# (config and the class) and through checked(jit)
LOOP_HP = [
    ("temperature", -1.0, "temperature must be finite and >= 0.0, got -1.0"),
    ("temperature", float("nan"), "temperature must be finite and >= 0.0, got nan"),
    ("discount", 1.5, "discount must be finite and in [0.0, 1.0], got 1.5"),
    ("threshold", 0.0, "threshold must be finite and > 0.0, got 0.0"),
    ("alpha", float("inf"), "alpha must be finite, got inf"),
]


@pytest.mark.parametrize("name,value,match", LOOP_HP, ids=[f"{n}={v}" for n, v, _ in LOOP_HP])
def test_loop_hparams_eager_and_checked_jit_agree(name, value, match):
    gen = DatasetGenerator(_trajs())
    eager = _message(lambda: lp.config(gen, NET, 2, 0, 20, fragment_length=5, **{name: value}))
    assert eager == match
    assert _message(lambda: lp.LoopConfig(2, **{name: value})) == match
    assert _message(lambda: _loop(**{name: value})) == match
    jitted = _message(jaxweight.checked(jax.jit(
        lambda v: getattr(lp.config(gen, NET, 2, 0, 20, fragment_length=5, **{name: v}), name))), jnp.float32(value))
    assert jitted == eager


def test_loop_config_builds_f32_leaves():
    cfg = lp.config(DatasetGenerator(_trajs()), NET, 2, 0, 20, fragment_length=5, temperature=2.0, alpha=-0.5)
    assert (float(cfg.temperature), float(cfg.discount), float(cfg.threshold), float(cfg.alpha)) == (2.0, 1.0, 50.0, -0.5)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(cfg))


@pytest.mark.parametrize("value,match", [(1.5, "discount must be finite and in [0.0, 1.0], got 1.5"),
                                         (float("nan"), "discount must be finite and in [0.0, 1.0], got nan")])
def test_preference_accuracy_discount_eager_and_checked_jit_agree(value, match):
    pairs = pf.random_fragments(0, _trajs(n=4, horizon=6), 3, 4)
    params = NET.init(jax.random.key(0), *pf.example_inputs(pairs))
    eager = _message(lambda: preference_accuracy(NET, params, pairs, discount=value))
    assert eager == match
    run = jaxweight.checked(jax.jit(lambda d: preference_accuracy(NET, params, pairs, discount=d)[0]))
    assert _message(run, jnp.float32(value)) == eager


def _zero(_):
    return jnp.zeros(())


_ENV20 = make_env("cartpole", horizon=20)
# host settings (stored as Python numbers / part of the static config): refused eagerly, and a traced
# value is a ValueError naming it instead of a ConcretizationTypeError
HOST = [
    ("transition_oversampling", lambda v: _zero(lp.LoopConfig(2, transition_oversampling=v)), 0.5,
     "transition_oversampling must be finite and >= 1.0, got 0.5", "finite and >= 1.0"),
    ("initial_comparison_frac", lambda v: _zero(lp.LoopConfig(2, initial_comparison_frac=v)), float("nan"),
     "initial_comparison_frac must be finite and in [0.0, 1.0], got nan", "finite and in [0.0, 1.0]"),
    ("initial_epoch_multiplier", lambda v: _zero(lp.LoopConfig(2, initial_epoch_multiplier=v)), -1.0,
     "initial_epoch_multiplier must be finite and >= 0.0, got -1.0", "finite and >= 0.0"),
    ("active_sample_factor", lambda v: _zero(lp.LoopConfig(2, active_sample_factor=v)), float("inf"),
     "active_sample_factor must be finite and >= 1.0, got inf", "finite and >= 1.0"),
    ("exploration_frac", lambda v: _zero(AgentGenerator(*_ENV20, exploration_frac=v)), 1.5,
     "exploration_frac must be finite and in [0.0, 1.0], got 1.5", "finite and in [0.0, 1.0]"),
    ("switch_prob", lambda v: _zero(AgentGenerator(*_ENV20, switch_prob=v)), float("nan"),
     "switch_prob must be finite and in [0.0, 1.0], got nan", "finite and in [0.0, 1.0]"),
    ("random_prob", lambda v: _zero(AgentGenerator(*_ENV20, random_prob=v)), -0.5,
     "random_prob must be finite and in [0.0, 1.0], got -0.5", "finite and in [0.0, 1.0]"),
    ("config.max_grad_norm", lambda v: _zero(AgentGenerator(*_ENV20, config=PPOConfig(
        num_envs=2, num_steps=4, num_minibatches=2, max_grad_norm=v))), 0.0,
     "config.max_grad_norm must be finite and > 0.0, got 0.0", "finite and > 0.0"),
]


@pytest.mark.parametrize("fn,value,eager_msg,rng", [c[1:] for c in HOST], ids=[c[0] for c in HOST])
def test_host_settings_refused_eagerly_and_when_traced(fn, value, eager_msg, rng):
    assert _message(lambda: fn(value)) == eager_msg
    name = eager_msg.split(" must be")[0]
    jitted = _message(jaxweight.checked(jax.jit(fn)), jnp.float32(value))
    assert jitted == (f"{name} must be static (a concrete number, not traced under jax.jit) and {rng}, "
                      "got a traced float32[]")


# ------------------------------------------------------------------ no empty work
PLAN_CASES = [
    (dict(), (0, 0), "total_comparisons must be >= 1"),
    (dict(), (-1, 20), "total_timesteps must be >= 0"),
    (dict(), (1, 20), "total_timesteps 1 < num_iterations 2: the agent would train 0 steps per round"),
    (dict(), (0, 2), "gives round 0 0 comparisons"),
    (dict(initial_epoch_multiplier=0.1), (0, 20), "Must train for at least one epoch."),
    (dict(initial_comparison_frac=0.0), (0, 20), "gives round 0 0 comparisons"),
]


@pytest.mark.parametrize("kw,totals,match", PLAN_CASES, ids=[f"plan{i}" for i in range(len(PLAN_CASES))])
def test_settings_that_give_no_work_fail_at_plan_time(kw, totals, match):
    with pytest.raises(ValueError, match=match):
        _loop(**kw).plan(*totals)


def test_a_dataset_with_only_short_episodes_is_refused():
    short = _trajs().replace(lengths=jnp.full((6,), 4, jnp.int32))
    with pytest.raises(ValueError, match="no fragment fits, so there would be no comparisons"):
        _loop(short)


# ------------------------------------------------------------------ honest resume
T, C = 0, 20


@pytest.fixture
def saved(tmp_path):
    """A checkpoint written by a run of the default settings (state after init, fingerprint of the run)."""
    pc = _loop()
    plan = pc.plan(T, C)
    state = pc.init_run(0, T, C)
    checkpoint.save(tmp_path / dr.CHECKPOINT_NAME, state,
                    metadata={"fingerprint": pc.fingerprint(plan, None), "history": [], "rounds_done": 0})
    return tmp_path


CHANGES = [
    (dict(temperature=2.0), ["loop/temperature"]),
    (dict(discount=0.9), ["loop/discount"]),
    (dict(alpha=1.0), ["loop/alpha"]),
    (dict(reward_trainer=pf.RewardTrainer(NET, num_members=2, learning_rate=5e-3)), ["reward/learning_rate"]),
    (dict(reward_trainer=pf.RewardTrainer(NET, num_members=2, noise_prob=0.1)), ["reward/noise_prob"]),
    (dict(reward_trainer=pf.RewardTrainer(NET, num_members=2, epochs=2)), ["reward/epochs", "plan/epochs"]),
    (dict(initial_comparison_frac=0.5), ["loop/initial_comparison_frac", "plan/schedule"]),
    (dict(temperature=0.5, reward_trainer=pf.RewardTrainer(NET, num_members=2, weight_decay=0.0)),
     ["loop/temperature", "reward/weight_decay"]),
    (dict(trajs=_trajs(seed=1)), ["generator/sha256"]),
]


@pytest.mark.parametrize("kw,fields", CHANGES, ids=[",".join(c[1]) for c in CHANGES])
def test_resume_with_changed_settings_is_refused_and_lists_the_fields(saved, kw, fields):
    kw = dict(kw)
    pc = _loop(kw.pop("trajs", None), **kw)
    with pytest.raises(ValueError, match="belongs to another run: settings differ") as e:
        pc.check_checkpoint(saved, T, C)
    for f in fields:
        assert f in str(e.value)
    assert "allow_changed=True" in str(e.value) and "--resume-override" in str(e.value)
    with pytest.raises(ValueError, match=fields[0]):
        pc.train(0, T, C, checkpoint_dir=saved, resume=True)
    assert pc.state is None
    # the explicit override accepts the change (and reports it)
    changed = pc.check_checkpoint(saved, T, C, allow_changed=True)
    assert {c.split(" (")[0] for c in changed} >= set(fields)


def test_resume_with_the_same_settings_is_accepted(saved):
    assert _loop().check_checkpoint(saved, T, C) == []


def test_override_resumes_with_the_new_hyperparameters(saved):
    pc = _loop(temperature=3.0, reward_trainer=pf.RewardTrainer(NET, num_members=2, learning_rate=2e-3))
    changed = pc.check_checkpoint(saved, T, C, allow_changed=True)
    assert [c.split(" (")[0] for c in changed] == ["loop/temperature", "reward/learning_rate"]
    pc.train(0, T, C, checkpoint_dir=saved, resume=True, allow_changed=True)
    assert pc.overrides[-1]["round"] == 0 and len(pc.overrides[-1]["changed"]) == 2
    # the settings live in the config, which the resumed run used
    assert float(pc.config.temperature) == 3.0 and float(pc.config.trainer.learning_rate) == pytest.approx(2e-3)


def test_shape_changes_cannot_be_overridden(saved):
    pc = _loop(reward_trainer=pf.RewardTrainer(NET, num_members=3))
    with pytest.raises(ValueError, match="reward/num_members.*change the shapes of the saved state"):
        pc.check_checkpoint(saved, T, C, allow_changed=True)


BAD_FILES = [
    (b"garbage" * 20, "not a jaxweight checkpoint"),
    (b"JAXWCKPT\x01\x00", "truncated"),
    ("flip", "checksum mismatch"),
    ("foreign", "no preference-loop fingerprint"),
]


@pytest.mark.parametrize("content,match", BAD_FILES, ids=["garbage", "truncated", "bitflip", "foreign"])
def test_damaged_or_foreign_checkpoints_raise_state_file_error(saved, content, match):
    path = saved / dr.CHECKPOINT_NAME
    if content == "flip":
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    elif content == "foreign":
        checkpoint.save(path, {"x": np.zeros(2, np.float32)}, metadata={"rounds_done": 1})
    else:
        path.write_bytes(content)
    with pytest.raises(StateFileError, match=match) as e:
        _loop().check_checkpoint(saved, T, C)
    assert str(path) in str(e.value)


# ------------------------------------------------------------------ bad data inside a round
def test_nonfinite_samples_are_counted_and_do_not_poison_the_reward_model():
    trajs = _trajs(n=8)
    trajs = trajs.replace(rews=trajs.rews.at[0, 3].set(jnp.nan), obs=trajs.obs.at[1, 2, 0].set(jnp.inf))
    pc = _loop(trajs, num_iterations=1, eval_episodes=0, transition_oversampling=6.0)  # every round: all episodes
    pc.train(0, 0, 40)
    h = pc.history
    # one NaN reward (1 transition) and one inf observation (the 2 transitions that touch it), every round
    assert [r["n_nonfinite"] for r in h] == [3, 3]
    assert all(0 <= r["n_invalid"] <= r["buffer_size"] for r in h)
    assert all(np.isfinite(r["reward_loss"]) for r in h)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(pc.state.reward.params))
    assert np.isfinite(float(pc.state.reward_shift)) and np.isfinite(float(pc.state.reward_scale))


# ------------------------------------------------------------------ the demo's command line
CLI_CASES = [
    (["--seeds", "0"], "argument --seeds: must be an integer >= 1, got '0'"),
    (["--seeds", "-3"], "argument --seeds: must be an integer >= 1"),
    (["--timesteps", "0"], "argument --timesteps: must be an integer >= 1"),
    (["--timesteps", "-5"], "argument --timesteps"),
    (["--comparisons", "abc"], "argument --comparisons: must be an integer, got 'abc'"),
    (["--rounds", "0"], "argument --rounds"),
    (["--fragment-length", "0"], "argument --fragment-length"),
    (["--members", "1"], "argument --members: must be an integer >= 2"),
    (["--reward-lr", "-1"], "argument --reward-lr: must be a number > 0.0"),
    (["--agent-lr", "nan"], "argument --agent-lr: must be a finite number"),
    (["--seed", "-1"], "argument --seed"),
    (["--resume-override"], "--resume-override needs --resume"),
]
# (a bad --env is one line and exit 2 from the demo itself, not from argparse: test_demo_preferences_ids.py)


@pytest.mark.parametrize("argv,match", CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_cli_bad_flags_exit_2_with_one_line(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and match in errors[0], err
    assert "Traceback" not in err


def test_cli_settings_the_loop_refuses_exit_2_with_one_line(tmp_path, capsys):
    assert demo.main(["--quick", "--fragment-length", "600", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fragment_length 600 is longer than the generator's episodes" in err


@pytest.mark.parametrize("content", [b"garbage", b"JAXWCKPT"], ids=["garbage", "truncated"])
def test_cli_resume_of_a_damaged_checkpoint_exits_2_with_one_line(tmp_path, capsys, content):
    ck = tmp_path / "checkpoints" / "cartpole_quick"
    ck.mkdir(parents=True)
    (ck / dr.CHECKPOINT_NAME).write_bytes(content)
    assert demo.main(["--quick", "--resume", "--out", str(tmp_path), "--no-progress"]) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and str(ck / dr.CHECKPOINT_NAME) in cap.err and "Traceback" not in cap.err


ENV_CHANGES = [
    (lambda env, p: AgentGenerator(env, p.replace(gravity=10.0)), ["generator/env_params"]),
    (lambda env, p: AgentGenerator(*make_env("cartpole", horizon=25)), ["generator/env", "generator/horizon"]),
    (lambda env, p: AgentGenerator(*make_env("pendulum", horizon=20)), ["generator/env", "generator/env_params"]),
    (lambda env, p: AgentGenerator(env, p, exploration_frac=0.5), ["generator/exploration_frac"]),
    (lambda env, p: AgentGenerator(env, p, hparams=PPOHParams.create(learning_rate=1e-4)),
     ["generator/ppo/learning_rate"]),
]


@pytest.mark.parametrize("change,fields", ENV_CHANGES, ids=[",".join(c[1]) for c in ENV_CHANGES])
def test_resume_fingerprint_covers_every_environment_and_agent_setting(change, fields):
    """The environment (its name, parameters and horizon) and the agent's settings change results: a
    checkpoint of one refuses a resume with another, listing the fields."""
    env, params = make_env("cartpole", horizon=20)

    def pc(gen, **kw):
        net = reward_net(gen.base_env, hidden_sizes=(4,))
        return dr.PreferenceComparisons(gen, net, 1, fragment_length=5, initial_epoch_multiplier=1.0,
                                        reward_trainer=pf.RewardTrainer(net, num_members=2), **kw)

    old = pc(AgentGenerator(env, params))
    plan = old.plan(200, 20)
    diff = [d.split(" (")[0] for d in dr._fingerprint_diff(old.fingerprint(plan), pc(change(env, params)).fingerprint(plan))]
    assert set(fields) <= set(diff), diff
    # the teacher's settings too (temperature, discount, threshold, sampling)
    same = pc(AgentGenerator(env, params), temperature=0.5, sample=False)
    diff = [d.split(" (")[0] for d in dr._fingerprint_diff(old.fingerprint(plan), same.fingerprint(plan))]
    assert diff == ["loop/sample", "loop/temperature"]
