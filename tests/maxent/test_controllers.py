"""jaxweight.maxent controllers: tau / beta / meta rules step by step, contracts, settings."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import maxent as M
from jaxweight.interop import maxent_grpo as MG
from tests.contracts import assert_no_retrace, assert_vmap_matches_loop, check_state_contract

SCHED = M.TauSchedule(target_entropy=0.8, learning_rate=0.1, minimum_value=0.05,
                      maximum_value=2.0, warmup_steps=0)


def f(x):
    return float(np.asarray(x))


def ctl(tau, beta, denom=None):
    """A fresh controller state with these values."""
    return M.init(M.config(tau, beta, denom=denom))


def typed(tree):
    """Python scalars -> strongly typed 0-d arrays (as a config built from arrays would be)."""
    def conv(x):
        if isinstance(x, bool):
            return jnp.asarray(x, bool)
        if isinstance(x, int):
            return jnp.asarray(x, jnp.int32)
        return jnp.asarray(x, jnp.float32)
    return jax.tree.map(conv, tree)


# ------------------------------------------------------------------- init
def test_init_layout():
    s = ctl(0.5, 0.04)
    assert f(s.tau) == pytest.approx(0.5) and f(s.denom) == pytest.approx(0.5)
    assert f(s.log_tau) == pytest.approx(math.log(0.5), rel=1e-6)
    # nothing measured yet: flags, not NaN placeholders
    assert not bool(s.has_entropy_ema) and not bool(s.has_target)
    assert f(s.entropy_ema) == 0.0 and f(s.current_target) == 0.0
    for leaf in jax.tree.leaves(s):
        assert leaf.shape == () and not leaf.weak_type
        assert leaf.dtype in (jnp.float32, jnp.bool_)
    s0 = ctl(0.0, 0.1)
    assert f(s0.denom) == 1.0 and f(s0.log_tau) == pytest.approx(math.log(1e-8), rel=1e-6)
    assert f(ctl(0.5, 0.1, denom=0.6).denom) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="one config"):
        ctl(jnp.ones(3), 0.1)


# --------------------------------------------------------------- tau rule
def test_spec_example_6_tau_controller(jit_or_eager):
    upd = jit_or_eager(M.update_tau)
    s = ctl(0.5, 0.0)
    s = upd(s, 1.0, 0, SCHED)
    assert f(s.tau) == 0.5  # step 0 always skips ...
    assert f(s.entropy_ema) == 1.0 and bool(s.has_entropy_ema)  # ... but the EMA starts
    assert f(s.current_target) == pytest.approx(0.8) and bool(s.has_target)
    s = upd(s, 1.0, 1, SCHED)
    np.testing.assert_allclose(f(s.tau), 0.4900993366533776, rtol=1e-6)
    np.testing.assert_allclose(f(s.denom), f(s.tau), rtol=0)
    np.testing.assert_allclose(f(s.log_tau), math.log(0.4900993366533776), rtol=1e-6)


def _run(steps, entropies, sched, tau=0.5):
    s = ctl(tau, 0.0)
    for step, h in zip(steps, entropies):
        s = M.update_tau(s, h, step, sched)
    return s


def test_tau_warmup_skips():
    sched = SCHED.replace(warmup_steps=3)
    s = _run([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0], sched)
    assert f(s.tau) == 0.5
    assert f(s.entropy_ema) == 1.0  # set once, then frozen while warming up
    s = M.update_tau(s, 1.0, 4, sched)
    np.testing.assert_allclose(f(s.entropy_ema), 1.0, rtol=1e-6)
    np.testing.assert_allclose(f(s.tau), 0.5 * math.exp(0.1 * (0.8 - 1.0)), rtol=1e-6)


def test_tau_ema_and_log_step():
    # python reference of the rule, applied for a few steps
    sched = SCHED.replace(minimum_value=0.0, maximum_value=0.0)
    hs = [1.3, 0.4, 0.9, 1.1]
    s = _run(range(1, 5), hs, sched)
    ema, log_tau = None, math.log(0.5)
    for h in hs:
        ema = h if ema is None else ema
        ema = 0.9 * ema + 0.1 * h
        log_tau += 0.1 * (0.8 - ema)
    np.testing.assert_allclose(f(s.entropy_ema), ema, rtol=1e-6)
    np.testing.assert_allclose(f(s.tau), math.exp(log_tau), rtol=1e-5)


def test_tau_nonfinite_entropy_is_skipped():
    """A non-finite measurement changes nothing once the EMA is set."""
    warm = M.update_tau(ctl(0.5, 0.0), 1.2, 1, SCHED)
    for bad in (float("nan"), float("inf"), -float("inf")):
        out = M.update_tau(warm, bad, 5, SCHED)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(warm)):
            np.testing.assert_array_equal(a, b)


def _same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_tau_invalid_first_measurement_starts_the_ema_at_tau():
    """maxent_grpo's rule: an invalid first measurement (non-finite, ``valid=False``, or a
    WeightEntropy of an all-masked batch) sets the unset EMA to tau and nothing else; the next
    valid one moves that EMA; a later invalid measurement changes nothing."""
    fresh = ctl(0.5, 0.0)
    empty = M.weight_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3), bool))
    assert int(empty.count) == 0 and not bool(empty.valid) and float(empty.mean) == 0.0
    for out in (M.update_tau(fresh, float("nan"), 5, SCHED), M.update_tau(fresh, float("inf"), 5, SCHED),
                M.update_tau(fresh, 1.0, 5, SCHED, valid=False), M.update_tau(fresh, empty, 5, SCHED),
                jax.jit(M.update_tau)(fresh, empty, 5, SCHED), M.update_tau(fresh, float("nan"), 0, SCHED)):
        assert f(out.entropy_ema) == 0.5 and bool(out.has_entropy_ema)
        _same(out.replace(entropy_ema=fresh.entropy_ema, has_entropy_ema=fresh.has_entropy_ema), fresh)
        _same(M.update_tau(out, float("nan"), 6, SCHED), out)  # later invalid ones change nothing
        nxt = M.update_tau(out, 1.0, 6, SCHED)
        ema = 0.9 * 0.5 + 0.1 * 1.0
        np.testing.assert_allclose(f(nxt.entropy_ema), ema, rtol=1e-6)
        np.testing.assert_allclose(f(nxt.tau), 0.5 * math.exp(0.1 * (0.8 - ema)), rtol=1e-6)
    # without a target the EMA still starts at tau (as a valid first measurement starts it at m)
    no_target = M.update_tau(ctl(0.3, 0.0), float("nan"), 5, SCHED.replace(target_entropy=None))
    assert f(no_target.entropy_ema) == pytest.approx(0.3) and bool(no_target.has_entropy_ema)
    # vmapped over a sweep: each member starts at its own tau
    taus = jnp.array([0.2, 0.5, 1.0], jnp.float32)
    swept = jax.vmap(lambda t: M.update_tau(ctl(t, 0.0), jnp.nan, 5, SCHED))(taus)
    np.testing.assert_allclose(np.asarray(swept.entropy_ema), np.asarray(taus), rtol=0)
    # a finite first measurement initialises the EMA with itself
    assert f(M.update_tau(fresh, 1.3, 0, SCHED).entropy_ema) == pytest.approx(1.3)


def _masked_batch_entropy(all_masked: bool, nan: bool = False):
    """The WeightEntropy of a batch: ordinary, all masked, or all NaN weights."""
    w = jnp.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
    mask = jnp.array([[True, True, True], [True, True, False]])
    if nan:
        w = jnp.full_like(w, jnp.nan)
    return M.weight_entropy(w, jnp.zeros_like(mask) if all_masked else mask)


@pytest.mark.parametrize("kind", ["all_masked", "all_nan"])
def test_controllers_ignore_a_measurement_of_nothing(kind):
    """All-masked and all-NaN batches measure nothing: tau, beta, the EMA (and the flags) stay;
    an ordinary batch moves them as before."""
    s = M.update_tau(ctl(0.5, 0.1), 1.3, 1, SCHED)  # EMA set, tau moved once
    bad = _masked_batch_entropy(all_masked=kind == "all_masked", nan=kind == "all_nan")
    assert int(bad.count) == 0 and float(bad.mean) == 0.0  # 0 by convention, flagged as nothing
    _same(M.update_tau(s, bad, 5, SCHED), s)
    _same(jax.jit(M.update_tau)(s, bad, 5, SCHED), s)
    # the KL and meta rules take the same flag (e.g. a KL over zero tokens)
    kl = M.KLController(target=0.1, horizon=10, step_size=0.2)
    _same(M.update_beta(s, 0.0, kl, valid=bad.valid), s)
    g = M.analytic_meta_grads(bad, 0.8, 0.0, 0.1, kl_valid=bad.valid)
    assert not bool(g.tau_valid) and not bool(g.beta_valid) and float(g.tau_grad) == 0.0
    out, changed = M.meta_update(s, g.tau_grad, g.beta_grad, META, tau_valid=g.tau_valid, beta_valid=g.beta_valid)
    assert not bool(changed)
    _same(out, s)
    # a valid measurement moves them as before: the same as passing its mean
    good = _masked_batch_entropy(all_masked=False)
    assert int(good.count) == 2 and bool(good.valid)
    moved = M.update_tau(s, good, 5, SCHED)
    _same(moved, M.update_tau(s, float(good.mean), 5, SCHED))
    ema = 0.9 * f(s.entropy_ema) + 0.1 * f(good.mean)
    np.testing.assert_allclose(f(moved.entropy_ema), ema, rtol=1e-6)
    np.testing.assert_allclose(f(moved.tau), f(s.tau) * math.exp(0.1 * (0.8 - ema)), rtol=1e-5)
    np.testing.assert_allclose(f(M.update_beta(s, 0.2, kl, valid=good.valid).beta), 0.1 * 1.02, rtol=1e-6)


def test_tau_tiny_error_updates_ema_only():
    sched = SCHED.replace(target_entropy=0.0)
    s = ctl(0.5, 0.0).replace(denom=jnp.float32(0.7), entropy_ema=jnp.float32(1e-3), has_entropy_ema=jnp.asarray(True))
    s = M.update_tau(s, 0.0, 2, sched)  # EMA moves to 9e-4; err = -9e-4: a step
    assert f(s.entropy_ema) == pytest.approx(9e-4) and f(s.tau) < 0.5 and f(s.denom) == f(s.tau)
    s = s.replace(denom=jnp.float32(0.7), entropy_ema=jnp.float32(0.0))
    tau = f(s.tau)
    s = M.update_tau(s, 0.0, 3, sched)  # err exactly 0: no step, no write-back
    assert f(s.tau) == tau and f(s.denom) == pytest.approx(0.7) and f(s.entropy_ema) == 0.0


def test_tau_disabled_without_target():
    for sched in (M.TauSchedule(learning_rate=0.1), SCHED.replace(target_entropy=None)):
        s = M.update_tau(ctl(0.5, 0.0), 1.0, 10, sched)
        assert f(s.tau) == 0.5
        assert not bool(s.has_target) and f(s.current_target) == 0.0
        assert f(s.entropy_ema) == 1.0 and bool(s.has_entropy_ema)
    assert sched.normalized().target_entropy is None  # unset stays None: no NaN leaf
    with pytest.raises(ValueError, match="target_entropy must be finite and >= 0.0, got nan"):
        SCHED.replace(target_entropy=float("nan"))  # NaN is not a spelling of "unset"


def test_tau_clamps():
    lo = _run([1], [5.0], SCHED.replace(learning_rate=10.0))  # huge negative step
    assert f(lo.tau) == pytest.approx(0.05)
    assert f(lo.log_tau) == pytest.approx(math.log(0.05), rel=1e-6)  # written back
    hi = _run([1], [-5.0], SCHED.replace(learning_rate=10.0))
    assert f(hi.tau) == pytest.approx(2.0)
    nocap = _run([1], [-5.0], SCHED.replace(learning_rate=1.0, maximum_value=0.0))
    np.testing.assert_allclose(f(nocap.tau), 0.5 * math.exp(5.8), rtol=1e-5)


def test_tau_annealed_target():
    sched = M.TauSchedule(target_entropy=1.0, target_entropy_start=2.0, target_entropy_final=0.0,
                          target_entropy_horizon=10, learning_rate=0.1)
    for step, want in [(-3, 2.0), (0, 2.0), (5, 1.0), (10, 0.0), (20, 0.0)]:
        t, has = M.target_entropy_at(sched, step)
        np.testing.assert_allclose(f(t), want, atol=1e-6)
        assert bool(has)
    only_final = M.TauSchedule(target_entropy=1.0, target_entropy_final=0.3)
    assert f(M.target_entropy_at(only_final, 7)[0]) == pytest.approx(0.3)  # horizon 0 -> final
    only_start = M.TauSchedule(target_entropy=1.0, target_entropy_start=0.0, target_entropy_horizon=4)
    assert f(M.target_entropy_at(only_start, 2)[0]) == pytest.approx(0.5)  # final defaults to target
    # a value the rule needs is unset: no target (0, False), never NaN
    for sch, step in [(M.TauSchedule(), 3), (M.TauSchedule(target_entropy_start=1.0), 3),
                      (M.TauSchedule(target_entropy_final=0.3, target_entropy_horizon=4), 2)]:
        t, has = M.target_entropy_at(sch, step)
        assert f(t) == 0.0 and not bool(has)
    t, has = M.target_entropy_at(M.TauSchedule(target_entropy_final=0.3), 2)  # no ramp: final at once
    assert f(t) == pytest.approx(0.3) and bool(has)
    s = M.update_tau(ctl(0.5, 0.0), 1.0, 5, sched)
    assert f(s.current_target) == pytest.approx(1.0) and bool(s.has_target)


def test_tau_lr_scale():
    base = _run([1], [1.0], SCHED.replace(minimum_value=0.0))
    s = M.update_tau(ctl(0.5, 0.0), 1.0, 1, SCHED.replace(minimum_value=0.0), lr_scale=float("nan"))
    assert f(s.tau) == f(base.tau)  # non-finite scale -> 1
    s = M.update_tau(ctl(0.5, 0.0), 1.0, 1, SCHED, lr_scale=-2.0)
    assert f(s.tau) == 0.5  # negative scale -> 0
    s = M.update_tau(ctl(0.5, 0.0), 1.0, 1, SCHED.replace(minimum_value=0.0), lr_scale=2.0)
    np.testing.assert_allclose(f(s.tau), 0.5 * math.exp(-0.04), rtol=1e-6)


# ---------------------------------------------------------------- KL rule
def test_kl_controller_rule(jit_or_eager):
    upd = jit_or_eager(M.update_beta)
    kl = M.KLController(target=0.1, horizon=10, step_size=0.2)
    s = ctl(0.5, 0.1).replace(denom=jnp.float32(0.6))
    up = upd(s, 0.2, kl)  # err = 1, clipped to 0.2
    np.testing.assert_allclose(f(up.beta), 0.1 * (1 + 0.2 / 10), rtol=1e-6)
    assert f(up.denom) == pytest.approx(0.5)  # written back to tau
    down = upd(s, 0.09, kl)  # err = -0.1
    np.testing.assert_allclose(f(down.beta), 0.1 * (1 - 0.1 / 10), rtol=1e-6)
    same = upd(s, 0.1, kl)  # |err| < 1e-8: no change, no write-back
    assert f(same.beta) == pytest.approx(0.1) and f(same.denom) == pytest.approx(0.6)


def test_kl_controller_inactive_and_floor():
    s = ctl(0.5, 0.1)
    for kl in (M.KLController(0.0, 10, 0.2), M.KLController(0.0, 0, 0.2), M.KLController(0.1, 10, 0.0)):
        assert f(M.update_beta(s, 0.5, kl).beta) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="kl horizon"):  # an active controller needs a horizon >= 1
        M.update_beta(s, 0.5, M.KLController(0.1, 0, 0.2))
    kl = M.KLController(0.1, 10, 0.2)
    assert f(M.update_beta(s, float("nan"), kl).beta) == pytest.approx(0.1)
    assert f(M.update_beta(s, float("inf"), kl).beta) == pytest.approx(0.1)
    # horizon 1 and a big step size: f = 1 + clip(-1) = 0 -> 1e-6
    crash = M.update_beta(s, 0.0, M.KLController(0.1, 1, 5.0))
    np.testing.assert_allclose(f(crash.beta), 0.1 * 1e-6, rtol=1e-5)


# -------------------------------------------------------------- meta rule
META = M.MetaController(enabled=True, learning_rate=0.1, tau_min=0.05, tau_max=2.0)


def test_meta_tau_and_beta_steps(jit_or_eager):
    upd = jit_or_eager(M.meta_update)
    s = ctl(0.5, 0.1)
    out, changed = upd(s, 1.0, 0.5, META)
    assert bool(changed)
    np.testing.assert_allclose(f(out.tau), 0.4, rtol=1e-6)
    np.testing.assert_allclose(f(out.beta), 0.15, rtol=1e-6)  # plus sign
    assert f(out.denom) == pytest.approx(0.4) and f(out.log_tau) == pytest.approx(math.log(0.4), rel=1e-6)
    assert f(out.last_tau_grad) == 1.0 and f(out.last_beta_grad) == 0.5
    assert not bool(out.tau_projected) and not bool(out.beta_projected)


def test_meta_bounds_and_projection():
    s = ctl(0.5, 0.1)
    lo, _ = M.meta_update(s, 100.0, None, META)
    assert f(lo.tau) == pytest.approx(0.05) and bool(lo.tau_projected)
    hi, _ = M.meta_update(s, -100.0, None, META)
    assert f(hi.tau) == pytest.approx(2.0) and bool(hi.tau_projected)
    nocap, _ = M.meta_update(s, -100.0, None, META.replace(tau_max=0.0))
    assert f(nocap.tau) == pytest.approx(10.5) and not bool(nocap.tau_projected)
    neg, _ = M.meta_update(s, None, -100.0, META)
    assert f(neg.beta) == 0.0 and bool(neg.beta_projected)
    clipped, _ = M.meta_update(s, None, 100.0, META.replace(beta_grad_clip=0.5))
    np.testing.assert_allclose(f(clipped.beta), 0.1 + 0.1 * 0.5, rtol=1e-6)
    assert f(clipped.last_beta_grad) == 100.0  # the raw gradient is recorded


def test_meta_learning_rates():
    s = ctl(0.5, 0.1)
    per, _ = M.meta_update(s, 1.0, 1.0, META.replace(tau_learning_rate=0.2, beta_learning_rate=0.3))
    np.testing.assert_allclose([f(per.tau), f(per.beta)], [0.3, 0.4], rtol=1e-6)
    scaled, _ = M.meta_update(s, 1.0, 1.0, META, lr_scale=0.5)
    np.testing.assert_allclose([f(scaled.tau), f(scaled.beta)], [0.45, 0.15], rtol=1e-6)
    none, changed = M.meta_update(s, 1.0, 1.0, META.replace(learning_rate=0.0))
    assert not bool(changed) and f(none.tau) == 0.5 and f(none.beta) == pytest.approx(0.1)


def test_meta_inactive_cases():
    s = ctl(0.5, 0.1).replace(denom=jnp.float32(0.6))
    for meta, g in [(META.replace(enabled=False), 1.0), (META.replace(method="zeroth_order"), 1.0),
                    (META, float("nan")), (META, None)]:
        out, changed = M.meta_update(s, g, g, meta)
        assert not bool(changed)
        assert f(out.tau) == 0.5 and f(out.denom) == pytest.approx(0.6)
        assert f(out.last_tau_grad) == 0.0


def test_analytic_grads_and_interval():
    g = M.analytic_meta_grads(1.2, 0.8, 0.3, 0.1)
    np.testing.assert_allclose([f(g.tau_grad), f(g.beta_grad)], [0.4, 0.2], rtol=1e-6)
    assert bool(g.tau_valid) and bool(g.beta_valid)
    # a gradient that does not apply is 0 and flagged (meta_update skips it), never NaN
    for g in (M.analytic_meta_grads(1.2, 0.8, 0.3, 0.0), M.analytic_meta_grads(1.2, 0.8),
              M.analytic_meta_grads(1.2, 0.8, float("nan"), 0.1), M.analytic_meta_grads(1.2, 0.8, 0.3, 0.1,
                                                                                         kl_valid=False)):
        assert f(g.beta_grad) == 0.0 and not bool(g.beta_valid) and bool(g.tau_valid)
    for g in (M.analytic_meta_grads(1.2, None, 0.3, 0.1), M.analytic_meta_grads(1.2, 0.8, 0.3, 0.1, valid=False),
              M.analytic_meta_grads(1.2, 0.8, 0.3, 0.1, target_valid=False)):
        assert f(g.tau_grad) == 0.0 and not bool(g.tau_valid) and bool(g.beta_valid)
    s = ctl(0.5, 0.1)
    out, changed = M.meta_update(s, 1.0, 1.0, META, tau_valid=False, beta_valid=False)
    assert not bool(changed) and f(out.tau) == 0.5 and f(out.beta) == pytest.approx(0.1)
    out, changed = M.meta_update(s, 1.0, 1.0, META, tau_valid=False)
    assert bool(changed) and f(out.tau) == 0.5 and f(out.beta) == pytest.approx(0.2)
    meta = META.replace(update_interval=3)
    assert [bool(M.meta_should_update(meta, k)) for k in range(5)] == [True, False, False, True, False]


# -------------------------------------------------------------- contracts
def _batched_states():
    return jax.vmap(ctl)(jnp.array([0.2, 0.5, 1.0]), jnp.array([0.0, 0.1, 0.3]))


def test_contract_update_tau(tmp_path):
    sched_alt = typed(SCHED.replace(target_entropy=1.5, learning_rate=0.3))
    sched = typed(SCHED)
    check_state_contract(
        init=lambda: ctl(0.5, 0.1),
        update=lambda s, h, step, sch: M.update_tau(s, h, step, sch),
        update_args=(jnp.float32(1.0), jnp.int32(3), sched),
        update_args_alt=(jnp.float32(0.2), jnp.int32(4), sched_alt),
        batched_init=_batched_states,
        batched_update_in_axes=(0, None, 0),
        batched_update_args=(jnp.array([0.3, 1.0, 2.0]), jnp.int32(3),
                             jax.tree.map(lambda x: jnp.stack([x, x * 2, x // 2]), sched)),
        tmp_path=tmp_path,
    )


def test_contract_update_beta(tmp_path):
    kl = typed(M.KLController(0.1, 10, 0.2))
    check_state_contract(
        init=lambda: ctl(0.5, 0.1),
        update=lambda s, x, k: M.update_beta(s, x, k),
        update_args=(jnp.float32(0.3), kl),
        update_args_alt=(jnp.float32(0.01), jax.tree.map(lambda x: x * 2, kl)),
        batched_init=_batched_states,
        batched_update_in_axes=(0, None),
        batched_update_args=(jnp.array([0.05, 0.1, jnp.nan]), kl),
        tmp_path=tmp_path,
    )


def test_contract_meta_update(tmp_path):
    meta = typed(META)
    check_state_contract(
        init=lambda: ctl(0.5, 0.1),
        update=lambda s, g1, g2, m: M.meta_update(s, g1, g2, m),
        update_args=(jnp.float32(0.3), jnp.float32(-0.2), meta),
        update_args_alt=(jnp.float32(1.0), jnp.float32(2.0), meta.replace(learning_rate=jnp.float32(0.5))),
        batched_init=_batched_states,
        batched_update_in_axes=(0, 0, None),
        batched_update_args=(jnp.array([0.3, jnp.nan, 50.0]), jnp.array([-5.0, 0.1, jnp.inf]), meta),
        tmp_path=tmp_path,
    )


def test_vmap_over_schedules_matches_loop():
    """A sweep over (tau0, target, lr) runs the same masked rule per element, early exits included."""
    states = jax.vmap(ctl)(jnp.array([0.3, 0.5, 0.7, 0.9]), jnp.zeros(4))
    scheds = M.TauSchedule(target_entropy=jnp.array([0.8, 1.4, 1.0, 0.5]),
                           learning_rate=jnp.array([0.1, 0.1, 0.0, 5.0]),
                           minimum_value=jnp.full(4, 0.05), maximum_value=jnp.array([2.0, 2.0, 2.0, 0.0]),
                           warmup_steps=jnp.array([0, 0, 10, 0], jnp.int32),
                           target_entropy_horizon=jnp.zeros(4, jnp.int32))
    ents = jnp.array([1.0, 1.0, jnp.nan, -3.0])  # a NaN measurement is skipped in its member only

    def run(s, h, sch):
        for step in range(3):
            s = M.update_tau(s, h, step, sch)
        return s

    assert_vmap_matches_loop(jax.jit(run), (0, 0, 0), states, ents, scheds, rtol=1e-6)


def test_no_retrace_on_new_values():
    s = ctl(0.5, 0.1)
    assert_no_retrace(lambda s, h, sch: M.update_tau(s, h, 2, sch),
                      (s, jnp.float32(1.0), typed(SCHED)),
                      (s.replace(tau=jnp.float32(0.9)), jnp.float32(0.3),
                       typed(SCHED.replace(target_entropy=1.1, learning_rate=0.5, warmup_steps=1))))


# ------------------------------------------------------- config / init shape
def test_config_and_init():
    cfg = M.config(0.5, 0.04, schedule=SCHED, kl=M.KLController(0.05, 10, 0.2), meta=META)
    for leaf in jax.tree.leaves(cfg):
        assert isinstance(leaf, jax.Array) and leaf.dtype in (jnp.float32, jnp.int32, jnp.bool_), leaf
    assert M.config(0.5, 0.0).schedule.target_entropy is None  # unset target: no leaf, no NaN
    assert M.config(0.5, 0.0).denom is None  # denom = tau
    s = M.init(cfg)
    assert_trees_equal = lambda a, b: [np.testing.assert_array_equal(x, y)  # noqa: E731
                                       for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    assert_trees_equal(s, ctl(0.5, 0.04))
    assert f(M.init(M.config(0.5, 0.04, denom=0.7)).denom) == pytest.approx(0.7)
    # a config gives the same updates as the bare settings objects
    a = M.update_tau(s, 1.0, 1, cfg)
    b = M.update_tau(s, 1.0, 1, SCHED)
    assert_trees_equal(a, b)
    assert_trees_equal(M.update_beta(s, 0.2, cfg), M.update_beta(s, 0.2, M.KLController(0.05, 10, 0.2)))
    assert_trees_equal(M.meta_update(s, 0.3, 0.1, cfg)[0], M.meta_update(s, 0.3, 0.1, META)[0])


def test_config_vmaps_and_never_recompiles():
    cfgs = jax.vmap(lambda lr: M.config(0.5, 0.0, schedule=M.TauSchedule(target_entropy=0.8, learning_rate=lr,
                                                                          warmup_steps=0)))(jnp.array([0.1, 0.5]))
    s = ctl(0.5, 0.0)
    out = jax.vmap(lambda c: M.update_tau(s, 1.0, 1, c))(cfgs)
    np.testing.assert_allclose(out.tau, [0.5 * math.exp(-0.02), 0.5 * math.exp(-0.1)], rtol=1e-5)
    cfg = M.config(0.5, 0.0, schedule=SCHED)
    assert_no_retrace(lambda s, h, c: M.update_tau(s, h, 3, c), (s, jnp.float32(1.0), cfg),
                      (s, jnp.float32(0.3), M.config(0.9, 0.1, schedule=SCHED.replace(learning_rate=0.7))))


def test_config_refuses_wrong_types():
    with pytest.raises(ValueError, match="schedule must be a maxent.TauSchedule"):
        M.config(schedule=M.KLController())
    with pytest.raises(ValueError, match="MaxEntConfig"):
        M.init(SCHED)
    with pytest.raises(ValueError, match="MaxEntConfig"):
        M.update_tau(ctl(0.5, 0.0), 1.0, 1, M.KLController())


@pytest.mark.parametrize("build, fragment", [
    (lambda: M.TauSchedule(learning_rate=-0.1), "learning_rate must be finite and >= 0.0, got -0.1"),
    (lambda: M.TauSchedule(minimum_value=0.5, maximum_value=0.1), "minimum_value must be <= maximum_value"),
    (lambda: M.TauSchedule(target_entropy=float("inf")), "target_entropy must be finite"),
    (lambda: M.KLController(target=0.1, horizon=0, step_size=0.2), "kl horizon"),
    (lambda: M.MetaController(tau_min=0.5, tau_max=0.1), "meta tau_min must be <= meta tau_max"),
    (lambda: M.MetaController(update_interval=0), "meta update_interval must be >= 1"),
    (lambda: M.MaxEntConfig(**{**vars(M.config()), "q_temperature": jnp.float32(-1.0)}), "q_temperature"),
])
def test_settings_classes_validate_in_their_constructors(build, fragment):
    with pytest.raises(ValueError, match=fragment):
        build()


def test_settings_skip_traced_values_and_rebuild_under_transforms():
    cfg = M.config(0.5, schedule=SCHED)
    # jit / vmap / tree utilities rebuild the classes with tracers and placeholders: no check, no error
    out = jax.jit(lambda c: c.replace(tau=c.tau * 2))(cfg)
    assert f(out.tau) == 1.0
    assert jax.tree.structure(jax.tree.map(lambda _: object(), cfg)) == jax.tree.structure(cfg)


def test_public_surface():
    assert set(M.__all__) <= set(dir(M))
    for name in ("save_controller_state", "load_controller_state", "controller_state_dict", "init_controller",
                 "ControllerConfig", "maxent_step", "update"):
        assert not hasattr(M, name)  # file formats live in jaxweight.interop.maxent_grpo
    assert set(MG.__all__) <= set(dir(MG))
