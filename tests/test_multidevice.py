"""One process, 8 fake CPU devices: actor/learner on different devices, data-parallel training."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxweight import distributed as dist
from jaxweight import sync
from tests.contracts import assert_trees_close

pytestmark = pytest.mark.multidevice


# ------------------------------------------------------------ a toy policy
def _policy(params, obs):
    return jnp.tanh(obs @ params["w1"] + params["b1"]) @ params["w2"]


def _regression_grad(params, batch):
    def loss(p):
        return jnp.mean((_policy(p, batch["x"])[:, 0] - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return grads, {"loss": value}


def _init(seed=0, d=4, h=8):
    rng = np.random.RandomState(seed)
    return {"w1": jnp.asarray(rng.randn(d, h), jnp.float32), "b1": jnp.zeros((h,), jnp.float32),
            "w2": jnp.asarray(rng.randn(h, 1), jnp.float32)}


def _data(seed, n, d=4):
    rng = np.random.RandomState(seed)
    return {"x": jnp.asarray(rng.randn(n, d), jnp.float32), "y": jnp.asarray(rng.randn(n), jnp.float32)}


@pytest.mark.parametrize("use_hook", [True, False])
def test_actor_learner_on_different_devices(devices8, use_hook):
    """Learner data-parallel on devices 0-3, actor replicated on devices 4-7, synced every k steps."""
    learner_devs, actor_devs = dist.split_devices(devices8, num_actor=4)
    lmesh, amesh = dist.make_mesh(learner_devs), dist.make_mesh(actor_devs)
    actor_sharding = dist.replicated(amesh)
    opt = optax.sgd(0.05)
    step = dist.data_parallel_train_step(_regression_grad, opt, lmesh)
    act = jax.jit(_policy, out_shardings=dist.batch_sharding(amesh))

    k, n_steps = 3, 8
    params = dist.replicate(_init(), lmesh)
    opt_state = dist.replicate(opt.init(_init()), lmesh)
    actor = jax.device_put(params, actor_sharding)
    hook = sync.WeightSync(k, placement=actor_sharding)
    cfg = sync.config(k, placement=actor_sharding)
    state = sync.init(cfg)
    obs = jax.device_put(jnp.ones((8, 4), jnp.float32), dist.batch_sharding(amesh))
    history = {0: dist.to_host(params)}
    for t in range(1, n_steps + 1):
        batch = dist.shard_batch(_data(t, 16), lmesh)
        params, opt_state, _ = step(params, opt_state, batch)
        history[t] = dist.to_host(params)
        if use_hook:
            actor = hook(params, actor)
            fired = hook.fired
        else:
            state, actor, fired = sync.step(state, params, actor, cfg)
            fired = bool(fired)
        assert fired == (t % k == 0)
        # the actor lags exactly as the fire pattern says
        assert_trees_close(dist.to_host(actor), history[(t // k) * k])
        # and lives (and acts) on the actor devices only
        for leaf in jax.tree.leaves(actor):
            assert leaf.sharding.device_set == set(actor_devs)
            assert leaf.sharding.is_fully_replicated
        actions = act(actor, obs)
        assert actions.sharding.device_set == set(actor_devs)
        want = _policy(history[(t // k) * k], np.ones((8, 4), np.float32))
        np.testing.assert_allclose(np.asarray(actions), np.asarray(want), rtol=1e-6, atol=1e-6)
    for leaf in jax.tree.leaves(params):
        assert leaf.sharding.device_set == set(learner_devs)
    if use_hook:
        assert hook.state_dict() == {"counter": n_steps, "version": n_steps // k, "last_sync": (n_steps // k) * k}


def _one_device_run(grad_fn, opt, params, batches):
    @jax.jit
    def one(p, o, b):
        g, aux = grad_fn(p, b)
        u, o = opt.update(g, o, p)
        return optax.apply_updates(p, u), o, aux

    o = opt.init(params)
    for b in batches:
        params, o, aux = one(params, o, b)
    return params, aux


@pytest.mark.parametrize("make_opt", [lambda: optax.sgd(0.1, momentum=0.9), lambda: optax.adamw(1e-2)],
                         ids=["sgd", "adamw"])
def test_data_parallel_train_step_matches_one_device(devices8, make_opt):
    mesh = dist.make_mesh(devices8)
    opt = make_opt()  # SGD is sensitive to the gradient's scale, Adam is not: test both
    batches = [_data(s, 32) for s in range(4)]
    ref, ref_aux = _one_device_run(_regression_grad, opt, _init(), batches)
    step = dist.data_parallel_train_step(_regression_grad, opt, mesh)
    p, o = dist.replicate(_init(), mesh), dist.replicate(opt.init(_init()), mesh)
    for b in batches:
        p, o, aux = step(p, o, dist.shard_batch(b, mesh))
    assert all(x.sharding.is_fully_replicated and len(x.sharding.device_set) == 8 for x in jax.tree.leaves(p))
    assert_trees_close(dist.to_host(p), dist.to_host(ref), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(aux["loss"]), np.asarray(ref_aux["loss"]), rtol=1e-5)


def test_data_parallel_grad_is_the_mean_gradient(devices8):
    """The gradient itself, not only an optimiser's (scale-free) use of it."""
    mesh = dist.make_mesh(devices8)
    b = _data(3, 32)
    ref, _ = jax.jit(_regression_grad)(_init(), b)
    got, _ = jax.jit(dist.data_parallel_grad(_regression_grad, mesh))(dist.replicate(_init(), mesh),
                                                                      dist.shard_batch(b, mesh))
    assert_trees_close(dist.to_host(got), dist.to_host(ref), rtol=1e-5, atol=1e-7)


