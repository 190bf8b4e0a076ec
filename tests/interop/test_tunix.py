"""jaxweight.interop.tunix: registry estimators and policy loss, the curriculum prompt iterator, the learner.

Needs ``pip install -e ".[tunix]"`` (skipped otherwise; CI's second step runs it). The
end-to-end runs use tunix's own tiny test model (``ToyTransformer`` + ``MockVocab``) on CPU.
"""

import numpy as np
import pytest

pytest.importorskip("tunix")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxweight import curriculum as cur  # noqa: E402
from jaxweight import maxent as M  # noqa: E402
from jaxweight.interop import tunix as jt  # noqa: E402

# tunix and what it drives emit deprecations we cannot fix here; scoped to them
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:tunix.*"),
    pytest.mark.filterwarnings("ignore:.with mesh.*context manager has been deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:optax.global_norm is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:jax.interpreters.pxla.thread_resources is deprecated:DeprecationWarning"),
]

from tunix.rl import algo_core  # noqa: E402,F401  (registers tunix's own estimators and losses)
from tunix.rl import function_registry as fr  # noqa: E402


def tunix_grpo(r, g):
    return np.asarray(fr.get_advantage_estimator("grpo")(np.asarray(r, np.float64), g))


# ---------------------------------------------------------------- registry
def test_register_puts_the_objects_in_tunix_registry():
    reg = jt.register()
    assert fr.get_advantage_estimator("jaxweight_grpo") is reg.grpo
    assert fr.get_advantage_estimator("jaxweight_maxent") is reg.maxent
    assert fr.get_policy_loss_fn("jaxweight_maxent") is jt.maxent_policy_loss
    est = jt.MaxEntAdvantageEstimator(M.config(tau=0.3))
    assert jt.register(maxent_estimator=est).maxent is est
    assert fr.get_advantage_estimator("jaxweight_maxent") is est


@pytest.mark.parametrize("g", [2, 4, 7])
def test_grpo_equals_tunix_grpo_on_finite_rewards(g):
    r = np.random.default_rng(g).normal(size=5 * g) * 3.0
    r[:g] = 1.0  # a zero-std group: both give 0
    a = jt.GroupAdvantageEstimator()(rewards=r, num_generations=g)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == r.shape
    np.testing.assert_allclose(a, tunix_grpo(r, g), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a[:g], 0.0)


def test_grpo_options_match_tunix_drgrpo_and_rloo():
    r = np.random.default_rng(0).uniform(size=12).astype(np.float32)
    dr = jt.GroupAdvantageEstimator(scale="none")(r, 4)
    np.testing.assert_allclose(dr, np.asarray(fr.get_advantage_estimator("drgrpo")(jnp.asarray(r), 4)), atol=1e-6)
    rloo = jt.GroupAdvantageEstimator(scale="none", baseline="leave_one_out")(r, 4)
    np.testing.assert_allclose(rloo, np.asarray(fr.get_advantage_estimator("rloo")(jnp.asarray(r), 4)), atol=1e-6)


def test_grpo_eps_is_the_documented_difference():
    # jaxweight's own default eps (1e-4, TRL) against tunix's 1e-6: std / (std + eps) apart
    r = np.array([0.0, 1e-3, 2e-3, 3e-3])
    std = np.std(r, ddof=1)
    a4 = jt.GroupAdvantageEstimator(eps=1e-4)(r, 4)
    np.testing.assert_allclose(a4, tunix_grpo(r, 4) * (std + 1e-6) / (std + 1e-4), rtol=1e-4)
    assert not np.allclose(a4, tunix_grpo(r, 4), rtol=1e-3)


