"""jaxweight.interop.imitation: trajectories, fragment pairs and reward-net weights, both ways."""

import collections
import sys
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight.interop import imitation as imx
from jaxweight.preference.reward_nets import Discrete, RewardMLP, ensemble_init


@dataclass
class FakeTraj:
    """Duck-typed imitation TrajectoryWithRew."""

    obs: Any
    acts: Any
    rews: Any = None
    terminal: bool = True
    infos: Any = None


def _episodes():
    rng = np.random.default_rng(0)
    lens = [5, 3]
    return [FakeTraj(rng.normal(size=(n + 1, 2)).astype(np.float32), rng.integers(0, 3, n),
                     rng.normal(size=n).astype(np.float32), terminal=t) for n, t in zip(lens, [False, True])]


# ----------------------------------------------------------------------------- imitation -> jaxweight

def test_trajectories_from_imitation():
    eps = _episodes()
    t = imx.trajectories_from_imitation(eps, horizon=6)
    assert t.horizon == 6 and t.obs.shape == (2, 7, 2) and t.acts.dtype == jnp.int32
    np.testing.assert_array_equal(t.lengths, [5, 3])
    np.testing.assert_array_equal(t.terminal, [False, True])
    np.testing.assert_allclose(t.rews[1, :3], eps[1].rews)
    assert float(jnp.abs(t.rews[1, 3:]).sum()) == 0.0


@pytest.mark.parametrize("bad,match", [
    ([], "at least one episode"),
    ([object()], r"trajectories\[0\] has no obs/acts"),
    ([FakeTraj({"a": np.zeros(3)}, np.zeros(2))], "DictObs"),
    ([FakeTraj(np.zeros((3, 2)), np.zeros(3))], "observations"),
])
def test_trajectories_from_imitation_bad(bad, match):
    with pytest.raises(ValueError, match=match):
        imx.trajectories_from_imitation(bad)


def test_fragment_pairs_from_imitation():
    f = lambda v, term: FakeTraj(np.full((4, 2), v), np.zeros(3, int), np.full(3, v), terminal=term)  # noqa: E731
    pairs = imx.fragment_pairs_from_imitation([(f(1.0, False), f(2.0, True))])
    assert pairs.obs.shape == (1, 2, 4, 2) and pairs.fragment_length == 3
    np.testing.assert_array_equal(pairs.terminal, [[False, True]])
    with pytest.raises(ValueError, match="at least one pair"):
        imx.fragment_pairs_from_imitation([])
    with pytest.raises(ValueError, match="same length"):
        imx.fragment_pairs_from_imitation([(f(1.0, False), FakeTraj(np.zeros((3, 2)), np.zeros(2)))])


# ----------------------------------------------------------------------------- jaxweight -> imitation

def test_to_imitation_without_imitation_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "imitation", None)
    monkeypatch.setitem(sys.modules, "imitation.data", None)
    t = imx.trajectories_from_imitation(_episodes())
    with pytest.raises(ImportError, match="needs imitation: pip install imitation"):
        imx.trajectories_to_imitation(t)


@pytest.fixture
def fake_imitation(monkeypatch):
    """A stand-in ``imitation.data.types`` (the real one is used when installed)."""
    try:
        from imitation.data import types  # noqa: F401

        return types
    except ImportError:
        pass
    import types as pytypes

    @dataclass(frozen=True)
    class TrajectoryWithRew:
        obs: Any
        acts: Any
        infos: Any
        terminal: bool
        rews: Any

    mod = pytypes.ModuleType("imitation.data.types")
    mod.TrajectoryWithRew = TrajectoryWithRew
    pkg = pytypes.ModuleType("imitation")
    sub = pytypes.ModuleType("imitation.data")
    sub.types = mod
    pkg.data = sub
    monkeypatch.setitem(sys.modules, "imitation", pkg)
    monkeypatch.setitem(sys.modules, "imitation.data", sub)
    monkeypatch.setitem(sys.modules, "imitation.data.types", mod)
    return mod


def test_trajectories_round_trip(fake_imitation):
    t = imx.trajectories_from_imitation(_episodes(), horizon=7)
    out = imx.trajectories_to_imitation(t)
    assert [type(x).__name__ for x in out] == ["TrajectoryWithRew"] * 2
    assert [len(x.acts) for x in out] == [5, 3] and [len(x.obs) for x in out] == [6, 4]
    assert [x.terminal for x in out] == [False, True] and out[0].rews.dtype == np.float32
    back = imx.trajectories_from_imitation(out, horizon=7)
    jax.tree.map(np.testing.assert_array_equal, back, t)


