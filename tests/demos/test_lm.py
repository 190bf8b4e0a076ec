"""``demo lm``: task, device reward / clusters vs the host path, sampling, quick run, resume, devices."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import maxent as M
from jaxweight.demos import lm
from jaxweight.demos.lm import _model as LMM
from jaxweight.demos.lm import _task as T


# ------------------------------------------------------------------ task
def test_pool_distinct_keys_levels_and_splits():
    pool = T.make_pool(4096, seed=3)
    assert len(set(pool.keys)) == len(pool) == 4096
    assert set(np.unique(pool.level)) == {0, 1, 2, 3}
    np.testing.assert_array_equal(pool.answer, np.where(pool.op == 0, pool.a + pool.b, pool.a - pool.b))
    assert (pool.answer >= 0).all()
    assert (T.split_of(pool.a, pool.b, pool.op) == 0).all()                 # the pool is train problems only
    # prompts end with "=" at the same position; the target is the reversed answer + EOS
    assert (pool.prompts[:, -1] == T.VOCAB.index("=")).all()
    i = 5
    text = T.render_completion(pool.targets[i])
    assert T.answer_from_text(text) == str(pool.answer[i])
    assert M.extract_answer(text) == str(pool.answer[i])[::-1]
    # buckets: level x op x min(carries, 2)
    bk = T.bucket_of(pool.level, pool.op, pool.carries)
    np.testing.assert_array_equal(bk // 6, pool.level)
    assert T.bucket_name(int(bk[i])).startswith(f"{pool.level[i] + 1}d{'+-'[pool.op[i]]}")


def test_heldout_and_validation_disjoint_from_pool_and_warm_start_at_every_level():
    task = lm.make_task(lm.QUICK)
    train = set(task.pool.keys) | set(task.sft.keys)
    held, val = task.evals["heldout"], task.evals["validation"]
    assert not set(held.keys) & train and not set(val.keys) & train and not set(held.keys) & set(val.keys)
    assert set(task.sft.keys) <= set(task.pool.keys) and set(task.evals["inpool"].keys) <= set(task.pool.keys)
    for s in (held, val):
        n = np.bincount(s.level, minlength=T.N_LEVELS)
        assert 0 < n[0] < 32 and (n[1:] == lm.QUICK.eval_per_level).all()    # 1-digit: few problems exist
    assert set(task.pass_k.keys) <= set(held.keys) and set(np.unique(task.pass_k.level)) == {1, 2, 3}
    # the split is a property of the problem: the same wherever it is drawn
    np.testing.assert_array_equal(T.split_of(held.a, held.b, held.op), 2)
    np.testing.assert_array_equal(T.split_of(val.a, val.b, val.op), 1)
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


def _tiny_model():
    model = LMM.TinyLM(d_model=32, n_layers=1, n_heads=2, d_ff=64)
    params = model.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))
    prompts = jnp.asarray(T.make_pool(64, seed=2).prompts[:16])
    return model, params, prompts


@pytest.mark.slow
def test_sampling_logp_matches_teacher_forcing():
    model, params, prompts = _tiny_model()
    s = LMM.sample(model, params, prompts, jax.random.key(1), T.COMPLETION_LEN, 1.0)
    lp = LMM.sequence_logp(model, params, prompts, s.tokens)
    np.testing.assert_allclose(np.where(s.mask, lp, 0.0), s.logp, atol=1e-4)
    np.testing.assert_array_equal(s.mask, LMM.completion_mask(s.tokens))
    assert not np.any(np.asarray(s.tokens)[np.asarray(s.mask)] == T.PAD)  # the policy never emits PAD
    # the token entropy is that of the policy's distribution at each position
    logits = model.apply(params, jnp.concatenate([prompts, s.tokens], 1)[:, :-1])[:, prompts.shape[1] - 1:]
    lsm = jax.nn.log_softmax(logits, -1)
    ent = -jnp.sum(jnp.exp(lsm) * lsm, -1)
    np.testing.assert_allclose(np.where(s.mask, ent, 0.0), s.entropy, atol=1e-4)


@pytest.mark.slow
def test_sampled_logp_is_that_of_the_tempered_distribution():
    # tokens drawn from softmax(logits / T) record log softmax(logits / T), not the untempered log-prob
    model, params, prompts = _tiny_model()
    t = 0.5
    s = LMM.sample(model, params, prompts, jax.random.key(1), T.COMPLETION_LEN, t)
    m = np.asarray(s.mask)
    tempered = LMM.sequence_logp(model, params, prompts, s.tokens, temperature=t)
    plain = LMM.sequence_logp(model, params, prompts, s.tokens)
    np.testing.assert_allclose(np.where(m, tempered, 0.0), s.logp, atol=1e-4)
    assert np.abs(np.where(m, plain, 0.0) - np.asarray(s.logp)).max() > 0.05
    # and the draws follow that distribution: first-token frequencies of one prompt vs softmax(logits / T)
    one = jnp.repeat(prompts[:1], 4000, axis=0)
    s1 = LMM.sample(model, params, one, jax.random.key(2), 1, t)
    freq = np.bincount(np.asarray(s1.tokens[:, 0]), minlength=T.VOCAB_SIZE) / 4000
    want = np.asarray(jax.nn.softmax(model.apply(params, prompts[:1])[0, -1] / t))
    np.testing.assert_allclose(freq, want, atol=0.03)


@pytest.mark.slow
def test_one_update_raises_logp_of_positive_signal_completions():
    """One step of the pipeline's loss + optimiser raises the log-prob of completions with a
    positive signal and lowers those with a negative one."""
    import optax

    model, params, prompts = _tiny_model()
    s = LMM.sample(model, params, prompts, jax.random.key(3), T.COMPLETION_LEN, 1.0)
    signal = jnp.where(jnp.arange(prompts.shape[0]) % 2 == 0, 1.0, -1.0)
    ref = LMM.sequence_logp(model, params, prompts, s.tokens)

    def loss_fn(p):
        lp = jnp.where(s.mask, LMM.sequence_logp(model, p, prompts, s.tokens), 0.0)
        return M.policy_loss(lp, s.logp, signal, s.mask, ref_logp=ref, kl_coef=0.04)[0]

    opt = optax.adam(1e-3)
    g = jax.grad(loss_fn)(params)
    u, _ = opt.update(g, opt.init(params), params)
    new = optax.apply_updates(params, u)
    seq = lambda p: jnp.sum(jnp.where(s.mask, LMM.sequence_logp(model, p, prompts, s.tokens), 0.0), -1)  # noqa: E731
    d = np.asarray(seq(new) - seq(params))
    pos = np.asarray(signal) > 0
    assert d[pos].mean() > 0 > d[~pos].mean()
    assert (d[pos] > 0).mean() >= 0.75 and (d[~pos] < 0).mean() >= 0.75


def test_pass_at_k_estimator():
    np.testing.assert_allclose(lm.pass_at_k(np.array([0, 1, 4, 8]), 8, 1), [0, 1 / 8, 0.5, 1.0])
    np.testing.assert_allclose(lm.pass_at_k(np.array([0, 1, 4]), 8, 8), [0, 1, 1])
    np.testing.assert_allclose(lm.pass_at_k(np.array([1]), 4, 2), [1 - 3 / 6])


# ------------------------------------------------------------------ runs
def _strip(res):
    return {k: v for k, v in res.items() if k not in ("_state", "wall_seconds", "train_seconds",
                                                     "compile_seconds", "warm_start_seconds", "eval_seconds",
                                                     "seconds_per_step", "tokens_per_second",
                                                     "prompt_tokens_per_second")}


@pytest.fixture(scope="module")
def quick_run():
    return lm.run(quick=True)


@pytest.mark.slow
def test_quick_run_outputs(quick_run):
    res = quick_run
    assert res["finished"] and res["steps"] == lm.QUICK.steps
    for a in lm.ARMS:
        arm = res["arms"][a]
        for k in ("heldout_hard_accuracy_start", "heldout_hard_accuracy_final"):
            assert 0.0 <= arm[k] <= 1.0 and len(arm["per_seed"][k]) == lm.QUICK.seeds
        assert set(arm["heldout_accuracy_by_level_final"]) == {"1", "2", "3", "4"}
        assert set(arm["pass_at_k_final"]) == {"1", "8"}                     # k <= pass_k_samples = 8
        assert arm["pass_at_k_final"]["1"] <= arm["pass_at_k_final"]["8"]
        tr = arm["trace"]
        for k in ("reward", "kl", "tau", "beta", "weight_entropy", "entropy", "clip_fraction", "distinct_answers",
                  "frac_zero_std", "level_share_1"):
            assert np.isfinite(tr[k]).all(), k
        assert len(tr["steps"]) == lm.QUICK.steps // lm.QUICK.trace_every
        shares = np.asarray(arm["bucket_share"]["share"])
        np.testing.assert_allclose(shares.sum(1), 1.0, rtol=1e-5)
    # the plain arm is plain: controllers off, fixed KL coefficient, no SEED scale, first B groups
    g = res["arms"]["grpo_uniform"]["trace"]
    assert g["tau"][-1] == pytest.approx(lm.QUICK.tau0) and g["kl_coef"][-1] == pytest.approx(lm.QUICK.kl_coef)
    assert g["seed_scale"][-1] == 1.0 and g["replay"][-1] == 0.0
    # the loss's KL coefficient is the same in every arm but the KL-controller arm
    for a in (a for a in lm.ARMS if not lm.ARM_FLAGS[a][4]):
        assert res["arms"][a]["trace"]["kl_coef"] == pytest.approx([lm.QUICK.kl_coef] * len(g["steps"]))
    # dynamic sampling trains on groups with a signal first
    for a in ("grpo_dynamic", "full"):
        t = res["arms"][a]["trace"]
        assert np.mean(t["frac_zero_std_trained"]) <= np.mean(t["frac_zero_std"])
    assert res["tokens_per_second"] > 0 and res["prompt_tokens_per_second"] > 0
    assert max(res["arms"]["full"]["trace"]["staleness"]) <= lm.QUICK.sync_interval - 1
    assert res["split"]["problems_per_level"]["heldout"][1:] == [lm.QUICK.eval_per_level] * 3


@pytest.mark.slow
def test_resume_gives_the_same_numbers(quick_run, tmp_path):
    from jaxweight import metrics

    path = tmp_path / "ck.jwc"
    with metrics.open_writers(tmp_path) as w:
        part = lm.run(quick=True, checkpoint=path, stop_after_chunks=1, writer=w)
    assert not part["finished"] and path.exists()
    # killed after the next chunk's metric lines but before its checkpoint: the chunk's lines are in the file,
    # the checkpoint is the first chunk's
    first = path.read_bytes()
    with metrics.open_writers(tmp_path, append=True) as w:
        lm.run(quick=True, checkpoint=path, resume=True, stop_after_chunks=1, writer=w)
    path.write_bytes(first)
    with metrics.open_writers(tmp_path, append=True) as w:
        resumed = lm.run(quick=True, checkpoint=path, resume=True, writer=w)
    assert resumed["finished"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] == lm.QUICK.steps
    kinds: dict[int, list] = {}
    for r in rows:  # a step has a training line and perhaps an evaluation line, never one of them twice
        kinds.setdefault(r["step"], []).append(frozenset(r))
    assert all(len(set(k)) == len(k) for k in kinds.values()) and len(kinds) == lm.QUICK.steps + 1
    assert _strip(resumed) == _strip(quick_run)
    a, b = jax.tree.leaves(resumed["_state"]), jax.tree.leaves(quick_run["_state"])
    for x, y in zip(a, b):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
@pytest.mark.multidevice
def test_learner_and_actor_on_different_devices_equal_single_device(quick_run, devices8):
    ldev, adev = devices8[:3], devices8[3:6]                        # the 6 runs, 2 per device
    res = lm.run(quick=True, devices=(ldev, adev))
    st = res["_state"]
    learner_devs = {d for x in jax.tree.leaves(st.runs.learner) for d in x.devices()}
    actor_devs = {d for x in jax.tree.leaves(st.actor) for d in x.devices()}
    assert learner_devs == set(ldev) and actor_devs == set(adev)
    a, b = _strip(res), _strip(quick_run)
    cfg = lm.QUICK
    # The two paths compile different programs (three phases sharded over device groups vs one
    # vmapped step), so logits agree to float rounding only. Sampling is discrete: once a nearly
    # tied token flips, the runs diverge. So: every greedy evaluation is equal, and the first
    # trace block's metrics agree to rounding; later steps may differ by a flipped token.
    for arm in cfg.arms:
        ca, cb = a["arms"][arm]["curve"], b["arms"][arm]["curve"]
        assert ca["steps"] == cb["steps"] and len(ca["steps"]) >= 3
        assert ca["heldout_by_level"] == cb["heldout_by_level"], arm
        for k in ("heldout_hard_accuracy_start", "heldout_hard_accuracy_final", "heldout_accuracy_by_level_final"):
            assert a["arms"][arm][k] == b["arms"][arm][k]
        for k, v in b["arms"][arm]["trace"].items():
            np.testing.assert_allclose(a["arms"][arm]["trace"][k][:1], v[:1], rtol=2e-4, atol=2e-5, err_msg=k)


@pytest.mark.fast
@pytest.mark.smoke
def test_cli_smoke_tiny(tmp_path, capsys):
    """Smoke (the fast tier's end-to-end run of the demo): the quick task cut to a few steps."""
    rc = lm.main(["--quick", "--steps", "4", "--sft-steps", "2", "--eval-every", "2", "--out", str(tmp_path),
                  "--no-progress"])
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert {"split", "arms"} <= set(res) and "heldout_hard_accuracy_final" in res["arms"]["full"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 4
    assert "full" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_quick_writes_outputs(tmp_path, capsys):
    rc = lm.main(["--quick", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    for k in ("wall_seconds", "tokens_per_second", "prompt_tokens_per_second", "split", "arms"):
        assert k in res
    assert set(res["arms"]["full"]) >= {"heldout_hard_accuracy_start", "heldout_hard_accuracy_final",
                                        "heldout_accuracy_by_level_final", "pass_at_k_final", "per_seed"}
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
    (["--prompts", "8", "--sample-prompts", "4"], "sample_prompts"),
    (["--train-seeds", "4", "--seeds", "2"], "--train-seeds"),
    (["--train-seeds", "4", "--ablation-seeds", "8"], "--ablation-seeds"),
    (["--train-seeds", "4", "--part-seeds", "1"], "--part-seeds"),
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
    with pytest.raises(ValueError, match="sample_prompts must be >= prompts"):
        dataclasses.replace(lm.QUICK, sample_prompts=2)
    with pytest.raises(ValueError, match="normalization"):
        dataclasses.replace(lm.QUICK, normalization="sum")