def test_grpo_masks_nonfinite_rewards_where_tunix_gives_nan():
    r = np.array([1.0, np.nan, 0.0, 2.0, 0.5, 1.5, -1.0, 3.0])
    a = jt.GroupAdvantageEstimator()(r, 4)
    assert np.isnan(tunix_grpo(r, 4)[:4]).all()  # tunix: the whole group is NaN
    assert a[1] == 0.0
    # the rest of the group is normalised as a group of three
    v = np.array([1.0, 0.0, 2.0])
    np.testing.assert_allclose(a[[0, 2, 3]], (v - v.mean()) / (v.std(ddof=1) + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(a[4:], tunix_grpo(r[4:], 4), rtol=1e-5)
    # one valid reward left: 0, not NaN
    b = jt.GroupAdvantageEstimator()(np.array([np.inf, 1.0, np.nan, np.nan]), 4)
    np.testing.assert_array_equal(b, 0.0)


def test_jax_input_gives_jax_output_and_shapes_are_checked():
    a = jt.GroupAdvantageEstimator()(jnp.arange(6.0), 3)
    assert isinstance(a, jax.Array) and a.shape == (6,)
    np.testing.assert_allclose(np.asarray(a), tunix_grpo(np.arange(6.0), 3), rtol=1e-5)
    with pytest.raises(ValueError, match="not a multiple of num_generations=4"):
        jt.GroupAdvantageEstimator()(np.zeros(6), 4)
    with pytest.raises(ValueError, match="rank 1"):
        jt.GroupAdvantageEstimator()(np.zeros((2, 3)), 3)
    with pytest.raises(ValueError, match="eps"):
        jt.GroupAdvantageEstimator(eps=-1.0)
    with pytest.raises(ValueError, match="maxent.MaxEntConfig"):
        jt.MaxEntAdvantageEstimator({"tau": 1.0})


def test_sharded_rewards_as_some_tunix_versions_pass_them():
    devs = jax.devices()
    if len(devs) < 2:
        pytest.skip("needs several devices")
    mesh = jax.sharding.Mesh(np.array(devs[:2]), ("x",))
    r = np.random.default_rng(4).normal(size=8).astype(np.float32)
    rs = jax.device_put(r, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    np.testing.assert_allclose(np.asarray(jt.GroupAdvantageEstimator()(rs, 4)), tunix_grpo(r, 4), rtol=1e-5, atol=1e-6)
    a = jt.MaxEntAdvantageEstimator()(rs, 4)
    assert isinstance(a, jax.Array) and a.shape == (8,)


SCHED = M.TauSchedule(target_entropy=0.3, learning_rate=0.5, minimum_value=0.05, maximum_value=5.0)


def _reference_steps(rewards_list, g, cfg):
    """maxent.step called directly with the reference term off."""
    cfg = cfg.replace(include_reference_term=False)
    state, outs, step = M.init(cfg), [], jax.jit(M.step)
    for i, r in enumerate(rewards_list):
        u = jnp.asarray(r, jnp.float32).reshape(-1, g)
        state, out = step(state, u, jnp.zeros_like(u), cfg, global_step=jnp.int32(i))
        outs.append(out)
    return state, outs


def test_maxent_estimator_carries_the_controller_state_across_calls():
    cfg = M.config(tau=1.0, q_temperature=0.5, schedule=SCHED)
    est = jt.MaxEntAdvantageEstimator(cfg)
    rng = np.random.default_rng(1)
    batches = [rng.uniform(size=12) for _ in range(3)]
    got = [est(rewards=r, num_generations=4) for r in batches]
    state, outs = _reference_steps(batches, 4, cfg)
    assert int(est.calls) == 3
    np.testing.assert_allclose(float(est.state.tau), float(state.tau), rtol=1e-6)
    assert abs(float(state.tau) - 1.0) > 1e-3  # the controller moved
    for a, out in zip(got, outs):
        np.testing.assert_allclose(a, np.asarray(4.0 * out.weights - 1.0).reshape(-1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a.reshape(-1, 4).sum(-1), 0.0, atol=1e-5)  # centred
    # the third call used the tau after two updates, not the initial one
    assert not np.allclose(got[2], np.asarray(4.0 * _reference_steps([batches[2]], 4, cfg)[1][0].weights - 1).ravel())
    assert est.metrics()["maxent/tau"] == pytest.approx(float(state.tau))


def test_maxent_estimator_eval_calls_do_not_advance_and_bad_rewards_are_masked():
    est = jt.MaxEntAdvantageEstimator(M.config(schedule=SCHED))
    est(np.array([1.0, 0.0, 0.5, 0.2]), 2)
    tau, calls = float(est.state.tau), int(est.calls)
    est(np.array([1.0, 0.0, 0.5, 0.2]), 2, update=False)
    assert float(est.state.tau) == tau and int(est.calls) == calls
    a = est(np.array([1.0, np.nan, 0.0, 2.0, 0.5, 0.7]), 3)
    assert a[1] == 0.0 and np.isfinite(a).all()
    np.testing.assert_allclose(a[[0, 2]].sum(), 0.0, atol=1e-6)
    assert est.metrics()["maxent/n_invalid"] == 1.0
    before = jax.tree.map(np.asarray, est.state)
    est(np.full(4, np.nan), 2)  # all invalid: state exactly unchanged
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, est.state))


def test_maxent_estimator_save_restore_round_trip(tmp_path):
    est = jt.MaxEntAdvantageEstimator(M.config(schedule=SCHED))
    for _ in range(3):
        est(np.random.default_rng(0).uniform(size=8), 4)
    est.save(tmp_path / "maxent.ckpt", step=3)
    fresh = jt.MaxEntAdvantageEstimator(M.config(schedule=SCHED))
    assert fresh.restore(tmp_path / "maxent.ckpt") == 3
    assert int(fresh.calls) == 3 and float(fresh.state.tau) == float(est.state.tau)
    r = np.random.default_rng(5).uniform(size=8)
    np.testing.assert_array_equal(fresh(r, 4), est(r, 4))


# -------------------------------------------------------------- policy loss
def test_weights_from_centred_inverts_the_estimator():
    w = jnp.array([[0.1, 0.2, 0.7, 0.0], [0.25, 0.25, 0.25, 0.25]])
    valid = jnp.array([[True, True, True, False], [True] * 4])
    back, v = jt.weights_from_centred(jt.centred_from_weights(w, valid))
    np.testing.assert_allclose(np.asarray(back[0]), np.asarray(w[0]), atol=1e-6)
    assert not bool(v[0, 3])
    assert not bool(v[1].any())  # uniform weights: no listwise signal


def test_listwise_loss_value_and_gradient_direction():
    s = jnp.array([[-1.0, -2.0, -0.5], [0.0, 0.0, 0.0]])
    w = jnp.array([[0.1, 0.2, 0.7], [0.0, 0.0, 0.0]])
    valid = jnp.ones((2, 3), bool)
    expect = -np.sum(np.asarray(w[0]) * np.asarray(jax.nn.log_softmax(s[0])))
    np.testing.assert_allclose(float(jt.listwise_loss(s, w, valid)), expect, rtol=1e-6)  # the empty row is left out
    g = jax.grad(jt.listwise_loss)(s, w, valid)
    np.testing.assert_allclose(np.asarray(g[0]), np.asarray(jax.nn.softmax(s[0]) - w[0]), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(g[1]), 0.0)
    # an invalid entry takes no part, even with a huge log-prob
    m = valid.at[0, 2].set(False)
    w2 = jnp.array([[1 / 3, 2 / 3, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(float(jt.listwise_loss(s.at[0, 2].set(1e30), w2, m)),
                               float(jt.listwise_loss(s[:, :2], w2[:, :2], m[:, :2])), rtol=1e-6)


# ------------------------------------------------------ tunix's tiny model
def _toy_models():
    from flax import nnx
    from tunix.tests import test_common as tc

    vocab = tc.MockVocab()
    make = lambda: tc.ToyTransformer(config=tc.ModelConfig(vocab_size=vocab.GetPieceSize()), rngs=nnx.Rngs(0))
    return vocab, make(), make()


def _toy_cluster(max_steps=2, max_tokens=5, eval_every_n_steps=100, checkpoint_dir=None):
    import optax
    from tunix.rl import rl_cluster as rlc
    from tunix.rl.rollout import base_rollout

    vocab, actor, ref = _toy_models()
    ckpt = {}
    if checkpoint_dir is not None:
        import orbax.checkpoint as ocp

        ckpt = dict(checkpoint_root_directory=str(checkpoint_dir),
                    checkpointing_options=ocp.CheckpointManagerOptions(save_interval_steps=1, max_to_keep=4))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    cc = rlc.ClusterConfig(
        role_to_mesh={r: mesh for r in (rlc.Role.ACTOR, rlc.Role.REFERENCE, rlc.Role.ROLLOUT)},
        rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rlc.RLTrainingConfig(actor_optimizer=optax.sgd(1e-2), eval_every_n_steps=eval_every_n_steps,
                                             max_steps=max_steps, **ckpt),
        rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=max_tokens, max_prompt_length=8,
                                                  kv_cache_size=32, temperature=1.0))
    return rlc.RLCluster(actor=actor, reference=ref, tokenizer=vocab, cluster_config=cc), actor


PROMPTS = np.array(["input string", "hello world", "My name", "hello there"])


def toy_reward(prompts, completions, **kw):
    """Rewards with spread: completions' lengths plus a per-position offset."""
    return [float(len(c)) + 0.25 * (i % 3) for i, c in enumerate(completions)]


def _batches(n, b=2):
    return [{"prompts": PROMPTS[(b * i + np.arange(b)) % len(PROMPTS)]} for i in range(n)]


def test_policy_loss_matches_its_definition_on_tunix_model():
    from flax import nnx
    from tunix.rl import common
    from tunix.rl.grpo import grpo_learner as gl

    vocab, model, ref = _toy_models()
    g, b, L = 3, 6, 5
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(3, 20, size=(b, 3)), jnp.int32)
    comp = jnp.asarray(rng.integers(3, 20, size=(b, L)), jnp.int32)
    mask = jnp.asarray(np.arange(L)[None, :] < np.array([5, 3, 4, 5, 2, 5])[:, None])
    comp = jnp.where(mask, comp, vocab.pad_id())
    gd, st = nnx.split(ref)
    ref_lp = common.compute_per_token_logps(gd, st, prompt, comp, vocab.pad_id(), vocab.eos_id())
    est = jt.MaxEntAdvantageEstimator(M.config(tau=0.5))
    adv = est(rewards=jnp.array([1.0, 0.0, 2.0, 0.3, np.nan, 0.1]), num_generations=g)
    ex = gl.TrainExample(prompt_ids=prompt, prompt_mask=prompt != vocab.pad_id(), completion_ids=comp,
                         completion_mask=mask, advantages=adv, ref_per_token_logps=ref_lp, old_per_token_logps=None)
    cfg = gl.GRPOConfig(num_generations=g, beta=0.1, advantage_estimator="jaxweight_maxent",
                        policy_loss_fn="jaxweight_maxent")
    loss, aux = jt.maxent_policy_loss(model, ex, algo_config=cfg, pad_id=vocab.pad_id(), eos_id=vocab.eos_id())
    gd, st = nnx.split(model)
    lp = common.compute_per_token_logps(gd, st, prompt, comp, vocab.pad_id(), vocab.eos_id())
    mf = np.asarray(mask, np.float64)
    seq = (np.asarray(lp) * mf).sum(-1) / mf.sum(-1)
    w = np.asarray(est.last.weights)
    valid = np.asarray(est.last.valid)
    lsm = np.asarray(jax.nn.log_softmax(jnp.where(valid, seq.reshape(-1, g), -jnp.inf), axis=-1))
    listwise = -np.where(valid, w * np.where(valid, lsm, 0), 0).sum(-1).mean()
    kl = np.asarray(lp) - np.asarray(ref_lp)  # tunix's "kl" mode
    kl_loss = float(common.aggregate_loss(jnp.asarray(kl), mask, cfg.loss_agg_mode))
    np.testing.assert_allclose(float(aux["listwise_loss"]), listwise, rtol=1e-5)
    np.testing.assert_allclose(float(loss), listwise + 0.1 * kl_loss, rtol=1e-5, atol=1e-6)
    assert float(aux["pg_clipfrac"]) == 0.0 and float(aux["kl"]) == pytest.approx(kl_loss, rel=1e-5, abs=1e-7)
    with pytest.raises(ValueError, match="sequence packing"):
        jt.maxent_policy_loss(model, ex.replace(segment_ids=jnp.zeros((b, L), jnp.int32)), algo_config=cfg,
                              pad_id=0, eos_id=2)


@pytest.mark.parametrize("agg", ["token-mean", "sequence-mean-token-mean"])
def test_policy_loss_k3_kl_term_equals_tunix_low_var_kl(agg):
    # the "low_var_kl" KL term goes through jaxweight.maxent.policy_loss: same value as tunix's
    from tunix.rl import common
    from tunix.rl.grpo import grpo_learner as gl

    from jaxweight.interop.tunix import loss as jl

    rng = np.random.default_rng(1)
    lp = jnp.asarray(np.log(rng.uniform(0.1, 0.9, (6, 5))), jnp.float32)
    ref = jnp.asarray(lp + rng.normal(0, 0.3, (6, 5)), jnp.float32)
    mask = jnp.asarray(np.arange(5)[None, :] < np.array([5, 3, 4, 5, 2, 1])[:, None], jnp.float32)
    cfg = gl.GRPOConfig(num_generations=3, beta=0.1, kl_loss_mode="low_var_kl", loss_agg_mode=agg)
    want = common.aggregate_loss(common.compute_kl_divergence(lp, ref, "low_var_kl"), mask, agg)
    np.testing.assert_allclose(float(jl._kl_term(common, lp, ref, mask, cfg)), float(want), rtol=1e-5)
    g_ours = jax.grad(lambda x: jl._kl_term(common, x, ref, mask, cfg))(lp)
    g_tunix = jax.grad(lambda x: common.aggregate_loss(common.compute_kl_divergence(x, ref, "low_var_kl"),
                                                       mask, agg))(lp)
    np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_tunix), rtol=1e-5, atol=1e-7)


def test_learner_jaxweight_grpo_gives_tunix_grpo_advantages_with_the_curriculum_iterator():
    """One tunix run: "jaxweight_grpo" advantages equal tunix's "grpo"; train batches drawn and
    updated by the curriculum iterator, eval batches leave it alone."""
    from tunix.rl.grpo import grpo_learner as gl

    jt.register()
    it = jt.CurriculumPromptIterator({"prompts": PROMPTS}, cur.config("uniform", capacity=len(PROMPTS)),
                                     batch_size=2, num_generations=3, seed=0)
    seen, evals = [], []

    def capture(prompts, completions, rewards, advantages, **kw):
        (seen if jt.DRAW_KEY in kw else evals).append((np.asarray(rewards, np.float64), np.asarray(advantages)))
        return {}

    cluster, _ = _toy_cluster(max_steps=2, eval_every_n_steps=1)
    cfg = gl.GRPOConfig(num_generations=3, beta=0.0, advantage_estimator="jaxweight_grpo")
    learner = gl.GRPOLearner(rl_cluster=cluster, algo_config=cfg, reward_fns=toy_reward,
                             metric_fns=[capture, it.metric_fn])
    # one mesh: trainer and rollout share the parameters, tunix copies nothing (the tunix guide, weight sync)
    assert not learner.should_sync_weights
    learner.train(it, eval_ds=it.eval_batches(2))
    assert len(seen) == 2 and len(evals) >= 2
    for r, a in seen + evals:
        assert r.std() > 0
        np.testing.assert_allclose(a, tunix_grpo(r, 3), rtol=1e-5, atol=1e-5)
    assert int(it.state.total_updates) == 4  # 2 train batches of 2 prompts; eval added nothing
    assert jt.tunix_step(learner) == 2


def _readme_blocks():
    """The tunix guide's blocks that need tunix (docs/guides/tunix.md, marked ``docs:needs tunix``)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "tunix.md").read_text()
    return re.findall(r"<!-- docs:needs tunix -->\s*```python\n(.*?)```", text, flags=re.S)


def test_readme_tunix_example_runs(monkeypatch, tmp_path):
    """The tunix guide's example, as written: registry estimator + loss + curriculum iterator."""
    from flax import nnx

    monkeypatch.chdir(tmp_path)
    blocks = _readme_blocks()
    assert len(blocks) == 2
    ns: dict = {}
    exec(compile(blocks[0].replace("learner.train(", "before = jax.tree.map(np.array, nnx.state("
                                   "cluster.actor_trainer.model, nnx.Param))\nlearner.train(", 1),
                 "docs/guides/tunix.md block 0", "exec"), ns)  # noqa: S102 - the guide's own code
    assert int(ns["it"].state.total_updates) == 8  # 4 train steps x 2 prompts, eval batches not counted
    assert ns["reg"].maxent.metrics()["maxent/tau"] != 1.0 and int(ns["reg"].maxent.calls) >= 4
    assert (tmp_path / "runs/maxent.ckpt").exists() and (tmp_path / "runs/curriculum/curriculum_4.ckpt").exists()
    after = jax.tree.map(np.array, nnx.state(ns["cluster"].actor_trainer.model, nnx.Param))
    assert any(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.any(x != y)), ns["before"], after)))
    ns["cluster"], _ = _toy_cluster(max_steps=4)  # "instead of the GRPOLearner above": a fresh cluster
    exec(compile(blocks[1], "docs/guides/tunix.md block 1", "exec"), ns)  # noqa: S102 - builds the full learner
    assert isinstance(ns["learner"], jt.MaxEntGRPOLearner) and ns["learner"].seed_alpha == 0.0417

