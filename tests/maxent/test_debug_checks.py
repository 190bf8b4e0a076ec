"""jaxweight.maxent under ``jax.debug_nans`` and ``jax.debug_infs``: the debugging contract.

Users debug with ``jax_debug_nans`` / ``jax_debug_infs``, so every public maxent function
and the component's ``config`` / ``init`` / ``step`` / ``metrics_dict`` must run under both
on ordinary input: finite data with masks, partly masked groups, all-masked groups and an
all-masked batch. Eagerly every intermediate array is checked (an ``-inf`` mask placeholder
fails), under ``jax.jit`` every output (a NaN "not measured" placeholder fails). Each case
also checks that its outputs are finite and equal to the same call without the checks.
"""

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import maxent as M
from tests.contracts import assert_trees_close

P, G = 5, 4
SCHED = M.TauSchedule(target_entropy=0.8, learning_rate=0.1, minimum_value=0.05, maximum_value=2.0, warmup_steps=0)
KL = M.KLController(target=0.05, horizon=10, step_size=0.2)
META = M.MetaController(enabled=True, learning_rate=0.1, tau_min=0.05, tau_max=2.0)


@contextlib.contextmanager
def debug_checks():
    with jax.debug_nans(True), jax.debug_infs(True):
        yield


def batch(all_masked=False):
    """Finite data; row 1 partly masked, row 3 all masked, masked entries hold finite junk."""
    rng = np.random.default_rng(0)
    u = rng.integers(0, 3, (P, G)).astype(np.float32) + rng.normal(0, 0.1, (P, G)).astype(np.float32)
    ref = -rng.uniform(0.1, 3.0, (P, G)).astype(np.float32)
    tok = rng.integers(1, 20, (P, G)).astype(np.float32)
    mask = np.ones((P, G), bool)
    mask[1, 2:] = False
    mask[3] = False
    u[~mask] = 123.0
    ref[~mask] = -77.0
    if all_masked:
        mask[:] = False
    ids = np.array([[0, 1, 0, 2], [0, 0, 1, 1], [3, 3, 3, 3], [0, 1, 2, 3], [1, 0, 1, 0]], np.int32)
    return dict(u=jnp.asarray(u), ref=jnp.asarray(ref), tok=jnp.asarray(tok), mask=jnp.asarray(mask),
                ids=jnp.asarray(ids))


def cfg():
    return M.config(0.5, 0.04, schedule=SCHED, kl=KL, meta=META)


def _loss_inputs(d):
    """Token-level inputs of ``policy_loss``: N = P completions of L = G tokens, the batch mask."""
    return d["ref"] * 0.5, d["ref"] * 0.5 + 0.01, d["u"][:, 0] - 1.0, d["mask"]


# name -> function of the batch dict (every one jittable)
CASES = {
    "group_advantages": lambda d: M.group_advantages(d["u"], d["mask"]),
    "group_advantages_batch_rloo": lambda d: M.group_advantages(d["u"], d["mask"], scale="batch",
                                                                baseline="leave_one_out"),
    "reward_moments": lambda d: M.reward_moments(d["u"], d["mask"]),
    "zero_truncated": lambda d: M.zero_truncated(d["u"], ~d["mask"]),
    "q_distribution": lambda d: M.q_distribution(d["u"], d["mask"], temperature=0.5),
    "q_distribution_hard": lambda d: M.q_distribution(d["u"], d["mask"], temperature=0.0),
    "weight_matrix": lambda d: M.weight_matrix(M.q_distribution(d["u"], d["mask"]), d["ref"], d["tok"], d["mask"],
                                               tau=0.5, beta=0.04),
    "weight_matrix_tau0_beta0": lambda d: M.weight_matrix(M.q_distribution(d["u"], d["mask"]), d["ref"], None,
                                                          d["mask"], tau=0.0, beta=0.0, denom=0.0),
    "uniform_weights": lambda d: M.uniform_weights(d["mask"]),
    "weight_entropy": lambda d: M.weight_entropy(M.uniform_weights(d["mask"]), d["mask"]),
    "effective_sample_size": lambda d: M.effective_sample_size(M.uniform_weights(d["mask"]), d["mask"]),
    "semantic_entropy": lambda d: M.semantic_entropy(d["ids"], d["ref"], d["mask"]),
    "seed_grpo_scale": lambda d: M.seed_grpo_scale(M.semantic_entropy(d["ids"], d["ref"], d["mask"]), 0.0417, G),
    "compute_reward_statistics": lambda d: M.compute_reward_statistics(
        d["u"], d["mask"], q_temperature=0.5, seed_cluster_ids=d["ids"], seed_logp_sum=d["ref"] * d["tok"],
        seed_token_counts=d["tok"]),
    "policy_loss": lambda d: M.policy_loss(*_loss_inputs(d), ref_logp=d["ref"] * 0.4, kl_coef=0.04),
    "policy_loss_token_mean": lambda d: M.policy_loss(*_loss_inputs(d), normalization="token_mean"),
    "k3_kl": lambda d: M.k3_kl(d["ref"] * 0.5, d["ref"]),
    "candidate_weights": lambda d: M.candidate_weights(d["u"], d["mask"], tau=0.5, lam=0.1, ref_logp=d["ref"]),
    "candidate_weights_tau0": lambda d: M.candidate_weights(d["u"], d["mask"], tau=0.0),
    "positive_class_weights": lambda d: M.positive_class_weights(d["u"], d["mask"]),
    "candidate_weights_vmap_tau": lambda d: jax.vmap(lambda t: M.candidate_weights(d["u"], d["mask"], tau=t))(
        jnp.array([0.0, 1e-3, 1e9])),
    "aggregation_diagnostics": lambda d: M.aggregation_diagnostics(M.candidate_weights(d["u"], d["mask"], tau=0.0),
                                                                   d["u"] - 1.0, d["mask"]),
    "policy_loss_weights": lambda d: M.policy_loss(
        *_loss_inputs(d), normalization="constant",
        weights=M.candidate_weights(d["u"][:, 0][None], d["mask"][:, 0][None], tau=0.5)),
    "select_groups": lambda d: M.select_groups(d["u"], num=3, mask=d["mask"]),
    "select_groups_key": lambda d: M.select_groups(d["u"], num=3, mask=d["mask"], key=jax.random.key(1)),
    # the component
    "config_init": lambda d: M.init(M.config(0.5, 0.04)),
    "config_init_full": lambda d: M.init(cfg()),
    "step": lambda d: M.step(M.init(cfg()), d["u"], d["ref"], cfg(), token_counts=d["tok"], mask=d["mask"],
                             global_step=3, measured_kl=jnp.float32(0.07)),
    "step_no_kl_no_target": lambda d: M.step(M.init(M.config(0.5, 0.04)), d["u"], d["ref"], M.config(0.5, 0.04),
                                             mask=d["mask"]),
    "step_invalid_kl": lambda d: M.step(M.init(cfg()), d["u"], d["ref"], cfg(), mask=d["mask"], global_step=3,
                                        measured_kl=jnp.float32(0.0), kl_valid=False),
    # the controller rules
    "update_tau": lambda d: M.update_tau(M.init(cfg()), M.weight_entropy(M.uniform_weights(d["mask"]), d["mask"]),
                                         2, cfg()),
    "update_tau_no_target": lambda d: M.update_tau(M.init(M.config()), 1.0, 2, M.config()),
    "update_beta": lambda d: M.update_beta(M.init(cfg()), 0.2, cfg()),
    "analytic_meta_grads_and_meta_update": lambda d: _meta(M.init(cfg()), d),
    "target_entropy_at": lambda d: [M.target_entropy_at(s, 3) for s in (
        M.TauSchedule(), SCHED, M.TauSchedule(target_entropy_final=0.3, target_entropy_horizon=5),
        M.TauSchedule(target_entropy=1.0, target_entropy_start=2.0, target_entropy_horizon=4))],
    "meta_should_update": lambda d: M.meta_should_update(cfg(), 4),
}


