"""jaxweight.sync: the component contract (tests/contracts.py), donation, one implementation."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxweight import sync
from tests.contracts import assert_no_retrace, assert_trees_close, assert_vmap_matches_loop, check_state_contract


def _params(scale=1.0):
    return {"dense": {"kernel": scale * jnp.ones((3, 2), jnp.float32), "bias": scale * jnp.zeros((2,), jnp.float32)},
            "step": jnp.asarray(0, jnp.int32)}


def _bump(p, by=1.0):
    return jax.tree.map(lambda x: x + jnp.asarray(by, x.dtype), p)


def test_step_contract(tmp_path):
    """jit == eager, stable layout, no recompilation for a new interval, vmap over states and over
    stacked configs (a hyperparameter sweep), checkpoint round trip, donation of the actor."""
    cfg, cfg2 = sync.config(3, copy_on_same_device=True), sync.config(5, copy_on_same_device=True)
    learner, actor = _params(), _params(0.0)
    counters = jnp.arange(4, dtype=jnp.int32) + 1
    check_state_contract(
        init=lambda: sync.init(cfg),
        update=sync.step,
        update_args=(learner, actor, cfg),
        update_args_alt=(_bump(learner, 2.0), _bump(actor, 3.0), cfg2),
        batched_init=lambda: jax.vmap(lambda c: sync.init(cfg).replace(counter=c))(counters),
        tmp_path=tmp_path,
    )
    # a sweep over the interval: stacked configs, one program; fires where (counter + 1) % interval == 0
    cfgs = jax.tree.map(lambda *x: jnp.stack(x), *[sync.config(i, copy_on_same_device=True) for i in (1, 2, 3, 5)])
    states = jax.vmap(lambda c: sync.init(cfg).replace(counter=c))(counters)
    out = assert_vmap_matches_loop(lambda s, c: sync.step(s, learner, actor, c), (0, 0), states, cfgs)
    np.testing.assert_array_equal(out[2], [True, False, False, True])
    assert_no_retrace(lambda s, c: sync.step(s, learner, actor, c), (sync.init(cfg), cfg), (sync.init(cfg2), cfg2))
    # donation: the jitted step consumes the old actor and gives the eager result
    want = sync.step(sync.init(cfg).replace(counter=jnp.int32(2)), learner, actor, cfg)
    old = sync.place(actor, copy=True)
    got = jax.jit(sync.step, donate_argnums=(0, 2))(sync.init(cfg).replace(counter=jnp.int32(2)), learner, old, cfg)
    assert all(x.is_deleted() for x in jax.tree.leaves(old))
    assert_trees_close(got, want)


def test_weight_sync_hook_applies_the_rules_of_step(monkeypatch):
    """The host hook holds no copy of the rules: it calls the counting and copying functions
    that sync.step is made of, and agrees with sync.step call for call."""
    from jaxweight.sync import hook as hook_mod

    counted, copied = [], []
    real_count, real_update = hook_mod._count, hook_mod._actor_update
    monkeypatch.setattr(hook_mod, "_count", lambda *a: counted.append(a) or real_count(*a))
    monkeypatch.setattr(hook_mod, "_actor_update", lambda *a, **k: copied.append(a[2]) or real_update(*a, **k))
    h = sync.WeightSync(2)
    p = _params()
    for _ in range(3):
        h(p, p)
    assert len(counted) == 3 and len(copied) == 3 and all(c is h.config for c in copied)
    assert h.state_dict() == {"counter": 3, "version": 1, "last_sync": 2}

    # the same sequence of states, fires and actors as sync.step, in copy mode
    monkeypatch.undo()
    h = sync.WeightSync(3, copy_on_same_device=True, donate=False)
    cfg = sync.config(3, copy_on_same_device=True)
    state, learner = sync.init(cfg), _params()
    actor_h = actor_s = sync.place(learner, copy=True)
    for t in range(7):
        learner = jax.tree.map(lambda x: x + 1, learner)
        actor_h = h(learner, actor_h)
        state, actor_s, fired = sync.step(state, learner, actor_s, cfg)
        assert h.fired == bool(fired)
        assert h.state_dict() == {"counter": int(state.counter), "version": int(state.version),
                                  "last_sync": int(state.last_sync)}
        assert_trees_close(actor_h, actor_s, rtol=0, atol=0)
    assert h.staleness == int(sync.staleness(state)) == 1


def test_public_surface():
    assert set(sync.__all__) <= set(dir(sync))
    for name in ("tick", "donated_tick", "make_tick", "init_sync"):
        assert not hasattr(sync, name)
