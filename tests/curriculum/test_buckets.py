"""curriculum.bucket_table / draw_in_buckets: a scheduler over buckets, problems drawn inside them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import curriculum as cur


def test_table_is_the_sorted_grouping(jit_or_eager):
    b = np.array([3, 0, 3, 1, 0, 3, 7, -1])              # ids 7 and -1 are outside K = 5
    t = jit_or_eager(cur.bucket_table, static_argnames="num_buckets")(b, num_buckets=5)
    np.testing.assert_array_equal(t.size, [2, 1, 0, 3, 0])
    np.testing.assert_array_equal(t.start, [0, 2, 3, 3, 6])
    np.testing.assert_array_equal(np.asarray(t.order)[:6], [1, 4, 3, 0, 2, 5])


def test_draws_are_uniform_inside_the_bucket(jit_or_eager):
    rng = np.random.default_rng(0)
    bucket_of = rng.integers(0, 4, 200)
    bucket_of[bucket_of == 2] = 1                          # bucket 2 is empty
    t = cur.bucket_table(bucket_of, num_buckets=4)
    ids = jnp.asarray(np.repeat([0, 1, 2, 3, -1, 9], 2000))
    items = np.asarray(jit_or_eager(cur.draw_in_buckets)(jax.random.key(0), t, ids))
    want = np.asarray(ids)
    ok = (want >= 0) & (want < 4) & (want != 2)
    assert (items[~ok] == -1).all()
    np.testing.assert_array_equal(bucket_of[items[ok]], want[ok])
    members = np.flatnonzero(bucket_of == 3)
    counts = np.bincount(items[want == 3], minlength=200)[members]
    assert counts.min() > 0 and counts.max() < 3 * counts.mean()    # every member drawn, none favoured


def test_scheduler_over_buckets_prefers_the_frontier():
    # the documented pattern: capacity = number of buckets, update with bucket ids
    k = 6
    cfg = cur.config("prioritized", n_bins=3, capacity=k, temperature=0.3, staleness_coeff=0.0,
                     priority="frontier", competence_threshold=0.5, ema_alpha=1.0)
    success = jnp.array([0.0, 0.1, 0.5, 0.9, 1.0, 0.45])
    state = cur.update_groups(cur.init(cfg), jnp.arange(k), success[:, None] * jnp.ones((k, 4)), cfg)
    b = np.asarray(cur.sample(state, jax.random.key(0), cfg, num=4000))
    share = np.bincount(b, minlength=k) / len(b)
    assert share[2] > 0.3 and share[5] > share[0] and share[5] > share[4]


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_buckets"):
        cur.bucket_table(jnp.zeros(3, jnp.int32), num_buckets=0)
    with pytest.raises(ValueError, match="bucket_of"):
        cur.bucket_table(jnp.zeros((3, 2), jnp.int32), num_buckets=2)