# ------------------------------------------------------ curriculum iterator
POOL = {"prompts": np.array([f"prompt {i}" for i in range(12)]), "answer": np.arange(12) * 10}


def _iterator(**kw):
    cfg = cur.config("prioritized", capacity=12, rebin_interval=1)
    return jt.CurriculumPromptIterator(POOL, cfg, batch_size=4, num_generations=3, seed=7, **kw)


def _feed(it, batch, rng):
    """What tunix does with a batch: repeat each row G times, score, call the metric functions."""
    rep = {k: np.repeat(v, it.num_generations, axis=0) for k, v in batch.items()}
    rewards = rng.uniform(size=rep["prompts"].shape[0]) + rep["answer"] / 100.0
    return it.metric_fn(prompts=rep["prompts"], completions=None, rewards=rewards, advantages=None,
                        **{k: v for k, v in rep.items() if k != "prompts"})


def _tunix_like_resume(it, step):
    """tunix's train(): one next() for the batch size, skip `step` batches, then train on the next."""
    first = next(it)
    for _ in range(step - 1):
        next(it)
    return first, next(it)


def test_iterator_batches_are_numpy_with_ids_and_updates_follow_rewards():
    it = _iterator()
    b = next(it)
    assert set(b) == {"prompts", "answer", jt.ITEM_ID_KEY, jt.DRAW_KEY}
    assert all(isinstance(v, np.ndarray) and v.shape[0] == 4 for v in b.values())
    np.testing.assert_array_equal(b["answer"], b[jt.ITEM_ID_KEY] * 10)  # rows follow the drawn ids
    logs = _feed(it, b, np.random.default_rng(0))
    assert logs["curriculum/total_updates"] == (4.0, np.mean)
    ema = np.asarray(it.state.ema)[b[jt.ITEM_ID_KEY]]
    assert np.isfinite(ema).all() and int(it.state.total_updates) == 4
    assert next(it)[jt.DRAW_KEY][0] == 1


