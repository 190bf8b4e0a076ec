"""jaxweight.curriculum: config, update, rebinning and per-item queries.

The oracle is :class:`AtroposRef`, a small pure-Python transcription of the
atropos ``CurriculumScheduler`` semantics described in the spec (dict of
(ema, count), rebin check on total updates, quantile boundaries from the
descending sort, equal spacing with fewer items than bins). It computes in
float32 (NumPy scalars) so that single updates can be compared bit for bit.
Unlike atropos it does not store lazily computed boundaries (deliberate
difference 3 of the spec), unless ``store_lazy=True``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import curriculum as cur

F32 = np.float32


class AtroposRef:
    """Pure-Python reference of the atropos scheduler (float32 arithmetic)."""

    def __init__(self, n_bins=5, ema_alpha=0.3, rebin_interval=50, store_lazy=False):
        self.n_bins = n_bins
        self.a = F32(ema_alpha)
        self.items: dict = {}
        self.bounds: list = []
        self.last_rebin = 0
        self.interval = rebin_interval
        self.store_lazy = store_lazy
        self.last_update: dict = {}
        self.total = 0

    def apply(self, key, score):
        """One update without the rebin check."""
        score = F32(score)
        if key in self.items:
            ema, c = self.items[key]
            self.items[key] = (F32(self.a * score + (F32(1) - self.a) * ema), c + 1)
        else:
            self.items[key] = (score, 1)
        self.total += 1
        self.last_update[key] = self.total

    def rebin_check(self):
        total = sum(c for _, c in self.items.values())  # atropos sums all counts
        assert total == self.total
        if total - self.last_rebin >= self.interval:
            self.bounds = self.compute()
            self.last_rebin = total

    def update(self, key, score):
        self.apply(key, score)
        self.rebin_check()

    def update_batch(self, key, scores):
        if not scores:
            return
        self.update(key, F32(sum(F32(s) for s in scores) / F32(len(scores))))

    def compute(self):
        if not self.items:
            return []
        desc = sorted((e for e, _ in self.items.values()), reverse=True)
        n = len(desc)
        if n < self.n_bins:
            mx, mn = max(desc), min(desc)
            if mx == mn:
                return [mn] * self.n_bins
            step = F32((mx - mn) / F32(self.n_bins))
            return [F32(mx - F32(i) * step) for i in range(self.n_bins)]
        return [desc[min((i * n) // self.n_bins, n - 1)] for i in range(self.n_bins)]

    def boundaries(self):
        if self.bounds:
            return self.bounds
        b = self.compute()
        if self.store_lazy:
            self.bounds = b
        return b

    def get_item_bin(self, key):
        if key not in self.items:
            return self.n_bins // 2
        b = self.boundaries()
        for i, x in enumerate(b):
            if self.items[key][0] >= x:
                return i
        return self.n_bins - 1

    def arrays(self, n):
        ema, cnt, last = np.zeros(n, F32), np.zeros(n, np.int32), np.zeros(n, np.int32)
        for k, (e, c) in self.items.items():
            ema[k], cnt[k], last[k] = e, c, self.last_update[k]
        return ema, cnt, last

    def metrics_dict(self):
        if not self.items:
            return {"curriculum/items_tracked": 0, "curriculum/strategy": 0}
        scores = [float(e) for e, _ in self.items.values()]
        out = {
            "curriculum/items_tracked": float(len(scores)),
            "curriculum/mean_difficulty": sum(scores) / len(scores),
            "curriculum/min_difficulty": min(scores),
            "curriculum/max_difficulty": max(scores),
            "curriculum/total_updates": float(sum(c for _, c in self.items.values())),
        }
        if self.bounds:
            counts = [0] * self.n_bins
            for k in self.items:
                counts[self.get_item_bin(k)] += 1
            for i, c in enumerate(counts):
                out[f"curriculum/bin_{i}_count"] = float(c)
        return out


def ref_boundaries(ema, tracked, n_bins):
    """NumPy reference of recompute_bins: (boundaries, has)."""
    vals = np.asarray(ema, F32)[np.asarray(tracked, bool)]
    ref = AtroposRef(n_bins)
    ref.items = {i: (F32(v), 1) for i, v in enumerate(vals)}
    b = ref.compute()
    return (np.asarray(b, F32) if b else np.zeros(n_bins, F32)), bool(b)


def assert_state_matches(state, ref, n):
    ema, cnt, last = ref.arrays(n)
    np.testing.assert_array_equal(np.asarray(state.ema), ema)
    np.testing.assert_array_equal(np.asarray(state.count), cnt)
    np.testing.assert_array_equal(np.asarray(state.last_update), last)
    assert int(state.total_updates) == ref.total
    assert int(state.last_rebin_count) == ref.last_rebin
    assert bool(state.has_boundaries) == bool(ref.bounds)
    if ref.bounds:
        np.testing.assert_array_equal(np.asarray(state.boundaries), np.asarray(ref.bounds, F32))


# ====================================================================== config
def test_config_invalid_strategy_message():
    with pytest.raises(ValueError) as e:
        cur.config("hardest_first", capacity=10)
    assert str(e.value) == (
        "Invalid curriculum strategy 'hardest_first'. Must be one of: "
        "['uniform', 'easy_first', 'competence_based', 'competence_sqrt', 'prioritized']"
    )


def test_config_n_bins_message():
    with pytest.raises(ValueError) as e:
        cur.config("uniform", 0, capacity=10)
    assert str(e.value) == "n_bins must be >= 1, got 0"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 10, "rebin_interval": 0}, "rebin_interval"),
        ({"capacity": 10, "competence_c0": 0.0}, "competence_c0"),
        ({"capacity": 10, "competence_c0": 1.5}, "competence_c0"),
        ({"capacity": 10, "staleness_coeff": -0.1}, "staleness_coeff"),
        ({"capacity": 10, "staleness_coeff": 1.1}, "staleness_coeff"),
        ({"capacity": 10, "priority": "medium"}, "priority"),
        ({"capacity": 2.5}, "capacity"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cur.config("uniform", 5, **kwargs)


def test_config_clamps_temperature_refuses_bad_alpha_and_leaves():
    # atropos's clamp max(0.01, T) is kept for positive temperatures; bad values are refused
    cfg = cur.config("easy_first", 5, capacity=10, temperature=0.001, ema_alpha=1.0)
    assert float(cfg.temperature) == pytest.approx(0.01)
    assert float(cfg.ema_alpha) == 1.0
    for kw in ({"ema_alpha": 1.5}, {"ema_alpha": -2.0}, {"temperature": 0.0}, {"temperature": -1.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            cur.config(capacity=10, **kw)
    for name in ("temperature", "ema_alpha", "competence_threshold", "competence_c0", "staleness_coeff"):
        leaf = getattr(cfg, name)
        assert leaf.dtype == jnp.float32 and leaf.shape == () and not leaf.weak_type
    assert cfg.rebin_interval.dtype == jnp.int32 and not cfg.rebin_interval.weak_type
    # the constructor refuses a bad concrete value; the clamps apply again at use, so a
    # traced value (unchecked outside jaxweight.checked) obeys them
    with pytest.raises(ValueError, match="temperature"):
        cfg.replace(temperature=jnp.float32(0.0))

    def run(t, a):
        raw = cfg.replace(temperature=t, ema_alpha=a)
        s = cur.update(cur.init(raw), jnp.array([0, 0, 0]), jnp.array([1.0, 0.5, 0.0], F32), raw)
        return cur.bin_probabilities(raw, step=0, total_steps=1), s.ema[0]

    p, ema0 = jax.jit(run)(jnp.float32(0.0), jnp.float32(2.0))
    want = jax.jit(lambda c: cur.bin_probabilities(c, step=0, total_steps=1))(cfg)  # the stored clamp
    np.testing.assert_allclose(p, want, rtol=1e-6)
    assert float(ema0) == 0.0  # alpha clipped to 1: ema = the last score


def test_init_layout():
    cfg = cur.config("uniform", 4, capacity=9)
    s = cur.init(cfg)
    for name, shape, dtype in [("ema", (9,), jnp.float32), ("count", (9,), jnp.int32),
                               ("last_update", (9,), jnp.int32), ("boundaries", (4,), jnp.float32),
                               ("has_boundaries", (), jnp.bool_), ("last_rebin_count", (), jnp.int32),
                               ("total_updates", (), jnp.int32)]:
        leaf = getattr(s, name)
        assert leaf.shape == shape and leaf.dtype == dtype and not np.any(np.asarray(leaf))


# ========================================================== worked examples
def test_example4_quantile_boundaries_one_batch(jit_or_eager):
    cfg = cur.config("uniform", 5, capacity=100)
    ids = jnp.arange(100, dtype=jnp.int32)
    s = jit_or_eager(cur.update)(cur.init(cfg), ids, ids.astype(jnp.float32) / 100, cfg)
    np.testing.assert_allclose(s.boundaries, [0.99, 0.79, 0.59, 0.39, 0.19], rtol=0, atol=1e-7)
    assert int(s.last_rebin_count) == 100 and bool(s.has_boundaries)
    bins = jit_or_eager(cur.item_bin)(s, jnp.array([99, 98, 80, 79, 60, 20, 19, 0]), cfg)
    np.testing.assert_array_equal(bins, [0, 1, 1, 1, 2, 4, 4, 4])


def test_example4_quantile_boundaries_one_at_a_time():
    cfg = cur.config("uniform", 5, capacity=100)
    s = cur.init(cfg)
    for i in range(100):
        s = _UP(s, jnp.array([i]), jnp.array([i / 100], jnp.float32), cfg)
        if i == 49:  # the first rebin happened at 50 updates
            assert int(s.last_rebin_count) == 50
    np.testing.assert_allclose(s.boundaries, [0.99, 0.79, 0.59, 0.39, 0.19], rtol=0, atol=1e-7)
    assert int(s.last_rebin_count) == 100
    bins = cur.item_bin(s, jnp.array([99, 98, 80, 79, 60, 20, 19, 0]), cfg)
    np.testing.assert_array_equal(bins, [0, 1, 1, 1, 2, 4, 4, 4])


def test_example5_on_the_fly_boundaries():
    cfg = cur.config("uniform", 5, capacity=10)
    s = cur.update(cur.init(cfg), np.array([0, 1, 2]), np.array([0.9, 0.5, 0.1], F32), cfg)
    assert not bool(s.has_boundaries)
    np.testing.assert_allclose(cur.bin_boundaries(s, cfg), [0.9, 0.74, 0.58, 0.42, 0.26], rtol=0, atol=1e-7)
    np.testing.assert_array_equal(cur.item_bin(s, jnp.array([0, 1, 2]), cfg), [0, 3, 4])
    # computed on the fly, not stored
    assert not bool(s.has_boundaries) and not np.any(np.asarray(s.boundaries))


def test_example5_one_at_a_time():
    cfg = cur.config("uniform", 5, capacity=10)
    s = cur.init(cfg)
    for i, x in enumerate([0.9, 0.5, 0.1]):
        s = cur.update(s, np.array([i]), np.array([x], F32), cfg)
    np.testing.assert_allclose(cur.bin_boundaries(s, cfg), [0.9, 0.74, 0.58, 0.42, 0.26], atol=1e-7)
    np.testing.assert_array_equal(cur.item_bin(s, np.array([0, 1, 2]), cfg), [0, 3, 4])


def test_example6_ema_batched_and_sequential(jit_or_eager):
    cfg = cur.config("uniform", 5, capacity=10, ema_alpha=0.3)
    up = jit_or_eager(cur.update)
    s = up(cur.init(cfg), jnp.array([4, 4, 4]), jnp.array([1.0, 0.0, 0.0]), cfg)  # duplicates in one batch
    np.testing.assert_allclose(s.ema[4], 0.49, rtol=1e-6)
    assert int(s.count[4]) == 3 and int(s.total_updates) == 3 and int(s.last_update[4]) == 3
    s2 = cur.init(cfg)
    for x in (1.0, 0.0, 0.0):
        s2 = up(s2, jnp.array([4]), jnp.array([x]), cfg)
    np.testing.assert_allclose(s2.ema[4], 0.49, rtol=1e-6)
    assert int(s2.count[4]) == 3


def test_example6_update_groups():
    cfg = cur.config("uniform", 5, capacity=10)
    s = cur.update_groups(cur.init(cfg), jnp.array([7]), jnp.array([[1.0, 0.0, 0.0, 1.0]]), cfg)
    assert float(s.ema[7]) == 0.5 and int(s.count[7]) == 1 and int(s.total_updates) == 1


# ============================================================== atropos parity
def _atropos_update(item_scores: dict, item_key, score, ema_alpha) -> None:
    """atropos ``CurriculumScheduler.update`` (atroposlib/envs/curriculum.py, PR #428), transcribed
    line for line with float32 numbers (no clipping, no special case of ``ema_alpha``)."""
    if item_key in item_scores:
        old_ema, count = item_scores[item_key]
        new_ema = ema_alpha * score + (F32(1) - ema_alpha) * old_ema
        item_scores[item_key] = (F32(new_ema), count + 1)
    else:
        item_scores[item_key] = (F32(score), 1)


@pytest.mark.parametrize("batched", [False, True])
def test_ema_alpha_zero_keeps_each_first_score_as_atropos(batched):
    """``ema_alpha=0`` is accepted as atropos accepts it: every EMA stays at the item's first
    score while its count grows; one batch or one update at a time, eager or jitted."""
    n, steps = 12, 60
    rng = np.random.default_rng(7)
    ids = rng.integers(0, n, steps).astype(np.int32)
    scores = rng.normal(size=steps).astype(F32)
    cfg = cur.config("uniform", 5, capacity=n, ema_alpha=0.0)
    assert float(cfg.ema_alpha) == 0.0
    want: dict = {}
    for k, x in zip(ids.tolist(), scores):
        _atropos_update(want, k, x, F32(0.0))
    if batched:
        s = cur.update(cur.init(cfg), ids, scores, cfg)
        sj = _UP(cur.init(cfg), jnp.asarray(ids), jnp.asarray(scores), cfg)
        np.testing.assert_array_equal(sj.ema, s.ema)
    else:
        s = cur.init(cfg)
        for k, x in zip(ids, scores):
            s = _UP(s, jnp.array([k]), jnp.array([x]), cfg)
    ema, cnt = np.zeros(n, F32), np.zeros(n, np.int32)
    for k, (e, c) in want.items():
        ema[k], cnt[k] = e, c
    np.testing.assert_array_equal(s.ema, ema)
    np.testing.assert_array_equal(s.count, cnt)
    first = {int(k): scores[j] for j, k in reversed(list(enumerate(ids)))}   # each id's first score
    np.testing.assert_array_equal(ema[list(first)], [first[k] for k in first])
    # the same oracle as the other parity tests, at alpha 0 (rebins included: a batch checks once)
    ref = AtroposRef(5, 0.0, 50)
    for k, x in zip(ids.tolist(), scores):
        (ref.apply if batched else ref.update)(k, x)
    if batched:
        ref.rebin_check()
    assert_state_matches(s, ref, n)


@pytest.mark.parametrize("n_bins, alpha, interval", [(5, 0.3, 50), (3, 0.77, 7)])
def test_single_updates_match_atropos_bit_for_bit(n_bins, alpha, interval):
    """Random sequences of B = 1 updates: EMAs, counts, boundaries and bins equal the oracle exactly."""
    n = 40
    rng = np.random.default_rng(n_bins)
    cfg = cur.config("uniform", n_bins, capacity=n, ema_alpha=alpha, rebin_interval=interval)
    ref = AtroposRef(n_bins, float(cfg.ema_alpha), interval)
    s = cur.init(cfg)
    up, ib = _UP, jax.jit(cur.item_bin)  # the jitted path, where XLA could fuse a multiply-add
    everyone = jnp.arange(n)
    for t in range(220):
        k = int(rng.integers(0, n if t > 30 else 6))  # early repeats, then spread
        x = float(np.round(rng.random(), 1)) if rng.random() < 0.5 else float(rng.normal())  # ties too
        s = up(s, jnp.array([k]), jnp.array([x], jnp.float32), cfg)
        ref.update(k, x)
        if t % 3 == 0 or t > 200:
            assert_state_matches(s, ref, n)
            np.testing.assert_array_equal(ib(s, everyone, cfg), [ref.get_item_bin(i) for i in range(n)])


def test_update_groups_match_atropos_update_batch():
    cfg = cur.config("uniform", 5, capacity=10, rebin_interval=4)
    ref = AtroposRef(5, 0.3, 4)
    rng = np.random.default_rng(3)
    s = cur.init(cfg)
    for _ in range(30):
        k = int(rng.integers(0, 10))
        row = rng.integers(0, 2, size=4).astype(F32)
        s = _UPG(s, jnp.array([k]), jnp.asarray(row[None]), cfg)
        ref.update_batch(k, list(row))
        assert_state_matches(s, ref, 10)


# ==================================================== batches, masks, ranges
N_B = 16  # fixed batch shape for the property tests (one compilation)


@settings(max_examples=40, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.integers(-2, 11), st.sampled_from([0.0, 0.25, 0.5, 1.0, -0.5, 2.0, math.nan, math.inf]),
                  st.booleans()),
        min_size=1, max_size=N_B),
    n_pre=st.integers(0, 6),
    interval=st.integers(1, 12),
)
def test_batched_equals_sequential_with_duplicates(entries, n_pre, interval):
    """One batch == the entries applied one by one in order, with one rebin check at the end."""
    n = 10
    cfg = cur.config("uniform", 5, capacity=n, rebin_interval=interval)
    ref = AtroposRef(5, float(cfg.ema_alpha), interval)
    s = cur.init(cfg)
    # some history first (one at a time, each with its rebin check)
    for k in range(n_pre):
        s = _UP(s, jnp.array([k]), jnp.array([0.1 * (k + 1)], jnp.float32), cfg)
        ref.update(k, 0.1 * (k + 1))
    ids = np.full(N_B, -1, np.int32)
    scores = np.zeros(N_B, F32)
    mask = np.zeros(N_B, bool)
    for j, (k, x, m) in enumerate(entries):
        ids[j], scores[j], mask[j] = k, x, m
        if m and math.isfinite(x) and 0 <= k < n:
            ref.apply(k, x)
    ref.rebin_check()
    s = _UP(s, jnp.asarray(ids), jnp.asarray(scores), cfg, mask=jnp.asarray(mask))
    ema, cnt, last = ref.arrays(n)
    np.testing.assert_allclose(np.asarray(s.ema), ema, rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(s.count), cnt)
    np.testing.assert_array_equal(np.asarray(s.last_update), last)
    assert int(s.total_updates) == ref.total == int(np.sum(cnt))
    assert int(s.last_rebin_count) == ref.last_rebin
    assert bool(s.has_boundaries) == bool(ref.bounds)
    if ref.bounds:
        np.testing.assert_allclose(np.asarray(s.boundaries), np.asarray(ref.bounds, F32), rtol=2e-6, atol=1e-6)


_UP = jax.jit(cur.update)
_UPG = jax.jit(cur.update_groups)


def test_batch_rebins_once_at_the_end():
    """Deliberate difference 2: a batch crossing rebin points rebins once, at its end."""
    cfg = cur.config("uniform", 5, capacity=10, rebin_interval=5)
    ids = np.arange(16) % 10
    scores = np.linspace(0, 1, 16).astype(F32)
    s = _UP(cur.init(cfg), jnp.asarray(ids), jnp.asarray(scores), cfg, mask=jnp.ones(16, bool))
    assert int(s.last_rebin_count) == 16  # atropos: 15 (rebins at 5, 10 and 15)
    b, _ = ref_boundaries(np.asarray(s.ema), np.ones(10, bool), 5)
    np.testing.assert_array_equal(s.boundaries, b)


def test_skipped_entries_add_nothing():
    cfg = cur.config("uniform", 5, capacity=6)
    s0 = cur.update(cur.init(cfg), np.array([1]), np.array([0.5], F32), cfg)
    ids = jnp.array([2, 3, 4, 5, 1])
    scores = jnp.array([jnp.nan, jnp.inf, -jnp.inf, 0.7, 0.9])
    mask = jnp.array([True, True, True, False, True])
    s = cur.update(s0, ids, scores, cfg, mask=mask)
    np.testing.assert_array_equal(s.count, [0, 2, 0, 0, 0, 0])
    assert int(s.total_updates) == 2 and int(s.last_update[1]) == 2
    np.testing.assert_allclose(s.ema[1], 0.3 * 0.9 + 0.7 * 0.5, rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(s.ema)))


def test_out_of_range_ids_traced_are_ignored():
    cfg = cur.config("uniform", 5, capacity=6)
    s0 = cur.init(cfg)
    s = jax.jit(cur.update)(s0, jnp.array([-1, 6, 100, -7, 2]), jnp.ones(5), cfg)
    np.testing.assert_array_equal(s.count, [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(s.ema, [0, 0, 1, 0, 0, 0])
    assert int(s.total_updates) == 1
    s = jax.jit(cur.update_groups)(s0, jnp.array([6, 1]), jnp.ones((2, 3)), cfg)
    np.testing.assert_array_equal(s.count, [0, 1, 0, 0, 0, 0])


def test_out_of_range_ids_concrete_are_refused():
    cfg = cur.config("uniform", 5, capacity=6)
    s0 = cur.init(cfg)
    with pytest.raises(ValueError, match=r"item_ids must be in \[0, 6\).*got item_ids\[1\]=6"):
        cur.update(s0, np.array([1, 6]), np.ones(2, F32), cfg)
    with pytest.raises(ValueError, match=r"got item_ids\[0\]=-1"):
        cur.update(s0, [-1], [1.0], cfg)
    with pytest.raises(ValueError, match=r"got item_ids\[0\]=9"):
        cur.update_groups(s0, np.array([9]), np.ones((1, 2), F32), cfg)
    # an id that int32 would wrap onto a valid one (2**32 -> 0) is refused, not applied to item 0
    with pytest.raises(ValueError, match=r"got item_ids\[0\]=4294967296"):
        cur.update(s0, np.array([2**32], np.int64), np.ones(1, F32), cfg)
    # masked-out padding
    s = cur.update(s0, np.array([1, -1]), np.ones(2, F32), cfg, mask=np.array([True, False]))
    assert int(s.total_updates) == 1
    s = cur.update_groups(s0, np.array([1, -1]), np.ones((2, 2), F32), cfg, mask=np.array([True, False]))
    assert int(s.total_updates) == 1


def test_bad_shapes_and_dtypes():
    cfg = cur.config("uniform", 5, capacity=6)
    s0 = cur.init(cfg)
    with pytest.raises(ValueError, match="item_ids"):
        cur.update(s0, np.array([[1]]), np.ones((1, 1), F32), cfg)
    with pytest.raises(ValueError, match="scores"):
        cur.update(s0, np.array([1, 2]), np.ones(3, F32), cfg)
    with pytest.raises(ValueError, match="mask"):
        cur.update(s0, np.array([1, 2]), np.ones(2, F32), cfg, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="integers"):
        cur.update(s0, np.array([1.0]), np.ones(1, F32), cfg)
    with pytest.raises(ValueError, match="scores"):
        cur.update_groups(s0, np.array([1, 2]), np.ones((3, 2), F32), cfg)
    with pytest.raises(ValueError, match="mask"):
        cur.update_groups(s0, np.array([1, 2]), np.ones((2, 2), F32), cfg, mask=np.ones(3, bool))


def test_update_groups_masks_and_nonfinite():
    cfg = cur.config("uniform", 5, capacity=6)
    scores = jnp.array([[1.0, jnp.nan, 0.0, 0.5], [jnp.nan, jnp.nan, jnp.nan, jnp.nan], [1.0, 1.0, 0.0, 0.0]])
    mask = jnp.array([[True, True, True, True], [True, True, True, True], [True, False, False, False]])
    s = cur.update_groups(cur.init(cfg), jnp.array([0, 1, 2]), scores, cfg, mask=mask)
    np.testing.assert_array_equal(s.count, [1, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(s.ema[:3], [0.5, 0.0, 1.0], rtol=1e-6)
    s = cur.update_groups(cur.init(cfg), jnp.array([0, 1]), jnp.ones((2, 3)), cfg, mask=jnp.array([False, True]))
    np.testing.assert_array_equal(s.count, [0, 1, 0, 0, 0, 0])


def test_empty_batch_is_identity():
    cfg = cur.config("uniform", 5, capacity=6)
    s0 = cur.update(cur.init(cfg), np.array([1]), np.array([0.3], F32), cfg)
    s = cur.update(s0, np.zeros((0,), np.int32), np.zeros((0,), F32), cfg)
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(s0)):
        np.testing.assert_array_equal(a, b)


def test_difficulty():
    cfg = cur.config("uniform", 5, capacity=6)
    s = cur.update(cur.init(cfg), np.array([1, 3]), np.array([0.25, -1.0], F32), cfg)
    ema, tracked = cur.difficulty(s, jnp.array([1, 3, 0, -1, 6]))
    np.testing.assert_array_equal(tracked, [True, True, False, False, False])
    np.testing.assert_array_equal(ema[:2], [0.25, -1.0])
    np.testing.assert_array_equal(ema[2:], [0.0, 0.0, 0.0])   # not measured: tracked says so, no NaN
    np.testing.assert_array_equal(cur.item_bin(s, jnp.array([0, -1, 6, 4]), cfg), [2, 2, 2, 2])


# =================================================== exact order statistics
def _check_bins(ema, tracked, n_bins):
    cfg = cur.config("uniform", n_bins, capacity=len(ema))
    s = cur.init(cfg).replace(ema=jnp.asarray(ema, jnp.float32),
                              count=jnp.asarray(tracked, jnp.int32))
    out = _RB(s, cfg)
    b, has = ref_boundaries(ema, tracked, n_bins)
    assert bool(out.has_boundaries) == has
    if has:
        np.testing.assert_array_equal(np.asarray(out.boundaries), b)
    assert int(out.last_rebin_count) == 0  # recompute_bins never touches it
    return out


_RB = jax.jit(cur.recompute_bins)


@settings(max_examples=40, deadline=None)
@given(
    vals=st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, -1e-30, 3.0e38, -3.0e38, 0.1, 7.0]),
                  min_size=64, max_size=64),
    tracked=st.lists(st.booleans(), min_size=64, max_size=64),
    noise=st.booleans(),
)
def test_recompute_bins_exact_with_ties_and_signed_zeros(vals, tracked, noise):
    ema = np.asarray(vals, F32)
    if noise:
        ema = ema + np.random.default_rng(len(vals)).normal(size=64).astype(F32)
    for n_bins in (5, 9):
        _check_bins(ema, np.asarray(tracked), n_bins)


@pytest.mark.parametrize("n_bins", [1, 5, 40])
def test_recompute_bins_exact_large_pool(n_bins):
    """Exact order statistics at a larger N, also with > 32 bins (three radix passes)."""
    rng = np.random.default_rng(n_bins)
    n = 20_000
    ema = np.concatenate([rng.normal(size=n // 2), np.round(rng.random(n // 2), 2)]).astype(F32)
    rng.shuffle(ema)
    tracked = rng.random(n) < 0.7
    _check_bins(ema, tracked, n_bins)


@pytest.mark.parametrize("n_tracked", [0, 1, 2, 4, 5])
def test_recompute_bins_few_items(n_tracked):
    ema = np.array([0.3, 0.9, 0.3, -0.2, 0.6, 0.0, 0.0, 0.0], F32)
    tracked = np.arange(8) < n_tracked
    _check_bins(ema, tracked, 5)
    _check_bins(np.full(8, 0.4, F32), tracked, 5)  # max == min


def test_rebin_interval_and_last_rebin_count():
    cfg = cur.config("uniform", 5, capacity=10, rebin_interval=3)
    s = cur.init(cfg)
    seen = []
    for i in range(7):
        s = _UP(s, jnp.array([i]), jnp.array([float(i)], jnp.float32), cfg)
        seen.append(int(s.last_rebin_count))
    assert seen == [0, 0, 3, 3, 3, 6, 6]
    s = cur.recompute_bins(s, cfg)
    assert int(s.last_rebin_count) == 6
    np.testing.assert_array_equal(s.boundaries, [6.0, 5.0, 4.0, 2.0, 1.0])


def test_large_batch_with_long_runs_matches_sequential():
    """B > 2048 takes the O(B) associative scan; long runs of duplicates stay within float32 rounding."""
    n, b = 10, 3000
    rng = np.random.default_rng(11)
    ids = rng.integers(0, n, b).astype(np.int32)
    scores = rng.random(b).astype(F32)
    cfg = cur.config("uniform", 5, capacity=n, ema_alpha=0.05)
    s0 = cur.update(cur.init(cfg), np.arange(5), np.full(5, 0.5, F32), cfg)
    ref = AtroposRef(5, float(cfg.ema_alpha))
    for k in range(5):
        ref.update(k, 0.5)
    for k, x in zip(ids, scores):
        ref.apply(int(k), x)
    ref.rebin_check()
    s = cur.update(s0, ids, scores, cfg)
    ema, cnt, last = ref.arrays(n)
    np.testing.assert_allclose(np.asarray(s.ema), ema, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(s.count), cnt)
    np.testing.assert_array_equal(np.asarray(s.last_update), last)
    assert int(s.total_updates) == ref.total and int(s.last_rebin_count) == ref.last_rebin
