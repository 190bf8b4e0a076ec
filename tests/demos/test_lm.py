"""``demo lm``: task, device reward / clusters vs the host path, sampling, quick run, resume, devices."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import maxent as M
from jaxweight.demos import _lm_model as LMM
from jaxweight.demos import _lm_task as T
from jaxweight.demos import lm


# ------------------------------------------------------------------ task
def test_pool_distinct_keys_levels_and_heldout():
    pool = T.make_pool(4096, seed=3)
    assert len(set(pool.keys)) == len(pool) == 4096
    assert set(np.unique(pool.level)) == {0, 1, 2, 3}
    np.testing.assert_array_equal(pool.answer, np.where(pool.op == 0, pool.a + pool.b, pool.a - pool.b))
    assert (pool.answer >= 0).all()
    held = T.make_heldout(16, pool, seed=4)
    assert np.bincount(held.level).tolist() == [16, 16, 16, 16]
    inside = set(pool.keys)
    assert not any(k in inside for k, lv in zip(held.keys, held.level) if lv >= 2)
    # prompts end with "=" at the same position; the target is the reversed answer + EOS
    assert (pool.prompts[:, -1] == T.VOCAB.index("=")).all()
    i = 5
    text = T.render_completion(pool.targets[i])
    assert T.answer_from_text(text) == str(pool.answer[i])
    assert M.extract_answer(text) == str(pool.answer[i])[::-1]
    # the curriculum's string key index of the pool
    task = lm.make_task(lm.QUICK)
    assert task.keys.ids([task.pool.keys[7]])[0] == 7


def _completions(rng, targets, g):
    """Random completions per prompt: the target, copies of one wrong answer, garbage, no EOS."""
    p, L = targets.shape
    out = np.zeros((p, g, L), np.int32)
    for i in range(p):
        wrong = targets[i].copy()
        wrong[0] = 1 + (wrong[0] % 10)  # another digit
        for j in range(g):
            kind = rng.integers(0, 4)
            if kind == 0:
                c = targets[i]
            elif kind == 1:
                c = wrong
            elif kind == 2:  # no EOS at all
                c = rng.integers(1, 11, L)
            else:  # short answer
                n = rng.integers(0, L)
                c = np.r_[rng.integers(1, 11, n), T.EOS, np.zeros(L - n - 1, int)]
            out[i, j] = c
    return out


def test_device_reward_and_clusters_equal_host_extract_answer():
    rng = np.random.default_rng(0)
    pool = T.make_pool(512, seed=1)
    idx = rng.choice(len(pool), 24, replace=False)
    targets = pool.targets[idx]
    comp = _completions(rng, targets, 8)
    dev_r = np.asarray(lm.device_rewards(jnp.asarray(comp), jnp.asarray(targets)))
    host_r = T.host_rewards(comp, pool.answer[idx])
    np.testing.assert_array_equal(dev_r, host_r)
    assert 0 < host_r.mean() < 1
    dev_c = np.asarray(lm.device_cluster_ids(jnp.asarray(comp)))
    np.testing.assert_array_equal(dev_c, T.host_cluster_ids(comp))


def test_sampling_logp_matches_teacher_forcing():
    model = LMM.TinyLM(d_model=32, n_layers=1, n_heads=2, d_ff=64)
    params = model.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))
    prompts = jnp.asarray(T.make_pool(64, seed=2).prompts[:16])
    s = LMM.sample(model, params, prompts, jax.random.key(1), T.COMPLETION_LEN, 1.0)
    lp = LMM.sequence_logp(model, params, prompts, s.tokens)
    np.testing.assert_allclose(np.where(s.mask, lp, 0.0), s.logp, atol=1e-4)
    np.testing.assert_array_equal(s.mask, LMM.completion_mask(s.tokens))
    assert not np.any(np.asarray(s.tokens)[np.asarray(s.mask)] == T.PAD)  # the policy never emits PAD


# ------------------------------------------------------------------ runs
def _strip(res):
    return {k: v for k, v in res.items() if k not in ("_state", "wall_seconds", "train_seconds",
                                                     "compile_seconds", "warm_start_seconds",
                                                     "seconds_per_step", "tokens_per_second")}


@pytest.fixture(scope="module")
def quick_run():
    return lm.run(quick=True)


def test_quick_run_outputs(quick_run):
    res = quick_run
    assert res["finished"] and res["steps"] == lm.QUICK.steps
    for a in lm.ARMS:
        arm = res["arms"][a]
        for k in ("heldout_accuracy_start", "heldout_accuracy_final"):
            assert 0.0 <= arm[k]["overall"] <= 1.0
            assert len(arm[k]["per_level"]) == T.N_LEVELS and len(arm[k]["per_seed"]) == lm.QUICK.seeds
        tr = arm["trace"]
        assert all(np.isfinite(tr[k]).all() for k in ("reward", "kl", "tau", "beta", "weight_entropy"))
    # the GRPO arms run with the controllers switched off
    assert res["arms"]["grpo_uniform"]["trace"]["tau"][-1] == pytest.approx(lm.QUICK.tau0)
    assert res["tokens_per_second"] > 0
    # the actor lags the learner by at most sync_interval - 1 steps
    assert max(res["arms"]["full"]["trace"]["staleness"]) <= lm.QUICK.sync_interval - 1


def test_resume_gives_the_same_numbers(quick_run, tmp_path):
    path = tmp_path / "ck.jwc"
    part = lm.run(quick=True, checkpoint=path, stop_after_chunks=1)
    assert not part["finished"] and path.exists()
    resumed = lm.run(quick=True, checkpoint=path, resume=True)
    assert resumed["finished"]
    assert _strip(resumed) == _strip(quick_run)
    a, b = jax.tree.leaves(resumed["_state"]), jax.tree.leaves(quick_run["_state"])
    for x, y in zip(a, b):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.multidevice
def test_learner_and_actor_on_different_devices_equal_single_device(quick_run, devices8):
    res = lm.run(quick=True, devices=(devices8[:4], devices8[4:]))
    st = res["_state"]
    learner_devs = {d for x in jax.tree.leaves(st.runs.learner) for d in x.devices()}
    actor_devs = {d for x in jax.tree.leaves(st.actor) for d in x.devices()}
    assert learner_devs == set(devices8[:4]) and actor_devs == set(devices8[4:])
    a, b = _strip(res), _strip(quick_run)
    # The two paths compile different programs (three phases sharded over device groups vs one
    # vmapped step), so logits agree to float rounding only. Sampling is discrete: once a nearly
    # tied token flips, the runs diverge. So: every held-out evaluation (greedy) is equal, and the
    # first chunk's per-step metrics agree to rounding; later chunks may differ by a flipped token.
    for arm in lm.ARMS:
        ca, cb = a["arms"][arm]["heldout_curve"], b["arms"][arm]["heldout_curve"]
        assert ca["steps"] == cb["steps"] and len(ca["steps"]) >= 3
        assert ca["per_level"] == cb["per_level"], arm
        for k in ("heldout_accuracy_start", "heldout_accuracy_final"):
            assert a["arms"][arm][k] == b["arms"][arm][k]
        for k, v in b["arms"][arm]["trace"].items():
            np.testing.assert_allclose(a["arms"][arm]["trace"][k][:1], v[:1], rtol=2e-4, atol=2e-5, err_msg=k)


def test_cli_quick_writes_outputs(tmp_path, capsys):
    rc = lm.main(["--quick", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    for k in ("wall_seconds", "tokens_per_second", "arms"):
        assert k in res
    assert set(res["arms"]["full"]["heldout_accuracy_final"]) >= {"overall", "per_level", "per_seed"}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= lm.QUICK.steps
    assert (tmp_path / "checkpoint.jwc").exists()
    out = capsys.readouterr().out
    assert "full" in out and "grpo_uniform" in out


@pytest.mark.parametrize("argv, fragment", [
    (["--steps", "0"], "--steps"),
    (["--arms", "full,nope"], "--arms"),
    (["--generations", "1"], "--generations"),
    (["--replay", "1.5"], "--replay"),
])
def test_cli_rejects_bad_flags(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        lm.main(argv + ["--quick"])
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_config_validation():
    with pytest.raises(ValueError, match="generations must be >= 2"):
        dataclasses.replace(lm.QUICK, generations=1)
    with pytest.raises(ValueError, match="arms must be"):
        dataclasses.replace(lm.QUICK, arms=("bogus",))