def test_eval_batches_never_update_the_curriculum():
    it = _iterator()
    _feed(it, next(it), np.random.default_rng(0))
    before = jax.tree.map(np.asarray, it.state)
    evals = it.eval_batches(5)
    assert len(evals) == 2 and jt.DRAW_KEY not in evals[0]
    for b in evals:
        assert _feed(it, b, np.random.default_rng(1)) == {}
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, it.state))
    assert it.draws == 1


def test_iterator_refuses_bad_settings():
    cfg = cur.config("uniform", capacity=12)
    with pytest.raises(ValueError, match="'prompts' column"):
        jt.CurriculumPromptIterator({"text": POOL["prompts"]}, cfg, batch_size=2, num_generations=2)
    with pytest.raises(ValueError, match="cfg.capacity=12"):
        jt.CurriculumPromptIterator({"prompts": POOL["prompts"][:5]}, cfg, batch_size=2, num_generations=2)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        jt.CurriculumPromptIterator(POOL, cfg, batch_size=0, num_generations=2)
    with pytest.raises(ValueError, match="restore.save_dir. needs the tunix step"):
        jt.CurriculumPromptIterator(POOL, cfg, batch_size=2, num_generations=2).restore(".")


def test_group_scores_mask_nonfinite_rewards():
    np.testing.assert_allclose(jt.group_mean_scores(np.array([[1.0, np.nan, 3.0], [np.inf, np.nan, np.nan]])),
                               [2.0, np.nan])
    it = _iterator()
    b = next(it)
    with pytest.raises(ValueError, match="num_generations"):
        it.metric_fn(rewards=np.zeros(8), **{jt.ITEM_ID_KEY: np.repeat(b[jt.ITEM_ID_KEY], 2),
                                             jt.DRAW_KEY: np.repeat(b[jt.DRAW_KEY], 2)})


