"""jaxweight.interop.maxent_grpo: maxent_grpo's ``controller_state.json`` <-> the maxent controller state."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import maxent as M
from jaxweight._util import StateFileError
from jaxweight.interop import maxent_grpo as MG

SCHED = M.TauSchedule(target_entropy=0.8, learning_rate=0.1, minimum_value=0.05,
                      maximum_value=2.0, warmup_steps=0)
META = M.MetaController(enabled=True, learning_rate=0.1, tau_min=0.05, tau_max=2.0)


def f(x):
    return float(np.asarray(x))


def ctl(tau, beta, denom=None):
    return M.init(M.config(tau, beta, denom=denom))


def _batched_states():
    return jax.vmap(ctl)(jnp.array([0.2, 0.5, 1.0]), jnp.array([0.0, 0.1, 0.3]))


# ------------------------------------------------------------ persistence
def test_state_dict_layout():
    s = ctl(0.5, 0.1)
    d = MG.controller_state_dict(s)
    assert set(d) == {"beta", "tau", "tau_log", "tau_entropy_ema"}
    assert d["tau_entropy_ema"] is None  # not measured yet -> null (maxent_grpo's None)
    assert json.loads(json.dumps(d))["tau_entropy_ema"] is None  # valid JSON (no NaN literal)
    s2, _ = M.meta_update(s, 0.3, 0.2, META)
    d = MG.controller_state_dict(s2, META)
    assert d["meta"]["version"] == 1
    ctrl = d["meta"]["controller"]
    assert ctrl["last_tau_grad"] == pytest.approx(0.3) and ctrl["method"] == "analytic"
    assert {"enabled", "learning_rate", "update_interval", "use_hessian", "tau_min", "tau_max"} <= set(ctrl)
    json.dumps(d)
    with pytest.raises(ValueError, match="batch"):
        MG.controller_state_dict(_batched_states())


def test_json_round_trip(tmp_path):
    s = M.update_tau(M.update_tau(ctl(0.5, 0.1), 1.2, 0, SCHED), 1.2, 1, SCHED)
    s, _ = M.meta_update(s, 0.25, -0.5, META)
    path = tmp_path / "deep" / "dir" / MG.CONTROLLER_STATE_FILENAME
    MG.save_controller_state(path, s, META)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    back, meta = MG.load_controller_file(path)
    for k in ("tau", "beta", "log_tau", "entropy_ema", "last_tau_grad", "last_beta_grad"):
        np.testing.assert_allclose(f(getattr(back, k)), f(getattr(s, k)), rtol=1e-7, err_msg=k)
    assert bool(back.has_entropy_ema) and bool(s.has_entropy_ema)
    # the maxent_grpo loader rule
    assert f(back.denom) == pytest.approx(f(s.tau) + f(s.beta), rel=1e-6)
    assert meta.enabled and float(meta.learning_rate) == pytest.approx(0.1) and float(meta.tau_max) == 2.0
    # the next controller update resets denom to tau
    nxt = M.update_tau(back, 0.1, 5, SCHED)
    assert f(nxt.denom) == pytest.approx(f(nxt.tau))


@pytest.mark.parametrize("written", ["missing", "null", "NaN", "string", "number"])
def test_not_measured_ema_round_trips(tmp_path, written):
    """maxent_grpo's "not measured" EMA (None / NaN; also missing or unreadable) <-> the flag, both ways."""
    p = tmp_path / "c.json"
    body = {"missing": "", "null": ', "tau_entropy_ema": null', "NaN": ', "tau_entropy_ema": NaN',
            "string": ', "tau_entropy_ema": "x"', "number": ', "tau_entropy_ema": 1.25'}[written]
    p.write_text('{"beta": 0.04, "tau": 0.3' + body + "}")
    s = MG.load_controller_state(p)
    measured = written == "number"
    assert bool(s.has_entropy_ema) == measured and f(s.entropy_ema) == (1.25 if measured else 0.0)
    # and back: the flag is written as null (a measured EMA as its value), and read as the same state
    d = MG.controller_state_dict(s)
    assert d["tau_entropy_ema"] == (1.25 if measured else None)
    MG.save_controller_state(p, s)
    again = MG.load_controller_state(p)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(s), strict=True):
        np.testing.assert_array_equal(a, b)
    # a first valid measurement after loading starts the EMA (not measured) or blends into it
    nxt = M.update_tau(s, 1.0, 5, SCHED)
    assert f(nxt.entropy_ema) == pytest.approx(0.9 * 1.25 + 0.1 if measured else 1.0)


def test_json_runs_under_debug_nans_and_infs(tmp_path):
    """Writing and reading a controller file (fresh or updated state) trips neither debug check."""
    with jax.debug_nans(True), jax.debug_infs(True):
        for s in (ctl(0.5, 0.1), M.update_tau(ctl(0.5, 0.1), 1.2, 1, SCHED)):
            MG.save_controller_state(tmp_path / "c.json", s, META)
            back = MG.load_controller_state(tmp_path / "c.json")
            assert bool(back.has_entropy_ema) == bool(s.has_entropy_ema)


def test_save_bare_filename(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    MG.save_controller_state("controller_state.json", ctl(0.5, 0.1))
    assert f(MG.load_controller_state("controller_state.json").tau) == pytest.approx(0.5)


def test_load_original_layout(tmp_path):
    """Files written by maxent_grpo: minimal, or with a meta payload and odd fields."""
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"beta": 0.04, "tau": 0.3}))
    s = MG.load_controller_state(p)
    assert f(s.log_tau) == pytest.approx(math.log(0.3), rel=1e-6)
    assert not bool(s.has_entropy_ema) and f(s.entropy_ema) == 0.0  # no EMA in the file: not measured
    assert f(s.denom) == pytest.approx(0.34, rel=1e-6)
    p.write_text(json.dumps({"beta": 0.0, "tau": 0.0, "tau_log": "x", "tau_entropy_ema": None,
                             "meta": {"version": 1, "controller": {
                                 "enabled": True, "method": "first_order", "learning_rate": "bad",
                                 "update_interval": 0, "last_tau_grad": 0.7}}}))
    s, meta = MG.load_controller_file(p)
    assert not bool(s.has_entropy_ema)  # null: maxent_grpo's "not measured"
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
