"""Bad inputs for jaxweight.curriculum and its atropos JSON files (issue H).

Every case asserts the specific outcome: the error type and a fragment of its
message, or in-range / finite outputs, the invalid-count metric and an unchanged state.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxweight
from jaxweight import _util
from jaxweight import curriculum as cur
from jaxweight.interop import atropos

N = 8
NAN, INF = math.nan, math.inf
STRATEGIES = cur.STRATEGIES


def _tier(values, fast=1):
    """A sweep whose first ``fast`` values stay in the fast tier; the rest (one compilation each) run
    with the whole suite only."""
    return [v if i < fast else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            for i, v in enumerate(values)]


# one compilation per strategy (the config is an argument), shared by the tests below
_draw = jax.jit(lambda st, k, c, t, tt: cur.sample(st, k, c, step=t, total_steps=tt, num=64))


def _tracked_state(cfg, n=N):
    ids = jnp.arange(n, dtype=jnp.int32)
    return cur.update(cur.init(cfg), ids, jnp.linspace(0.0, 1.0, n, dtype=jnp.float32), cfg)


def _same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ============================================================ config values
# (argument, bad value, message fragment); each checked eagerly and through checked(jit)
BAD_HYPER = [
    ("temperature", 0.0, "temperature must be finite and > 0.0"),
    ("temperature", -1.0, "temperature must be finite and > 0.0"),
    ("temperature", NAN, "temperature must be finite and > 0.0"),
    ("temperature", INF, "temperature must be finite and > 0.0"),
    ("ema_alpha", 1.5, "ema_alpha must be finite and in [0.0, 1.0]"),
    ("ema_alpha", -0.1, "ema_alpha must be finite and in [0.0, 1.0], got -0.1"),
    ("ema_alpha", NAN, "ema_alpha must be finite and in [0.0, 1.0]"),
    ("competence_c0", 0.0, "competence_c0 must be finite and in (0.0, 1.0]"),
    ("competence_c0", 1.5, "competence_c0 must be finite and in (0.0, 1.0]"),
    ("competence_c0", NAN, "competence_c0 must be finite and in (0.0, 1.0]"),
    ("staleness_coeff", -0.1, "staleness_coeff must be finite and in [0.0, 1.0]"),
    ("staleness_coeff", 1.1, "staleness_coeff must be finite and in [0.0, 1.0]"),
    ("staleness_coeff", NAN, "staleness_coeff must be finite and in [0.0, 1.0]"),
    ("competence_threshold", NAN, "competence_threshold must be finite"),
    ("competence_threshold", -INF, "competence_threshold must be finite"),
    ("competence_threshold", 2.0, "competence_threshold must be finite and in [0.0, 1.0], got 2.0"),
    ("competence_threshold", -0.1, "competence_threshold must be finite and in [0.0, 1.0], got -0.1"),
    ("rebin_interval", 0, "rebin_interval must be an integer and finite and in [1,"),
    ("rebin_interval", -3, "rebin_interval must be an integer and finite and in [1,"),
]


@pytest.mark.parametrize("name,value,frag", BAD_HYPER)
def test_bad_hyperparameter_same_error_eager_and_checked_jit(name, value, frag):
    with pytest.raises(ValueError) as eager:
        cur.config("easy_first", 5, capacity=N, **{name: value})
    assert frag in str(eager.value)
    dtype = jnp.int32 if name == "rebin_interval" else jnp.float32
    build = jaxweight.checked(jax.jit(lambda v: cur.config("easy_first", 5, capacity=N, **{name: v})))
    with pytest.raises(ValueError) as jitted:
        build(jnp.asarray(value, dtype))
    assert frag in str(jitted.value)
    assert str(jitted.value).startswith(str(eager.value).split(", got")[0])


def test_good_traced_hyperparameters_pass_checked_jit():
    build = jaxweight.checked(jax.jit(lambda t, a: cur.config("easy_first", 5, capacity=N,
                                                                temperature=t, ema_alpha=a)))
    cfg = build(jnp.float32(0.5), jnp.float32(0.2))
    assert float(cfg.temperature) == 0.5 and float(cfg.ema_alpha) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "kwargs,exc,frag",
    [
        (dict(strategy="hardest_first"), ValueError, "Invalid curriculum strategy 'hardest_first'"),
        (dict(strategy=None), ValueError, "Invalid curriculum strategy"),
        (dict(n_bins=0), ValueError, "n_bins must be >= 1, got 0"),
        (dict(n_bins=2.0), ValueError, "n_bins must be a static Python int"),
        (dict(capacity=0), ValueError, "capacity"),
        (dict(capacity=2.5), ValueError, "capacity"),
        (dict(priority="medium"), ValueError, "priority must be one of"),
        (dict(rebin_interval=2.5), ValueError, "rebin_interval must be an integer"),
        (dict(temperature="hot"), ValueError, "temperature must be a number"),
    ],
)
def test_bad_static_config(kwargs, exc, frag):
    kw = dict(strategy="uniform", n_bins=5, capacity=N) | kwargs
    with pytest.raises(exc) as e:
        cur.config(kw.pop("strategy"), kw.pop("n_bins"), **kw)
    assert frag in str(e.value)


# ======================================================== non-finite scores
@pytest.mark.parametrize("bad", _tier([NAN, INF, -INF]))
@pytest.mark.parametrize("how", ["eager", "jit_update", "jit_step"])
def test_all_invalid_batch_leaves_state_exactly_unchanged(bad, how):
    cfg = cur.config("easy_first", 5, capacity=N, rebin_interval=1)
    before = _tracked_state(cfg)
    ids = jnp.array([1, 2, 2], jnp.int32)
    scores = jnp.full((3,), bad, jnp.float32)
    if how == "eager":
        after = cur.update(before, ids, scores, cfg)
        stats = cur.batch_stats(ids, scores, cfg)
    elif how == "jit_update":
        after = jax.jit(cur.update, donate_argnums=0)(jax.tree.map(jnp.copy, before), ids, scores, cfg)
        stats = cur.batch_stats(ids, scores, cfg)
    else:
        step = jax.jit(cur.step, donate_argnums=0, static_argnames="num")
        after, out = step(jax.tree.map(jnp.copy, before), jax.random.key(0), ids, scores,
                          cfg, step=0, total_steps=10, num=4)
        stats = out.stats
        assert np.all((np.asarray(out.item_ids) >= 0) & (np.asarray(out.item_ids) < N))
    _same(after, before)
    assert int(stats.n_applied) == 0 and int(stats.n_invalid) == 3 and int(stats.n_nonfinite) == 3


@pytest.mark.parametrize("bad", [NAN, INF])
def test_nonfinite_scores_are_skipped_and_counted(bad):
    cfg = cur.config("uniform", 5, capacity=N)
    s0 = cur.init(cfg)
    ids = jnp.array([0, 1, 2, 1], jnp.int32)
    scores = jnp.array([0.5, bad, 0.25, 1.0], jnp.float32)
    got = cur.update(s0, ids, scores, cfg)
    want = cur.update(s0, ids[jnp.array([0, 2, 3])], scores[jnp.array([0, 2, 3])], cfg)
    _same(got, want)
    assert np.all(np.isfinite(np.asarray(got.ema)))
    d = cur.batch_stats(ids, scores, cfg).to_dict()
    assert d == {"curriculum/n_applied": 3.0, "curriculum/n_invalid": 1.0,
                 "curriculum/n_nonfinite": 1.0, "curriculum/n_out_of_range": 0.0}


@pytest.mark.parametrize("rows", [[[NAN, NAN]], [[INF, -INF]], [[NAN, 1.0]]])
def test_update_groups_nonfinite_rows(rows):
    cfg = cur.config("uniform", 5, capacity=N)
    s0 = _tracked_state(cfg)
    scores = jnp.asarray(rows, jnp.float32)
    got = cur.update_groups(s0, jnp.array([3]), scores, cfg)
    finite = np.isfinite(np.asarray(rows))
    stats = cur.batch_stats(jnp.array([3]), scores, cfg)
    if finite.any():  # the row's mean over its finite entries is one update
        assert int(got.count[3]) == int(s0.count[3]) + 1 and int(stats.n_applied) == 1
        assert np.isfinite(float(got.ema[3]))
    else:
        _same(got, s0)
        assert int(stats.n_invalid) == 1 and int(stats.n_applied) == 0
    assert int(stats.n_nonfinite) == int((~finite).sum())


def test_huge_finite_scores_keep_finite_emas_and_bins():
    cfg = cur.config("easy_first", 5, capacity=N, rebin_interval=1)
    s = cur.update(cur.init(cfg), jnp.array([0, 0, 1, 2]), jnp.array([3e38, 3e38, -3e38, 1.0]), cfg)
    assert np.all(np.isfinite(np.asarray(s.ema))) and np.all(np.isfinite(np.asarray(s.boundaries)))
    ids = cur.sample(s, 0, cfg, step=5, total_steps=10, num=16)
    assert np.all((np.asarray(ids) >= 0) & (np.asarray(ids) < N))


# ================================================================ progress
@pytest.mark.parametrize("step,total", [(NAN, 10), (0, NAN), (INF, 10), (1, -INF)])
@pytest.mark.parametrize("fn", ["sample", "bin_probabilities", "sample_bin"])
def test_nonfinite_progress_refused_eagerly(step, total, fn):
    cfg = cur.config("easy_first", 5, capacity=N)
    s = _tracked_state(cfg)
    name = "step" if not math.isfinite(step) else "total_steps"
    with pytest.raises(ValueError, match=f"^{name} must be finite"):
        if fn == "sample":
            cur.sample(s, 0, cfg, step=step, total_steps=total, num=4)
        elif fn == "bin_probabilities":
            cur.bin_probabilities(cfg, step=step, total_steps=total)
        else:
            cur.sample_bin(0, cfg, step=step, total_steps=total, shape=(4,))


@pytest.mark.parametrize("strategy", _tier(STRATEGIES, fast=2))
@pytest.mark.parametrize("step,total", [(NAN, 10.0), (INF, NAN)])
def test_nonfinite_progress_under_jit_gives_in_range_ids(strategy, step, total):
    cfg = cur.config(strategy, 5, capacity=N)
    s = _tracked_state(cfg, n=N // 2)  # half tracked, half untracked
    ids = np.asarray(_draw(s, jax.random.key(1), cfg, jnp.float32(step), jnp.float32(total)))
    assert ids.shape == (64,) and np.all((ids >= 0) & (ids < N))


def test_nonfinite_progress_refused_by_checked_jit():
    cfg = cur.config("competence_sqrt", 5, capacity=N)
    s = _tracked_state(cfg)
    draw = jaxweight.checked(jax.jit(lambda st, t: cur.sample(st, 0, cfg, step=t, total_steps=100, num=8)))
    with pytest.raises(ValueError, match="^step must be finite"):
        draw(s, jnp.float32(NAN))
    ids = np.asarray(draw(s, jnp.float32(5.0)))
    assert np.all((ids >= 0) & (ids < N))


@pytest.mark.parametrize("strategy", _tier(STRATEGIES, fast=2))
@pytest.mark.parametrize("field,value", [("temperature", NAN), ("ema_alpha", NAN), ("staleness_coeff", NAN)])
def test_nan_config_leaves_under_jit_never_give_out_of_range_ids(strategy, field, value):
    """A config bypassing config() (replace / traced sweep) still samples in range, EMAs stay finite."""
    cfg = cur.config(strategy, 5, capacity=N, rebin_interval=1)
    with pytest.raises(ValueError, match=field):  # a concrete bad value is refused by the constructor
        cfg.replace(**{field: jnp.float32(value)})

    def run(v):  # a traced value cannot be checked without jaxweight.checked
        bad = cfg.replace(**{field: v})
        s = cur.update(cur.init(bad), jnp.arange(N // 2), jnp.linspace(0, 1, N // 2, dtype=jnp.float32), bad)
        s = cur.update(s, jnp.array([0, 1]), jnp.array([0.3, 0.9], jnp.float32), bad)
        return s.ema, cur.sample(s, jax.random.key(2), bad, step=50.0, total_steps=100.0, num=64)

    ema, ids = jax.jit(run)(jnp.float32(value))
    assert np.all(np.isfinite(np.asarray(ema)))
    ids = np.asarray(ids)
    assert np.all((ids >= 0) & (ids < N))


# ============================================================ item ids
def _call(call, cfg, ids, mask=None):
    """``(state -> new state)`` of one batch with ids ``ids`` through ``call``."""
    b = len(ids)
    if call == "update":
        return lambda s: cur.update(s, ids, np.linspace(0.1, 0.2, b, dtype=np.float32), cfg, mask=mask)
    if call == "update_groups":
        return lambda s: cur.update_groups(s, ids, np.ones((b, 3), np.float32), cfg, mask=mask)
    return lambda s: cur.step(s, 0, ids, np.linspace(0.1, 0.2, b, dtype=np.float32), cfg, num=4, mask=mask)[0]


@pytest.mark.parametrize("call", ["update", "update_groups", "step"])
@pytest.mark.parametrize("bad_id", [-1, N, 2**20, 2**31 - 1])
def test_out_of_range_ids_concrete_raise_naming_value_and_capacity(call, bad_id):
    """A concrete id outside [0, capacity) is a caller's bug: ValueError naming item_ids, the value
    and the capacity, before anything is applied."""
    cfg = cur.config("uniform", 5, capacity=N)
    s = cur.init(cfg)
    with pytest.raises(ValueError, match=rf"item_ids must be in \[0, {N}\) \(the pool capacity is {N}\), "
                                         rf"got item_ids\[1\]={bad_id} \(1 of 3 out of range\)"):
        _call(call, cfg, np.array([0, bad_id, 2]))(s)


@pytest.mark.parametrize("call", ["update", "update_groups", "step"])
def test_out_of_range_ids_concrete_masked_out_are_padding(call):
    """Masked-out entries may carry any id (e.g. -1 padding): no error, nothing applied for them."""
    cfg = cur.config("uniform", 5, capacity=N)
    s0 = cur.init(cfg)
    ids, mask = np.array([0, -1, 2**31 - 1, 3]), np.array([True, False, False, True])
    got = _call(call, cfg, ids, mask)(s0)
    np.testing.assert_array_equal(got.count, [1, 0, 0, 1, 0, 0, 0, 0])
    # the masked-in ones are still checked
    with pytest.raises(ValueError, match=r"item_ids\[1\]=-1"):
        _call(call, cfg, ids, np.array([True, True, False, True]))(s0)


@pytest.mark.parametrize("call", ["update", "update_groups", "step"])
@pytest.mark.parametrize("bad_id", [-1, 2**31 - 1] + _tier([N, 2**20], fast=0))
def test_out_of_range_ids_traced_are_masked_and_counted(call, bad_id):
    """Under jax.jit the ids are not known: out-of-range ones are skipped (state unchanged for
    them, exactly as if the entry were absent) and counted as n_out_of_range / n_invalid."""
    cfg = cur.config("uniform", 5, capacity=N)
    s0 = _tracked_state(cfg)
    ids = jnp.array([1, bad_id, 4], jnp.int32)
    got = jax.jit(lambda s, ids: _call(call, cfg, ids)(s))(s0, ids)   # traced ids (a closure's are concrete)
    # the same batch without the bad entry (its scores: linspace(0.1, 0.2) of 3 without the middle one)
    _same(got, _call(call, cfg, np.array([1, 4]))(s0))
    assert int(got.total_updates) == int(s0.total_updates) + 2
    scores = jnp.ones((3, 2), jnp.float32) if call == "update_groups" else jnp.ones((3,), jnp.float32)
    stats = jax.jit(cur.batch_stats)(ids, scores, cfg)
    assert (int(stats.n_applied), int(stats.n_invalid), int(stats.n_out_of_range)) == (2, 1, 1)
    if call == "step":   # the step's own metrics count it
        step = jax.jit(cur.step, static_argnames="num")
        _, out = step(s0, 0, ids, jnp.full((3,), 0.5, jnp.float32), cfg, num=4)
        assert out.to_dict() == {"curriculum/n_applied": 2.0, "curriculum/n_invalid": 1.0,
                                 "curriculum/n_nonfinite": 0.0, "curriculum/n_out_of_range": 1.0}


@pytest.mark.parametrize("groups", [False, True])
def test_out_of_range_ids_skipped_and_counted_under_jit(groups):
    cfg = cur.config("uniform", 5, capacity=N)
    s0 = _tracked_state(cfg)
    ids = jnp.array([-1, 3, N, 2**30], jnp.int32)
    scores = jnp.ones((4, 2), jnp.float32) if groups else jnp.ones((4,), jnp.float32)
    fn = jax.jit(cur.update_groups if groups else cur.update, donate_argnums=0)
    got = fn(jax.tree.map(jnp.copy, s0), ids, scores, cfg)
    assert int(got.count[3]) == int(s0.count[3]) + 1
    assert int(got.total_updates) == int(s0.total_updates) + 1
    stats = jax.jit(cur.batch_stats)(ids, scores, cfg)
    assert (int(stats.n_applied), int(stats.n_invalid), int(stats.n_out_of_range)) == (1, 3, 3)


# ========================================================= capacity / shapes
@pytest.mark.parametrize(
    "call",
    ["update", "update_groups", "sample", "item_bin", "recompute_bins", "bin_boundaries", "metrics",
     "metrics_dict", "step"],
)
def test_state_capacity_differs_from_config(call):
    small = cur.config("easy_first", 5, capacity=N)
    big = cur.config("easy_first", 5, capacity=2 * N)
    s = _tracked_state(small)
    calls = {
        "update": lambda: cur.update(s, jnp.array([9]), jnp.array([1.0]), big),
        "update_groups": lambda: cur.update_groups(s, jnp.array([9]), jnp.ones((1, 2)), big),
        "sample": lambda: cur.sample(s, 0, big, step=0, total_steps=10, num=4),
        "item_bin": lambda: cur.item_bin(s, jnp.array([1]), big),
        "recompute_bins": lambda: cur.recompute_bins(s, big),
        "bin_boundaries": lambda: cur.bin_boundaries(s, big),
        "metrics": lambda: cur.metrics(s, big),
        "metrics_dict": lambda: cur.metrics_dict(s, big),
        "step": lambda: cur.step(s, 0, jnp.array([9]), jnp.array([1.0]), big, step=0, total_steps=10, num=4),
    }
    with pytest.raises(ValueError, match=r"state capacity 8 .* differs from cfg.capacity=16"):
        calls[call]()


def test_state_capacity_mismatch_refused_under_jit_too():
    small = cur.config("easy_first", 5, capacity=N)
    big = cur.config("easy_first", 5, capacity=2 * N)
    with pytest.raises(ValueError, match="differs from cfg.capacity"):
        jax.jit(cur.update, donate_argnums=0)(cur.init(small), jnp.array([1]), jnp.array([1.0]), big)


def test_state_n_bins_differs_from_config():
    s = cur.init(cur.config("easy_first", 5, capacity=N))
    with pytest.raises(ValueError, match="cfg.n_bins=3"):
        cur.sample(s, 0, cur.config("easy_first", 3, capacity=N), step=0, total_steps=10, num=4)


@pytest.mark.parametrize(
    "args,frag",
    [
        ((np.zeros((2, 2), np.int32), np.zeros(2, np.float32)), "item_ids"),
        ((np.arange(3), np.zeros(2, np.float32)), "scores must have 3 rows"),
        ((np.arange(3), np.zeros((3, 2), np.float32)), "use update_groups"),
        ((np.array([0.0, 1.0]), np.zeros(2, np.float32)), "item_ids must be integers"),
        ((np.array(["a", "b"]), np.zeros(2, np.float32)), "item_ids must be numbers"),
        ((np.arange(2), np.array(["a", "b"])), "scores must be numbers"),
    ],
)
def test_update_wrong_shapes_and_types(args, frag):
    cfg = cur.config("uniform", 5, capacity=N)
    with pytest.raises(ValueError, match=frag):
        cur.update(cur.init(cfg), *args, cfg)


def test_update_mask_shape_and_groups_shape():
    cfg = cur.config("uniform", 5, capacity=N)
    s = cur.init(cfg)
    with pytest.raises(ValueError, match="mask must have shape"):
        cur.update(s, np.arange(3), np.zeros(3, np.float32), cfg, mask=np.ones(2, bool))
    with pytest.raises(ValueError, match=r"scores must have shape \(3, G\)"):
        cur.update_groups(s, np.arange(3), np.zeros(3, np.float32), cfg)
    with pytest.raises(ValueError, match="eligible must have shape"):
        cur.sample(s, 0, cfg, step=0, total_steps=10, num=4, eligible=np.ones(N + 1, bool))


# ============================================================== JSON files
GOOD = {"strategy": "easy_first", "n_bins": 2, "temperature": 1.0, "ema_alpha": 0.3,
        "competence_threshold": 0.5, "item_scores": {"a": [0.5, 1]}, "bin_boundaries": [],
        "last_rebin_count": 0}

BAD_FILES = [
    ("missing strategy", json.dumps({k: v for k, v in GOOD.items() if k != "strategy"}), "missing key 'strategy'"),
    ("missing n_bins", json.dumps({k: v for k, v in GOOD.items() if k != "n_bins"}), "missing key 'n_bins'"),
    ("n_bins as string", json.dumps(GOOD | {"n_bins": "2"}), "'n_bins' must be an integer"),
    ("temperature as string", json.dumps(GOOD | {"temperature": "hot"}), "'temperature' must be a number"),
    ("negative temperature", json.dumps(GOOD | {"temperature": -1.0}), "temperature must be finite and > 0.0"),
    ("item_scores a list", json.dumps(GOOD | {"item_scores": [1, 2]}), "'item_scores' must be an object"),
    ("item entry too short", json.dumps(GOOD | {"item_scores": {"a": [0.5]}}), "must be [ema, count]"),
    ("count as string", json.dumps(GOOD | {"item_scores": {"a": [0.5, "1"]}}), "count must be an integer"),
    ("ema as string", json.dumps(GOOD | {"item_scores": {"a": ["x", 1]}}), "ema must be a number"),
    ("boundaries wrong length", json.dumps(GOOD | {"bin_boundaries": [1.0]}), "bin_boundaries must have 0 or"),
    ("boundaries not numbers", json.dumps(GOOD | {"bin_boundaries": ["a", "b"]}), "finite numbers"),
    ("jaxweight block a list", json.dumps(GOOD | {"jaxweight": [1]}), "'jaxweight' must be an object"),
    ("bad priority", json.dumps(GOOD | {"jaxweight": {"priority": "medium"}}), "priority must be one of"),
    ("unknown strategy", json.dumps(GOOD | {"strategy": "nope"}), "Invalid curriculum strategy 'nope'"),
    ("top level a list", json.dumps([GOOD]), "expected a JSON object"),
    ("truncated", json.dumps(GOOD)[:40], "invalid or truncated JSON"),
    ("empty", "", "empty file"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a UTF-8 JSON file"),
]


@pytest.mark.parametrize("what,content,frag", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_malformed_json_file_raises_state_file_error_naming_the_file(tmp_path, what, content, frag):
    path = tmp_path / "state.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(_util.StateFileError) as e:
        atropos.load_json(path, capacity=N)
    assert str(path) in str(e.value) and frag in str(e.value), str(e.value)


def test_good_json_file_loads_and_capacity_too_small_is_a_value_error(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(GOOD | {"item_scores": {"a": [0.5, 1], "b": [0.1, 2]}}))
    cfg, s, keys = atropos.load_json(path, capacity=N)
    assert keys.keys() == ["a", "b"] and int(s.total_updates) == 3
    with pytest.raises(ValueError, match="more than capacity 1"):
        atropos.load_json(path, capacity=1)


def test_load_state_dict_refuses_non_mapping():
    with pytest.raises(_util.StateFileError, match="expected a JSON object"):
        atropos.load_state_dict("not a dict", N)
