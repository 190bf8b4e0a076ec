"""jaxweight.curriculum with the pool sharded over 8 (fake CPU) devices: same results as one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxweight import curriculum as cur
from tests.contracts import assert_trees_close

pytestmark = pytest.mark.multidevice

N = 512


def _batches(rng, k=3, b=96):
    return [(jnp.asarray(rng.integers(0, N, b), jnp.int32), jnp.asarray(np.round(rng.random(b), 2), jnp.float32))
            for _ in range(k)]


def test_sharded_pool_matches_single_device(devices8):
    mesh = jax.sharding.Mesh(np.array(devices8), ("pool",))
    cfg = cur.config("easy_first", 5, capacity=N, rebin_interval=40, temperature=0.7)
    batches = _batches(np.random.default_rng(0))
    update = jax.jit(cur.update)
    single = cur.init(cfg)
    sharded = cur.shard_state(cur.init(cfg), cfg, mesh)
    assert sharded.ema.sharding == NamedSharding(mesh, P("pool"))
    assert len(sharded.ema.addressable_shards) == 8
    for ids, scores in batches:
        single = update(single, ids, scores, cfg)
        sharded = update(sharded, ids, scores, cfg)
    assert_trees_close(jax.device_get(sharded), jax.device_get(single))
    assert bool(single.has_boundaries)
    # the pool stays sharded through the jitted update (and the donated one)
    assert sharded.ema.sharding.is_equivalent_to(NamedSharding(mesh, P("pool")), 1)
    ids, scores = batches[0]
    sharded = jax.jit(cur.update, donate_argnums=0)(sharded, ids, scores, cfg)  # donated: updated in place, shard by shard
    single = update(single, ids, scores, cfg)
    assert_trees_close(jax.device_get(sharded), jax.device_get(single))
    # rebin, bins, metrics
    rebin = jax.jit(cur.recompute_bins)
    assert_trees_close(jax.device_get(rebin(sharded, cfg)), jax.device_get(rebin(single, cfg)))
    everyone = jnp.arange(N)
    np.testing.assert_array_equal(cur.item_bin(sharded, everyone, cfg), cur.item_bin(single, everyone, cfg))
    ms, m1 = cur.metrics_dict(sharded, cfg), cur.metrics_dict(single, cfg)
    assert set(ms) == set(m1)
    for k, v in m1.items():  # a float sum over shards may round differently
        assert ms[k] == (pytest.approx(v, rel=1e-6) if k.endswith("mean_difficulty") else v), k
    # sampling: the same draws, for a bin strategy and for prioritized (same state layout)
    draw = jax.jit(cur.sample, static_argnames="num")
    key = jax.random.key(3)
    eligible = jnp.arange(N) % 5 != 0
    for c in (cfg, cur.config("prioritized", 5, capacity=N, temperature=0.7)):
        a = draw(sharded, key, c, step=300, total_steps=1000, num=256, eligible=eligible)
        b = draw(single, key, c, step=300, total_steps=1000, num=256, eligible=eligible)
        np.testing.assert_array_equal(a, b)
        assert np.all(np.asarray(eligible)[np.asarray(a)])


def test_state_sharding_rejects_uneven_pool(devices8):
    mesh = jax.sharding.Mesh(np.array(devices8), ("pool",))
    with pytest.raises(ValueError, match="multiple"):
        cur.state_sharding(cur.config(capacity=N + 1), mesh)
