"""jaxweight.sync: torchrl UpdateWeights semantics, path maps, placement, the host hook."""

import dataclasses
import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxweight import checkpoint, sync
from jaxweight.sync import SyncState, WeightSync, apply_update_map, config, resolve_path
from jaxweight.sync.placement import _bucket_fns, _shares_buffers
from tests.contracts import assert_trees_close


def fresh_state():
    """A fresh state (the config does not change it)."""
    return sync.init(config(1))


def _params(scale=1.0):
    return {
        "dense": {"kernel": scale * jnp.ones((3, 2), jnp.float32), "bias": scale * jnp.zeros((2,), jnp.float32)},
        "batch_stats": {"mean": scale * jnp.ones((2,), jnp.float32)},
        "step": jnp.asarray(0, jnp.int32),
    }


def _bump(p, by=1.0):
    return jax.tree.map(lambda x: x + jnp.asarray(by, x.dtype), p)


def _ptr(x):
    return x.unsafe_buffer_pointer()


# ------------------------------------------------------------ spec section 5
def test_example1_fire_pattern_interval3(jit_or_eager):
    """Spec 5.1: interval 3 over 9 ticks -> cumulative fires [0,0,1,1,1,2,2,2,3]."""
    f = jit_or_eager(lambda s, l, a: sync.step(s, l, a, config(3)))
    learner = _params()
    state, actor = fresh_state(), learner
    cumulative = []
    for _ in range(9):
        state, actor, fired = f(state, learner, actor)
        cumulative.append(int(state.version))
    assert cumulative == [0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert int(state.counter) == 9 and int(state.version) == 3 and int(state.last_sync) == 9


def test_example2_interval_zero_raises():
    """Spec 5.2: sync.step(..., interval=0) and WeightSync(0) raise ValueError."""
    p = _params()
    with pytest.raises(ValueError, match=r"^interval must be >= 1, got 0$"):
        sync.step(fresh_state(), p, p, config(0))
    with pytest.raises(ValueError, match=r"^interval must be >= 1, got 0$"):
        WeightSync(0)
    with pytest.raises(ValueError, match=r"interval must be >= 1, got -2"):
        sync.step(fresh_state(), p, p, config(-2))
    with pytest.raises(ValueError, match="interval"):
        WeightSync(2.5)
    with pytest.raises(ValueError, match="interval"):
        jax.jit(lambda s: sync.step(s, p, p, config(0)))(fresh_state())


def test_example3_same_device_sees_new_bias_without_fire():
    """Spec 5.3: change a learner bias, tick without a fire: the actor already shows it."""
    learner = _params()
    state, actor, fired = sync.step(fresh_state(), learner, learner, config(5))
    learner2 = {**learner, "dense": {**learner["dense"], "bias": jnp.asarray([7.0, -1.0], jnp.float32)}}
    state, actor, fired = sync.step(state, learner2, actor, config(5))
    assert not bool(fired)
    np.testing.assert_array_equal(actor["dense"]["bias"], [7.0, -1.0])
    # no copy: the very same arrays
    assert all(a is b for a, b in zip(jax.tree.leaves(actor), jax.tree.leaves(learner2)))
    hook = WeightSync(5)
    out = hook(learner2, learner)
    assert not hook.fired and out is learner2


def test_example4_restore_counter_mid_interval():
    """Spec 5.4: load_state_dict({"counter": 3}), interval 5: tick 4 no fire, tick 5 fires."""
    hook = WeightSync(5, copy_on_same_device=True)
    hook.load_state_dict({"counter": 3})
    assert hook.state_dict() == {"counter": 3, "version": 0, "last_sync": 0}
    p = _params()
    a = jax.device_put(p, may_alias=False)
    a = hook(_bump(p), a)
    assert not hook.fired and hook.counter == 4
    np.testing.assert_array_equal(a["dense"]["kernel"], p["dense"]["kernel"])
    a = hook(_bump(p), a)
    assert hook.fired and hook.state_dict() == {"counter": 5, "version": 1, "last_sync": 5}
    np.testing.assert_array_equal(a["dense"]["kernel"], p["dense"]["kernel"] + 1)


# ------------------------------------------------- torchrl behaviours, more
@pytest.mark.parametrize("interval", [1, 2, 4, 7])
def test_fire_pattern_several_intervals(interval, jit_or_eager):
    n = 15
    f = jit_or_eager(lambda s, l, a: sync.step(s, l, a, config(interval, copy_on_same_device=True)))
    hook = WeightSync(interval, copy_on_same_device=True)
    p = _params()
    state, actor, hactor = fresh_state(), jax.device_put(p, may_alias=False), jax.device_put(p, may_alias=False)
    fires, hfires, stale = [], [], []
    for _ in range(n):
        state, actor, fired = f(state, p, actor)
        hactor = hook(p, hactor)
        fires.append(bool(fired))
        hfires.append(hook.fired)
        stale.append(int(sync.staleness(state)))
    want = [(c % interval) == 0 for c in range(1, n + 1)]
    assert fires == want and hfires == want
    assert stale == [c % interval for c in range(1, n + 1)]
    assert int(state.version) == n // interval == hook.version
    assert int(state.last_sync) == (n // interval) * interval == hook.state_dict()["last_sync"]
    assert hook.staleness == n % interval


def test_copy_on_same_device_lags_exactly(jit_or_eager):
    """The actor holds the learner of the last fire; it changes only on fires."""
    k = 3
    f = jit_or_eager(lambda s, l, a: sync.step(s, l, a, config(k, copy_on_same_device=True)))
    learner = _params()
    state, actor = fresh_state(), jax.device_put(learner, may_alias=False)
    history = {0: learner}
    for step in range(1, 11):
        learner = _bump(learner)
        history[step] = learner
        state, actor, fired = f(state, learner, actor)
        assert_trees_close(actor, history[(step // k) * k])
        assert int(state.last_sync) == (step // k) * k


def test_same_device_every_tick_is_learner_and_counters_advance():
    learner = _params()
    state, actor = fresh_state(), learner
    for step in range(1, 7):
        learner = _bump(learner)
        state, actor, fired = sync.step(state, learner, actor, config(2))
        assert all(a is b for a, b in zip(jax.tree.leaves(actor), jax.tree.leaves(learner)))
        assert int(state.counter) == step and int(state.version) == step // 2


def test_same_device_when_placement_equals_learner_layout():
    """Outside jit, a placement equal to the learner's current layout means no copy."""
    learner = jax.device_put(_params(), jax.devices()[0])
    _, actor, _ = sync.step(fresh_state(), learner, learner, config(1, placement=jax.devices()[0]))
    assert all(a is b for a, b in zip(jax.tree.leaves(actor), jax.tree.leaves(learner)))


def test_same_device_update_map_aliases_learner_leaves():
    learner = {"loss_module": {"actor_network": _params()}, "critic": jnp.ones(4)}
    actor = {"policy": jax.device_put(_params(), may_alias=False), "eps": jnp.asarray(0.1, jnp.float32)}
    umap = {"policy": "loss_module.actor_network"}
    state, out, fired = sync.step(fresh_state(), learner, actor, config(10, update_map=umap))
    assert not bool(fired)
    assert all(a is b for a, b in zip(jax.tree.leaves(out["policy"]),
                                      jax.tree.leaves(learner["loss_module"]["actor_network"])))
    assert out["eps"] is actor["eps"]


# ------------------------------------------------------------- placement
def test_device_placement_lags_and_lives_on_actor_device(devices8):
    learner_dev, actor_dev = devices8[0], devices8[5]
    learner = jax.device_put(_params(), learner_dev)
    actor = jax.device_put(learner, actor_dev)
    state, k = fresh_state(), 2
    history = {0: learner}
    for step in range(1, 6):
        learner = _bump(learner)
        history[step] = learner
        state, actor, fired = sync.step(state, learner, actor, config(k, placement=actor_dev))
        assert bool(fired) == (step % k == 0)
        assert_trees_close(actor, history[(step // k) * k])
        assert all(x.devices() == {actor_dev} for x in jax.tree.leaves(actor))
    assert all(x.devices() == {learner_dev} for x in jax.tree.leaves(learner))


def test_sharding_and_pytree_of_shardings_placement(devices8):
    mesh = jax.make_mesh((4,), ("a",), devices=devices8[4:])
    rep, row = NamedSharding(mesh, P()), NamedSharding(mesh, P("a"))
    learner = jax.device_put({"w": jnp.arange(8.0), "b": jnp.ones(3)}, devices8[0])
    # one Sharding for the whole tree
    a1 = jax.device_put(learner, rep)
    _, a1, fired = sync.step(fresh_state(), _bump(learner), a1, config(1, placement=rep))
    assert bool(fired) and all(x.sharding.is_equivalent_to(rep, x.ndim) for x in jax.tree.leaves(a1))
    np.testing.assert_array_equal(a1["w"], np.arange(8.0) + 1)
    # a pytree of Shardings
    pl = {"w": row, "b": rep}
    a2 = jax.device_put(learner, pl)
    _, a2, fired = sync.step(fresh_state(), _bump(learner), a2, config(1, placement=pl))
    assert a2["w"].sharding.is_equivalent_to(row, 1) and a2["b"].sharding.is_equivalent_to(rep, 1)
    assert len(a2["w"].addressable_shards) == 4 and a2["w"].addressable_shards[0].data.shape == (2,)
    np.testing.assert_array_equal(a2["b"], np.full(3, 2.0))


@pytest.mark.parametrize("leaf_shape", [(4,), (1024, 1024)], ids=["small-packed", "large-direct"])
def test_one_device_put_for_the_whole_tree(devices8, monkeypatch, leaf_shape):
    calls = []
    real = jax.device_put

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    n = 20 if leaf_shape == (4,) else 2
    learner = jax.device_put({f"l{i}": jnp.full(leaf_shape, float(i)) for i in range(n)}, devices8[0])
    actor = jax.device_put(learner, devices8[1])
    monkeypatch.setattr(jax, "device_put", counting)
    state, actor, fired = sync.step(fresh_state(), learner, actor, config(1, placement=devices8[1]))
    assert bool(fired) and len(calls) == 1
    assert_trees_close(actor, learner)
    hook = WeightSync(1, placement=devices8[1], donate=False)
    calls.clear()
    hook(learner, actor)
    assert len(calls) == 1


def test_packed_transfer_keeps_dtypes_shapes_and_values(devices8):
    """Small trees travel as one buffer per dtype; every leaf comes back exactly."""
    rng = np.random.RandomState(0)
    learner = jax.device_put({
        "w": jnp.asarray(rng.randn(3, 5), jnp.float32),
        "scalar": jnp.asarray(2.5, jnp.float32),
        "count": jnp.asarray(rng.randint(-9, 9, (4,)), jnp.int32),
        "flags": jnp.asarray(rng.rand(2, 2) < 0.5),
        "half": jnp.asarray(rng.randn(6), jnp.bfloat16),
        "empty": jnp.zeros((0, 3), jnp.float32),
    }, devices8[0])
    before = _bucket_fns.cache_info()
    actor = sync.place(learner, devices8[2])
    after = _bucket_fns.cache_info()
    assert after.hits + after.misses == before.hits + before.misses + 1  # the packed path ran
    assert_trees_close(actor, learner)
    for x in jax.tree.leaves(actor):
        assert x.devices() == {devices8[2]}
    state, actor2, _ = sync.step(fresh_state(), _bump_numeric(learner), actor, config(1, placement=devices8[2]))
    assert_trees_close(actor2, _bump_numeric(learner))
    # typed PRNG keys cannot be packed: such trees take the direct path
    with_key = {**learner, "key": jax.device_put(jax.random.key(3), devices8[0])}
    moved = sync.place(with_key, devices8[2])
    assert_trees_close(moved, with_key)
    assert moved["key"].devices() == {devices8[2]}


def _bump_numeric(tree):
    return jax.tree.map(lambda x: x if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) or x.dtype == bool
                        else x + jnp.asarray(1, x.dtype), tree)


def test_jit_sharding_constraint_and_donation(devices8):
    """The jitted recipe: ``jax.jit(sync.step, donate_argnums=2)`` writes fires into the old actor."""
    mesh = jax.make_mesh((4,), ("a",), devices=devices8[:4])
    rep, row = NamedSharding(mesh, P()), NamedSharding(mesh, P("a"))
    pl = {"w": row, "b": rep}
    learner = jax.device_put({"w": jnp.arange(8.0), "b": jnp.ones(2)}, rep)
    actor = jax.device_put(learner, pl)
    cfg = config(2, placement=pl)
    state = sync.init(cfg)
    run = jax.jit(sync.step, donate_argnums=2)
    for i in range(1, 5):
        learner = _bump(learner)
        old = actor
        state, actor, fired = run(state, learner, actor, cfg)
        assert bool(fired) == (i % 2 == 0)
        assert old["w"].is_deleted()  # donated
        assert actor["w"].sharding.is_equivalent_to(row, 1)
        np.testing.assert_array_equal(actor["w"], np.arange(8.0) + 2 * (i // 2))


def test_donating_jitted_step_needs_an_actor_that_owns_its_buffers(devices8):
    """place() of a tree already at the placement aliases the learner; ``copy=True`` gives the actor
    its own buffers, which a jitted step may donate without touching the learner."""
    mesh = jax.make_mesh((4,), ("a",), devices=devices8[:4])
    rep = NamedSharding(mesh, P())
    learner = jax.device_put({"w": jnp.arange(8.0)}, rep)
    assert _shares_buffers(sync.place(learner, rep), learner)
    actor = sync.place(learner, rep, copy=True)
    assert not _shares_buffers(actor, learner)
    cfg = config(2, placement=rep)
    run = jax.jit(sync.step, donate_argnums=2)
    state, a1, _ = run(fresh_state(), learner, actor, cfg)
    assert actor["w"].is_deleted() and not learner["w"].is_deleted()
    state, a2, fired = run(state, _bump(learner), a1, cfg)
    assert bool(fired) and a1["w"].is_deleted() and not learner["w"].is_deleted()
    np.testing.assert_array_equal(a2["w"], np.arange(8.0) + 1)


def test_weightsync_donates_old_actor_but_never_the_learner(devices8):
    learner = jax.device_put(_params(), devices8[0])
    actor = jax.device_put(learner, devices8[2])
    hook = WeightSync(2, placement=devices8[2])
    a1 = hook(learner, actor)
    assert a1 is actor and not any(x.is_deleted() for x in jax.tree.leaves(actor))
    a2 = hook(_bump(learner), a1)
    assert hook.fired and all(x.is_deleted() for x in jax.tree.leaves(actor))
    assert not any(x.is_deleted() for x in jax.tree.leaves(learner) + jax.tree.leaves(a2))
    # an eager step does not donate unless asked
    _, a3, _ = sync.step(fresh_state(), learner, a2, config(1, placement=devices8[2]))
    assert not any(x.is_deleted() for x in jax.tree.leaves(a2))
    _, _, _ = sync.step(fresh_state(), learner, a3, config(1, placement=devices8[2], donate=True))
    assert all(x.is_deleted() for x in jax.tree.leaves(a3))


def test_donation_frees_the_old_actor_before_the_transfer(devices8):
    """The actor's devices never hold the old and the new copy at once (torchrl copies in place)."""
    learner = jax.device_put({"net": {"w": jnp.ones(3)}, "opt": jnp.zeros(5)}, devices8[0])
    seen = []

    def transport(tree, placement):
        seen.append([x.is_deleted() for x in jax.tree.leaves(old)])
        return jax.device_put(tree, placement)

    old = jax.device_put(learner, devices8[1])
    hook = WeightSync(1, placement=devices8[1], transport=transport)
    new = hook(learner, old)
    assert seen == [[True, True]] and not any(x.is_deleted() for x in jax.tree.leaves(learner))
    assert_trees_close(new, learner)
    # with a map only the replaced subtree goes; the rest of the actor stays alive
    old = jax.device_put({"pol": {"w": jnp.zeros(3)}, "temp": jnp.ones(())}, devices8[1])
    seen.clear()
    hook = WeightSync(1, placement=devices8[1], update_map={"pol": "net"}, transport=transport)
    new = hook(learner, old)
    assert seen == [[True, False]]  # leaves in key order: pol.w, temp
    assert new["temp"] is old["temp"]
    # donate=False keeps the old actor
    old = jax.device_put(learner, devices8[1])
    seen.clear()
    WeightSync(1, placement=devices8[1], transport=transport, donate=False)(learner, old)
    assert seen == [[False, False]]


def test_update_map_with_placement_copies_only_the_mapped_part(devices8):
    learner = jax.device_put({"net": {"w": jnp.ones(3)}, "opt": jnp.zeros(5)}, devices8[0])
    actor = jax.device_put({"pol": {"w": jnp.zeros(3)}, "temp": jnp.ones(())}, devices8[3])
    hook = WeightSync(1, placement=devices8[3], update_map={"pol": "net"})
    new = hook(learner, actor)
    np.testing.assert_array_equal(new["pol"]["w"], np.ones(3))
    assert new["pol"]["w"].devices() == {devices8[3]}
    assert new["temp"] is actor["temp"] and not actor["temp"].is_deleted()
    assert actor["pol"]["w"].is_deleted()


def test_place_initial_actor(devices8):
    learner = jax.device_put(_params(), devices8[0])
    assert sync.place(learner) is learner
    actor = sync.place(learner, devices8[6])
    assert all(x.devices() == {devices8[6]} for x in jax.tree.leaves(actor))
    assert_trees_close(actor, learner)
    assert jax.tree.structure(actor) == jax.tree.structure(learner)


def test_bad_placement_rejected():
    p = _params()
    with pytest.raises(ValueError, match="placement must be"):
        sync.step(fresh_state(), p, p, config(1, placement="cpu:1"))
    with pytest.raises(ValueError, match="placement must be"):
        WeightSync(1, placement={"a": 3})


# ------------------------------------------------------------ tree checks
def test_tree_mismatch_names_first_path():
    p = _params()
    q = {**p, "dense": {**p["dense"], "bias": jnp.zeros((3,), jnp.float32)}}
    want = r"first mismatch at 'dense\.bias': shape \(2,\) in learner_params vs \(3,\) in actor_params"
    with pytest.raises(ValueError, match=want):
        sync.step(fresh_state(), p, q, config(2))
    q = {**p, "step": jnp.asarray(0, jnp.int16)}
    with pytest.raises(ValueError, match=r"'step': dtype int32 in learner_params vs int16 in actor_params"):
        sync.step(fresh_state(), p, q, config(2, copy_on_same_device=True))
    q = {k: v for k, v in p.items() if k != "batch_stats"}
    with pytest.raises(ValueError, match=r"'batch_stats': present in learner_params only"):
        WeightSync(2)(p, q)
    q = {**p, "layers": [jnp.ones(2), jnp.ones(3)]}
    r = {**p, "layers": [jnp.ones(2), jnp.ones(4)]}
    with pytest.raises(ValueError, match=r"'layers\[1\]': shape \(3,\) in learner_params vs \(4,\) in actor_params"):
        jax.jit(lambda s: sync.step(s, q, r, config(2)))(fresh_state())


def test_batched_state_without_vmap_rejected():
    states = jax.vmap(lambda _: fresh_state())(jnp.arange(3))
    p = _params()
    with pytest.raises(ValueError, match="vmap"):
        sync.step(states, p, p, config(2))


# -------------------------------------------------------------- path maps
class _NT(NamedTuple):
    a: jax.Array
    b: list


@struct.dataclass
class _Struct:
    params: dict
    tag: str = struct.field(pytree_node=False, default="x")


@dataclasses.dataclass
class _Plain:
    policy: dict


def _tree(scale=1.0):
    return {
        "loss_module": {"actor_network": {"kernel": scale * jnp.ones((2, 2)), "bias": jnp.zeros(2)}},
        "replay_buffer": {"transforms": [scale * jnp.arange(3.0), (scale * jnp.ones(1), jnp.zeros(1))]},
        "nt": _NT(a=scale * jnp.ones(4), b=[scale * jnp.ones(1)]),
        "st": _Struct(params={"w": jnp.full((2,), 3.0 * scale)}),
        "plain": _Plain(policy={"layers": [{"kernel": scale * jnp.ones(5)}]}),
    }


def test_resolve_path_grammar():
    t = _tree()
    assert resolve_path(t, "") is t
    assert resolve_path(t, "loss_module.actor_network") is t["loss_module"]["actor_network"]
    assert resolve_path(t, "replay_buffer.transforms[0]") is t["replay_buffer"]["transforms"][0]
    assert resolve_path(t, "replay_buffer.transforms[1][1]") is t["replay_buffer"]["transforms"][1][1]
    assert resolve_path(t, "nt.a") is t["nt"].a
    assert resolve_path(t, "nt.b[0]") is t["nt"].b[0]
    assert resolve_path(t, "st.params.w") is t["st"].params["w"]
    assert resolve_path(t, "plain.policy.layers[0].kernel") is t["plain"].policy["layers"][0]["kernel"]
    assert resolve_path([t, 1], "[0].nt.a") is t["nt"].a
    assert sync.parse_path("policy.layers[0].kernel") == ("policy", "layers", 0, "kernel")


def test_resolve_path_missing_names_first_missing_part():
    t = {"a": {"x": [{"c": 1}]}}
    with pytest.raises(KeyError) as e:
        resolve_path(t, "a.b[0].c")
    assert e.value.args[0] == "path 'a.b[0].c': no entry 'b'"
    with pytest.raises(KeyError, match=r"no entry '\[3\]'"):
        resolve_path(t, "a.x[3].c")
    with pytest.raises(KeyError, match="no entry 'd'"):
        resolve_path(t, "a.x[0].c.d")  # below a leaf
    with pytest.raises(KeyError, match="no entry 'tag'"):
        resolve_path(_Struct(params={}), "tag")  # static fields are not part of the tree


@pytest.mark.parametrize("bad", ["a..b", "a.", ".a", "a[", "a[x]", "a[-1]", "a]", "a[0]b", "a b", "a.[0]"])
def test_bad_path_syntax(bad):
    with pytest.raises(ValueError, match="bad path"):
        resolve_path({"a": {"b": 1}}, bad)


def test_apply_update_map_replaces_only_destinations():
    learner = _tree()
    actor = _tree(0.0)
    out = apply_update_map(actor, learner, {"loss_module.actor_network": "loss_module.actor_network",
                                            "replay_buffer.transforms[1][0]": "nt.b[0]",
                                            "plain.policy": "plain.policy"})
    assert out["loss_module"]["actor_network"]["kernel"] is learner["loss_module"]["actor_network"]["kernel"]
    assert out["replay_buffer"]["transforms"][1][0] is learner["nt"].b[0]
    assert out["replay_buffer"]["transforms"][1][1] is actor["replay_buffer"]["transforms"][1][1]
    assert out["plain"].policy is learner["plain"].policy and isinstance(out["plain"], _Plain)
    assert out["nt"] is actor["nt"] and out["st"] is actor["st"]
    assert isinstance(out["replay_buffer"]["transforms"][1], tuple)
    # actor untouched
    assert float(actor["loss_module"]["actor_network"]["kernel"][0, 0]) == 0.0
    # whole tree
    assert apply_update_map(actor, learner, {"": ""}) is learner


def test_apply_update_map_errors_name_both_paths():
    t = _tree()
    with pytest.raises(ValueError, match=r"'st\.params' <- 'nt\.a'.*first mismatch at '<root>'"):
        apply_update_map(t, t, {"st.params": "nt.a"})
    want = r"'replay_buffer\.transforms\[0\]' <- 'nt\.a'.*shape \(4,\) in the source vs \(3,\) in the destination"
    with pytest.raises(ValueError, match=want):
        apply_update_map(t, t, {"replay_buffer.transforms[0]": "nt.a"})
    with pytest.raises(ValueError, match=r"destinations 'loss_module' and 'loss_module\.actor_network' overlap"):
        apply_update_map(t, t, {"loss_module": "loss_module", "loss_module.actor_network": "loss_module.actor_network"})
    with pytest.raises(ValueError, match="overlap"):
        WeightSync(2, update_map=[("", ""), ("nt", "nt")])
    with pytest.raises(KeyError, match="no entry 'actor'"):
        apply_update_map(t, t, {"loss_module.actor": "loss_module.actor_network"})
    with pytest.raises(ValueError, match="bad path"):
        WeightSync(2, update_map={"a..b": "c"})


# ------------------------------------------------------------------ state
def test_vmap_over_sync_states_with_per_actor_params():
    counters = jnp.asarray([0, 1, 2, 5], jnp.int32)
    states = jax.vmap(lambda c: fresh_state().replace(counter=c))(counters)
    learner = _params(2.0)
    actors = jax.vmap(lambda i: _params(0.0))(jnp.arange(4))
    new, actors2, fired = jax.jit(jax.vmap(lambda s, a: sync.step(s, learner, a, config(3, copy_on_same_device=True)),
                                           in_axes=(0, 0)))(states, actors)
    np.testing.assert_array_equal(fired, [False, False, True, True])
    np.testing.assert_array_equal(new.version, [0, 0, 1, 1])
    np.testing.assert_array_equal(new.last_sync, [0, 0, 3, 6])
    np.testing.assert_array_equal(actors2["dense"]["kernel"][:, 0, 0], [0.0, 0.0, 2.0, 2.0])


def test_tick_inside_scan_loop():
    def body(carry, _):
        state, learner, actor = carry
        learner = _bump(learner)
        state, actor, fired = sync.step(state, learner, actor, config(4, copy_on_same_device=True))
        return (state, learner, actor), actor["dense"]["bias"][0]

    p = _params(0.0)
    (state, _, _), seen = jax.jit(lambda c: jax.lax.scan(body, c, None, length=10))((fresh_state(), p, p))
    np.testing.assert_array_equal(seen, [0, 0, 0, 4, 4, 4, 4, 8, 8, 8])
    assert int(state.version) == 2 and int(state.last_sync) == 8


def test_static_hashable_update_map_under_jit():
    learner = {"net": {"w": jnp.ones(3)}}
    actor = {"pol": {"w": jnp.zeros(3)}}
    f = jax.jit(sync.step)  # the config is a jit argument: its map and placement are static, hashable
    cfg = config(1, update_map={"pol": "net"}, copy_on_same_device=True)
    s, a, fired = f(fresh_state(), learner, actor, cfg)
    np.testing.assert_array_equal(a["pol"]["w"], np.ones(3))
    assert hash(cfg.update_map) == hash(config(1, update_map=[("pol", "net")]).update_map)


def test_sync_state_checkpoint_inside_training_state(tmp_path):
    @struct.dataclass
    class Train:
        params: dict
        sync: SyncState

    p = _params()
    s = fresh_state()
    for _ in range(7):
        s, _, _ = sync.step(s, p, p, config(3))
    ts = Train(params=p, sync=s)
    checkpoint.save(tmp_path / "t.ckpt", ts)
    back = checkpoint.load(tmp_path / "t.ckpt", Train(params=_params(0.0), sync=fresh_state()))
    assert_trees_close(back, ts)
    assert (int(back.sync.counter), int(back.sync.version), int(back.sync.last_sync)) == (7, 2, 6)
    assert back.sync.counter.dtype == jnp.int32


# --------------------------------------------------------------- host hook
def test_state_dict_roundtrip_json_and_torchrl_dicts():
    hook = WeightSync(3)
    p = _params()
    for _ in range(7):
        hook(p, p)
    d = json.loads(json.dumps(hook.state_dict()))
    assert d == {"counter": 7, "version": 2, "last_sync": 6}
    h2 = WeightSync(3)
    h2.load_state_dict(d)
    assert h2.state_dict() == d and h2.staleness == 1
    assert_trees_close(h2.state, hook.state)
    h2.load_state_dict({"counter": 10, "last_update_count": 9})
    assert h2.state_dict() == {"counter": 10, "version": 0, "last_sync": 9}
    h2.load_state_dict({"counter": np.int64(4)})
    assert h2.state_dict() == {"counter": 4, "version": 0, "last_sync": 0}
    with pytest.raises(KeyError, match="counter"):
        h2.load_state_dict({"version": 1})
    with pytest.raises(ValueError, match="counter"):
        h2.load_state_dict({"counter": -1})
    with pytest.raises(ValueError, match="last_sync"):
        h2.load_state_dict({"counter": 2, "last_sync": 5})
    with pytest.raises(ValueError, match="counter"):
        h2.load_state_dict({"counter": 1.5})


def test_hook_state_setter_and_metrics():
    hook = WeightSync(4)
    s = fresh_state()
    p = _params()
    for _ in range(6):
        s, _, _ = sync.step(s, p, p, config(4))
    hook.state = s
    assert hook.state_dict() == {"counter": 6, "version": 1, "last_sync": 4}
    hook(p, p)
    m = hook.metrics()
    assert m == {"sync/counter": 7.0, "sync/version": 1.0, "sync/last_sync": 4.0,
                 "sync/staleness": 3.0, "sync/fired": 0.0}
    hook(p, p)
    assert hook.fired and hook.metrics()["sync/staleness"] == 0.0
    assert hook.state.counter.dtype == jnp.int32 and "counter=8" in repr(hook)


@settings(max_examples=30, deadline=None)
@given(interval=st.integers(1, 9), start=st.integers(0, 40), n=st.integers(0, 30))
def test_property_counters_match_closed_form(interval, start, n):
    """After restoring counter=start and n more calls: fires exactly at multiples of interval."""
    hook = WeightSync(interval)
    hook.load_state_dict({"counter": start})
    p = {"w": jnp.zeros(2)}
    fires = []
    for _ in range(n):
        hook(p, p)
        fires.append(hook.fired)
    assert fires == [(c % interval) == 0 for c in range(start + 1, start + n + 1)]
    end = start + n
    n_fires = end // interval - start // interval
    assert hook.version == n_fires
    if n_fires:
        assert hook.state_dict()["last_sync"] == (end // interval) * interval
        assert hook.staleness == end % interval


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_property_update_map_roundtrip(data):
    """resolve(apply(actor, learner, {d: s}), d) is resolve(learner, s); other leaves unchanged."""
    shapes = [(2,), (3,), (2, 2)]
    names = ["a", "b", "c"]
    learner = {n: {"x": jnp.full(shapes[i], float(i)), "y": [jnp.ones(1), jnp.ones(shapes[i])]}
               for i, n in enumerate(names)}
    actor = jax.tree.map(jnp.zeros_like, learner)
    dest = data.draw(st.sampled_from(names))
    sub = data.draw(st.sampled_from(["", ".x", ".y[1]", ".y"]))
    out = apply_update_map(actor, learner, {dest + sub: dest + sub})
    assert resolve_path(out, dest + sub) is resolve_path(learner, dest + sub)
    for n in names:
        if n != dest:
            assert out[n] is actor[n]


# ---------------------------------------------------------------- benchmark
@pytest.mark.slow
@pytest.mark.smoke
def test_bench_sync_quick_runs(tmp_path):
    """Smoke: ``python -m jaxweight bench --only sync --quick`` runs (2 fake devices in a subprocess).

    Beyond running, it checks what does not depend on timing: the same-device
    tick copies no byte, and every goal of the issue has its record.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "sync.json"
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "jaxweight", "bench", "--only", "sync", "--quick", "--json", str(out)],
                       cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = {rec["name"]: rec for rec in json.loads(out.read_text())}
    assert all(rec["module"] == "sync" for rec in recs.values())
    same = [rec for name, rec in recs.items() if name.startswith("same-device tick")]
    assert len(same) == 2 and all(rec["bytes_copied"] == 0 for rec in same)
    cross = [rec for name, rec in recs.items() if name.startswith("cross-device sync")]
    assert len(cross) == 2 and all(rec["gbytes_per_s"] > 0 and rec["ratio"] > 0 for rec in cross)
    fractions = [rec for rec in recs.values() if "fraction" in rec]
    assert len(fractions) == 4 and all(rec["interval"] == sync.DEFAULT_INTERVAL for rec in fractions)


# ------------------------------------------------------ metrics, leaves, host counters
def test_metrics_dict_and_one_staleness_definition():
    cfg = config(3)
    s = sync.init(cfg)
    hook = WeightSync(3)
    p = _params()
    for _ in range(4):
        s, _, _ = sync.step(s, p, p, cfg)
        hook(p, p)
    assert sync.metrics_dict(s) == {"sync/version": 1.0, "sync/staleness": 1.0, "sync/counter": 4.0}
    assert int(s.staleness) == int(sync.staleness(s)) == hook.staleness == 1
    assert hook.metrics()["sync/staleness"] == sync.metrics_dict(hook.state)["sync/staleness"]
    # batched states: means
    states = jax.vmap(lambda c: sync.init(cfg).replace(counter=c))(jnp.asarray([2, 4], jnp.int32))
    assert sync.metrics_dict(states)["sync/counter/mean"] == 3.0


def test_interval_is_a_leaf_new_values_do_not_recompile():
    p = _params()
    traces = []

    @jax.jit
    def f(s, cfg):
        traces.append(1)
        return sync.step(s, p, p, cfg)

    for iv in (2, 3, 5):
        s = sync.init(config(iv))
        for _ in range(6):
            s, _, fired = f(s, config(iv))
        assert int(s.version) == 6 // iv
    assert len(traces) == 1
    # and vmappable over stacked configs
    cfgs = jax.tree.map(lambda *x: jnp.stack(x), config(2), config(3))
    s0 = jax.vmap(lambda _: sync.init(config(1)))(jnp.arange(2))
    s1, _, fired = jax.vmap(lambda s, c: sync.step(s, p, p, c))(s0.replace(counter=jnp.asarray([1, 2], jnp.int32)), cfgs)
    np.testing.assert_array_equal(fired, [True, True])


def test_eager_tick_keeps_counters_on_the_host():
    cfg = config(2)
    s, a, fired = sync.step(sync.init(cfg), _params(), _params(), cfg)
    assert all(type(x) is np.ndarray and x.dtype == np.int32 for x in (s.counter, s.version, s.last_sync))
    # and the same state goes into jit
    s2, _, fired = jax.jit(sync.step)(s, _params(), _params(), cfg)
    assert bool(fired) and int(s2.version) == 1
