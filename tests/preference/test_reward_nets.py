"""Spaces, preprocessing, RewardMLP, shaping, ensembles and reward normalisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces as gx

from jaxweight import preference as pf
from jaxweight.preference import normalization as rn
from tests.contracts import check_state_contract


def _init(net, key, *inputs):
    return jax.jit(net.init)(jax.random.key(key), *inputs)


def _apply(net, params, *inputs):
    return jax.jit(net.apply)(params, *inputs)


def _inputs(b=6, obs_dim=4, n_act=2, seed=0):
    rng = np.random.default_rng(seed)
    return (
        jnp.asarray(rng.normal(size=(b, obs_dim)), jnp.float32),
        jnp.asarray(rng.integers(0, n_act, b), jnp.int32),
        jnp.asarray(rng.normal(size=(b, obs_dim)), jnp.float32),
        jnp.asarray(rng.random(b) < 0.5),
    )


# ---------------------------------------------------------------- spaces
def test_preprocess_each_space():
    np.testing.assert_array_equal(pf.preprocess(pf.Discrete(3), jnp.array([0, 2])), [[1, 0, 0], [0, 0, 1]])
    md = pf.preprocess(pf.MultiDiscrete((2, 3)), jnp.array([[1, 2]]))
    np.testing.assert_array_equal(md, [[0, 1, 0, 0, 1]])
    mb = pf.preprocess(pf.MultiBinary(3), jnp.array([[1, 0, 1]], jnp.int8))
    assert mb.dtype == jnp.float32
    np.testing.assert_array_equal(mb, [[1, 0, 1]])
    img_space = pf.Box((2, 2, 3), 0, 255, "uint8")
    assert pf.reward_nets.is_image_space(img_space)
    img = jnp.full((1, 2, 2, 3), 255, jnp.uint8)
    np.testing.assert_allclose(pf.preprocess(img_space, img), 1.0)
    np.testing.assert_allclose(pf.preprocess(img_space, img, normalize_images=False), 255.0)
    assert not pf.reward_nets.is_image_space(pf.Box((2, 2, 3), 0, 1, "uint8"))
    assert not pf.reward_nets.is_image_space(pf.Box((4,)))
    x = pf.preprocess(pf.Box((2,)), jnp.array([[1, 2]], jnp.int32))
    assert x.dtype == jnp.float32
    assert [pf.reward_nets.flat_dim(s) for s in (pf.Discrete(3), pf.MultiDiscrete((2, 3)), img_space, pf.MultiBinary(4))] == [3, 5, 12, 4]
    with pytest.raises(ValueError, match="x must have shape"):
        pf.preprocess(pf.Box((3,)), jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match="n must be >= 1"):
        pf.Discrete(0)


def test_as_space_gymnax():
    assert pf.reward_nets.as_space(gx.Discrete(2)) == pf.Discrete(2)
    box = pf.reward_nets.as_space(gx.Box(-1.0, 1.0, (4,), jnp.float32))
    assert box == pf.Box((4,), -1.0, 1.0, "float32")
    assert hash(box) == hash(pf.Box((4,), -1.0, 1.0))
    assert pf.reward_nets.as_space(None) is None
    with pytest.raises(ValueError, match="unsupported space"):
        pf.reward_nets.as_space(gx.Dict({"a": gx.Discrete(2)}))
    net = pf.RewardMLP(observation_space=gx.Box(-1.0, 1.0, (4,), jnp.float32), action_space=gx.Discrete(2))
    assert net.action_space == pf.Discrete(2)


# ------------------------------------------------------------- RewardMLP
def test_reward_mlp_matches_manual_forward():
    net = pf.RewardMLP(hidden_sizes=(5, 3), use_next_state=True, use_done=True,
                       observation_space=pf.Box((4,)), action_space=pf.Discrete(2))
    s, a, s2, d = _inputs()
    params = _init(net, 0, s, a, s2, d)
    p = params["params"]
    assert p["dense0"]["kernel"].shape == (4 + 2 + 4 + 1, 5)  # [state, one-hot action, next state, done]
    assert p["dense_final"]["kernel"].shape == (3, 1)
    x = np.concatenate([np.asarray(s), np.eye(2)[np.asarray(a)], np.asarray(s2), np.asarray(d, np.float32)[:, None]], 1)
    h = np.maximum(x @ p["dense0"]["kernel"] + p["dense0"]["bias"], 0)
    h = np.maximum(h @ p["dense1"]["kernel"] + p["dense1"]["bias"], 0)
    want = (h @ p["dense_final"]["kernel"] + p["dense_final"]["bias"])[:, 0]
    got = _apply(net, params, s, a, s2, d)
    assert got.shape == (6,) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reward_mlp_any_batch_shape_and_input_options():
    net = pf.RewardMLP(observation_space=pf.Box((4,)), action_space=pf.Discrete(2))
    s, a, s2, d = _inputs(12)
    params = _init(net, 0, s, a, s2, d)
    flat = _apply(net, params, s, a, s2, d)
    shaped = _apply(net, params, s.reshape(3, 2, 2, 4), a.reshape(3, 2, 2), s2.reshape(3, 2, 2, 4), d.reshape(3, 2, 2))
    np.testing.assert_allclose(shaped.reshape(-1), flat, rtol=1e-6)
    # inputs that are not used do not change the output; default hidden sizes (32, 32)
    other = _apply(net, params, s, a, s2 + 100.0, ~d)
    np.testing.assert_array_equal(other, flat)
    assert params["params"]["dense0"]["kernel"].shape == (6, 32)
    assert params["params"]["dense1"]["kernel"].shape == (32, 32)
    only_done = pf.RewardMLP(hidden_sizes=(), use_state=False, use_action=False, use_done=True)
    pd = _init(only_done, 1, s, a, s2, d)
    assert pd["params"]["dense_final"]["kernel"].shape == (1, 1)
    # continuous actions without a space
    cont = pf.RewardMLP(hidden_sizes=(4,))
    pc = _init(cont, 2, s, jnp.ones((12, 3)), s2, d)
    assert pc["params"]["dense0"]["kernel"].shape == (7, 4)


def test_reward_mlp_errors():
    with pytest.raises(ValueError, match="at least one input"):
        pf.RewardMLP(use_state=False, use_action=False)
    s, a, s2, d = _inputs()
    with pytest.raises(ValueError, match="integer dtype"):
        pf.RewardMLP().init(jax.random.key(0), s, a, s2, d)  # discrete actions need their space
    with pytest.raises(ValueError, match="leading batch shape"):
        pf.RewardMLP(action_space=pf.Discrete(2)).init(jax.random.key(0), s, a[:3], s2, d)


def test_image_observations_are_scaled():
    space = pf.Box((3, 3, 1), 0, 255, "uint8")
    net = pf.RewardMLP(hidden_sizes=(4,), use_action=False, observation_space=space)
    obs = jnp.full((2, 3, 3, 1), 255, jnp.uint8)
    d = jnp.zeros((2,), bool)
    params = _init(net, 0, obs, None, obs, d)
    scaled = pf.RewardMLP(hidden_sizes=(4,), use_action=False, observation_space=pf.Box((3, 3, 1)))
    np.testing.assert_allclose(_apply(net, params, obs, None, obs, d),
                               _apply(scaled, params, jnp.ones((2, 3, 3, 1)), None, obs, d), rtol=1e-6)


# --------------------------------------------------------------- shaping
def test_shaped_reward_net_formula():
    net = pf.basic_shaped_reward_net(pf.Box((4,)), pf.Discrete(2), discount_factor=0.9)
    s, a, s2, d = _inputs(8)
    params = _init(net, 0, s, a, s2, d)
    p = params["params"]
    assert p["base"]["dense0"]["kernel"].shape == (6, 32) and "dense1" not in p["base"]  # reward (32,)
    assert p["potential"]["dense1"]["kernel"].shape == (32, 32)  # potential (32, 32)
    base = _apply(net.base, {"params": p["base"]}, s, a, s2, d)
    phi = lambda x: _apply(net.potential, {"params": p["potential"]}, x)  # noqa: E731
    want = base + 0.9 * (1 - d.astype(jnp.float32)) * phi(s2) - phi(s)
    np.testing.assert_allclose(_apply(net, params, s, a, s2, d), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------- ensembles
def test_ensemble_init_apply_moments():
    net = pf.RewardMLP(hidden_sizes=(8,), observation_space=pf.Box((4,)), action_space=pf.Discrete(2))
    inputs = _inputs(7)
    params = pf.ensemble_init(0, net, inputs, 4)
    assert jax.tree.leaves(params)[0].shape[0] == 4
    k0 = np.asarray(params["params"]["dense0"]["kernel"])
    assert not np.allclose(k0[0], k0[1])  # independent initialisations
    r = jax.jit(lambda p: pf.ensemble_apply(net, p, *inputs))(params)
    assert r.shape == (7, 4)
    for m in range(4):
        np.testing.assert_allclose(r[:, m], _apply(net, jax.tree.map(lambda x: x[m], params), *inputs), rtol=1e-5, atol=1e-6)
    mean, var = pf.ensemble_moments(r)
    np.testing.assert_allclose(mean, np.asarray(r).mean(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, np.asarray(r).var(-1, ddof=1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(pf.add_std(mean, var, 2.0), mean + 2 * np.sqrt(var), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda p: pf.ensemble_reward(net, p, *inputs, alpha=-1.0))(params), mean - np.sqrt(var), rtol=1e-5,
                               atol=1e-6)
    assert pf.reward_nets.num_members(net, params, inputs) == 4
    assert pf.reward_nets.num_members(net, jax.tree.map(lambda x: x[0], params), inputs) is None
    # differentiable per member
    g = jax.jit(jax.grad(lambda p: jnp.sum(pf.ensemble_apply(net, p, *inputs)[:, 2])))(params)
    gk = np.asarray(g["params"]["dense_final"]["kernel"])
    assert np.abs(gk[2]).sum() > 0 and np.abs(gk[[0, 1, 3]]).sum() == 0


def test_chunked_ensemble_apply_equals_vmap():
    net = pf.RewardMLP(hidden_sizes=(8,), observation_space=pf.Box((4,)), action_space=pf.Discrete(2))
    s, a, s2, d = _inputs(21)
    inputs = (s.reshape(3, 7, 4), a.reshape(3, 7), s2.reshape(3, 7, 4), d.reshape(3, 7))
    params = pf.ensemble_init(0, net, inputs, 3)
    full = jax.jit(lambda p: pf.ensemble_apply(net, p, *inputs))(params)
    for chunk in (1, 5, 21, 100):
        got = jax.jit(lambda p, c=chunk: pf.ensemble_apply(net, p, *inputs, chunk_size=c))(params)
        assert got.shape == (3, 7, 3)
        np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        pf.ensemble_apply(net, params, *inputs, chunk_size=0)


def test_ensemble_errors():
    net = pf.RewardMLP(hidden_sizes=(2,), observation_space=pf.Box((4,)), action_space=pf.Discrete(2))
    with pytest.raises(ValueError, match="Must be at least 2 member in the ensemble."):
        pf.ensemble_init(0, net, _inputs(), 1)
    with pytest.raises(ValueError, match="member axis of size >= 2"):
        pf.ensemble_moments(jnp.zeros((3, 1)))
    with pytest.raises(ValueError, match="neither"):
        pf.reward_nets.num_members(net, {"params": {"dense0": {"kernel": jnp.zeros((3, 3)), "bias": jnp.zeros(2)},
                                        "dense_final": {"kernel": jnp.zeros((2, 1)), "bias": jnp.zeros(1)}}},
                       _inputs())


# ------------------------------------------------------- normalisation
class _RunningNormNP:
    """imitation's RunningNorm.update_stats written out in NumPy (the reference)."""

    def __init__(self):
        self.mean, self.var, self.count = 0.0, 1.0, 0

    def update(self, x):
        bm, bv, bc = x.mean(), x.var(), len(x)
        delta = bm - self.mean
        tot = self.count + bc
        self.mean += delta * bc / tot
        self.var = (self.var * self.count + bv * bc + delta**2 * self.count * bc / tot) / tot
        self.count = tot


