"""The ``preferences`` demo on environment ids: generic settings for any gymnax id, a tiny run end to end,
and one clear error for a bad id (brax ids are tested in tests/preference/test_brax.py, brax's CI step)."""

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
    (["--env", "gymnax:Acrobot-v2"], r"unknown gymnax environment 'Acrobot-v2' in 'gymnax:Acrobot-v2'; "
                                     r"did you mean 'Acrobot-v1'\?"),
    (["--env", "acrobot"], r"env must be 'cartpole', 'pendulum', 'gymnax:<id>' or 'brax:<name>', got 'acrobot'"),
])
def test_bad_env_ids_are_one_line_and_exit_2(argv, match, capsys):
    import re

    assert demo.main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(match, err), err


@pytest.mark.slow
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