def test_weighted_pmean_is_exact_masked_mean(devices8):
    """Shards with different numbers of valid items: weighted=True gives the global masked mean."""
    mesh = dist.make_mesh(devices8)
    x = jnp.arange(16, dtype=jnp.float32)
    mask = jnp.asarray([True] * 2 + [False] * 6 + [True] * 8)  # device 1-3 shards all masked

    def shard_mean(_, b):
        xs, ms = b
        n = jnp.sum(ms)
        return jnp.sum(jnp.where(ms, xs, 0.0)) / jnp.maximum(n, 1), n

    f = jax.jit(dist.data_parallel_grad(shard_mean, mesh, weighted=True))
    got = f(jnp.zeros(()), dist.shard_batch((x, mask), mesh))
    np.testing.assert_allclose(float(got), float(np.mean(np.asarray(x)[np.asarray(mask)])), rtol=1e-6)
    unweighted = jax.jit(dist.data_parallel_grad(lambda p, b: shard_mean(p, b)[0], mesh))
    assert abs(float(unweighted(jnp.zeros(()), dist.shard_batch((x, mask), mesh))) - float(got)) > 1.0


def test_data_parallel_jit_masked_matches_one_device(devices8):
    mesh = dist.make_mesh(devices8)
    b = _data(7, 16)
    b["m"] = jnp.asarray(np.arange(16) % 3 != 0)

    def grad(params, batch):
        def loss(p):
            err = (_policy(p, batch["x"])[:, 0] - batch["y"]) ** 2
            return jnp.sum(jnp.where(batch["m"], err, 0.0)) / jnp.sum(batch["m"])
        return jax.grad(loss)(params)

    ref = jax.jit(grad)(_init(), b)
    got = dist.data_parallel_jit(grad, mesh)(dist.replicate(_init(), mesh), dist.shard_batch(b, mesh))
    assert_trees_close(dist.to_host(got), dist.to_host(ref), rtol=1e-5, atol=1e-7)


def test_helper_validation(devices8):
    with pytest.raises(ValueError, match="num_actor"):
        dist.split_devices(devices8, num_actor=8)
    with pytest.raises(ValueError, match="num_actor"):
        dist.split_devices(devices8, num_actor=0)
    mesh = dist.make_mesh(devices8)
    with pytest.raises(ValueError, match="multiple of the 8 devices"):
        dist.shard_batch({"x": jnp.ones((12, 2))}, mesh)
    with pytest.raises(ValueError, match="share a batch axis"):
        dist.shard_batch({"x": jnp.ones((8, 2)), "y": jnp.ones((16,))}, mesh)
    with pytest.raises(ValueError, match="devices"):
        dist.make_mesh([])
    with pytest.raises(ValueError, match="process_id"):
        dist.initialize_cpu_cluster("127.0.0.1:1", 2, 5)


def test_broadcast_single_process_is_identity(devices8):
    tree = {"w": jnp.arange(3.0), "n": jnp.asarray(4, jnp.int32)}
    out = dist.broadcast_from_process0(tree)
    assert_trees_close(jax.tree.map(jnp.asarray, out), tree)
    hook = sync.broadcast_weight_sync(2, placement=devices8[3])
    actor = jax.device_put(tree, devices8[3])
    a1 = hook(tree, actor)
    assert a1 is actor
    a2 = hook(jax.tree.map(lambda x: x + 1, tree), a1)
    assert hook.fired and a2["w"].devices() == {devices8[3]}
    np.testing.assert_array_equal(a2["w"], [1.0, 2.0, 3.0])