class _EMANormNP:
    def __init__(self, decay):
        self.mean, self.var, self.inv_lr, self.nb, self.decay = 0.0, 1.0, 0.0, 0, decay

    def update(self, x):
        self.inv_lr += self.decay**self.nb
        lr = 1 / self.inv_lr
        dm = x.mean() - self.mean
        self.mean += lr * dm
        self.var += lr * (x.var() + (1 - lr) * dm**2 - self.var)
        self.nb += 1


def test_running_and_ema_norm_match_imitation():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3, 2, size=n) for n in (5, 9, 1, 12)]
    c_run, c_ema = rn.config("running"), rn.config("ema", decay=0.9)
    run, ema = rn.init(c_run), rn.init(c_ema)
    ref_run, ref_ema = _RunningNormNP(), _EMANormNP(0.9)
    for b in batches:
        run, _ = rn.step(run, jnp.asarray(b, jnp.float32), c_run)
        ema, _ = rn.step(ema, jnp.asarray(b, jnp.float32), c_ema)
        ref_run.update(b)
        ref_ema.update(b)
    allx = np.concatenate(batches)
    np.testing.assert_allclose([run.mean, run.var], [allx.mean(), allx.var()], rtol=1e-5)
    np.testing.assert_allclose([run.mean, run.var], [ref_run.mean, ref_run.var], rtol=1e-5)
    np.testing.assert_allclose([ema.mean, ema.var], [ref_ema.mean, ref_ema.var], rtol=1e-5)
    assert int(run.count) == len(allx) and int(ema.num_batches) == 4
    np.testing.assert_allclose(rn.apply(run, jnp.asarray(allx), c_run),
                               (allx - allx.mean()) / np.sqrt(allx.var() + 1e-5), rtol=1e-4, atol=1e-5)