def test_saved_and_restored_iterator_continues_the_same_curriculum(tmp_path):
    it = _iterator(save_dir=tmp_path, save_every=2)
    rng = np.random.default_rng(3)
    drawn = []
    for _ in range(6):
        b = next(it)
        drawn.append(b[jt.ITEM_ID_KEY])
        _feed(it, b, rng)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curriculum_2.ckpt", "curriculum_4.ckpt",
                                                          "curriculum_6.ckpt"]
    # resume from tunix's checkpoint at step 4: tunix skips 4 batches, then trains on draw 4
    res = _iterator(save_dir=tmp_path, save_every=2)
    assert res.restore(tmp_path, jt.tunix_step(_FakeLearner(4))) == 4
    first, nxt = _tunix_like_resume(res, 4)
    assert first["prompts"].shape == (4,) and jt.ITEM_ID_KEY not in first  # a placeholder
    np.testing.assert_array_equal(nxt[jt.ITEM_ID_KEY], drawn[4])
    assert nxt[jt.DRAW_KEY][0] == 4
    # and the state it draws from is the original's: same next draws under the same feedback
    _feed(res, nxt, np.random.default_rng(99))
    it2 = _iterator()
    it2.restore(tmp_path / "curriculum_4.ckpt")
    _feed(it2, next(it2), np.random.default_rng(99))
    np.testing.assert_array_equal(next(res)[jt.ITEM_ID_KEY], next(it2)[jt.ITEM_ID_KEY])
    with pytest.raises(ValueError, match="resumes at step 3"):
        _iterator().restore(tmp_path / "curriculum_2.ckpt", step=3)


