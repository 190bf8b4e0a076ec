"""The curriculum runs under ``jax.debug_nans`` and ``jax.debug_infs`` (CONVENTIONS: no NaN or
inf as a sentinel in a state or an output).

"Not measured" is a flag or a count (``tracked``, ``items_tracked``, ``has_boundaries``), never
NaN; masks inside the kernels use finite values. Each test runs eager (op by op, where every
intermediate is checked) and jitted (outputs checked), on ordinary input: a fresh pool, and
batches with masked, NaN and inf scores. The results must equal the unchecked call's, and
the documented values of the empty cases.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import curriculum as cur
from tests.contracts import assert_trees_close, checked_and_plain, debug_checks

N = 200   # two blocks of the sampling tree (a partial last one)
NAN, INF = float("nan"), float("inf")
IDS = np.array([0, 1, 2, 1, 5, 7], np.int32)
SCORES = np.array([0.5, NAN, 0.25, INF, 1.0, -INF], np.float32)
MASK = np.array([True, True, False, True, True, True])
PROGRESS = dict(step=0, total_steps=10)   # competence_sqrt at step 0: bins of probability 0





def test_fresh_pool_reports_nothing_measured_without_nan(jit_or_eager):
    """Nothing tracked: the difficulty statistics are 0 and ``items_tracked == 0`` says why;
    untracked items read 0 with ``tracked`` False; no boundaries are stored."""
    with debug_checks():
        cfg = cur.config("prioritized", 5, capacity=N)
        s0 = cur.init(cfg)

    def f(s):
        return (cur.metrics(s, cfg), cur.recompute_bins(s, cfg), cur.bin_boundaries(s, cfg),
                cur.difficulty(s, jnp.array([0, 3, N - 1])), cur.item_bin(s, jnp.array([0, 3]), cfg))

    (m, rebinned, b, (ema, tracked), bins), plain = checked_and_plain(f, jit_or_eager, s0)
    assert_trees_close((m, rebinned, b, (ema, tracked), bins), plain)
    assert int(m["items_tracked"]) == 0 and not bool(m["has_boundaries"])
    assert [float(m[k]) for k in ("mean_difficulty", "min_difficulty", "max_difficulty")] == [0.0, 0.0, 0.0]
    assert not bool(rebinned.has_boundaries)
    np.testing.assert_array_equal(rebinned.boundaries, np.zeros(5, np.float32))
    np.testing.assert_array_equal(b, np.zeros(5, np.float32))
    np.testing.assert_array_equal(ema, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(tracked, [False, False, False])
    np.testing.assert_array_equal(bins, [2, 2])                      # untracked: the middle bin
    with debug_checks():
        assert cur.metrics_dict(s0, cfg) == {"curriculum/items_tracked": 0, "curriculum/strategy": 0}


@pytest.mark.parametrize("strategy", ["competence_sqrt", "prioritized"])
def test_step_with_masked_and_nonfinite_scores(strategy, jit_or_eager):
    """One step from a fresh pool with NaN / +-inf / masked scores: the checked run equals the
    unchecked one, applies exactly the valid entries, counts the others and draws in-range ids."""
    with debug_checks():
        cfg = cur.config(strategy, 5, capacity=N, rebin_interval=2)
        s0 = cur.init(cfg)

    def f(s, key):
        return cur.step(s, key, IDS, SCORES, cfg, num=16, mask=MASK, **PROGRESS)

    (s1, out), plain = checked_and_plain(f, jit_or_eager, s0, jax.random.key(3))
    assert_trees_close((s1, out), plain)
    np.testing.assert_array_equal(np.asarray(s1.count)[:8], [1, 0, 0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(s1.ema)[[0, 5]], [0.5, 1.0])
    assert int(s1.total_updates) == 2 and bool(s1.has_boundaries)   # rebinned (interval 2)
    assert out.to_dict() == {"curriculum/n_applied": 2.0, "curriculum/n_invalid": 3.0,
                             "curriculum/n_nonfinite": 3.0, "curriculum/n_out_of_range": 0.0}
    ids = np.asarray(out.item_ids)
    assert np.all((ids >= 0) & (ids < N))
    if strategy == "prioritized":   # PLR draws only tracked items
        assert set(ids.tolist()) <= {0, 5}
    with debug_checks():
        m = cur.metrics_dict(s1, cfg)
    assert m["curriculum/items_tracked"] == 2.0 and m["curriculum/mean_difficulty"] == 0.75
    assert (m["curriculum/min_difficulty"], m["curriculum/max_difficulty"]) == (0.5, 1.0)


def test_all_invalid_batch_leaves_the_state_and_finds_no_sentinel(jit_or_eager):
    """A batch with no valid entry (all NaN or masked) on a fresh pool changes nothing."""
    with debug_checks():
        cfg = cur.config("uniform", 5, capacity=N)
        s0 = cur.init(cfg)

    def f(s):
        return (cur.update(s, IDS, np.full(IDS.shape, NAN, np.float32), cfg),
                cur.update_groups(s, IDS, np.stack([SCORES, SCORES], 1), cfg, mask=np.zeros(IDS.shape, bool)))

    (a, b), plain = checked_and_plain(f, jit_or_eager, s0)
    assert_trees_close((a, b), plain)
    assert_trees_close(a, s0)
    assert_trees_close(b, s0)


def test_zero_probability_bins_are_never_drawn(jit_or_eager):
    """competence_sqrt at step 0 gives most bins probability 0; their log is a finite stand-in
    for -inf, and the draws are those of the unchecked run, all in the bins of probability > 0."""
    with debug_checks():
        cfg = cur.config("competence_sqrt", 5, capacity=N)
        p = cur.bin_probabilities(cfg, **PROGRESS)
    assert np.sum(np.asarray(p) == 0) == 4

    def f(key):
        return cur.sample_bin(key, cfg, shape=(256,), **PROGRESS)

    bins, plain = checked_and_plain(f, jit_or_eager, jax.random.key(1))
    assert_trees_close(bins, plain)
    assert set(np.asarray(bins).tolist()) == {0}


def test_sampling_with_empty_bins_and_no_eligible_item(jit_or_eager):
    """Binned sampling restricted to a few eligible items (empty bins), and with none eligible (-1)."""
    with debug_checks():
        cfg = cur.config("easy_first", 5, capacity=N)
        s = cur.update(cur.init(cfg), np.arange(10, dtype=np.int32), np.linspace(0, 1, 10, dtype=np.float32), cfg)
    some = jnp.arange(N) < 3
    none = jnp.zeros((N,), bool)

    def f(key):
        return (cur.sample(s, key, cfg, num=32, eligible=some, **PROGRESS),
                cur.sample(s, key, cfg, num=4, eligible=none, **PROGRESS))

    (ids, empty), plain = checked_and_plain(f, jit_or_eager, jax.random.key(2))
    assert_trees_close((ids, empty), plain)
    assert set(np.asarray(ids).tolist()) <= {0, 1, 2}
    np.testing.assert_array_equal(empty, [-1, -1, -1, -1])


@pytest.mark.parametrize("priority", ["frontier", "easy"])
def test_prioritized_ranks_without_an_inf_mask(priority, jit_or_eager):
    """PLR ranks the tracked eligible items (untracked and ineligible ones go last without an
    inf key): with the staleness share off, rank 1 of ``easy`` is the highest EMA, and
    ``frontier`` ranks by distance to the threshold."""
    with debug_checks():
        cfg = cur.config("prioritized", 5, capacity=N, priority=priority, temperature=0.05,
                         staleness_coeff=0.0, competence_threshold=0.5)
        s = cur.update(cur.init(cfg), np.array([10, 20, 30, 40], np.int32),
                       np.array([0.3, 0.45, 0.9, -0.0], np.float32), cfg)
    elig = jnp.arange(N) != 20

    def f(key):
        return cur.sample(s, key, cfg, num=64, eligible=elig)

    ids, plain = checked_and_plain(f, jit_or_eager, jax.random.key(4))
    assert_trees_close(ids, plain)
    ids = np.asarray(ids)
    assert set(ids.tolist()) <= {10, 30, 40}
    # rank weights (1/rank)^(1/0.05): rank 1 takes all but ~1e-6 of the mass
    top = 30 if priority == "easy" else 10   # frontier: |0.3 - 0.5| < |0.9 - 0.5| < |0 - 0.5|
    assert np.all(ids == top)


def test_boundaries_of_extreme_emas_without_overflow(jit_or_eager):
    """EMAs at +-3e38: max - min overflows float32, so the equal spacing is computed at half
    scale, and no intermediate inf appears on the way (the eager run checks every op)."""
    with debug_checks():
        cfg = cur.config("uniform", 5, capacity=N)
        s = cur.update(cur.init(cfg), np.array([0, 1, 2], np.int32),
                       np.array([3e38, -3e38, 0.0], np.float32), cfg)

    b, plain = checked_and_plain(lambda s: cur.recompute_bins(s, cfg).boundaries, jit_or_eager, s)
    assert_trees_close(b, plain)
    f32 = np.float32
    mx, mn, nb, i = f32(3e38), f32(-3e38), f32(5), np.arange(5, dtype=f32)
    half = f32(0.5) * mx - i * (f32(0.5) * mx / nb - f32(0.5) * mn / nb)
    np.testing.assert_allclose(b, np.clip(half, -1.7e38, 1.7e38) * 2, rtol=1e-6)
    assert np.all(np.isfinite(b)) and float(b[0]) == pytest.approx(3e38, rel=1e-6)


def test_ema_alpha_zero_under_debug_checks(jit_or_eager):
    """``ema_alpha=0`` (first score kept) runs under the checks like any other value."""
    with debug_checks():
        cfg = cur.config("uniform", 5, capacity=N, ema_alpha=0.0)
        s0 = cur.init(cfg)
    ids = np.array([3, 3, 3], np.int32)
    sc = np.array([0.25, 1.0, NAN], np.float32)
    s, plain = checked_and_plain(lambda s: cur.update(s, ids, sc, cfg), jit_or_eager, s0)
    assert_trees_close(s, plain)
    assert float(s.ema[3]) == 0.25 and int(s.count[3]) == 2


def test_batch_stats_and_buckets(jit_or_eager):
    """The stateless helpers: batch_stats counts bad entries without a NaN reaching an op; the
    bucket table and the draws inside buckets give -1 (a count, not NaN) for an empty bucket."""
    with debug_checks():
        cfg = cur.config("uniform", 5, capacity=N)

    def f(ids, scores, mask, bucket_of, key):
        table = cur.bucket_table(bucket_of, num_buckets=4)
        return (cur.batch_stats(ids, scores, cfg, mask=mask), table,
                cur.draw_in_buckets(key, table, jnp.array([0, 3, 1, 2, 9])))

    bucket_of = np.array([0, 2, 1, 2, 0, 2], np.int32)   # bucket 3 is empty
    (stats, table, items), plain = checked_and_plain(f, jit_or_eager, IDS, SCORES, MASK, bucket_of,
                                                      jax.random.key(5))
    assert_trees_close((stats, table, items), plain)
    assert stats.to_dict() == {"curriculum/n_applied": 2.0, "curriculum/n_invalid": 3.0,
                               "curriculum/n_nonfinite": 3.0, "curriculum/n_out_of_range": 0.0}
    np.testing.assert_array_equal(table.size, [2, 1, 3, 0])
    items = np.asarray(items)
    assert items[1] == -1 and items[4] == -1
    assert bucket_of[items[0]] == 0 and bucket_of[items[2]] == 1 and bucket_of[items[3]] == 2
