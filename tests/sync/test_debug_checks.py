"""sync runs under ``jax.debug_nans`` and ``jax.debug_infs`` (CONVENTIONS: no NaN or inf as a
sentinel in a state or an output).

The state is three int32 counters: "never synced" is ``version == 0`` and ``last_sync == 0``
(staleness counts the steps since), not a NaN time. The copy itself passes the learner's float
leaves through untouched. Each test runs eager and jitted and must equal the unchecked run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import sync
from tests.contracts import debug_checks



def _learner(t):
    return {"w": jnp.full((3,), t, jnp.float32), "b": jnp.asarray(-t, jnp.float32)}


def _run(cfg, steps, jit_or_eager):
    step = jit_or_eager(sync.step)
    state, actor = sync.init(cfg), sync.place(_learner(0.0), copy=True)
    trace = []
    for t in range(1, steps + 1):
        state, actor, fired = step(state, _learner(float(t)), actor, cfg)
        trace.append((int(state.counter), int(state.version), int(state.last_sync), bool(fired),
                      float(actor["w"][0])))
    return state, actor, trace


@pytest.mark.parametrize("copy", [False, True])
def test_counting_and_copying_under_debug_checks(copy, jit_or_eager):
    """Every 3rd step fires; in copy mode the actor holds the learner of the last fire."""
    with debug_checks():
        cfg = sync.config(3, copy_on_same_device=copy)
        fresh = sync.init(cfg)
        m0 = sync.metrics_dict(fresh)
        state, actor, trace = _run(cfg, 7, jit_or_eager)
        m = sync.metrics_dict(state)
    assert (state.counter.dtype, state.version.dtype, state.last_sync.dtype) == (np.int32,) * 3
    # never synced: version 0, staleness = steps since start (0 here), no NaN sentinel
    assert m0 == {"sync/version": 0.0, "sync/staleness": 0.0, "sync/counter": 0.0}
    assert m == {"sync/version": 2.0, "sync/staleness": 1.0, "sync/counter": 7.0}
    assert [f for *_, f, _ in trace] == [False, False, True, False, False, True, False]
    seen = [w for *_, w in trace]
    assert seen == ([0, 0, 3, 3, 3, 6, 6] if copy else [1, 2, 3, 4, 5, 6, 7])
    _, _, plain = _run(cfg, 7, jit_or_eager)
    assert trace == plain


def test_staleness_of_a_batch_of_states(jit_or_eager):
    """vmapped states: staleness is an int count per state."""
    with debug_checks():
        cfg = sync.config(2)
        states = jax.vmap(lambda _: sync.init(cfg))(jnp.arange(4))
        f = jit_or_eager(jax.vmap(lambda s, t: sync.step(s, _learner(t), _learner(t), cfg)[0]))
        states = f(states, jnp.arange(4.0))
        st = jit_or_eager(jax.vmap(sync.staleness))(states)
    np.testing.assert_array_equal(st, [1, 1, 1, 1])
    assert st.dtype == jnp.int32


def test_weight_sync_hook_underdebug_checks():
    """The host hook: the same counters, finite metrics."""
    with debug_checks():
        hook = sync.WeightSync(2, copy_on_same_device=True)
        actor = sync.place(_learner(0.0), copy=True)
        for t in range(1, 4):
            actor = hook(_learner(float(t)), actor)
        m = hook.metrics()
    assert hook.state_dict() == {"counter": 3, "version": 1, "last_sync": 2}
    assert float(actor["w"][0]) == 2.0
    assert m == {"sync/version": 1.0, "sync/staleness": 1.0, "sync/counter": 3.0, "sync/last_sync": 2.0,
                 "sync/fired": 0.0}
