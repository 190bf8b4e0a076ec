"""The AWR fit as a component: config/init/step/metrics_dict, the shared contracts and donation,
and the host driver running the same update as ``step``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import awr
from tests.contracts import assert_vmap_matches_loop, check_state_contract


def _data(n=32, f=3, k=2, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(n, f)), jnp.float32), jnp.asarray(rng.normal(size=(n, k)), jnp.float32),
            jnp.asarray(rng.normal(size=n), jnp.float32))


def test_contract_awr(tmp_path):
    x, a, adv = _data()
    # integer features, 32 rows: their mean and std are exact, so init compares bit for bit
    # jitted and eager (float reductions may sum in another order under jit)
    x = jnp.round(4 * x)
    x2, a2, adv2 = _data(seed=1)
    cfg = awr.config(2, hidden_sizes=(8,))
    cfg2 = awr.config(2, hidden_sizes=(8,), temperature=0.3, max_weight=5.0, learning_rate=1e-2, weight_decay=0.1,
                      max_grad_norm=0.5)
    check_state_contract(
        init=lambda: awr.init(cfg, jax.random.key(1), x),
        update=lambda s, x, a, adv, c: awr.step(s, x, a, adv, c),
        update_args=(x, a, adv, cfg),
        update_args_alt=(x2, a2, adv2, cfg2),          # new data and new hyperparameters: no recompilation
        batched_init=lambda: jax.vmap(lambda k: awr.init(cfg, k, x))(jax.random.split(jax.random.key(2), 3)),
        tmp_path=tmp_path,
        rtol=1e-6, atol=1e-7,                          # XLA fuses the network math differently under jit
    )
    # vmap over a hyperparameter (a learning-rate sweep), one state each
    sweep = jax.tree.map(lambda *v: jnp.stack(v), *(awr.config(2, hidden_sizes=(8,), learning_rate=lr)
                                                    for lr in (1e-3, 1e-2, 1e-1)))
    states = jax.vmap(lambda c: awr.init(c, 0, x))(sweep)
    out = assert_vmap_matches_loop(lambda s, c: awr.step(s, x, a, adv, c)[0], (0, 0), states, sweep,
                                   rtol=1e-6, atol=1e-7)
    moved = [float(jnp.max(jnp.abs(k))) for k in out.policy.variables["params"]["Dense_1"]["kernel"]]
    assert moved[0] < moved[1] < moved[2]        # the step size really is per config
    # donation: the jitted step consumes its state
    jstep = jax.jit(awr.step, donate_argnums=0)
    s = awr.init(cfg, 0, x)
    old_leaves = jax.tree.leaves(s)
    for _ in range(3):
        s, m = jstep(s, x, a, adv, cfg)
    assert all(v.is_deleted() for v in old_leaves if isinstance(v, jax.Array) and v.size > 1)
    assert int(s.count) == 3 and float(cfg.learning_rate) == np.float32(3e-3)


def test_step_is_the_update_of_the_fit_and_reports_metrics():
    x, a, adv = _data(n=48)
    cfg = awr.config(2, hidden_sizes=(8,), temperature=0.5)
    # one epoch with one minibatch of all rows = one step on the whole data set (same weights)
    params, fit_m = awr.fit_weight_policy(3, x, a, adv, cfg, batch_size=48, num_epochs=1)
    k_init, _ = jax.random.split(jax.random.key(3))
    s, out = jax.jit(awr.step)(awr.init(cfg, k_init, x), x, a, adv, cfg)
    for p, q in zip(jax.tree.leaves(s.policy.variables), jax.tree.leaves(params.variables)):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out["loss"]), float(fit_m["loss"][0]), rtol=1e-5)
    for k in ("num_valid", "n_invalid", "weight_ess", "clipped_fraction"):
        np.testing.assert_allclose(float(out[k]), float(fit_m[k]), rtol=1e-6)
    m = awr.metrics_dict(out, cfg)
    assert set(m) == {"awr/loss", "awr/num_valid", "awr/n_invalid", "awr/weight_ess", "awr/clipped_fraction"}
    assert all(isinstance(v, float) for v in m.values())


def test_step_masks_bad_rows_and_an_all_invalid_batch_changes_nothing():
    x, a, adv = _data(n=16)
    cfg = awr.config(2, hidden_sizes=(4,))
    s = awr.init(cfg, 0, x)
    bad_adv = adv.at[3].set(jnp.nan)
    mask = jnp.ones(16, bool).at[5].set(False)
    s1, out = awr.step(s, x, a, bad_adv, cfg, mask=mask)
    assert int(out["n_invalid"]) == 1 and float(out["num_valid"]) == 14.0
    assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(s1.policy.variables))
    # the same rows dropped by hand give the same update
    keep = np.setdiff1d(np.arange(16), [3, 5])
    s2, out2 = awr.step(s, x[keep], a[keep], adv[keep], cfg)
    np.testing.assert_allclose(float(out["loss"]), float(out2["loss"]), rtol=1e-6)
    for p, q in zip(jax.tree.leaves(s1.policy.variables), jax.tree.leaves(s2.policy.variables)):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-7)
    # nothing valid: zero gradient, parameters unchanged (AdamW with zero decay)
    s3, out3 = awr.step(s, x, a, jnp.full(16, jnp.nan), cfg)
    assert float(out3["num_valid"]) == 0.0 and float(out3["loss"]) == 0.0
    for p, q in zip(jax.tree.leaves(s3.policy.variables), jax.tree.leaves(s.policy.variables)):
        np.testing.assert_array_equal(p, q)


def test_init_and_step_errors():
    x, a, adv = _data()
    cfg = awr.config(2)
    with pytest.raises(ValueError, match="needs a key and example features"):
        awr.init(cfg, 0)
    with pytest.raises(ValueError, match="cfg must be an AWRConfig"):
        awr.init({"temperature": 1.0}, 0, x)
    s = awr.init(cfg, 0, x)
    with pytest.raises(ValueError, match="must equal log_weights.shape\\[1\\] \\(3\\)"):
        awr.step(s, x, jnp.zeros((32, 3)), adv, cfg)
    with pytest.raises(ValueError, match="state must be an AWRState"):
        awr.step(s.policy, x, a, adv, cfg)
    with pytest.raises(ValueError, match="mask must have shape \\(32,\\)"):
        awr.step(s, x, a, adv, cfg, mask=jnp.ones(3, bool))