def test_fragment_pairs_round_trip(fake_imitation):
    f = lambda v, term: FakeTraj(np.full((4, 2), v, np.float32), np.arange(3), np.full(3, v), terminal=term)  # noqa: E731
    pairs = imx.fragment_pairs_from_imitation([(f(1.0, False), f(2.0, True)), (f(3.0, True), f(4.0, False))])
    pairs = pairs.replace(valid=jnp.array([True, False]))
    out = imx.fragment_pairs_to_imitation(pairs)
    assert len(out) == 1 and out[0][1].terminal and float(out[0][1].rews[0]) == 2.0
    both = imx.fragment_pairs_to_imitation(pairs, only_valid=False)
    back = imx.fragment_pairs_from_imitation(both)
    jax.tree.map(np.testing.assert_array_equal, back, pairs.replace(valid=jnp.ones(2, bool)))


# ----------------------------------------------------------------------------- reward-net weights

OBS, N_ACT, HID = 4, 3, (8, 5)


def _net(**kw):
    return RewardMLP(hidden_sizes=HID, action_space=Discrete(N_ACT), **kw)


def _inputs(b=16, seed=1):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(b, OBS)).astype(np.float32)
    a = rng.integers(0, N_ACT, b).astype(np.int32)
    s2 = rng.normal(size=(b, OBS)).astype(np.float32)
    d = rng.random(b) < 0.3
    return s, a, s2, d


def _np_forward(sd, s, a, s2, d, prefix="mlp.", use_next_state=False, use_done=False):
    """imitation BasicRewardNet.forward in NumPy: cat(state, one_hot(action)[, next_state][, done]) -> MLP."""
    parts = [s, np.eye(N_ACT, dtype=np.float32)[a]]
    if use_next_state:
        parts.append(s2)
    if use_done:
        parts.append(d[:, None].astype(np.float32))
    x = np.concatenate(parts, 1)
    n_hidden = len([k for k in sd if k.endswith(".weight")]) - 1
    for i in range(n_hidden):
        x = np.maximum(x @ sd[f"{prefix}dense{i}.weight"].T + sd[f"{prefix}dense{i}.bias"], 0.0)
    return (x @ sd[f"{prefix}dense_final.weight"].T + sd[f"{prefix}dense_final.bias"])[:, 0]


@pytest.mark.parametrize("kw", [{}, {"use_next_state": True, "use_done": True}])
def test_state_dict_layout_and_rewards_match(kw):
    net = _net(**kw)
    params = net.init(jax.random.key(0), *_inputs())
    sd = imx.reward_params_to_state_dict(params, as_numpy=True)
    in_size = OBS + N_ACT + (OBS + 1 if kw else 0)
    assert list(sd) == ["mlp.dense0.weight", "mlp.dense0.bias", "mlp.dense1.weight", "mlp.dense1.bias",
                        "mlp.dense_final.weight", "mlp.dense_final.bias"]
    assert sd["mlp.dense0.weight"].shape == (HID[0], in_size) and sd["mlp.dense_final.weight"].shape == (1, HID[1])
    x = _inputs(seed=3)
    np.testing.assert_allclose(_np_forward(sd, *x, **kw), net.apply(params, *x), rtol=1e-5, atol=1e-6)
    back = imx.reward_params_from_state_dict(sd)
    jax.tree.map(lambda u, v: np.testing.assert_array_equal(np.asarray(u), np.asarray(v)), back, params)


def test_ensemble_state_dict_round_trip():
    net = _net()
    params = ensemble_init(0, net, _inputs(2), 3)
    sd = imx.reward_params_to_state_dict(params, as_numpy=True)
    assert len(sd) == 3 * 6 and "members.2.mlp.dense_final.bias" in sd
    np.testing.assert_array_equal(sd["members.1.mlp.dense1.weight"], np.asarray(params["params"]["dense1"]["kernel"][1]).T)
    back = imx.reward_params_from_state_dict(sd)
    jax.tree.map(lambda u, v: np.testing.assert_array_equal(np.asarray(u), np.asarray(v)), back, params)
    bare = imx.reward_params_to_state_dict(jax.tree.map(lambda x: x[0], params), prefix="", as_numpy=True)
    assert "dense0.weight" in bare
    jax.tree.map(lambda u, v: np.testing.assert_array_equal(np.asarray(u), np.asarray(v)),
                 imx.reward_params_from_state_dict(bare, prefix=""), jax.tree.map(lambda x: x[0], params))


def _sd():
    params = _net().init(jax.random.key(0), *_inputs())
    return imx.reward_params_to_state_dict(params, as_numpy=True)


