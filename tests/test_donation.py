"""Donation is part of the API: every state from an ``init`` can be donated to a jitted step.

A state whose leaves share a buffer (with each other, or with its config's arrays) makes
``jax.jit(step, donate_argnums=0)`` fail ("donate the same buffer twice") or delete the
config's values; these tests catch that for every component.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import awr
from jaxweight import curriculum as cur
from jaxweight import maxent
from jaxweight import preference as pf
from jaxweight import random_weighting as rw
from jaxweight import sync as S


def _pairs():
    rng = np.random.default_rng(0)
    return pf.fragment_pairs_from_arrays(rng.normal(size=(4, 2, 3, 2)).astype("f4"), rng.integers(0, 2, (4, 2, 2)),
                                         rng.normal(size=(4, 2, 2)).astype("f4"))


def _cases():
    k = maxent.config(0.5, 0.1, schedule=maxent.TauSchedule(target_entropy=1.0, learning_rate=0.1))
    c = cur.config("prioritized", capacity=16)
    r = rw.config()
    rc = rw.component_config(r)
    a = awr.config(2, hidden_sizes=(4,))
    xc = rw.xray_scale_config()
    s = S.config(2)
    tr = pf.RewardTrainer(pf.RewardMLP(hidden_sizes=(4,), action_space=pf.Discrete(2)), num_members=2)
    return {
        "maxent": (k, lambda: maxent.init(k)),
        "curriculum": (c, lambda: cur.init(c)),
        "random_weighting": (r, lambda: rw.init(r, 0)),
        "random_weighting_component": (rc, lambda: rw.component_init(rc, 0, 1.0)),
        "xray_scale": (xc, lambda: rw.xray_scale_init(xc, 1.0)),
        "awr": (a, lambda: awr.init(a, 0, jnp.ones((4, 3)))),
        "sync": (s, lambda: S.init(s)),
        "preference_buffer": (pf.buffer.config(8), lambda: pf.buffer.init(pf.buffer.config(8), None, _pairs())),
        "reward_trainer": (tr.config, lambda: tr.init(0, pf.example_inputs(_pairs()))),
    }


CASES = _cases()


def _buffers(tree):
    return [x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)
            if isinstance(x, jax.Array) and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]


@pytest.mark.parametrize("name", list(CASES))
def test_state_leaves_are_distinct_buffers_not_the_configs(name):
    cfg, init = CASES[name]
    state = init()
    bufs = _buffers(state)
    assert len(bufs) == len(set(bufs)), f"{name}: two state leaves share a buffer"
    if cfg is not None:
        assert not set(bufs) & set(_buffers(cfg)), f"{name}: a state leaf is one of the config's arrays"


@pytest.mark.parametrize("name", list(CASES))
def test_state_can_be_donated_and_the_config_survives(name):
    cfg, init = CASES[name]
    state = init()
    before = jax.tree.map(np.asarray, state)
    bump = jax.jit(lambda s: jax.tree.map(lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.number) else x, s),
                   donate_argnums=0)
    out = bump(state)
    jax.block_until_ready(out)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(before)):
        if np.issubdtype(b.dtype, np.number):
            np.testing.assert_array_equal(np.asarray(a), b + 1)
    if cfg is not None:  # the config's arrays were not donated with the state
        jax.block_until_ready(jax.tree.map(lambda x: x + 0 if isinstance(x, jax.Array) else x, cfg))


def test_donated_maxent_step_with_a_controller_state_from_init():
    """The case a user meets: a jitted training step that donates a state holding a ControllerState."""
    cfg = maxent.config(0.5, 0.04, schedule=maxent.TauSchedule(target_entropy=1.0, learning_rate=0.1))
    state = {"ctl": maxent.init(cfg), "t": jnp.zeros((), jnp.int32)}

    def _step(st, rewards):
        ctl, _ = maxent.step(st["ctl"], rewards, -jnp.ones_like(rewards), cfg, global_step=st["t"])
        return {"ctl": ctl, "t": st["t"] + 1}

    step = jax.jit(_step, donate_argnums=0)
    for i in range(3):
        state = step(state, jnp.arange(12.0).reshape(3, 4) * (i + 1))
    assert int(state["t"]) == 3 and float(cfg.tau) == 0.5   # the config kept its value
    assert np.isfinite(float(state["ctl"].tau)) and float(state["ctl"].tau) != 0.5