def _meta(state, d):
    ent = M.weight_entropy(M.uniform_weights(d["mask"]), d["mask"])
    target, has = M.target_entropy_at(cfg(), 3)
    g = M.analytic_meta_grads(ent, target, jnp.float32(0.2), 0.1, target_valid=has)
    return g, M.meta_update(state, g.tau_grad, g.beta_grad, cfg(), tau_valid=g.tau_valid, beta_valid=g.beta_valid)


def _finite(tree):
    for leaf in jax.tree.leaves(tree):
        a = np.asarray(leaf)
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            continue
        assert np.all(np.isfinite(a.astype(np.float64))), a


@pytest.mark.parametrize("all_masked", [False, True], ids=["masked_entries", "all_masked_batch"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_under_debug_nans_and_infs(name, all_masked, jit_or_eager):
    fn = CASES[name]
    d = batch(all_masked)
    plain = jit_or_eager(fn)(d)
    with debug_checks():
        got = jit_or_eager(fn)(d)
    _finite(got)
    assert_trees_close(got, plain)


@pytest.mark.parametrize("all_masked", [False, True], ids=["masked_entries", "all_masked_batch"])
def test_metrics_dict_under_debug_checks(all_masked):
    d = batch(all_masked)
    with debug_checks():
        c = cfg()
        state, out = jax.jit(M.step)(M.init(c), d["u"], d["ref"], c, token_counts=d["tok"], mask=d["mask"],
                                     global_step=3, measured_kl=jnp.float32(0.07))
        logs = M.metrics_dict(out, c)
        st = M.metrics_dict(state, c)
        fresh = M.metrics_dict(M.init(c), c)
    assert all(math.isfinite(v) for v in [*logs.values(), *st.values(), *fresh.values()])
    # nothing measured yet: the fresh state has no EMA and no target to report
    assert "maxent/entropy_ema" not in fresh and "maxent/current_target" not in fresh
    if all_masked:  # the batch measured nothing: the fresh state, but its EMA started at tau (maxent_grpo)
        assert st.pop("maxent/entropy_ema") == pytest.approx(fresh["maxent/tau"])
        assert st == fresh
    else:
        assert logs["maxent/kl"] == pytest.approx(0.07) and st["maxent/current_target"] == pytest.approx(0.8)


def test_every_public_function_is_covered():
    """Every public function of maxent that runs JAX is a case above (host helpers are NumPy)."""
    host = {"extract_answer", "cluster_ids", "pad_groups", "truncation_flags", "metrics_dict", "config", "init",
            "step"}
    called = " ".join(CASES) + " " + " ".join(
        ["config", "init", "step", "metrics_dict", "analytic_meta_grads", "meta_update"])
    public = {n for n in M.__all__ if callable(getattr(M, n)) and not isinstance(getattr(M, n), type)}
    missing = {n for n in public - host if n not in called}
    assert not missing, missing


def test_host_helpers_give_finite_padding():
    """``pad_groups`` pads with a finite value: its arrays go straight into a checked step."""
    u, mask = M.pad_groups([[1.0, 0.0, 0.0, 1.0], [2.0], [5.0, 4.0]])
    assert np.all(np.isfinite(u)) and mask.sum() == 7
    c = M.config(0.5, 0.04, schedule=SCHED)
    with debug_checks():
        state, out = M.step(M.init(c), u, -np.ones_like(u), c, mask=mask, global_step=1)
    _finite((state, out))
    np.testing.assert_array_equal(np.asarray(out.weights)[~mask], 0.0)
