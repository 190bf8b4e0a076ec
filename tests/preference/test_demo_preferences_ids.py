"""The ``preferences`` demo on environment ids: generic settings for any gymnax id, a tiny run end to end,
and one clear error for a bad id (brax ids are tested in tests/rl/test_brax.py, brax's CI step)."""

import json

import numpy as np
import pytest

from jaxweight.demos import preferences as demo


def test_gymnax_ids_get_settings_by_action_space():
    # discrete: the cartpole PPO settings; a reward paid on arrival (Acrobot's 0 at the goal step) needs the
    # next state in the reward model
    a = demo.settings("gymnax:Acrobot-v1")
    c = demo.settings("cartpole")
    assert (a.ppo_envs, a.ppo_steps, a.learning_rate, a.gamma) == (c.ppo_envs, c.ppo_steps, c.learning_rate, c.gamma)
    assert a.use_next_state and not a.use_action and not a.normalize_observations and a.reward_scaling == 1.0
    # continuous: the pendulum ones; MountainCarContinuous pays an action cost, so the reward model sees actions
    m = demo.settings("gymnax:MountainCarContinuous-v0", quick=True)
    p = demo.settings("pendulum")
    assert (m.ppo_envs, m.ppo_epochs, m.gamma) == (p.ppo_envs, p.ppo_epochs, p.gamma)
    assert m.use_next_state and m.use_action and m.total_timesteps < demo.settings(
        "gymnax:MountainCarContinuous-v0").total_timesteps
    # the built-ins are what they were: state-only reward model, no normalisation (their runs are unchanged)
    assert not (c.use_next_state or c.use_action or c.normalize_observations) and c.horizon is None
    pc = demo.build(demo.settings("gymnax:Acrobot-v1", quick=True, horizon=60, fragment_length=10))
    assert pc.generator.horizon == 60 and pc.generator.base_env.env_id == "gymnax:Acrobot-v1"
    assert pc.reward_module.net.use_next_state and not pc.reward_module.net.use_action
    assert demo.file_tag("gymnax:Acrobot-v1", quick=True) == "gymnax-Acrobot-v1_quick"
    assert demo.file_tag("cartpole") == "cartpole"


@pytest.mark.parametrize(("argv", "match"), [
    (["--env", "gymnax:Acrobot-v2"], r"error: argument --env: unknown gymnax environment 'Acrobot-v2' in "
                                     r"'gymnax:Acrobot-v2'; did you mean 'Acrobot-v1'\?"),
    (["--env", "acrobot"], r"error: argument --env: must be 'cartpole', 'pendulum', 'gymnax:<id>' or "
                           r"'brax:<name>', got 'acrobot'"),
    (["--env", "mars"], r"error: argument --env: must be .* got 'mars'"),
    (["--env", "gymnax:"], r"error: argument --env: unknown gymnax environment ''"),
])
def test_bad_env_ids_are_one_line_naming_env_and_exit_2(argv, match, capsys):
    """A bad ``--env`` is one line that names the flag (as argparse did when the ids were a fixed list)."""
    import re

    try:
        rc = demo.main(argv + ["--no-progress"])
    except SystemExit as e:  # refused by the command line before jax is needed (a form no family has)
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(match, err), err
    with pytest.raises(demo.EnvIdError):  # the library call keeps its ValueError
        demo.settings(argv[1])


@pytest.mark.fast
def test_tiny_run_on_a_gymnax_id(tmp_path):
    """``--env gymnax:Acrobot-v1`` end to end at tiny sizes: the results file has the cartpole file's layout
    (settings.env, final.return, baseline_return) and the numbers are sane. About 45 s of CPU, nearly all of it
    compiling the loop's programs, the held-out evaluation and the random policy."""
    res = demo.run("gymnax:Acrobot-v1", quick=True, seeds=1, out=tmp_path, progress=False, baseline=False,
                   log=lambda *_: None, horizon=40, total_timesteps=2_048, total_comparisons=60, num_iterations=1,
                   fragment_length=8, heldout_steps=200, heldout_pairs=100, final_episodes=2, eval_episodes=2)
    saved = json.loads((tmp_path / "gymnax-Acrobot-v1_quick.json").read_text())
    assert saved["settings"]["env"] == "gymnax:Acrobot-v1" and saved["settings"]["horizon"] == 40
    ret = np.asarray(saved["final"]["return"])
    # Acrobot pays -1 a step until the goal, then 0 (absorbing): a return in [-40, 0]
    assert ret.shape == (1,) and -40.0 <= ret[0] <= 0.0
    assert "baseline_return" in saved  # None: no baseline asked for (it costs one more compiled program)
    assert len(saved["history"]) == 2 and saved["history"][-1]["buffer_size"][0] == 60
    assert (tmp_path / "checkpoints" / "gymnax-Acrobot-v1_quick").is_dir()
    assert np.asarray(saved["random_return"]).shape == (1,) and -40.0 <= saved["random_return"][0] <= 0.0
    assert "held-out acc" in demo.report(res)
    # the JSON says where it came from: command, commit (this checkout's HEAD, or None outside git), machine
    assert saved["command"] and "CPUs" in saved["machine"]
    assert saved["commit"] is None or len(saved["commit"].split()[0]) == 40
    fake = {"final": {"return": [30.0]}, "baseline_return": [50.0], "random_return": [10.0]}
    np.testing.assert_allclose(demo.normalised_score(fake), [0.5])