class _FakeLearner:
    def __init__(self, steps):
        import types

        self.rl_cluster = types.SimpleNamespace(actor_trainer=types.SimpleNamespace(iter_steps=steps))


# ---------------------------------------------------------------- learner
def test_public_names_resolve():
    assert set(jt.__all__) <= set(dir(jt))
    for name in jt.__all__:
        assert getattr(jt, name) is not None


def test_learner_refuses_sequence_packing():
    cluster, _ = _toy_cluster()
    cluster.cluster_config.training_config.max_seq_token_per_tpu = 64
    from tunix.rl.grpo import grpo_learner as gl

    with pytest.raises(ValueError, match="sequence packing"):
        jt.MaxEntGRPOLearner(rl_cluster=cluster, algo_config=gl.GRPOConfig(num_generations=3),
                             reward_fns=toy_reward)


def test_maxent_learner_feeds_reference_logps_kl_and_seed(tmp_path):
    """The learner's weights use the reference log-probs and the measured KL (beta controller),
    SEED scales the groups, the per-step beta travels in the example, eval does not advance."""
    from flax import nnx
    from tunix.rl import common
    from tunix.rl.grpo import grpo_learner as gl

    jt.register()
    cfg_m = M.config(tau=0.7, beta=0.05, schedule=SCHED, kl=M.KLController(target=1e-6, horizon=1, step_size=0.5))
    est = jt.MaxEntAdvantageEstimator(cfg_m)
    cluster, _ = _toy_cluster(max_steps=2, eval_every_n_steps=1)
    cfg = gl.GRPOConfig(num_generations=3, beta=0.05, advantage_estimator="grpo", policy_loss_fn="jaxweight_maxent")
    learner = jt.MaxEntGRPOLearner(rl_cluster=cluster, algo_config=cfg, reward_fns=toy_reward, estimator=est,
                                   seed_alpha=0.5, save_dir=tmp_path, save_every=1)
    examples = []
    orig = learner._generate_and_compute_advantage

    def spy(training_input, mode=None):
        ex = orig(training_input, mode) if mode is not None else orig(training_input)
        examples.append((mode, ex, est.last))
        return ex

    learner._generate_and_compute_advantage = spy
    learner.train(_batches(2), eval_ds=_batches(1))
    train = [(ex, out) for mode, ex, out in examples if str(mode) != "eval"]
    assert len(train) == 2 and len(examples) > 2
    assert int(est.calls) == 2  # eval batches weighted, not counted
    tau_in, beta_in = 0.7, 0.05
    for i, (ex, out) in enumerate(train):
        assert isinstance(ex, learner.TrainExample)
        # the weights use the reference term and the token counts, with the incoming tau / beta
        ref = np.asarray(jt.masked_token_mean(ex.ref_per_token_logps, ex.completion_mask)).reshape(-1, 3)
        tok = np.asarray(ex.completion_mask).sum(-1).reshape(-1, 3).astype(np.float32)
        w = M.weight_matrix(out.q, ref, tok, out.valid, tau=tau_in, beta=beta_in)
        np.testing.assert_allclose(np.asarray(out.weights), np.asarray(w), rtol=1e-5, atol=1e-6)
        assert not np.allclose(np.asarray(out.weights), np.asarray(M.weight_matrix(out.q, ref, tok, out.valid,
                                                                                   tau=tau_in, beta=0.0)))
        scale = np.asarray(ex.maxent_scale).reshape(-1, 3)
        assert (scale <= 1.0).all() and (scale > 0).all() and (scale == scale[:, :1]).all()
        adv = np.asarray(ex.advantages).reshape(-1, 3)
        n = np.asarray(out.valid).sum(-1, keepdims=True)
        np.testing.assert_allclose(adv, (n * np.asarray(out.weights) - 1) * scale, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(ex.maxent_beta), float(out.beta), rtol=1e-6)
        # the policy loss reads the weights back from the SEED-scaled signal
        model = learner.rl_cluster.actor_trainer.model
        _, aux = jt.maxent_policy_loss(model, ex, algo_config=cfg, pad_id=0, eos_id=2)
        gd, st = nnx.split(model)
        lp = common.compute_per_token_logps(gd, st, ex.prompt_ids, ex.completion_ids, 0, 2,
                                            temperature=cfg.temperature)
        seq = np.asarray(jt.masked_token_mean(lp, ex.completion_mask)).reshape(-1, 3)
        lsm = np.asarray(jax.nn.log_softmax(jnp.where(out.valid, seq, -jnp.inf), axis=-1))
        nonuniform = np.abs(n * np.asarray(out.weights) - 1).max(-1) > 0
        per_group = -np.where(out.valid, np.asarray(out.weights) * np.where(out.valid, lsm, 0), 0).sum(-1)
        expect = (per_group * scale[:, 0] * nonuniform).sum() / max(nonuniform.sum(), 1)
        np.testing.assert_allclose(float(aux["listwise_loss"]), expect, rtol=1e-4, atol=1e-6)
        # the beta controller got the KL measured on the batch: 0 before the first update
        # (policy == reference), then the policy has moved
        kl = float(out.kl)
        assert (kl == 0.0) if i == 0 else (kl != 0.0 and np.isfinite(kl))
        f = 1.0 + np.clip(kl / 1e-6 - 1.0, -0.5, 0.5)
        np.testing.assert_allclose(float(out.beta), beta_in * f, rtol=1e-5)
        tau_in, beta_in = float(out.tau), float(out.beta)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maxent_1.ckpt", "maxent_2.ckpt"]