def test_normalize_then_update_and_masking():
    cfg = rn.config()
    s0 = rn.init(cfg)
    s1, out = rn.step(s0, jnp.array([2.0, 4.0]), cfg)
    np.testing.assert_allclose(out, np.array([2.0, 4.0]) / np.sqrt(1 + 1e-5), rtol=1e-6)  # old stats (identity)
    np.testing.assert_allclose(s1.mean, 3.0)
    s2, _ = rn.step(s1, jnp.array([100.0, jnp.nan]), cfg, mask=jnp.array([False, False]))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), s2, s1))  # empty batch: unchanged
    s3, _ = rn.step(s1, jnp.array([5.0, jnp.nan]), cfg, mask=jnp.array([True, False]))
    assert np.isfinite(float(s3.var)) and int(s3.count) == 3
    s4, _ = rn.step(s1, jnp.array([9.0]), cfg, update_stats=False)
    assert int(s4.count) == 2
    assert rn.metrics_dict(s1, cfg) == {"reward_norm/mean": 3.0, "reward_norm/std": 1.0, "reward_norm/count": 2.0}
    for build in (rn.config, lambda *a: rn.RewardNormConfig(*a)):
        with pytest.raises(ValueError, match="kind must be"):
            build("batch")
        with pytest.raises(ValueError, match="decay must be"):
            build("ema", 1.5)


@pytest.mark.parametrize("kind", ["running", "ema"])
def test_reward_norm_contract(kind, tmp_path):
    x1 = jnp.array([1.0, 2.0, 3.0])
    x2 = jnp.array([-4.0, 0.5, 9.0])
    cfg = rn.config(kind, 0.95)
    check_state_contract(
        init=lambda: rn.init(cfg),
        update=lambda s, x, c: rn.step(s, x, c),
        update_args=(x1, cfg),
        update_args_alt=(x2, cfg.replace(decay=jnp.float32(0.9))),
        batched_init=lambda: jax.vmap(lambda _: rn.init(cfg))(jnp.arange(2)),
        batched_update_in_axes=(0, 0),
        batched_update_args=(jnp.stack([x1, x2]), jax.vmap(lambda d: cfg.replace(decay=d))(jnp.array([0.9, 0.99]))),
        tmp_path=tmp_path,
        rtol=1e-6,
    )
