"""PreferenceBuffer: FIFO semantics, imitation's errors, contracts and checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import checkpoint
from jaxweight import preference as pf
from jaxweight.preference import buffer
from tests.contracts import check_state_contract


def _init(capacity, example):
    return buffer.init(buffer.config(capacity), None, example)


def _push(buf, pairs, prefs, count=None):
    return buffer.step(buf, pairs, prefs, buffer.config(buf.capacity), count=count)


def _pairs(ids, length=2):
    """Pairs whose observations all equal their id (to track them through the ring)."""
    ids = np.asarray(ids, np.float32)
    p = len(ids)
    obs = np.broadcast_to(ids[:, None, None, None], (p, 2, length + 1, 1)).copy()
    return pf.fragment_pairs_from_arrays(obs, np.zeros((p, 2, length), np.int32),
                                         np.broadcast_to(ids[:, None, None], (p, 2, length)))


def _stored_ids(buf):
    pairs, prefs, filled = buffer.ordered(buf)
    n = int(np.asarray(filled).sum())
    return np.asarray(pairs.obs[:n, 0, 0, 0]).tolist(), np.asarray(prefs[:n]).tolist()


def test_imitation_queue_max_size_5():
    buf = _init(5, _pairs([0]))
    for i in range(6):
        assert int(buf.size) == min(i, 5)
        buf = _push(buf, _pairs([i]), jnp.array([i / 10], jnp.float32))
        assert int(buf.size) == min(i + 1, 5)
    ids, prefs = _stored_ids(buf)
    assert ids == [1, 2, 3, 4, 5]  # the first comparison was evicted
    np.testing.assert_allclose(prefs, [0.1, 0.2, 0.3, 0.4, 0.5])


def test_more_than_capacity_keeps_newest_and_capacity_zero_refused():
    buf = _init(4, _pairs([0]))
    buf = _push(buf, _pairs([1, 2]), jnp.zeros(2, jnp.float32))
    buf = _push(buf, _pairs(range(10, 17)), jnp.arange(7, dtype=jnp.float32) / 8)  # preferences: in [0, 1]
    ids, prefs = _stored_ids(buf)
    assert ids == [13, 14, 15, 16] and prefs == [3 / 8, 4 / 8, 5 / 8, 6 / 8]
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        _init(0, _pairs([0]))


@pytest.mark.slow
def test_push_count_equals_push_of_the_prefix():
    """One push path: ``count`` (traced or not) writes the first ``count`` pairs, exactly like
    pushing the prefix (this replaced the loop's ``push_first``)."""
    push = jax.jit(buffer.step)
    pairs = _pairs(range(100, 106))
    prefs = jnp.arange(6, dtype=jnp.float32) / 10
    for cap in (3, 4, 8):
        for pre in (0, 2, 5):
            for count in (0, 1, 3, 6):
                buf = _init(cap, _pairs([0]))
                if pre:
                    buf = _push(buf, _pairs(range(pre)), jnp.arange(pre, dtype=jnp.float32) / 8)
                ref = _push(buf, jax.tree.map(lambda x: x[:count], pairs), prefs[:count])
                for got in (push(buf, pairs, prefs, buffer.config(cap), count=jnp.int32(count)),
                            _push(buf, pairs, prefs, count)):
                    jax.tree.map(np.testing.assert_array_equal, got, ref)
    with pytest.raises(ValueError, match=r"count must be an integer and finite and in \[0, 6\], got 7"):
        _push(_init(3, _pairs([0])), pairs, prefs, 7)


def test_imitation_error_messages():
    buf = _init(3, _pairs([0]))
    with pytest.raises(ValueError, match=r"Unexpected preferences shape \(3,\), expected \(2,\)"):
        _push(buf, _pairs([1, 2]), np.empty(3, np.float32))
    with pytest.raises(ValueError, match="preferences should have dtype float32"):
        _push(buf, _pairs([1, 2]), np.empty(2, np.float64))
    with pytest.raises(ValueError, match=r"pairs\.obs must have per-pair shape"):
        _push(buf, _pairs([1], length=3), np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        _init(-1, _pairs([0]))


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 3, 5]), st.lists(st.sampled_from([0, 1, 2, 3, 7]), min_size=1, max_size=6))
def test_fifo_keeps_the_newest(capacity, push_sizes):
    buf = _init(capacity, _pairs([0]))
    model: list[int] = []
    next_id = 0
    for n in push_sizes:
        ids = list(range(next_id, next_id + n))
        next_id += n
        buf = _push_jit(buf, _pairs(ids), jnp.asarray(ids, jnp.float32)) if n else buf
        model = (model + ids)[-capacity:]
    got_ids, got_prefs = _stored_ids(buf)
    assert got_ids == model and got_prefs == model
    assert int(buf.size) == len(model)


_push_jit = jax.jit(_push)


def test_valid_flags_are_stored_and_masked():
    buf = _init(4, _pairs([0]))
    pairs = _pairs([1, 2, 3]).replace(valid=jnp.array([True, False, True]))
    buf = _push(buf, pairs, jnp.zeros(3, jnp.float32))
    np.testing.assert_array_equal(buffer.mask(buf), [True, False, True, False])


@pytest.mark.fast
def test_buffer_contract_donation_and_checkpoint(tmp_path):
    ex = _pairs([0, 0])
    cfg = buffer.config(5)
    check_state_contract(
        init=lambda: buffer.init(cfg, None, ex),
        update=lambda b, p, y, n: buffer.step(b, p, y, cfg, count=n),
        update_args=(_pairs([1, 2]), jnp.array([0.0, 1.0], jnp.float32), jnp.int32(2)),
        update_args_alt=(_pairs([3, 4]), jnp.array([0.5, 0.5], jnp.float32), jnp.int32(1)),
        batched_init=lambda: jax.vmap(lambda _: buffer.init(cfg, None, ex))(jnp.arange(3)),
        tmp_path=tmp_path,
    )
    # donation: the jitted push reuses the buffer's memory
    state = buffer.init(cfg, None, ex)
    push = jax.jit(buffer.step, donate_argnums=0)
    out = push(state, _pairs([7, 8]), jnp.array([1.0, 0.0], jnp.float32), cfg)
    assert all(x.is_deleted() for x in jax.tree.leaves(state))
    assert _stored_ids(out) == ([7.0, 8.0], [1.0, 0.0])
    assert buffer.metrics_dict(out, cfg) == {"buffer/size": 2.0, "buffer/valid": 2.0, "buffer/capacity": 5.0}
    buf = _push(_init(5, ex), _pairs(range(7)), jnp.arange(7, dtype=jnp.float32) / 8)
    path = tmp_path / "prefs.ckpt"
    checkpoint.save(path, buf)
    back = checkpoint.load(path, _init(5, ex))
    jax.tree.map(np.testing.assert_array_equal, back, buf)
    assert back.prefs.dtype == jnp.float32
    assert _stored_ids(back) == _stored_ids(buf)


def test_config_is_checked_in_config_and_constructor():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        buffer.config(0)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        buffer.BufferConfig(capacity=-2)
    with pytest.raises(ValueError, match="cfg must be a BufferConfig"):
        buffer.init(5, None, _pairs([0]))
