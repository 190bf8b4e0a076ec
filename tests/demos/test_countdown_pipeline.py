"""``demo lm --task countdown``: the vmapped arms, the evaluation metrics, a tiny end-to-end run.

The regression (statsmodels, the ``stats`` extra) is tested in test_countdown_stats.py.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight.demos import lm
from jaxweight.demos.lm import _countdown as D
from jaxweight.demos.lm import _countdown_pipeline as P
from jaxweight.demos.lm import _countdown_task as C

TINY = dataclasses.replace(P.QUICK, arms=("drgrpo", "xdr_tau0.05"), n_train=16, n_eval=8, sft_steps=2, sft_batch=8,
                           d_model=16, d_ff=32, prompts=2, generations=4, train_seeds=1, eval_seeds=2, eval_samples=8,
                           steps=2, chunk=2)


@pytest.fixture(scope="module")
def tiny():
    task = P.make_task(TINY)
    pipe = P.make_pipeline(TINY, task)
    params, _ = P.warm_start(TINY, task, jax.random.split(jax.random.key(0), TINY.train_seeds))
    return task, pipe, params


def _rows(tree, rows):
    return jax.tree.map(lambda x: x[np.asarray(rows)], tree)


def _close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=2e-5, atol=2e-6)


@pytest.mark.fast
def test_arms_are_array_leaves_of_one_program():
    binary = tuple(n for n in P.ARMS if not P.ARM_SETTINGS[n].graded)
    a = P.arm_params(dataclasses.replace(TINY, arms=binary, train_seeds=2))
    assert a.tau.shape == a.xdr.shape == (2 * len(binary),)
    names = np.repeat(binary, 2)
    np.testing.assert_array_equal(np.asarray(a.xdr), [n.startswith("xdr") for n in names])
    np.testing.assert_allclose(np.asarray(a.tau)[names == "xdr_tau0.05"], 0.05)
    np.testing.assert_array_equal(np.asarray(a.seed), names == "seed_drgrpo")
    np.testing.assert_allclose(np.asarray(a.entropy_coef), np.where(names == "entropy_bonus", TINY.entropy_coef, 0))
    np.testing.assert_array_equal(np.asarray(a.positive), names == "positive_class")
    np.testing.assert_array_equal(np.asarray(a.maxent), names == "maxent_step")
    np.testing.assert_allclose(np.asarray(a.lr_scale), np.select([names == "drgrpo_lr2x", names == "drgrpo_lr4x"],
                                                                 [2.0, 4.0], 1.0))
    with pytest.raises(ValueError, match="arms"):
        dataclasses.replace(TINY, arms=("drgrpo", "nope"))
    with pytest.raises(ValueError, match="graded"):
        dataclasses.replace(TINY, arms=("drgrpo", "drgrpo_graded"))
    assert dataclasses.replace(TINY, arms=("drgrpo_graded", "xdr_tau0.05_graded")).graded and not TINY.graded


@pytest.mark.fast
def test_positive_class_weights_train_each_correct_completion_with_g_minus_k_over_k():
    from jaxweight import maxent as M

    r = jnp.asarray([[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [1.0] * 7 + [0.0], [0.0] * 8])
    w = M.positive_class_weights(r)
    np.testing.assert_array_equal(np.asarray(w), np.asarray(M.candidate_weights(r, tau=0.0)))
    # the loss's aggregation multipliers n w / sum w times Dr.GRPO's advantage r - mean(r)
    k = np.asarray(r).sum(-1, keepdims=True)
    mult = np.where(np.asarray(w) > 0, 8 * np.asarray(w), 0.0)
    signal = mult * (np.asarray(r) - k / 8)
    np.testing.assert_allclose(signal[:2], np.where(np.asarray(r)[:2] > 0, (8 - k[:2]) / k[:2], 0.0), rtol=1e-6)
    np.testing.assert_allclose(signal[2], 0.0)


@pytest.mark.fast
def test_graded_reward_on_device_equals_the_host_rule():
    texts = ["(12-7)*5", "12+7+5", "12*7*5", "5+7", "12/(7-7)+5", "5*7-12", "((5", "12-7-5"]
    nums, target = (5, 7, 12), 25
    tok = jnp.asarray(C.encode_completions(texts))[None]
    dev = np.asarray(C.device_graded_reward(tok, jnp.asarray([nums]), jnp.asarray([target])))[0]
    host = np.asarray([C.graded_reward(t, nums, target) for t in texts])
    np.testing.assert_allclose(dev, host, rtol=1e-6, atol=1e-7)
    corr, _ = C.device_verify(tok, jnp.asarray([nums]), jnp.asarray([target]))
    np.testing.assert_array_equal(dev == 1.0, np.asarray(corr)[0] == 1.0)
    assert host.tolist()[:4] == [1.0, 0.48, 0.0, 0.0]      # 420 misses by more than the target; 5+7 leaves 12 out
    assert 0 < host[5] <= C.GRADED_CREDIT and host[4] == 0.0


@pytest.mark.fast
def test_class_mean_weights_keep_class_totals_and_spread_them_uniformly():
    w = jnp.asarray([[0.5, 0.3, 0.15, 0.05], [0.9, 0.05, 0.03, 0.02], [0.25, 0.25, 0.25, 0.25]])
    r = jnp.asarray([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    c = np.asarray(P.class_mean_weights(w, r))
    np.testing.assert_allclose(c[0], [0.4, 0.4, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(c[1], [0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3], rtol=1e-6)   # a lone correct one keeps its weight
    np.testing.assert_allclose(c[2], 0.25, rtol=1e-6)
    for i in range(3):                                                  # each class keeps its total weight
        for v in (0.0, 1.0):
            np.testing.assert_allclose(c[i][np.asarray(r[i]) == v].sum(), np.asarray(w[i])[np.asarray(r[i]) == v].sum(),
                                       rtol=1e-6, atol=1e-7)
    a = P.arm_params(dataclasses.replace(TINY, arms=P.DEFAULT_ARMS, train_seeds=2))
    np.testing.assert_array_equal(np.asarray(a.classmean), [False, False, False, False, True, True])
    np.testing.assert_allclose(np.asarray(a.tau)[4:], 0.05)


def test_arms_of_a_training_seed_share_the_sampling_keys(tiny):
    """Paired runs: run (arm i, seed s) and (arm j, seed s) start from the same warm start and key."""
    task, _, params = tiny
    cfg = dataclasses.replace(TINY, arms=P.DEFAULT_ARMS, train_seeds=2)
    pipe = P.make_pipeline(cfg, task)
    state = pipe.init(jax.tree.map(lambda x: jnp.concatenate([x, x + 1.0]), params), jax.random.key(0))
    keys = np.asarray(jax.random.key_data(state.key))
    s = cfg.train_seeds
    for arm in range(1, len(cfg.arms)):
        np.testing.assert_array_equal(keys[arm * s:(arm + 1) * s], keys[:s])
    assert not np.array_equal(keys[0], keys[1])
    leaf = jax.tree.leaves(state.params)[0]
    np.testing.assert_array_equal(np.asarray(leaf[2]), np.asarray(leaf[0]))
    assert not np.array_equal(np.asarray(leaf[1]), np.asarray(leaf[0]))


@pytest.mark.fast
def test_paper_pool_is_the_default_and_full_stays_an_option():
    paper = C.candidates()
    assert len(paper) == 787 and paper.target.max() <= 36
    assert not np.any(paper.numbers == paper.target[:, None])
    full = C.candidates(**C.POOLS["full"])
    assert len(full) == 1015 and set(paper.keys) < set(full.keys)
    task = P.make_task(dataclasses.replace(TINY, pool="paper"))
    assert set(task.train.keys) <= set(paper.keys) and (task.sft.n_modes == 1).all() and task.sft.target.max() <= 36
    with pytest.raises(ValueError, match="pool"):
        dataclasses.replace(TINY, pool="nope")
    with pytest.raises(ValueError, match="number_targets"):
        C.candidates(number_targets="yes")


@pytest.mark.slow
def test_vmapped_arms_equal_each_arm_alone_and_huge_tau_is_drgrpo(tiny):
    """The R-run program gives each run what it gives that run alone (R = 1, same compiled program for
    both arms: only array leaves differ), and xDr.GRPO at tau = 1e9 is Dr.GRPO."""
    _, pipe, params = tiny
    state = pipe.init(params, jax.random.key(1))
    # both runs draw the same prompts and completions: the arms' losses differ, not their data
    state = state.replace(key=jnp.stack([state.key[0]] * 2))
    f = pipe.fns.chunk_jit
    both, m_both = pipe.chunk(jax.tree.map(jnp.copy, state), 2)
    for r in range(2):
        alone, m_alone = f(_rows(state, [r]), _rows(pipe.arms, [r]), pipe.train, 2)
        _close(_rows((both.params, both.opt), [r]), (alone.params, alone.opt))
        _close({k: v[:, r:r + 1] for k, v in m_both.items()}, m_alone)
    huge = pipe.arms.replace(tau=jnp.asarray([0.0, 1e9], jnp.float32))
    out, m = pipe.chunk(jax.tree.map(jnp.copy, state), 2, arms=huge)
    _close(_rows(out.params, [0]), _rows(out.params, [1]))
    np.testing.assert_allclose(m["effective_candidates"][:, 0], m["effective_candidates"][:, 1], rtol=1e-5)


@pytest.mark.slow
def test_xdr_weights_move_the_update_where_rewards_differ(tiny):
    """With a group holding right and wrong answers, tau = 0.05 and Dr.GRPO take different steps."""
    task, pipe, params = tiny
    # a warm start that writes the first train problem's solution: its groups are informative
    sol = jnp.asarray(task.train.solutions[:1, 0])
    from jaxweight.demos.lm._pipeline import sft_program
    p1, _ = sft_program(pipe.model, 60, 8, 3e-3)(jax.random.split(jax.random.key(3), 1), jnp.asarray(
        task.train.prompts[:1]), sol)
    data = jax.tree.map(lambda x: jnp.repeat(x[:1], x.shape[0], 0), pipe.train)      # only that problem
    state = pipe.init(p1, jax.random.key(4))
    state = state.replace(key=jnp.stack([state.key[0]] * 2))
    out, m = pipe.chunk(state, 2, data=data)
    assert float(np.max(m["informative_groups"])) > 0, "the probe needs a group with right and wrong answers"
    d = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
        jax.tree.leaves(_rows(out.params, [0])), jax.tree.leaves(_rows(out.params, [1]))))
    assert d > 1e-6
    assert np.all(np.isfinite(np.asarray(m["loss"])))
    # xDr.GRPO at tau = 0.05 puts (almost) no mass on wrong answers; Dr.GRPO's uniform weights do
    inf = np.asarray(m["informative_groups"]) > 0
    assert np.all(np.asarray(m["incorrect_mass"])[:, 1][inf[:, 1]] < 0.05)
    assert np.all(np.asarray(m["incorrect_mass"])[:, 0][inf[:, 0]] > 0.05)


@pytest.mark.slow
def test_evaluating_the_warm_starts_once_equals_their_tiled_rows(tiny):
    """The evaluation keys are the same for every run: the [S] warm-start models evaluated alone give
    the rows of the runs they start."""
    _, pipe, params = tiny
    alone, tiled = pipe.evaluate(params, jax.random.key(5)), pipe.evaluate(pipe.per_run(params), jax.random.key(5))
    for k in P.METRICS:
        np.testing.assert_array_equal(alone[k], tiled[k][: TINY.train_seeds])
        np.testing.assert_array_equal(tiled[k][0], tiled[k][TINY.train_seeds])


@pytest.mark.slow
def test_eval_metrics_on_a_hand_built_case():
    probs = C.candidates()
    i = probs.keys.index("2,3,4=24")           # modes: 2*(3*4), 3*(2*4), 4*(2*3)
    j = probs.keys.index("2,3,4=10")           # modes: 2*3+4 and 3*4-2 (and their orderings)
    sub = probs.take([i, j])
    data = P._data(sub)
    texts_i = ["2*3*4", "4*(3*2)", "2*(3*4)", "2*3*4", "24", "2+3+4", "((", "2*4*3"]
    texts_j = ["2+3+4", "9", "2*3*4", "4/2", "3+4+2", "1+9", "2*5", "4+2*3"]
    tok = jnp.asarray(np.stack([C.encode_completions(texts_i), C.encode_completions(texts_j)]))
    samples = jnp.stack([tok, tok.at[0].set(tok[1, 0])])                         # E = 2 seeds
    greedy = jnp.asarray(C.encode_completions(["4*(2*3)", "2+3+4"]))
    out = jax.device_get(P.eval_metrics(samples, greedy, data))
    # host reference: reward / mode_id of each text
    ri = [C.reward(t, (2, 3, 4), 24) for t in texts_i]
    modes_i = {C.mode_id(t, (2, 3, 4), 24) for t in texts_i} - {-1}
    assert sum(ri) == 5 and len(modes_i) == 3 and sub.n_modes[0] == 3
    rj = [C.reward(t, (2, 3, 4), 10) for t in texts_j]
    assert sum(rj) == 1
    np.testing.assert_allclose(out["mean_at_8"][0], [5 / 8, 1 / 8])
    np.testing.assert_allclose(out["pass_at_8"][0], [1.0, 1.0])
    np.testing.assert_allclose(out["distinct_at_8"][0], [3.0, 1.0])            # "4+2*3" is the mode 2*3+4
    np.testing.assert_allclose(out["coverage_at_8"][0], [1.0, 1.0 / sub.n_modes[1]])
    np.testing.assert_allclose(out["pass_at_1"], [[1.0, 0.0]] * 2)
    # seed 1: prompt 0's samples are all wrong -> pass@8 = coverage = 0
    np.testing.assert_allclose(out["pass_at_8"][1], [0.0, 1.0])
    np.testing.assert_allclose(out["coverage_at_8"][1][0], 0.0)


@pytest.mark.slow
def test_tiny_run_writes_finite_results(tmp_path):
    """Smoke test (with a few properties): the whole demo at tiny size."""
    res = D.run(TINY, seed=0, out=tmp_path)
    res.pop("_state")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["arms"]) == set(TINY.arms)
    for a, r in saved["arms"].items():
        for k in P.METRICS:
            assert 0.0 <= r[k] <= (C.MAX_MODES if k == "distinct_at_8" else 1.0)
            assert len(r["per_seed"][k]) == TINY.train_seeds
            assert np.array_equal(np.shape(r["per_seed_pair"][k]), (TINY.train_seeds, TINY.eval_seeds))
        assert r["coverage_at_8"] <= r["pass_at_8"] + 1e-9
        assert all(np.isfinite(v).all() for k, v in r["trace"].items())
        assert len(r["trace"]["steps"]) > 0
        assert r["wall_seconds"] == saved["wall_seconds"]   # one program runs every arm
    assert saved["wall_seconds"] > 0 and saved["rollouts_per_run"] == TINY.steps * TINY.prompts * TINY.generations
    assert saved["warm_start"]["base_policy"]["train"]["mean_at_8"] >= 0


def test_cli_task_flag_dispatches_and_rejects_bad_arms(capsys):
    with pytest.raises(SystemExit) as e:
        lm.main(["--task", "countdown", "--arms", "drgrpo,bogus"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        lm.main(["--task", "chess"])
    assert e.value.code == 2