def test_agent_sac_settings_build_and_errors():
    """``--agent sac``: SAC's settings over the id's, a SACGenerator in the loop, its own file tag; refused on
    discrete actions, on the built-in envs and as an unknown name, one clear error each."""
    from jaxweight.preference.generators import SACGenerator

    s = demo.settings("gymnax:MountainCarContinuous-v0", agent="sac")
    assert s.agent == "sac" and s.total_timesteps == demo.SAC_SETTINGS["total_timesteps"]
    assert (s.learning_rate, s.gamma, s.sac_batch) == (3e-4, 0.99, 256) and s.use_action  # the id's reward inputs
    assert demo.settings("gymnax:MountainCarContinuous-v0", quick=True, agent="sac").total_timesteps == 10_000
    pc = demo.build(demo.settings("gymnax:MountainCarContinuous-v0", agent="sac", sac_buffer=4_096, horizon=50))
    gen = pc.generator
    assert isinstance(gen, SACGenerator) and gen.reward_apply is not None
    assert (gen.config.buffer_size, gen.config.num_envs, gen.config.updates_per_step) == (4_096, 16, 16)
    assert float(pc.config_for(1_000, 100).agent_hparams.gamma) == np.float32(0.99)
    assert demo.file_tag("brax:halfcheetah", agent="sac") == "brax-halfcheetah_sac"
    assert demo.file_tag("brax:halfcheetah", True, "sac") == "brax-halfcheetah_sac_quick"
    assert demo.settings("gymnax:MountainCarContinuous-v0").agent == "ppo"  # PPO stays the default
    with pytest.raises(ValueError, match="agent 'sac' needs continuous actions; gymnax:Acrobot-v1 has 3"):
        demo.settings("gymnax:Acrobot-v1", agent="sac")
    with pytest.raises(ValueError, match="not the built-in 'pendulum'"):
        demo.settings("pendulum", agent="sac")
    with pytest.raises(ValueError, match=r"agent must be one of \['ppo', 'sac'\], got 'td3'"):
        demo.settings("gymnax:Pendulum-v1", agent="td3")


def test_agent_flag_is_checked_by_argparse(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["--agent", "td3", "--no-progress"])
    assert e.value.code == 2 and "argument --agent: invalid choice: 'td3'" in capsys.readouterr().err
    assert demo.main(["--env", "gymnax:Acrobot-v1", "--agent", "sac", "--no-progress"]) == 2
    assert "agent 'sac' needs continuous actions" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_sac_run_on_a_gymnax_id(tmp_path, monkeypatch):
    """``--agent sac`` end to end at tiny sizes: the results file says which agent and the returns are
    Pendulum's (in [-16.3 H, 0]); a report with a baseline names SAC's. A commit made while the run
    runs is recorded apart: ``commit`` is the code the run started with."""
    from jaxweight.demos import _common as C

    real, commits = C.provenance, iter(["aaa111", "bbb222"])
    monkeypatch.setattr(C, "provenance", lambda: dict(real(), commit=next(commits)))
    res = demo.run("gymnax:Pendulum-v1", quick=True, seeds=1, out=tmp_path, progress=False, baseline=False,
                   log=lambda *_: None, agent="sac", horizon=20, total_timesteps=640, total_comparisons=40,
                   num_iterations=1, fragment_length=5, heldout_steps=100, heldout_pairs=50, final_episodes=2,
                   eval_episodes=2, sac_buffer=1_024, sac_learning_starts=64, sac_hidden=(16, 16))
    saved = json.loads((tmp_path / "gymnax-Pendulum-v1_sac_quick.json").read_text())
    assert saved["settings"]["agent"] == "sac" and saved["settings"]["sac_hidden"] == [16, 16]
    assert (saved["commit"], saved["commit_at_end"]) == ("aaa111", "bbb222")
    for r in (saved["final"]["return"][0], saved["random_return"][0]):
        assert -16.3 * 20 <= r <= 0.0
    text = demo.report(dict(res, baseline_return=np.array([-50.0])))
    assert "SAC on true r" in text and "(SAC on true r - random)" in text