@pytest.mark.slow
def test_resumed_tunix_run_continues_the_curriculum_and_the_controller(tmp_path):
    """Two tunix runs on one checkpoint directory: the second resumes at step 2 with the
    curriculum and controller state of the first, and draws the batch the first would have."""
    from tunix.rl.grpo import grpo_learner as gl

    jt.register()
    snaps = tmp_path / "jaxweight"

    def run(max_steps):
        it = jt.CurriculumPromptIterator({"prompts": PROMPTS}, cur.config("prioritized", capacity=len(PROMPTS)),
                                         batch_size=2, num_generations=3, seed=0, save_dir=snaps, save_every=1)
        est = jt.MaxEntAdvantageEstimator(M.config(beta=0.02, schedule=SCHED))
        cluster, _ = _toy_cluster(max_steps=max_steps, checkpoint_dir=tmp_path / "tunix")
        cfg = gl.GRPOConfig(num_generations=3, beta=0.02, policy_loss_fn="jaxweight_maxent")
        drawn = []
        learner = jt.MaxEntGRPOLearner(
            rl_cluster=cluster, algo_config=cfg, reward_fns=toy_reward, estimator=est, save_dir=snaps, save_every=1,
            metric_fns=[it.metric_fn, lambda **kw: drawn.append((kw[jt.DRAW_KEY][0], kw[jt.ITEM_ID_KEY][::3])) or {}])
        start = jt.tunix_step(learner)
        if start:
            it.restore(snaps, start)
        restored = (int(est.calls), float(est.state.tau), float(est.state.beta), int(it.state.total_updates))
        learner.train(it)
        return it, est, drawn, start, restored

    it_a, est_a, drawn_a, start_a, _ = run(2)
    assert start_a == 0 and [int(d) for d, _ in drawn_a] == [0, 1]
    expected = next(it_a)[jt.ITEM_ID_KEY]  # what an uninterrupted run draws third
    it_b, est_b, drawn_b, start_b, restored = run(3)
    assert start_b == 2  # tunix resumed from its checkpoint; ours came back with it
    assert restored == (2, float(est_a.state.tau), float(est_a.state.beta), 4)
    assert float(est_a.state.tau) != 1.0
    assert [int(d) for d, _ in drawn_b] == [2]
    np.testing.assert_array_equal(drawn_b[0][1], expected)
    assert int(it_b.state.total_updates) == 6 and int(est_b.calls) == 3


@pytest.mark.smoke
def test_demo_runs():
    """Smoke: the comparison demo's jaxweight arm end to end on a tiny budget (numbers: docs/guides/tunix.md)."""
    from jaxweight.interop.tunix import demo

    assert demo.reward(["hello world"], ["hello there hello"]) == [2 / 3]
    r = demo.run("maxent", 0, 2, eval_samples=1)
    assert r["arm"] == "maxent" and r["steps"] == 2 and 0.0 <= r["eval_after"] <= 1.0
    with pytest.raises(ValueError, match="arm must be"):
        demo.run("ppo", 0, 1)
