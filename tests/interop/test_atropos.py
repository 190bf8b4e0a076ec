"""jaxweight.interop.atropos: the atropos JSON layout, metrics against atropos, checkpoints."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import checkpoint
from jaxweight import curriculum as cur
from jaxweight.interop import atropos
from tests.contracts import assert_trees_close
from tests.curriculum.test_curriculum import AtroposRef

F32 = np.float32
N = 10


_UP = jax.jit(cur.update)


def run_ref_and_state(n_updates=80, n_bins=5, seed=0):
    """The same random single updates through the oracle (string keys) and jaxweight."""
    rng = np.random.default_rng(seed)
    cfg = cur.config("easy_first", n_bins, capacity=N, temperature=0.8, ema_alpha=0.4,
                     competence_threshold=0.6)
    ref = AtroposRef(n_bins, float(cfg.ema_alpha), store_lazy=True)
    keys = cur.KeyIndex(N)
    s = cur.init(cfg)
    for _ in range(n_updates):
        k = f"item-{int(rng.integers(0, 8))}"
        x = float(np.round(rng.random(), 2))
        s = _UP(s, keys.ids([k]), np.array([x], F32), cfg)
        ref.update(keys.ids(k).item(), x)
    return cfg, s, ref, keys


# ===================================================================== metrics
def test_metrics_dict_matches_atropos():
    cfg, s, ref, _ = run_ref_and_state()
    got = cur.metrics_dict(s, cfg)
    want = ref.metrics_dict()
    assert set(got) == set(want) and any(k.startswith("curriculum/bin_") for k in got)
    for k, v in want.items():
        assert type(got[k]) is float
        assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-7), k
    m = jax.jit(cur.metrics)(s, cfg)
    assert m["items_tracked"].dtype == jnp.int32 and int(m["items_tracked"]) == len(ref.items)
    assert bool(m["has_boundaries"])


def test_metrics_dict_empty_and_without_boundaries():
    cfg = cur.config("uniform", 5, capacity=N)
    s = cur.init(cfg)
    d = cur.metrics_dict(s, cfg)
    assert d == {"curriculum/items_tracked": 0, "curriculum/strategy": 0}
    assert all(type(v) is int for v in d.values())
    m = cur.metrics(s, cfg)
    assert int(m["items_tracked"]) == 0 and int(m["bin_0_count"]) == 0
    # nothing measured: 0, flagged by items_tracked == 0 (no NaN sentinel)
    assert [float(m[k]) for k in ("mean_difficulty", "min_difficulty", "max_difficulty")] == [0.0, 0.0, 0.0]
    s = cur.update(s, np.array([1, 2]), np.array([0.5, 1.0], F32), cfg)  # no rebin yet
    d = cur.metrics_dict(s, cfg)
    assert not any(k.startswith("curriculum/bin_") for k in d)
    assert d["curriculum/items_tracked"] == 2.0 and d["curriculum/mean_difficulty"] == 0.75
    assert d["curriculum/min_difficulty"] == 0.5 and d["curriculum/max_difficulty"] == 1.0
    assert d["curriculum/total_updates"] == 2.0


# ================================================================ persistence
def test_state_dict_atropos_layout_and_roundtrip(tmp_path):
    cfg, s, ref, keys = run_ref_and_state()
    d = atropos.state_dict(s, cfg, keys)
    assert list(d)[:8] == ["strategy", "n_bins", "temperature", "ema_alpha", "competence_threshold",
                           "item_scores", "bin_boundaries", "last_rebin_count"]
    assert d["strategy"] == "easy_first" and d["n_bins"] == 5
    assert d["temperature"] == pytest.approx(0.8) and d["ema_alpha"] == pytest.approx(0.4)
    assert d["last_rebin_count"] == ref.last_rebin
    want = {keys.key(i): [float(e), c] for i, (e, c) in ref.items.items()}
    assert d["item_scores"] == want
    assert list(d["item_scores"]) == [k for k in keys.keys() if k in want]  # first-seen order
    assert d["bin_boundaries"] == [float(b) for b in ref.bounds]
    jw = d["jaxweight"]
    assert jw["version"] == 1 and jw["capacity"] == N and jw["rebin_interval"] == 50
    assert jw["total_updates"] == ref.total and jw["priority"] == "frontier"
    json.dumps(d)  # JSON-serialisable as is
    # file round trip (atomic write)
    path = atropos.save_json(tmp_path / "sub" / "cur.json", s, cfg, keys)
    cfg2, s2, keys2 = atropos.load_json(path, N)
    assert keys2.keys() == keys.keys()
    assert_trees_close(s2, s)
    assert_trees_close(cfg2, cfg)
    assert (cfg2.strategy, cfg2.n_bins, cfg2.capacity, cfg2.priority) == (cfg.strategy, 5, N, "frontier")
    assert not list(tmp_path.glob("sub/.*tmp"))


def test_state_dict_with_integer_keys_roundtrip():
    cfg = cur.config("prioritized", 3, capacity=N, rebin_interval=2, staleness_coeff=0.6,
                     competence_c0=0.3, priority="hard")
    s = cur.update(cur.init(cfg), np.array([7, 2, 7]), np.array([0.1, 0.9, 0.3], F32), cfg)
    d = json.loads(json.dumps(atropos.state_dict(s, cfg)))
    assert set(d["item_scores"]) == {"2", "7"}
    cfg2, s2, keys2 = atropos.load_state_dict(d, N)
    assert keys2 is None
    assert_trees_close(s2, s)
    assert_trees_close(cfg2, cfg)
    assert cfg2.priority == "hard"


def test_load_plain_atropos_dict_gives_same_bins_difficulties_metrics():
    cfg, s, ref, keys = run_ref_and_state(n_updates=120, seed=3)
    # what atropos's state_dict() returns (tuples, no jaxweight block), before and after JSON
    plain = {
        "strategy": "easy_first", "n_bins": 5, "temperature": 0.8, "ema_alpha": 0.4,
        "competence_threshold": 0.6,
        "item_scores": {f"q{k}": (float(e), c) for k, (e, c) in ref.items.items()},
        "bin_boundaries": [float(b) for b in ref.bounds],
        "last_rebin_count": ref.last_rebin,
    }
    for d in (plain, json.loads(json.dumps(plain))):
        cfg2, s2, keys2 = atropos.load_state_dict(d, 20)
        assert cfg2.capacity == 20 and int(cfg2.rebin_interval) == 50
        ids = keys2.ids([f"q{k}" for k in ref.items], add=False)
        ema, tracked = cur.difficulty(s2, ids)
        assert np.all(np.asarray(tracked))
        np.testing.assert_array_equal(ema, [e for e, _ in ref.items.values()])
        np.testing.assert_array_equal(cur.item_bin(s2, ids, cfg2), [ref.get_item_bin(k) for k in ref.items])
        assert int(s2.total_updates) == ref.total and int(s2.last_rebin_count) == ref.last_rebin
        got, want = cur.metrics_dict(s2, cfg2), ref.metrics_dict()
        assert set(got) == set(want)
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-7), k


def test_ema_alpha_zero_loads_and_keeps_first_scores():
    """A saved atropos scheduler with ``ema_alpha`` 0 (atropos accepts it) loads, keeps each item's
    EMA at its stored value through later updates, and saves 0 back."""
    plain = {"strategy": "uniform", "n_bins": 2, "temperature": 1.0, "ema_alpha": 0.0,
             "competence_threshold": 0.5, "item_scores": {"a": [0.25, 1], "b": [0.75, 3]},
             "bin_boundaries": [], "last_rebin_count": 0}
    cfg, s, keys = atropos.load_state_dict(plain, 4)
    assert float(cfg.ema_alpha) == 0.0
    ref = AtroposRef(2, 0.0)
    ref.items = {"a": (F32(0.25), 1), "b": (F32(0.75), 3)}
    ref.total = 4
    s = cur.update(s, keys.ids(["b", "a", "c"]), np.array([0.0, 1.0, 0.5], F32), cfg)
    for k, x in (("b", 0.0), ("a", 1.0), ("c", 0.5)):
        ref.apply(k, x)
    d = atropos.state_dict(s, cfg, keys)
    assert d["ema_alpha"] == 0.0
    assert {k: tuple(v) for k, v in d["item_scores"].items()} == {
        k: (float(e), c) for k, (e, c) in ref.items.items()} == {"a": (0.25, 2), "b": (0.75, 4), "c": (0.5, 1)}


def test_load_state_dict_errors_and_nonfinite():
    base = {"strategy": "uniform", "n_bins": 2, "temperature": 1.0, "ema_alpha": 0.3,
            "competence_threshold": 0.5, "item_scores": {"a": [0.5, 1], "b": [float("nan"), 2]},
            "bin_boundaries": [], "last_rebin_count": 0}
    cfg, s, keys = atropos.load_state_dict(base, 4)
    assert keys.keys() == ["a"] and int(s.total_updates) == 1  # the NaN item is dropped
    with pytest.raises(ValueError, match="more than capacity"):
        atropos.load_state_dict(base, 1)
    with pytest.raises(ValueError) as e:
        atropos.load_state_dict({**base, "strategy": "nope"}, 4)
    assert str(e.value).startswith("state dict: Invalid curriculum strategy 'nope'. Must be one of: [")
    with pytest.raises(ValueError, match="bin_boundaries"):
        atropos.load_state_dict({**base, "bin_boundaries": [1.0]}, 4)
    with pytest.raises(ValueError, match="count"):
        atropos.load_state_dict({**base, "item_scores": {"a": [0.5, 0]}}, 4)


def test_checkpoint_roundtrip_state_and_config(tmp_path):
    cfg, s, _, _ = run_ref_and_state()
    checkpoint.save(tmp_path / "c.ckpt", {"state": s, "cfg": cfg})
    back = checkpoint.load(tmp_path / "c.ckpt", {"state": cur.init(cfg), "cfg": cfg})
    assert_trees_close(back, {"state": s, "cfg": cfg})
