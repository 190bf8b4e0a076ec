"""jaxweight.metrics: flatten, the JSON-lines and TensorBoard writers, MultiWriter, open_writers."""

import json
import math
import struct
import sys
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import metrics


@flax.struct.dataclass
class _Inner:
    accuracy: jax.Array
    per_item: jax.Array


@flax.struct.dataclass
class _Out:
    loss: jax.Array
    inner: _Inner
    n_invalid: jax.Array
    key: jax.Array
    name: str = flax.struct.field(pytree_node=False, default="x")


class _NT(NamedTuple):
    a: float
    b: np.ndarray


def _out():
    return _Out(loss=jnp.float32(0.5), inner=_Inner(jnp.array([0.75]), jnp.array([1.0, jnp.nan, 3.0])),
                n_invalid=jnp.int32(2), key=jax.random.key(0))


# ----------------------------------------------------------------------------- flatten

def test_flatten_nested_dataclass_keys_and_types():
    d = metrics.flatten(_out(), prefix="preference")
    assert d == {"preference/loss": 0.5, "preference/inner/accuracy": 0.75,
                 "preference/inner/per_item/mean": 2.0, "preference/n_invalid": 2.0}
    assert all(type(v) is float for v in d.values())


def test_flatten_drops_keys_strings_and_none():
    d = metrics.flatten({"k": jax.random.key(1), "s": "text", "n": None, "old_key": jax.random.PRNGKey(1),
                         "x": 1})
    # typed PRNG keys, strings and None are dropped; a raw uint32 key is just numbers
    assert "k" not in d and "s" not in d and "n" not in d and d["x"] == 1.0


def test_flatten_nested_dicts_lists_namedtuples():
    d = metrics.flatten({"a": {"b": {"c": np.float64(1.5)}}, "l": [1, 2.5], "nt": _NT(3.0, np.array([1.0, 3.0]))},
                        prefix="m/")
    assert d == {"m/a/b/c": 1.5, "m/l/0": 1.0, "m/l/1": 2.5, "m/nt/a": 3.0, "m/nt/b/mean": 2.0}


def test_flatten_no_reduce_spells_out_entries():
    d = metrics.flatten({"w": jnp.arange(3.0)}, "x", reduce=False)
    assert d == {"x/w/0": 0.0, "x/w/1": 1.0, "x/w/2": 2.0}


def test_flatten_mean_ignores_nonfinite_and_all_nan_is_nan():
    d = metrics.flatten({"a": np.array([np.inf, 1.0, 3.0]), "b": np.array([np.nan, np.nan])})
    assert d["a/mean"] == 2.0 and math.isnan(d["b/mean"])


def test_flatten_bool_int_and_skip():
    d = metrics.flatten({"ok": jnp.bool_(True), "n": np.int64(7), "big": jnp.zeros(5), "flag": False},
                        skip=("big",))
    assert d == {"ok": 1.0, "n": 7.0, "flag": 0.0}


def test_flatten_empty_and_scalar_without_prefix():
    assert metrics.flatten({}) == {}
    assert metrics.flatten(jnp.float32(3.0)) == {"value": 3.0}
    assert metrics.flatten({"e": jnp.zeros((0,))}) == {}


def test_flatten_under_jit_outputs_is_host_floats():
    out = jax.jit(lambda x: {"mean": x.mean(), "max": x.max()})(jnp.arange(4.0))
    assert metrics.flatten(out, "s") == {"s/mean": 1.5, "s/max": 3.0}


# ----------------------------------------------------------------------------- JSON lines

def test_jsonl_writer_nan_inf_to_null(tmp_path):
    p = tmp_path / "sub" / "metrics.jsonl"
    with metrics.JsonlWriter(p) as w:
        w.write(0, {"a": 1.0, "b": float("nan"), "c": float("inf"), "d": -float("inf")})
        w.write(np.int64(1), {"a": np.float32(2.5)})
    lines = p.read_text().splitlines()
    assert [json.loads(ln) for ln in lines] == [{"step": 0, "a": 1.0, "b": None, "c": None, "d": None},
                                               {"step": 1, "a": 2.5}]
    assert "NaN" not in p.read_text() and "Infinity" not in p.read_text()


def test_jsonl_writer_append_and_overwrite(tmp_path):
    p = tmp_path / "m.jsonl"
    with metrics.JsonlWriter(p) as w:
        w.write(0, {"a": 1.0})
    with metrics.JsonlWriter(p, append=True) as w:
        w.write(1, {"a": 2.0})
    assert len(p.read_text().splitlines()) == 2
    with metrics.JsonlWriter(p) as w:
        w.write(5, {"a": 3.0})
    assert [json.loads(ln)["step"] for ln in p.read_text().splitlines()] == [5]


