"""jaxweight.curriculum: metrics, atropos JSON layout (interop.atropos), checkpoints, contracts, demo."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import checkpoint
from jaxweight import curriculum as cur
from jaxweight.interop import atropos
from tests.contracts import assert_trees_close, check_state_contract
from tests.test_curriculum import AtroposRef

F32 = np.float32
N = 10


def run_ref_and_state(n_updates=80, n_bins=5, seed=0):
    """The same random single updates through the oracle (string keys) and jaxweight."""
    rng = np.random.default_rng(seed)
    cfg = cur.config("easy_first", n_bins, capacity=N, temperature=0.8, ema_alpha=0.4,
                     competence_threshold=0.6)
    ref = AtroposRef(n_bins, float(cfg.ema_alpha), store_lazy=True)
    keys = atropos.KeyIndex(N)
    s = cur.init(cfg)
    for _ in range(n_updates):
        k = f"item-{int(rng.integers(0, 8))}"
        x = float(np.round(rng.random(), 2))
        s = cur.update(s, keys.ids([k]), np.array([x], F32), cfg)
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
    assert np.isnan(float(m["mean_difficulty"])) and int(m["bin_0_count"]) == 0
    s = cur.update(s, np.array([1, 2]), np.array([0.5, 1.0], F32), cfg)  # no rebin yet
    d = cur.metrics_dict(s, cfg)
    assert not any(k.startswith("curriculum/bin_") for k in d)
    assert d["curriculum/items_tracked"] == 2.0 and d["curriculum/mean_difficulty"] == 0.75
    assert d["curriculum/min_difficulty"] == 0.5 and d["curriculum/max_difficulty"] == 1.0
    assert d["curriculum/total_updates"] == 2.0


# ==================================================================== KeyIndex
def test_key_index():
    k = atropos.KeyIndex(3)
    np.testing.assert_array_equal(k.ids(["b", "a", "b"]), [0, 1, 0])
    assert k.ids(["a", "zz"], add=False).tolist() == [1, -1] and len(k) == 2
    assert k.ids("c").shape == () and k.ids("c") == 2
    assert k.ids([["a"], ["c"]]).shape == (2, 1)
    assert k.key(1) == "a" and k.keys() == ["b", "a", "c"] and "c" in k
    with pytest.raises(ValueError) as e:
        k.ids(["d"])
    assert str(e.value) == "KeyIndex is full (capacity 3)"
    assert len(k) == 3  # nothing added by the failed call
    with pytest.raises(ValueError, match="str"):
        k.ids([1])
    with pytest.raises(IndexError):
        k.key(3)
    assert k.ids(np.array(["a", "b"])).dtype == np.int32


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


# ================================================================== contracts
def test_update_contracts(tmp_path):
    cfg = cur.config("competence_based", 5, capacity=N, rebin_interval=3)
    cfg2 = cur.config("competence_based", 5, capacity=N, rebin_interval=7, ema_alpha=0.9,
                      temperature=0.3, competence_c0=0.5, staleness_coeff=0.9)
    ids = jnp.array([3, 1, 3, 9, 0, 3], jnp.int32)
    scores = jnp.array([0.2, 1.0, 0.7, -0.5, 0.3, 0.9], jnp.float32)
    bids = jnp.stack([ids, ids[::-1], (ids + 4) % N])
    bscores = jnp.stack([scores, scores * 2, scores[::-1]])
    check_state_contract(
        init=lambda: cur.init(cfg),
        update=cur.update,
        update_args=(ids, scores, cfg),
        update_args_alt=(ids[::-1], scores + 1, cfg2),
        batched_init=lambda: jax.vmap(lambda _: cur.init(cfg))(jnp.arange(3)),
        batched_update_in_axes=(0, 0, None),
        batched_update_args=(bids, bscores, cfg),
        tmp_path=tmp_path,
    )


def test_update_groups_contracts(tmp_path):
    cfg = cur.config("uniform", 5, capacity=N, rebin_interval=2)
    cfg2 = cur.config("uniform", 5, capacity=N, rebin_interval=5, ema_alpha=0.1)
    ids = jnp.array([4, 4, 2], jnp.int32)
    scores = jnp.array([[1.0, 0.0, jnp.nan], [0.5, 0.5, 1.0], [0.0, 0.0, 0.0]], jnp.float32)
    check_state_contract(
        init=lambda: cur.init(cfg),
        update=cur.update_groups,
        update_args=(ids, scores, cfg),
        update_args_alt=(ids + 1, scores * 0.5, cfg2),
        batched_init=lambda: jax.vmap(lambda _: cur.init(cfg))(jnp.arange(2)),
        tmp_path=tmp_path,
    )


def test_donated_update_and_step():
    cfg = cur.config("easy_first", 5, capacity=N)
    s = cur.init(cfg)
    ref = cur.update(s, np.array([1, 2]), np.array([0.3, 0.6], F32), cfg)
    s_in = jax.tree.map(jnp.copy, s)
    out = cur.update_jit(s_in, jnp.array([1, 2]), jnp.array([0.3, 0.6], jnp.float32), cfg)
    assert s_in.ema.is_deleted() and s_in.count.is_deleted()  # the pool was donated
    assert_trees_close(out, ref)
    out2, step_out = cur.step_jit(out, jax.random.key(0), jnp.array([3, 99]),
                                  jnp.array([0.1, 0.2], jnp.float32), cfg, 0, 10, num=5)
    items = step_out.item_ids
    assert out.ema.is_deleted() and items.shape == (5,) and int(out2.count[3]) == 1
    # under jit the out-of-range id 99 is skipped and counted
    assert step_out.to_dict() == {"curriculum/n_applied": 1.0, "curriculum/n_invalid": 1.0,
                                  "curriculum/n_nonfinite": 0.0, "curriculum/n_out_of_range": 1.0}
    want_state, want_out = cur.step(ref, jax.random.key(0), jnp.array([3]),
                                    jnp.array([0.1], jnp.float32), cfg, 0, 10, 5)
    assert_trees_close(out2, want_state)
    np.testing.assert_array_equal(items, want_out.item_ids)
    sampled = cur.sample(want_state, jax.random.key(0), cfg, 0, 10, 5)
    np.testing.assert_array_equal(sampled, items)


@pytest.mark.smoke
def test_demo_quick(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from jaxweight.demos import curriculum as demo

    # two strategies keep it short; the notebook runs all five at small size
    assert demo.main(["--quick", "--out", str(tmp_path), "--no-progress",
                      "--strategies", "uniform,prioritized", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "uniform" in out and "prioritized" in out
    assert (tmp_path / "curriculum_learning_curves.png").stat().st_size > 0
    res = json.loads((tmp_path / "curriculum_results.json").read_text())
    assert set(res["strategies"]) == {"uniform", "prioritized"}
    assert res["time"]["time/compile_s"] > 0 and res["time"]["time/run_s"] > 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == res["steps"]
    assert "curriculum/prioritized/mastered" in json.loads(lines[-1])


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--strategies", "hardest"], ["--seed", "-1"]])
def test_demo_bad_flags_exit_2(argv, capsys):
    from jaxweight.demos import curriculum as demo

    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    assert e.value.code == 2 and "error: argument" in capsys.readouterr().err


# ========================================================= deprecated aliases
def test_deprecated_sample_items_forwards_to_sample():
    cfg = cur.config("easy_first", 5, capacity=N)
    s = cur.update(cur.init(cfg), np.arange(N), np.linspace(0, 1, N).astype(F32), cfg)
    with pytest.deprecated_call(match="use jaxweight.curriculum.sample"):
        old = cur.sample_items(jax.random.key(4), s, cfg, 3, 10, 16)
    np.testing.assert_array_equal(old, cur.sample(s, jax.random.key(4), cfg, 3, 10, 16))


def test_deprecated_key_index_forwards():
    with pytest.deprecated_call(match="interop.atropos.KeyIndex"):
        k = cur.KeyIndex(4, ["a", "b"])
    assert isinstance(k, atropos.KeyIndex) and k.keys() == ["a", "b"]


def test_deprecated_state_dict_and_load_state_dict_forward():
    cfg, s, _, keys = run_ref_and_state(n_updates=20)
    with pytest.deprecated_call(match="interop.atropos.state_dict"):
        d = cur.state_dict(s, cfg, keys)
    assert d == atropos.state_dict(s, cfg, keys)
    with pytest.deprecated_call(match="interop.atropos.load_state_dict"):
        cfg2, s2, keys2 = cur.load_state_dict(d, N)
    assert_trees_close(s2, s)
    assert keys2.keys() == keys.keys()


def test_deprecated_save_json_and_load_json_forward(tmp_path):
    cfg, s, _, keys = run_ref_and_state(n_updates=20)
    with pytest.deprecated_call(match="interop.atropos.save_json"):
        path = cur.save_json(tmp_path / "old.json", s, cfg, keys)
    new = atropos.save_json(tmp_path / "new.json", s, cfg, keys)
    assert path.read_text() == new.read_text()
    with pytest.deprecated_call(match="interop.atropos.load_json"):
        cfg2, s2, _ = cur.load_json(path, N)
    assert_trees_close(s2, s)
    assert_trees_close(cfg2, cfg)


def test_init_accepts_and_ignores_a_key():
    cfg = cur.config("uniform", 5, capacity=N)
    assert_trees_close(cur.init(cfg, jax.random.key(0)), cur.init(cfg))
    with pytest.raises(ValueError, match="cfg must be a CurriculumConfig"):
        cur.init(jax.random.key(0), cfg)


def test_public_surface():
    assert set(cur.__all__) <= set(dir(cur))
    assert not any(n.startswith("_") for n in cur.__all__)
    for name in ("update_jit", "step_jit"):
        assert name in (cur.update.__doc__ + cur.__doc__)
