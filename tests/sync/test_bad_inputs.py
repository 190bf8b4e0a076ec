"""Bad inputs of jaxweight.sync: each case asserts the error type and a fragment of its message.

Hyperparameter checks give the same message eagerly and under ``jaxweight.checked(jax.jit(...))``.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxweight
from jaxweight import sync


def _params(scale=1.0):
    return {
        "dense": {"kernel": scale * jnp.ones((3, 2), jnp.float32), "bias": jnp.zeros((2,), jnp.float32)},
        "stats": {"mean": jnp.ones((2,), jnp.float32)},
    }


def _state():
    return sync.init(sync.config(1))


MODES = ["eager", "checked_jit"]


# ------------------------------------------------------------- interval
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("interval", [0, -3])
def test_interval_below_one_same_message_eager_and_jit(mode, interval):
    p = _params()
    msg = f"interval must be >= 1, got {interval}"
    with pytest.raises(ValueError, match=re.escape(msg)):
        if mode == "eager":
            sync.step(_state(), p, p, sync.config(interval))
        else:
            f = jaxweight.checked(jax.jit(lambda iv: sync.step(_state(), p, p, sync.config(iv))[2]))
            f(jnp.int32(interval))


@pytest.mark.parametrize("mode", MODES)
def test_interval_replaced_in_config_is_checked(mode):
    """A config leaf set by hand (cfg.replace): the constructor refuses a concrete bad value,
    ``jaxweight.checked`` a traced one (checked by step)."""
    p = _params()
    with pytest.raises(ValueError, match=re.escape("interval must be >= 1, got 0")):
        if mode == "eager":
            sync.config(2).replace(interval=np.asarray(0, np.int32))
        else:
            run = jaxweight.checked(jax.jit(lambda iv: sync.step(_state(), p, p, sync.config(2).replace(interval=iv))))
            run(jnp.int32(0))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("interval", [0, -3])
def test_host_hook_interval_eager_and_traced(mode, interval):
    """WeightSync keeps the interval on the host: a traced one is refused
    with a ValueError naming it, not a ConcretizationTypeError from int()."""
    if mode == "eager":
        eager = re.escape(f"interval must be >= 1, got {interval}")
        with pytest.raises(ValueError, match=eager):
            sync.WeightSync(interval)
        return
    msg = "interval must be static (a concrete number, not traced under jax.jit) and >= 1, got a traced int32[]"
    with pytest.raises(ValueError, match=re.escape(msg)):
        jaxweight.checked(jax.jit(lambda iv: (sync.WeightSync(iv), jnp.zeros(()))[1]))(jnp.int32(interval))


@pytest.mark.parametrize("interval", [2.5, True, "3", None, np.float32(2.0), [2]])
def test_interval_not_an_integer(interval):
    with pytest.raises(ValueError, match="interval must be"):
        sync.config(interval)


def test_interval_beyond_int32():
    with pytest.raises(ValueError, match=r"interval must be < 2\*\*31"):
        sync.config(2**31)


@pytest.mark.parametrize("kw", [dict(copy_on_same_device="yes"), dict(donate=1)])
def test_flags_must_be_bools(kw):
    with pytest.raises(ValueError, match="must be a bool"):
        sync.config(2, **kw)


# ------------------------------------------------------------- tree mismatch
def _mismatched():
    p = _params()
    shape = {**p, "dense": {**p["dense"], "bias": jnp.zeros((3,), jnp.float32)}}
    dtype = {**p, "dense": {**p["dense"], "bias": jnp.zeros((2,), jnp.int32)}}
    extra = {**p, "extra": jnp.zeros(())}
    missing = {"dense": p["dense"]}
    return {"shape": (shape, "'dense.bias': shape (2,)"), "dtype": (dtype, "'dense.bias': dtype"),
            "extra": (extra, "'extra': present in actor_params only"),
            "missing": (missing, "'stats': present in learner_params only")}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["shape", "dtype", "extra", "missing"])
@pytest.mark.parametrize("copy", [False, True], ids=["same-device", "copy"])
def test_mismatched_learner_actor_trees_name_the_path(mode, kind, copy):
    actor, frag = _mismatched()[kind]
    p = _params()
    cfg = sync.config(2, copy_on_same_device=copy)
    with pytest.raises(ValueError, match=re.escape(frag)):
        if mode == "eager":
            sync.step(_state(), p, actor, cfg)
        else:
            jaxweight.checked(jax.jit(sync.step))(_state(), p, actor, cfg)


# ------------------------------------------------------------- update maps
@pytest.mark.parametrize("umap,err,frag", [
    ({"a..b": "dense"}, ValueError, "bad path 'a..b'"),
    ({"pol": "dense[x]"}, ValueError, "bad path 'dense[x]'"),
    ({"pol": "dense", "pol.kernel": "dense.kernel"}, ValueError, "overlap"),
    ({"pol": 3}, ValueError, "update_map paths must be str"),
    ("pol", ValueError, "update_map must be a mapping"),
])
def test_bad_update_map_at_config_time(umap, err, frag):
    with pytest.raises(err, match=re.escape(frag)):
        sync.config(1, update_map=umap)


@pytest.mark.parametrize("umap,err,frag", [
    ({"pol": "nope"}, KeyError, "path 'nope': no entry 'nope'"),
    ({"pol": "dense.nope"}, KeyError, "path 'dense.nope': no entry 'nope'"),
    ({"nope": "dense"}, KeyError, "path 'nope': no entry 'nope'"),
    ({"pol": "stats"}, ValueError, "update_map entry 'pol' <- 'stats'"),
])
def test_bad_update_map_paths_at_step_time(umap, err, frag):
    learner = _params()
    actor = {"pol": {"kernel": jnp.zeros((3, 2), jnp.float32), "bias": jnp.zeros((2,), jnp.float32)}}
    with pytest.raises(err, match=re.escape(frag)):
        sync.step(_state(), learner, actor, sync.config(1, update_map=umap, copy_on_same_device=True))


# ------------------------------------------------------------- placement and state
@pytest.mark.parametrize("placement", ["cpu:1", 3, {"dense": "cpu"}, [None]])
def test_bad_placement(placement):
    with pytest.raises(ValueError, match="placement must be None, a jax.Device"):
        sync.config(1, placement=placement)


@pytest.mark.parametrize("state,frag", [
    ({"counter": 0}, "state must be a SyncState"),
    (None, "state must be a SyncState"),
])
def test_bad_state(state, frag):
    p = _params()
    with pytest.raises(ValueError, match=frag):
        sync.step(state, p, p, sync.config(1))


def test_batched_state_without_vmap():
    p = _params()
    states = jax.vmap(lambda _: _state())(jnp.arange(3))
    with pytest.raises(ValueError, match=r"state.counter must be a scalar i32\[\].*jax.vmap"):
        sync.step(states, p, p, sync.config(1))


def test_cfg_must_be_a_sync_config():
    with pytest.raises(ValueError, match="cfg must be a SyncConfig"):
        sync.init({"interval": 1})
    with pytest.raises(ValueError, match="cfg must be a SyncConfig"):
        sync.step(_state(), _params(), _params(), {"interval": 1})


# ------------------------------------------------------------- load_state_dict
@pytest.mark.parametrize("d,frag", [
    ([("counter", 3)], "expected a mapping"),
    (None, "expected a mapping"),
    ("counter=3", "expected a mapping"),
    ({"counter": -1}, "entry 'counter' must be a non-negative int"),
    ({"counter": 1.5}, "entry 'counter' must be a non-negative int"),
    ({"counter": "3"}, "entry 'counter' must be a non-negative int"),
    ({"counter": True}, "entry 'counter' must be a non-negative int"),
    ({"counter": [1, 2]}, "entry 'counter' must be a non-negative int"),
    ({"counter": 2**40}, "entry 'counter' must be a non-negative int < 2**31"),
    ({"counter": 3, "version": -2}, "entry 'version' must be a non-negative int"),
    ({"counter": 3, "last_update_count": "x"}, "entry 'last_sync' must be a non-negative int"),
    ({"counter": 2, "last_sync": 5}, "last_sync (5) must be <= counter (2)"),
])
def test_malformed_state_dict(d, frag):
    hook = sync.WeightSync(3)
    hook(_params(), _params())
    with pytest.raises(jaxweight.StateFileError, match=re.escape(frag)):
        hook.load_state_dict(d)
    # the hook is unchanged by a refused load
    assert hook.state_dict() == {"counter": 1, "version": 0, "last_sync": 0}


def test_state_dict_without_counter_is_a_key_error_and_a_state_file_error():
    hook = sync.WeightSync(3)
    with pytest.raises(KeyError, match="no 'counter' entry"):
        hook.load_state_dict({"version": 1})
    with pytest.raises(jaxweight.StateFileError, match=r"no 'counter' entry \(keys: \['version'\]\)"):
        hook.load_state_dict({"version": 1})


def test_transport_must_be_callable():
    with pytest.raises(ValueError, match="transport must be a callable"):
        sync.WeightSync(2, transport="nccl")
