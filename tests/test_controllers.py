"""jaxweight.controllers: tau / beta / meta rules step by step, contracts, persistence."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import controllers as C
from jaxweight._util import StateFileError
from jaxweight.interop import maxent_grpo as MG
from tests.contracts import assert_no_retrace, assert_vmap_matches_loop, check_state_contract

SCHED = C.TauSchedule(target_entropy=0.8, learning_rate=0.1, minimum_value=0.05,
                      maximum_value=2.0, warmup_steps=0)


def f(x):
    return float(np.asarray(x))


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
def test_init_controller_layout():
    s = C.init_controller(0.5, 0.04)
    assert f(s.tau) == pytest.approx(0.5) and f(s.denom) == pytest.approx(0.5)
    assert f(s.log_tau) == pytest.approx(math.log(0.5), rel=1e-6)
    assert math.isnan(f(s.entropy_ema)) and math.isnan(f(s.current_target))
    for leaf in jax.tree.leaves(s):
        assert leaf.shape == () and not leaf.weak_type
        assert leaf.dtype in (jnp.float32, jnp.bool_)
    s0 = C.init_controller(0.0, 0.1)
    assert f(s0.denom) == 1.0 and f(s0.log_tau) == pytest.approx(math.log(1e-8), rel=1e-6)
    assert f(C.init_controller(0.5, 0.1, denom=0.6).denom) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="scalars"):
        C.init_controller(jnp.ones(3), 0.1)


# --------------------------------------------------------------- tau rule
def test_spec_example_6_tau_controller(jit_or_eager):
    upd = jit_or_eager(C.update_tau)
    s = C.init_controller(0.5, 0.0)
    s = upd(s, 1.0, 0, SCHED)
    assert f(s.tau) == 0.5  # step 0 always skips ...
    assert f(s.entropy_ema) == 1.0  # ... but the unset EMA is initialised
    assert f(s.current_target) == pytest.approx(0.8)
    s = upd(s, 1.0, 1, SCHED)
    np.testing.assert_allclose(f(s.tau), 0.4900993366533776, rtol=1e-6)
    np.testing.assert_allclose(f(s.denom), f(s.tau), rtol=0)
    np.testing.assert_allclose(f(s.log_tau), math.log(0.4900993366533776), rtol=1e-6)


def _run(steps, entropies, sched, tau=0.5):
    s = C.init_controller(tau, 0.0)
    for step, h in zip(steps, entropies):
        s = C.update_tau(s, h, step, sched)
    return s


def test_tau_warmup_skips():
    sched = SCHED.replace(warmup_steps=3)
    s = _run([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0], sched)
    assert f(s.tau) == 0.5
    assert f(s.entropy_ema) == 1.0  # set once, then frozen while warming up
    s = C.update_tau(s, 1.0, 4, sched)
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


def test_tau_nonfinite_entropy_leaves_state_exactly_unchanged():
    fresh = C.init_controller(0.5, 0.0)
    warm = C.update_tau(fresh, 1.2, 1, SCHED)
    for s in (fresh, warm):
        for bad in (float("nan"), float("inf"), -float("inf")):
            out = C.update_tau(s, bad, 5, SCHED)
            for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(s)):
                np.testing.assert_array_equal(a, b)


def test_tau_tiny_error_updates_ema_only():
    sched = SCHED.replace(target_entropy=0.0)
    s = C.init_controller(0.5, 0.0).replace(denom=jnp.float32(0.7), entropy_ema=jnp.float32(1e-3))
    s = C.update_tau(s, 0.0, 2, sched)  # EMA moves to 9e-4; err = -9e-4: a step
    assert f(s.entropy_ema) == pytest.approx(9e-4) and f(s.tau) < 0.5 and f(s.denom) == f(s.tau)
    s = s.replace(denom=jnp.float32(0.7), entropy_ema=jnp.float32(0.0))
    tau = f(s.tau)
    s = C.update_tau(s, 0.0, 3, sched)  # err exactly 0: no step, no write-back
    assert f(s.tau) == tau and f(s.denom) == pytest.approx(0.7) and f(s.entropy_ema) == 0.0


def test_tau_disabled_without_target():
    for sched in (C.TauSchedule(learning_rate=0.1), SCHED.replace(target_entropy=jnp.float32(jnp.nan))):
        s = C.update_tau(C.init_controller(0.5, 0.0), 1.0, 10, sched)
        assert f(s.tau) == 0.5
        assert math.isnan(f(s.current_target))
        assert f(s.entropy_ema) == 1.0


def test_tau_clamps():
    lo = _run([1], [5.0], SCHED.replace(learning_rate=10.0))  # huge negative step
    assert f(lo.tau) == pytest.approx(0.05)
    assert f(lo.log_tau) == pytest.approx(math.log(0.05), rel=1e-6)  # written back
    hi = _run([1], [-5.0], SCHED.replace(learning_rate=10.0))
    assert f(hi.tau) == pytest.approx(2.0)
    nocap = _run([1], [-5.0], SCHED.replace(learning_rate=1.0, maximum_value=0.0))
    np.testing.assert_allclose(f(nocap.tau), 0.5 * math.exp(5.8), rtol=1e-5)


def test_tau_annealed_target():
    sched = C.TauSchedule(target_entropy=1.0, target_entropy_start=2.0, target_entropy_final=0.0,
                          target_entropy_horizon=10, learning_rate=0.1)
    for step, want in [(-3, 2.0), (0, 2.0), (5, 1.0), (10, 0.0), (20, 0.0)]:
        np.testing.assert_allclose(f(C.target_entropy_at(sched, step)), want, atol=1e-6)
    only_final = C.TauSchedule(target_entropy=1.0, target_entropy_final=0.3)
    assert f(C.target_entropy_at(only_final, 7)) == pytest.approx(0.3)  # horizon 0 -> final
    only_start = C.TauSchedule(target_entropy=1.0, target_entropy_start=0.0, target_entropy_horizon=4)
    assert f(C.target_entropy_at(only_start, 2)) == pytest.approx(0.5)  # final defaults to target
    s = C.update_tau(C.init_controller(0.5, 0.0), 1.0, 5, sched)
    assert f(s.current_target) == pytest.approx(1.0)


def test_tau_lr_scale():
    base = _run([1], [1.0], SCHED.replace(minimum_value=0.0))
    s = C.update_tau(C.init_controller(0.5, 0.0), 1.0, 1, SCHED.replace(minimum_value=0.0), lr_scale=float("nan"))
    assert f(s.tau) == f(base.tau)  # non-finite scale -> 1
    s = C.update_tau(C.init_controller(0.5, 0.0), 1.0, 1, SCHED, lr_scale=-2.0)
    assert f(s.tau) == 0.5  # negative scale -> 0
    s = C.update_tau(C.init_controller(0.5, 0.0), 1.0, 1, SCHED.replace(minimum_value=0.0), lr_scale=2.0)
    np.testing.assert_allclose(f(s.tau), 0.5 * math.exp(-0.04), rtol=1e-6)


# ---------------------------------------------------------------- KL rule
def test_kl_controller_rule(jit_or_eager):
    upd = jit_or_eager(C.update_beta)
    kl = C.KLController(target=0.1, horizon=10, step_size=0.2)
    s = C.init_controller(0.5, 0.1).replace(denom=jnp.float32(0.6))
    up = upd(s, 0.2, kl)  # err = 1, clipped to 0.2
    np.testing.assert_allclose(f(up.beta), 0.1 * (1 + 0.2 / 10), rtol=1e-6)
    assert f(up.denom) == pytest.approx(0.5)  # written back to tau
    down = upd(s, 0.09, kl)  # err = -0.1
    np.testing.assert_allclose(f(down.beta), 0.1 * (1 - 0.1 / 10), rtol=1e-6)
    same = upd(s, 0.1, kl)  # |err| < 1e-8: no change, no write-back
    assert f(same.beta) == pytest.approx(0.1) and f(same.denom) == pytest.approx(0.6)


def test_kl_controller_inactive_and_floor():
    s = C.init_controller(0.5, 0.1)
    for kl in (C.KLController(0.0, 10, 0.2), C.KLController(0.0, 0, 0.2), C.KLController(0.1, 10, 0.0)):
        assert f(C.update_beta(s, 0.5, kl).beta) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="kl horizon"):  # an active controller needs a horizon >= 1
        C.update_beta(s, 0.5, C.KLController(0.1, 0, 0.2))
    kl = C.KLController(0.1, 10, 0.2)
    assert f(C.update_beta(s, float("nan"), kl).beta) == pytest.approx(0.1)
    assert f(C.update_beta(s, float("inf"), kl).beta) == pytest.approx(0.1)
    # horizon 1 and a big step size: f = 1 + clip(-1) = 0 -> 1e-6
    crash = C.update_beta(s, 0.0, C.KLController(0.1, 1, 5.0))
    np.testing.assert_allclose(f(crash.beta), 0.1 * 1e-6, rtol=1e-5)


# -------------------------------------------------------------- meta rule
META = C.MetaController(enabled=True, learning_rate=0.1, tau_min=0.05, tau_max=2.0)


def test_meta_tau_and_beta_steps(jit_or_eager):
    upd = jit_or_eager(C.meta_update)
    s = C.init_controller(0.5, 0.1)
    out, changed = upd(s, 1.0, 0.5, META)
    assert bool(changed)
    np.testing.assert_allclose(f(out.tau), 0.4, rtol=1e-6)
    np.testing.assert_allclose(f(out.beta), 0.15, rtol=1e-6)  # plus sign
    assert f(out.denom) == pytest.approx(0.4) and f(out.log_tau) == pytest.approx(math.log(0.4), rel=1e-6)
    assert f(out.last_tau_grad) == 1.0 and f(out.last_beta_grad) == 0.5
    assert not bool(out.tau_projected) and not bool(out.beta_projected)


def test_meta_bounds_and_projection():
    s = C.init_controller(0.5, 0.1)
    lo, _ = C.meta_update(s, tau_grad=100.0, cfg=META)
    assert f(lo.tau) == pytest.approx(0.05) and bool(lo.tau_projected)
    hi, _ = C.meta_update(s, tau_grad=-100.0, cfg=META)
    assert f(hi.tau) == pytest.approx(2.0) and bool(hi.tau_projected)
    nocap, _ = C.meta_update(s, tau_grad=-100.0, cfg=META.replace(tau_max=0.0))
    assert f(nocap.tau) == pytest.approx(10.5) and not bool(nocap.tau_projected)
    neg, _ = C.meta_update(s, beta_grad=-100.0, cfg=META)
    assert f(neg.beta) == 0.0 and bool(neg.beta_projected)
    clipped, _ = C.meta_update(s, beta_grad=100.0, cfg=META.replace(beta_grad_clip=0.5))
    np.testing.assert_allclose(f(clipped.beta), 0.1 + 0.1 * 0.5, rtol=1e-6)
    assert f(clipped.last_beta_grad) == 100.0  # the raw gradient is recorded


def test_meta_learning_rates():
    s = C.init_controller(0.5, 0.1)
    per, _ = C.meta_update(s, 1.0, 1.0, META.replace(tau_learning_rate=0.2, beta_learning_rate=0.3))
    np.testing.assert_allclose([f(per.tau), f(per.beta)], [0.3, 0.4], rtol=1e-6)
    scaled, _ = C.meta_update(s, 1.0, 1.0, META, lr_scale=0.5)
    np.testing.assert_allclose([f(scaled.tau), f(scaled.beta)], [0.45, 0.15], rtol=1e-6)
    none, changed = C.meta_update(s, 1.0, 1.0, META.replace(learning_rate=0.0))
    assert not bool(changed) and f(none.tau) == 0.5 and f(none.beta) == pytest.approx(0.1)


def test_meta_inactive_cases():
    s = C.init_controller(0.5, 0.1).replace(denom=jnp.float32(0.6))
    for meta, g in [(META.replace(enabled=False), 1.0), (META.replace(method="zeroth_order"), 1.0),
                    (META, float("nan")), (META, None)]:
        out, changed = C.meta_update(s, g, g, meta)
        assert not bool(changed)
        assert f(out.tau) == 0.5 and f(out.denom) == pytest.approx(0.6)
        assert f(out.last_tau_grad) == 0.0


def test_analytic_grads_and_interval():
    tg, bg = C.analytic_meta_grads(1.2, 0.8, 0.3, 0.1)
    np.testing.assert_allclose([f(tg), f(bg)], [0.4, 0.2], rtol=1e-6)
    _, bg = C.analytic_meta_grads(1.2, 0.8, 0.3, 0.0)
    assert math.isnan(f(bg))  # skipped by meta_update
    _, bg = C.analytic_meta_grads(1.2, 0.8)
    assert math.isnan(f(bg))
    meta = META.replace(update_interval=3)
    assert [bool(C.meta_should_update(meta, k)) for k in range(5)] == [True, False, False, True, False]


# -------------------------------------------------------------- contracts
def _batched_states():
    return jax.vmap(C.init_controller)(jnp.array([0.2, 0.5, 1.0]), jnp.array([0.0, 0.1, 0.3]))


def test_contract_update_tau(tmp_path):
    sched_alt = typed(SCHED.replace(target_entropy=1.5, learning_rate=0.3))
    sched = typed(SCHED)
    check_state_contract(
        init=lambda: C.init_controller(0.5, 0.1),
        update=lambda s, h, step, sch: C.update_tau(s, h, step, sch),
        update_args=(jnp.float32(1.0), jnp.int32(3), sched),
        update_args_alt=(jnp.float32(0.2), jnp.int32(4), sched_alt),
        batched_init=_batched_states,
        batched_update_in_axes=(0, None, 0),
        batched_update_args=(jnp.array([0.3, 1.0, 2.0]), jnp.int32(3),
                             jax.tree.map(lambda x: jnp.stack([x, x * 2, x // 2]), sched)),
        tmp_path=tmp_path,
    )


def test_contract_update_beta(tmp_path):
    kl = typed(C.KLController(0.1, 10, 0.2))
    check_state_contract(
        init=lambda: C.init_controller(0.5, 0.1),
        update=lambda s, x, k: C.update_beta(s, x, k),
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
        init=lambda: C.init_controller(0.5, 0.1),
        update=lambda s, g1, g2, m: C.meta_update(s, g1, g2, m),
        update_args=(jnp.float32(0.3), jnp.float32(-0.2), meta),
        update_args_alt=(jnp.float32(1.0), jnp.float32(2.0), meta.replace(learning_rate=jnp.float32(0.5))),
        batched_init=_batched_states,
        batched_update_in_axes=(0, 0, None),
        batched_update_args=(jnp.array([0.3, jnp.nan, 50.0]), jnp.array([-5.0, 0.1, jnp.inf]), meta),
        tmp_path=tmp_path,
    )


def test_vmap_over_schedules_matches_loop():
    """A sweep over (tau0, target, lr) runs the same masked rule per element, early exits included."""
    states = jax.vmap(C.init_controller)(jnp.array([0.3, 0.5, 0.7, 0.9]), jnp.zeros(4))
    scheds = C.TauSchedule(target_entropy=jnp.array([0.8, jnp.nan, 1.0, 0.5]),
                           learning_rate=jnp.array([0.1, 0.1, 0.0, 5.0]),
                           minimum_value=jnp.full(4, 0.05), maximum_value=jnp.array([2.0, 2.0, 2.0, 0.0]),
                           warmup_steps=jnp.array([0, 0, 10, 0], jnp.int32),
                           target_entropy_horizon=jnp.zeros(4, jnp.int32))
    ents = jnp.array([1.0, 1.0, jnp.nan, -3.0])

    def run(s, h, sch):
        for step in range(3):
            s = C.update_tau(s, h, step, sch)
        return s

    assert_vmap_matches_loop(jax.jit(run), (0, 0, 0), states, ents, scheds, rtol=1e-6)


def test_no_retrace_on_new_values():
    s = C.init_controller(0.5, 0.1)
    assert_no_retrace(lambda s, h, sch: C.update_tau(s, h, 2, sch),
                      (s, jnp.float32(1.0), typed(SCHED)),
                      (s.replace(tau=jnp.float32(0.9)), jnp.float32(0.3),
                       typed(SCHED.replace(target_entropy=1.1, learning_rate=0.5, warmup_steps=1))))


# ------------------------------------------------------------ persistence
def test_state_dict_layout():
    s = C.init_controller(0.5, 0.1)
    d = MG.controller_state_dict(s)
    assert set(d) == {"beta", "tau", "tau_log", "tau_entropy_ema"}
    assert d["tau_entropy_ema"] == pytest.approx(0.5)  # unset EMA -> tau
    s2, _ = C.meta_update(s, 0.3, 0.2, META)
    d = MG.controller_state_dict(s2, META)
    assert d["meta"]["version"] == 1
    ctrl = d["meta"]["controller"]
    assert ctrl["last_tau_grad"] == pytest.approx(0.3) and ctrl["method"] == "analytic"
    assert {"enabled", "learning_rate", "update_interval", "use_hessian", "tau_min", "tau_max"} <= set(ctrl)
    json.dumps(d)
    with pytest.raises(ValueError, match="batch"):
        MG.controller_state_dict(_batched_states())


def test_json_round_trip(tmp_path):
    s = C.update_tau(C.update_tau(C.init_controller(0.5, 0.1), 1.2, 0, SCHED), 1.2, 1, SCHED)
    s, _ = C.meta_update(s, 0.25, -0.5, META)
    path = tmp_path / "deep" / "dir" / MG.CONTROLLER_STATE_FILENAME
    MG.save_controller_state(path, s, META)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    back, meta = MG.load_controller_file(path)
    for k in ("tau", "beta", "log_tau", "entropy_ema", "last_tau_grad", "last_beta_grad"):
        np.testing.assert_allclose(f(getattr(back, k)), f(getattr(s, k)), rtol=1e-7, err_msg=k)
    # the maxent_grpo loader rule
    assert f(back.denom) == pytest.approx(f(s.tau) + f(s.beta), rel=1e-6)
    assert meta.enabled and float(meta.learning_rate) == pytest.approx(0.1) and float(meta.tau_max) == 2.0
    # the next controller update resets denom to tau
    nxt = C.update_tau(back, 0.1, 5, SCHED)
    assert f(nxt.denom) == pytest.approx(f(nxt.tau))


def test_save_bare_filename(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    MG.save_controller_state("controller_state.json", C.init_controller(0.5, 0.1))
    assert f(MG.load_controller_state("controller_state.json").tau) == pytest.approx(0.5)


def test_load_original_layout(tmp_path):
    """Files written by maxent_grpo: minimal, or with a meta payload and odd fields."""
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"beta": 0.04, "tau": 0.3}))
    s = MG.load_controller_state(p)
    assert f(s.log_tau) == pytest.approx(math.log(0.3), rel=1e-6)
    assert f(s.entropy_ema) == pytest.approx(0.3)
    assert f(s.denom) == pytest.approx(0.34, rel=1e-6)
    p.write_text(json.dumps({"beta": 0.0, "tau": 0.0, "tau_log": "x", "tau_entropy_ema": None,
                             "meta": {"version": 1, "controller": {
                                 "enabled": True, "method": "first_order", "learning_rate": "bad",
                                 "update_interval": 0, "last_tau_grad": 0.7}}}))
    s, meta = MG.load_controller_file(p)
    assert f(s.denom) == 1.0  # tau + beta <= 0 -> 1
    assert f(s.log_tau) == pytest.approx(math.log(1e-8), rel=1e-6)
    assert f(s.last_tau_grad) == pytest.approx(0.7)
    assert meta.method == "first_order" and meta.update_interval == 1 and float(meta.learning_rate) == 0.0


@pytest.mark.parametrize("content, field", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"beta": 0.1}', "'tau'"),
    ('{"beta": 0.1, "tau": "0.5"}', "'tau'"),
    ('{"beta": true, "tau": 0.5}', "'beta'"),
    ('{"beta": NaN, "tau": 0.5}', "'beta'"),
])
def test_load_malformed(tmp_path, content, field):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(StateFileError, match=field) as e:
        MG.load_controller_state(p)
    assert str(p) in str(e.value)


def test_load_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        MG.load_controller_state(tmp_path / "nope.json")


# ------------------------------------------------------- config / init shape
def test_config_and_init():
    cfg = C.config(0.5, 0.04, schedule=SCHED, kl=C.KLController(0.05, 10, 0.2), meta=META)
    for leaf in jax.tree.leaves(cfg):
        assert isinstance(leaf, jax.Array) and leaf.dtype in (jnp.float32, jnp.int32, jnp.bool_), leaf
    assert math.isnan(float(C.config(0.5, 0.0).schedule.target_entropy))  # unset target
    s = C.init(cfg)
    assert_trees_equal = lambda a, b: [np.testing.assert_array_equal(x, y)  # noqa: E731
                                       for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    assert_trees_equal(s, C.init_controller(0.5, 0.04))
    assert f(C.init(C.config(0.5, 0.04, denom=0.7)).denom) == pytest.approx(0.7)
    # a config gives the same updates as the bare settings objects
    a = C.update_tau(s, 1.0, 1, cfg)
    b = C.update_tau(s, 1.0, 1, SCHED)
    assert_trees_equal(a, b)
    assert_trees_equal(C.update_beta(s, 0.2, cfg), C.update_beta(s, 0.2, C.KLController(0.05, 10, 0.2)))
    assert_trees_equal(C.meta_update(s, 0.3, 0.1, cfg)[0], C.meta_update(s, 0.3, 0.1, META)[0])
    # update = tau then beta
    both = C.update(s, 1.0, 1, cfg, measured_kl=0.2)
    assert_trees_equal(both, C.update_beta(C.update_tau(s, 1.0, 1, cfg), 0.2, cfg))
    assert_trees_equal(C.update(s, 1.0, 1, cfg), C.update_tau(s, 1.0, 1, cfg))


def test_config_vmaps_and_never_recompiles():
    cfgs = jax.vmap(lambda lr: C.config(0.5, 0.0, schedule=C.TauSchedule(target_entropy=0.8, learning_rate=lr,
                                                                          warmup_steps=0)))(jnp.array([0.1, 0.5]))
    s = C.init_controller(0.5, 0.0)
    out = jax.vmap(lambda c: C.update_tau(s, 1.0, 1, c))(cfgs)
    np.testing.assert_allclose(out.tau, [0.5 * math.exp(-0.02), 0.5 * math.exp(-0.1)], rtol=1e-5)
    cfg = C.config(0.5, 0.0, schedule=SCHED)
    assert_no_retrace(lambda s, h, c: C.update(s, h, 3, c), (s, jnp.float32(1.0), cfg),
                      (s, jnp.float32(0.3), C.config(0.9, 0.1, schedule=SCHED.replace(learning_rate=0.7))))


def test_config_refuses_wrong_types():
    with pytest.raises(ValueError, match="schedule must be a controllers.TauSchedule"):
        C.config(schedule=C.KLController())
    with pytest.raises(ValueError, match="ControllerConfig"):
        C.init(SCHED)
    with pytest.raises(ValueError, match="ControllerConfig"):
        C.update(C.init_controller(0.5, 0.0), 1.0, 1, SCHED)


# ------------------------------------------------------------- deprecations
def test_deprecated_meta_update_order():
    s = C.init_controller(0.5, 0.1)
    new = C.meta_update(s, 0.3, -0.2, META)
    with pytest.deprecated_call():
        old = C.meta_update(s, META, 0.3, -0.2)
    for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new)):
        np.testing.assert_array_equal(a, b)


def test_deprecated_file_helpers_forward(tmp_path):
    s, _ = C.meta_update(C.init_controller(0.5, 0.1), 0.3, 0.2, META)
    with pytest.deprecated_call():
        assert C.controller_state_dict(s, META) == MG.controller_state_dict(s, META)
    path = tmp_path / "c.json"
    with pytest.deprecated_call():
        C.save_controller_state(path, s, META)
    assert json.loads(path.read_text()) == MG.controller_state_dict(s, META)
    with pytest.deprecated_call():
        back = C.load_controller_state(path)
    np.testing.assert_allclose(f(back.tau), f(MG.load_controller_state(path).tau))
    with pytest.deprecated_call():
        back, meta = C.load_controller_state(path, return_meta=True)
    assert meta == MG.load_controller_file(path).meta
    with pytest.deprecated_call():
        assert META.to_state(s) == MG.meta_to_payload(META, s)
    with pytest.deprecated_call():
        assert C.MetaController.from_state({"learning_rate": 0.3}) == MG.meta_from_payload({"learning_rate": 0.3})


def test_public_surface():
    assert set(C.__all__) <= set(dir(C))
    for name in ("save_controller_state", "load_controller_state", "controller_state_dict"):
        assert name not in C.__all__  # deprecated: in jaxweight.interop.maxent_grpo
    assert set(MG.__all__) <= set(dir(MG))