@pytest.mark.parametrize("edit,match", [
    (lambda sd: sd.update({"mlp.normalize_input.running_mean": np.zeros(3)}), "not a mlp Linear weight"),
    (lambda sd: sd.update({"potential.dense0.weight": np.zeros((2, 2))}), "not a mlp Linear weight"),
    (lambda sd: sd.pop("mlp.dense_final.bias"), "needs both weight and bias"),
    (lambda sd: (sd.pop("mlp.dense_final.weight"), sd.pop("mlp.dense_final.bias")), "no dense_final"),
    (lambda sd: (sd.pop("mlp.dense0.weight"), sd.pop("mlp.dense0.bias")), "dense0..dense0"),
    (lambda sd: sd.update({"mlp.dense1.weight": np.zeros((5, 7), np.float32)}), "takes 7 inputs"),
    (lambda sd: sd.update({"mlp.dense1.bias": np.zeros(4, np.float32)}), "weight .* and bias"),
    (lambda sd: sd.update({"members.0.mlp.dense0.weight": np.zeros((8, 7))}), "mixes ensemble members"),
    (lambda sd: sd.clear(), "empty"),
])
def test_state_dict_import_refuses_foreign_layouts(edit, match):
    sd = _sd()
    edit(sd)
    with pytest.raises(ValueError, match=match):
        imx.reward_params_from_state_dict(sd)


@pytest.mark.parametrize("params,match", [
    ({}, "RewardMLP parameters"),
    ({"params": {"conv0": {"kernel": np.zeros((2, 2)), "bias": np.zeros(2)}}}, "dense0, dense1"),
    ({"params": {"dense_final": {"kernel": np.zeros((2, 1))}}}, "exactly 'kernel' and 'bias'"),
    ({"params": {"dense0": {"kernel": np.zeros((2, 2)), "bias": np.zeros(2)},
                 "dense_final": {"kernel": np.zeros((3, 2, 1)), "bias": np.zeros((3, 1))}}}, r"must all be \[in, out\] or all \[M, in, out\]"),
])
def test_state_dict_export_refuses_other_params(params, match):
    with pytest.raises(ValueError, match=match):
        imx.reward_params_to_state_dict(params, as_numpy=True)


def test_export_without_torch_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    params = _net().init(jax.random.key(0), *_inputs())
    with pytest.raises(ImportError, match="need torch .*as_numpy=True"):
        imx.reward_params_to_state_dict(params)


def _torch_basic_reward_net(th, in_size):
    """imitation's BasicRewardNet layout: ``mlp`` = build_mlp Sequential(dense0, act0, dense1, act1, dense_final)."""
    try:
        from imitation.util.networks import build_mlp

        mlp = build_mlp(in_size=in_size, hid_sizes=HID, out_size=1, squeeze_output=True)
    except ImportError:
        layers, prev = collections.OrderedDict(), in_size
        for i, h in enumerate(HID):
            layers[f"dense{i}"] = th.nn.Linear(prev, h)
            layers[f"act{i}"] = th.nn.ReLU()
            prev = h
        layers["dense_final"] = th.nn.Linear(prev, 1)
        mlp = th.nn.Sequential(layers)
    net = th.nn.Module()
    net.mlp = mlp
    return net


def test_torch_round_trip_1e6():
    th = pytest.importorskip("torch")
    net = _net()
    params = net.init(jax.random.key(4), *_inputs())
    tnet = _torch_basic_reward_net(th, OBS + N_ACT)
    tnet.load_state_dict(imx.reward_params_to_state_dict(params), strict=True)
    s, a, s2, d = _inputs(seed=5)
    x = th.cat([th.from_numpy(s), th.nn.functional.one_hot(th.from_numpy(a).long(), N_ACT).float()], 1)
    with th.no_grad():
        out = tnet.mlp(x).reshape(-1).numpy()
    np.testing.assert_allclose(out, np.asarray(net.apply(params, s, a, s2, d)), atol=1e-6, rtol=1e-6)
    # torch -> jaxweight after a torch-side change
    with th.no_grad():
        tnet.mlp.dense0.bias.add_(0.25)
    back = imx.reward_params_from_state_dict(tnet.state_dict())
    with th.no_grad():
        out2 = tnet.mlp(x).reshape(-1).numpy()
    np.testing.assert_allclose(np.asarray(net.apply(back, s, a, s2, d)), out2, atol=1e-6, rtol=1e-6)


def test_imitation_basic_reward_net_loads_our_weights():
    pytest.importorskip("torch")
    pytest.importorskip("imitation")
    import gymnasium as gym
    import torch as th
    from imitation.rewards.reward_nets import BasicRewardNet

    obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    tnet = BasicRewardNet(obs_space, gym.spaces.Discrete(N_ACT), hid_sizes=HID)
    net = _net()
    params = net.init(jax.random.key(6), *_inputs())
    tnet.load_state_dict(imx.reward_params_to_state_dict(params), strict=True)
    s, a, s2, d = _inputs(seed=7)
    want = tnet.predict(s, a, s2, d)
    np.testing.assert_allclose(want, np.asarray(net.apply(params, s, a, s2, d)), atol=1e-6, rtol=1e-6)
    back = imx.reward_params_from_state_dict(tnet.state_dict())
    jax.tree.map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=1e-7), back, params)
    del th
