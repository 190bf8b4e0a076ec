"""Contracts of the random_weighting components (tests/contracts.py) plus donation:
jit == eager, vmap over seeds and over a hyperparameter, no recompilation, stable
dtypes/shapes, checkpoint round trip, and a donated jitted step."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxweight import random_weighting as rw
from tests.contracts import assert_vmap_matches_loop, check_state_contract


def _donated_steps(step, state, args_per_call):
    """``jax.jit(step, donate_argnums=0)`` over a few calls: each call consumes its input state
    (leaves the step does not read are pruned by jit and stay alive); an unusable donation
    warns, and warnings are errors in the tests."""
    jstep = jax.jit(step, donate_argnums=0)
    for args in args_per_call:
        old = state
        out = jstep(state, *args)
        state = out[0] if isinstance(out, tuple) else out
        assert any(x.is_deleted() for x in jax.tree.leaves(old) if isinstance(x, jax.Array)), "not donated"
    return state


# Op by op, ``mean + scale * z`` rounds twice; under jit XLA may fuse it into one
# multiply-add: eager and jitted draws may differ in the last bit (1 ulp).
ULP = dict(rtol=2e-7, atol=0.0)


def test_contract_random_weighting(tmp_path):
    cfg = rw.config()
    cfg2 = rw.config(default_log_weights=0.3, trajectory_sigmas=1.2, step_sigmas=0.4, log_weight_bounds=(-2.0, 2.0))
    keys = jax.random.split(jax.random.key(0), 6)
    check_state_contract(
        init=lambda: rw.init(cfg, jax.random.key(1)),
        update=lambda s, k, c: rw.step(s, k, c),
        update_args=(jax.random.key(2), cfg),
        update_args_alt=(jax.random.key(3), cfg2),
        batched_init=lambda: jax.vmap(rw.init, in_axes=(None, 0))(cfg, keys),
        batched_update_in_axes=(0, None),
        batched_update_args=(jax.random.split(jax.random.key(4), 6), cfg),
        tmp_path=tmp_path,
        **ULP,
    )
    check_state_contract(   # resample_trajectory too
        init=lambda: rw.init(cfg, jax.random.key(1)),
        update=lambda s, k, c: rw.resample_trajectory(s, k, c),
        update_args=(jax.random.key(2), cfg),
        update_args_alt=(jax.random.key(3), cfg2),
        **ULP,
    )
    # vmap over a hyperparameter: a stack of configs, one state each
    sweep = rw.stack_configs(cfg, cfg2, rw.config(step_sigmas=0.0))
    states = jax.vmap(rw.init, in_axes=(0, None))(sweep, jax.random.key(5))
    out = assert_vmap_matches_loop(rw.step, (0, None, 0), states, jax.random.key(6), sweep, **ULP)
    np.testing.assert_array_equal(out.log_weights[2], states.base_log_weights[2])   # step sigma 0: the base
    # donation: the state's buffers are reused, the config survives
    s = _donated_steps(rw.step, rw.init(cfg, 0), [(jax.random.key(i), cfg) for i in range(3)])
    assert int(s.sample_count) == 3 and float(cfg.step_sigma[0]) == np.float32(0.1)


def test_contract_xray_scale(tmp_path):
    xc, xc2 = rw.xray_scale_config(), rw.xray_scale_config(10.0, 0.2, 5.0, 0.9)
    check_state_contract(
        init=lambda: rw.xray_scale_init(xc),
        update=lambda s, loss, c: rw.xray_scale_step(s, loss, c),
        update_args=(jnp.float32(100.0), xc),
        update_args_alt=(jnp.float32(3.0), xc2),
        batched_init=lambda: jax.vmap(lambda L: rw.xray_scale_init(xc, L))(jnp.float32([1.0, 2.0, 0.0])),
        batched_update_in_axes=(0, None),
        batched_update_args=(jnp.float32([100.0, float("nan"), 1.0]), xc),
        tmp_path=tmp_path,
    )
    sweep = jax.tree.map(lambda *x: jnp.stack(x), xc, xc2)   # vmap over the settings
    _, w = jax.vmap(rw.xray_scale_step, in_axes=(None, None, 0))(rw.xray_scale_init(xc), 100.0, sweep)
    np.testing.assert_allclose(w, [0.75, 0.92], rtol=1e-6)
    s = _donated_steps(rw.xray_scale_step, rw.xray_scale_init(xc), [(jnp.float32(100.0), xc)] * 3)
    np.testing.assert_allclose(float(s.weight), 0.5625, rtol=1e-6)


def test_contract_component_weighting(tmp_path):
    cfg = rw.component_config()
    cfg2 = rw.component_config(rw.config(trajectory_sigmas=0.3), rw.xray_scale_config(smoothing=0.9))
    check_state_contract(
        init=lambda: rw.component_init(cfg, jax.random.key(1)),
        update=lambda s, k, loss, c: rw.component_step(s, k, loss, c),
        update_args=(jax.random.key(2), jnp.float32(100.0), cfg),
        update_args_alt=(jax.random.key(3), jnp.float32(5.0), cfg2),
        batched_init=lambda: jax.vmap(rw.component_init, in_axes=(None, 0))(
            cfg, jax.random.split(jax.random.key(5), 4)),
        batched_update_in_axes=(0, 0, None),
        batched_update_args=(jax.random.split(jax.random.key(6), 4), jnp.float32([1.0, 10.0, 100.0, 1e3]), cfg),
        tmp_path=tmp_path,
        **ULP,
    )
    s = _donated_steps(rw.component_step, rw.component_init(cfg, 0),
                       [(jax.random.key(i), jnp.float32(100.0), cfg) for i in range(2)])
    assert int(s.random.sample_count) == 2