def test_jsonl_lines_are_flushed_as_written(tmp_path):
    w = metrics.JsonlWriter(tmp_path / "m.jsonl")
    w.write(0, metrics.flatten(_out(), "p"))
    assert json.loads((tmp_path / "m.jsonl").read_text())["p/loss"] == 0.5  # before close
    w.close()
    w.close()  # idempotent


def test_writers_follow_the_protocol(tmp_path):
    w = metrics.JsonlWriter(tmp_path / "m.jsonl")
    assert isinstance(w, metrics.MetricsWriter)
    assert isinstance(metrics.MultiWriter(w), metrics.MetricsWriter)
    w.close()


def test_multiwriter_fans_out(tmp_path):
    seen = []

    class Rec:
        def write(self, step, m):
            seen.append((step, dict(m)))

        def close(self):
            seen.append("closed")

    with metrics.MultiWriter(Rec(), metrics.JsonlWriter(tmp_path / "m.jsonl")) as w:
        w.write(3, {"x": 1.0})
    assert seen == [(3, {"x": 1.0}), "closed"]
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {"step": 3, "x": 1.0}


def test_open_writers_jsonl_only(tmp_path):
    with metrics.open_writers(tmp_path / "out") as w:
        assert len(w.writers) == 1
        w.write(0, {"a": 1.0})
    assert (tmp_path / "out" / "metrics.jsonl").exists()


def test_tensorboard_writer_missing_extra_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    import re

    from jaxweight._install import install_hint

    with pytest.raises(ImportError, match=re.escape(f"tensorboardX: {install_hint('tensorboard')}")):
        metrics.TensorBoardWriter(tmp_path / "tb")


# ----------------------------------------------------------------------------- TensorBoard, read back

def _read_events(logdir):
    """All (tag, step, value) scalars of the event files in ``logdir``, checked record by record."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    out = []
    files = sorted(logdir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {logdir}"
    for f in files:
        buf = f.read_bytes()
        i = 0
        while i < len(buf):
            header = buf[i:i + 8]
            (n,) = struct.unpack("Q", header)
            (crc_h,) = struct.unpack("I", buf[i + 8:i + 12])
            assert crc_h == masked_crc32c(header)
            data = buf[i + 12:i + 12 + n]
            (crc_d,) = struct.unpack("I", buf[i + 12 + n:i + 16 + n])
            assert crc_d == masked_crc32c(data)
            i += 16 + n
            ev = event_pb2.Event.FromString(data)
            for v in ev.summary.value:
                out.append((v.tag, ev.step, v.simple_value))
    return out


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboardX")
    logs = [metrics.flatten(_out(), "preference"),
            {"curriculum/items_tracked": 12.0, "maxent/weight_entropy": 1.25}]
    with metrics.open_writers(tmp_path / "out", tensorboard=tmp_path / "tb") as w:
        assert len(w.writers) == 2
        for step, m in enumerate(logs):
            w.write(step, m)
    got = _read_events(tmp_path / "tb")
    want = [(k, step, v) for step, m in enumerate(logs) for k, v in m.items()]
    assert sorted((t, s) for t, s, _ in got) == sorted((t, s) for t, s, _ in want)
    gd = {(t, s): v for t, s, v in got}
    for t, s, v in want:
        assert gd[(t, s)] == pytest.approx(v, rel=1e-6)
    # the same numbers went to metrics.jsonl
    rows = [json.loads(ln) for ln in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["maxent/weight_entropy"] == 1.25 and rows[0]["preference/inner/accuracy"] == 0.75


def test_tensorboard_writer_nan_is_written(tmp_path):
    pytest.importorskip("tensorboardX")
    with metrics.TensorBoardWriter(tmp_path / "tb") as w:
        w.write(7, {"a/b": float("nan"), "a/c": 2.0})
    got = {(t, s): v for t, s, v in _read_events(tmp_path / "tb")}
    assert math.isnan(got[("a/b", 7)]) and got[("a/c", 7)] == 2.0


# ------------------------------------------------------------ every kind of metrics a user meets
def _every_kind():
    """name -> flat metrics of each component's step output or state (small sizes)."""
    from jaxweight import awr, curriculum, maxent, sync
    from jaxweight import preference as pf
    from jaxweight import random_weighting as rw

    out = {}
    rcfg = rw.config()
    rstate = rw.step(rw.init(rcfg, 0), 1, rcfg)
    out["random_weighting/state"] = rw.metrics_dict(rstate, rcfg)
    ccfg = curriculum.config("prioritized", capacity=64)
    cstate, step_out = curriculum.step(curriculum.init(ccfg), 0, jnp.arange(8), jnp.linspace(0, 1, 8), ccfg, num=4)
    out["curriculum/state"] = curriculum.metrics_dict(cstate, ccfg)
    out["curriculum/step"] = step_out.to_dict()
    kcfg = maxent.config(0.5, 0.04, schedule=maxent.TauSchedule(target_entropy=1.0, learning_rate=0.1),
                         kl=maxent.KLController(target=0.05, horizon=10, step_size=0.2))
    m_state, m_out = maxent.step(maxent.init(kcfg), jnp.arange(12.0).reshape(3, 4), -jnp.ones((3, 4)), kcfg,
                                 global_step=1, measured_kl=0.1)
    out["maxent/step"] = maxent.metrics_dict(m_out, kcfg)
    out["maxent/state"] = maxent.metrics_dict(m_state, kcfg)
    scfg = sync.config(2)
    s, _, _ = sync.step(sync.init(scfg), {"w": jnp.ones(2)}, {"w": jnp.ones(2)}, scfg)
    out["sync/state"] = sync.metrics_dict(s)
    rng = np.random.default_rng(0)
    pairs = pf.fragment_pairs_from_arrays(rng.normal(size=(16, 2, 4, 3)).astype("f4"),
                                          rng.integers(0, 2, (16, 2, 3)), rng.normal(size=(16, 2, 3)).astype("f4"))
    out["preference/teacher"] = pf.synthetic_teacher(0, pairs).to_dict()
    prefs, _ = pf.synthetic_preferences(1, pairs)
    trainer = pf.RewardTrainer(pf.RewardMLP(hidden_sizes=(4,), action_space=pf.Discrete(2)), num_members=2,
                               batch_size=8, minibatch_size=8)
    tstate = trainer.init(0, pf.example_inputs(pairs))
    bcfg = pf.buffer.config(16)
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, pairs), pairs, prefs, bcfg)
    out["preference/buffer"] = pf.buffer.metrics_dict(buf, bcfg)
    _, host = trainer.train(tstate, 2, buf)
    out["preference/trainer"] = host
    _, m = pf.training.epoch(tstate, 2, buf, trainer.config)
    out["preference/train_reward"] = pf.training.metrics_dict(m, trainer.config)
    _, fit = awr.fit_weight_policy(0, rng.normal(size=(32, 3)).astype("f4"), rng.normal(size=(32, 2)).astype("f4"),
                                   rng.normal(size=32).astype("f4"), awr.config(2, hidden_sizes=(4,)), num_epochs=2,
                                   batch_size=16)
    out["awr/fit"] = metrics.flatten(fit, "awr")
    return out