# ------------------------------------------------ curriculum pool sharded
def test_curriculum_pool_sharded_on_the_data_mesh_matches_one_device(devices8):
    """The pool split over the learner's data mesh: masked group updates and rebins as on one device.

    tests/test_curriculum_multidevice.py covers ``update`` / ``recompute_bins`` / metrics /
    sampling on a dedicated mesh; this runs the atropos ``update_batch`` path on the mesh of
    :func:`jaxweight.distributed.make_mesh`.
    """
    from jaxweight import curriculum as cur

    n, p, g = 256, 24, 4
    mesh = dist.make_mesh(devices8)
    cfg = cur.config("competence_based", 4, capacity=n, rebin_interval=30)
    rng = np.random.RandomState(0)
    update = jax.jit(cur.update_groups)
    single, sharded = cur.init(cfg), cur.shard_state(cur.init(cfg), cfg, mesh)
    for _ in range(4):
        ids = jnp.asarray(rng.randint(0, n, p), jnp.int32)
        scores = jnp.asarray(rng.rand(p, g).round(2), jnp.float32)
        mask = jnp.asarray(rng.rand(p, g) < 0.8)
        single, sharded = update(single, ids, scores, cfg, mask=mask), update(sharded, ids, scores, cfg, mask=mask)
        assert sharded.ema.sharding.is_equivalent_to(dist.batch_sharding(mesh), 1)
    assert bool(single.has_boundaries)  # 96 updates: a rebin happened on the way
    assert_trees_close(jax.device_get(sharded), jax.device_get(single))


# ----------------------------------------------- reward-ensemble training
def _reward_batch(lead, length=5, d=3, seed=0):
    from jaxweight.preference import FragmentPairs

    rng = np.random.RandomState(seed)
    n = int(np.prod(lead))
    pairs = FragmentPairs(
        obs=jnp.asarray(rng.randn(n, 2, length + 1, d), jnp.float32),
        acts=jnp.asarray(rng.randn(n, 2, length, 1), jnp.float32),
        rews=jnp.asarray(rng.randn(n, 2, length), jnp.float32),
        terminal=jnp.asarray(rng.rand(n, 2) < 0.2), valid=jnp.ones((n,), bool))
    pairs = jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), pairs)
    prefs = jnp.asarray(rng.rand(n) < 0.5, jnp.float32).reshape(lead)
    mask = jnp.asarray(rng.rand(n) < 0.8).reshape(lead)
    return pairs, prefs, mask


# The final bias of a Bradley-Terry reward net adds L * b to both returns of a pair and
# cancels in their difference: its gradient is exactly 0 in exact arithmetic and only
# float noise in practice. AdamW normalises that noise into steps of size ~lr whose
# sign depends on the summation order, so the bias is compared through the check that
# its gradient is noise (and the model's predictions, which do not depend on it).
_UNIDENTIFIABLE = "['params']['dense_final']['bias']"


def _reward_cases():
    from jaxweight.preference import lp_regularizer, weight_decay_regularizer

    return {
        "single": dict(),
        # minibatches of 2 inside each device's 4 pairs, decay between minibatches
        "ensemble-accumulate-weight-decay": dict(num_members=3, minibatch_size=2,
                                                 regularizer=weight_decay_regularizer(0.5)),
        # minibatches of 16 spanning 4 devices each, penalty once per minibatch
        "lp-minibatch-spans-devices": dict(minibatch_size=16, regularizer=lp_regularizer(0.1)),
    }