@pytest.fixture(scope="module")
def kinds():
    return _every_kind()


def test_every_kind_of_metrics_is_a_flat_float_dict(kinds):
    for name, d in kinds.items():
        assert d, name
        for k, v in d.items():
            assert isinstance(k, str) and "/" in k and type(v) is float, (name, k, type(v))
    assert kinds["maxent/step"]["maxent/tau"] == kinds["maxent/state"]["maxent/tau"] != 0.5  # updated
    assert kinds["sync/state"] == {"sync/counter": 1.0, "sync/staleness": 1.0, "sync/version": 0.0}
    assert kinds["curriculum/step"]["curriculum/n_applied"] == 8.0
    assert kinds["maxent/state"]["maxent/current_target"] == pytest.approx(1.0)  # set by the update


def test_every_kind_of_metrics_goes_to_tensorboard(kinds, tmp_path):
    """Each kind is written with SummaryWriter.add_scalar (through TensorBoardWriter) and read back."""
    pytest.importorskip("tensorboardX")
    with metrics.TensorBoardWriter(tmp_path / "tb") as w:
        for step, d in enumerate(kinds.values()):
            w.write(step, d)
    got = {(t, s): v for t, s, v in _read_events(tmp_path / "tb")}
    for step, d in enumerate(kinds.values()):
        for k, v in d.items():
            if math.isnan(v):
                assert math.isnan(got[(k, step)])
            else:
                assert got[(k, step)] == pytest.approx(v, rel=1e-6, abs=1e-30), k


def test_keep_through_drops_the_lines_a_resume_writes_again(tmp_path):
    """A run killed after a chunk's metric lines but before its checkpoint, then resumed from the checkpoint's
    step: the lines past that step (and a torn last line) leave, so each step is in the file once."""
    with metrics.open_writers(tmp_path) as w:
        for s in range(6):
            w.write(s, {"a": float(s)})
    path = tmp_path / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"step": 6, "a"')  # a line torn by the kill
    with metrics.open_writers(tmp_path, append=True) as w:
        assert w.keep_through(3) == 3
        for s in range(4, 6):
            w.write(s, {"a": float(s)})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5] and [r["a"] for r in rows] == [0, 1, 2, 3, 4, 5]
    with metrics.open_writers(tmp_path, append=True) as w:
        assert w.keep_through(5) == 0
    assert len(path.read_text().splitlines()) == 6