@pytest.mark.parametrize("case", list(_reward_cases()))
def test_reward_training_data_parallel_matches_one_device(devices8, case):
    from jaxweight.preference import RewardMLP, RewardTrainer, cross_entropy_loss, preference_probabilities, training

    kw = _reward_cases()[case]
    trainer = RewardTrainer(RewardMLP(hidden_sizes=(8,)), batch_size=32, progress=False, **kw)
    lead = (kw["num_members"], 32) if "num_members" in kw else (32,)
    pairs, prefs, mask = _reward_batch(lead)
    example = jax.tree.map(lambda x: x.reshape(-1, *x.shape[len(lead):])[:1], pairs).transitions()
    state = jax.jit(lambda: trainer.init(0, example))()
    mesh = dist.make_mesh(devices8)
    dp_step = jax.jit(lambda s, p, y, m: training.step(s, p, y, trainer.config, mask=m, mesh=mesh))
    one_step = jax.jit(lambda s, p, y, m: training.step(s, p, y, trainer.config, mask=m))
    ref, dp = state, dist.replicate(state, mesh)
    for _ in range(2):
        ref, ref_m = one_step(ref, pairs, prefs, mask)
        dp, dp_m = dp_step(dp, pairs, prefs, mask)
    assert int(dp.steps) == int(ref.steps) == 2
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(dp.params))
    got = dist.to_host(dp.params)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(ref.params)):
        if jax.tree_util.keystr(path) != _UNIDENTIFIABLE:
            np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    for name in ("loss", "accuracy", "gt_reward_loss"):
        np.testing.assert_allclose(np.asarray(dp_m[name]), np.asarray(ref_m[name]), rtol=1e-5, atol=1e-7)
    # the excluded bias has a zero gradient up to float noise ...
    first = jax.tree.map(lambda x: x[0], state.params) if "num_members" in kw else state.params
    sub = jax.tree.map(lambda x: x[0], (pairs, prefs, mask)) if "num_members" in kw else (pairs, prefs, mask)
    g = jax.grad(lambda p: cross_entropy_loss(preference_probabilities(trainer.module, p, sub[0])[0], sub[1],
                                              sub[2])[0])(first)
    g_bias = float(np.abs(np.asarray(g["params"]["dense_final"]["bias"])).max())
    g_max = max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(g))
    assert g_bias <= 1e-6 * g_max
    # ... and the trained models make the same predictions
    test_pairs = _reward_batch((16,), seed=1)[0]
    net = trainer.module
    ens = "num_members" in kw
    probs = jax.jit(lambda p: preference_probabilities(net, p, test_pairs, ensemble=ens)[0])
    p_ref, p_dp = probs(ref.params), probs(dist.to_host(got))
    np.testing.assert_allclose(np.asarray(p_dp), np.asarray(p_ref), rtol=1e-5, atol=1e-6)


def test_reward_step_on_a_mesh_validation(devices8):
    from jaxweight.preference import RewardMLP, training

    mesh = dist.make_mesh(devices8)
    pairs, prefs, _ = _reward_batch((16,))
    state = jax.eval_shape(lambda: _trainer_state(pairs))

    def step(**kw):
        cfg = training.config(RewardMLP(), **kw)
        return lambda p, y: jax.eval_shape(lambda s: training.step(s, p, y, cfg, mesh=mesh), state)

    with pytest.raises(ValueError, match="multiple of the 8 devices"):
        step(batch_size=12)(pairs, prefs)
    with pytest.raises(ValueError, match="must divide one another"):
        step(batch_size=48, minibatch_size=4)(pairs, prefs)
    with pytest.raises(ValueError, match="prefs must have shape"):
        step(batch_size=16)(pairs, prefs[:8])


def _trainer_state(pairs):
    from jaxweight.preference import RewardMLP, RewardTrainer

    trainer = RewardTrainer(RewardMLP(), batch_size=16, progress=False)
    return trainer.init(0, jax.tree.map(lambda x: x[:1], pairs).transitions())


@pytest.mark.parametrize("members", [None, 2])
def test_train_reward_on_a_mesh_matches_one_device(devices8, members):
    """Whole epochs over a buffer, data-parallel: the same one train step with ``axis_name``."""
    from jaxweight.preference import RewardMLP, RewardTrainer, buffer, training

    trainer = RewardTrainer(RewardMLP(hidden_sizes=(8,)), num_members=members, batch_size=16, minibatch_size=8,
                            eps=1.0)
    pairs, prefs, _ = _reward_batch((40,))
    # two bad stored pairs: left out (counted) on every device alike; a concrete preference
    # outside [0, 1] is refused by buffer.step, a traced one (under jit) is stored and masked
    pairs = pairs.replace(obs=pairs.obs.at[3].set(jnp.nan))
    prefs = prefs.at[7].set(2.0)
    bcfg = buffer.config(48)
    buf = jax.jit(lambda b, p, q: buffer.step(b, p, q, bcfg))(buffer.init(bcfg, None, pairs), pairs, prefs)
    state = trainer.init(0, jax.tree.map(lambda x: x[:1], pairs).transitions())
    one = jax.jit(lambda s, k, b: training.epoch(s, k, b, trainer.config, epochs=2))
    mesh = dist.make_mesh(devices8)
    dp = jax.jit(lambda s, k, b: training.epoch(s, k, b, trainer.config, epochs=2, mesh=mesh))
    ref, m_ref = one(state, jax.random.key(3), buf)
    got, m_dp = dp(state, jax.random.key(3), buf)
    assert int(got.steps) == int(ref.steps) == 2 * 3  # ceil(38 / 16) steps per epoch
    assert int(m_dp["n_invalid"]) == int(m_ref["n_invalid"]) == 2
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(jax.device_get(got.params))[0],
                            jax.tree.leaves(ref.params)):
        if jax.tree_util.keystr(path) != _UNIDENTIFIABLE:
            np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    for name in ("train/loss", "train/accuracy"):
        np.testing.assert_allclose(np.asarray(m_dp[name]), np.asarray(m_ref[name]), rtol=1e-5, atol=1e-7)
