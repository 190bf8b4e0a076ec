"""PreferenceBuffer: FIFO semantics, imitation's errors, contracts and checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxweight import checkpoint
from jaxweight import preference as pf
from tests.contracts import check_state_contract


def _pairs(ids, length=2):
    """Pairs whose observations all equal their id (to track them through the ring)."""
    ids = np.asarray(ids, np.float32)
    p = len(ids)
    obs = np.broadcast_to(ids[:, None, None, None], (p, 2, length + 1, 1)).copy()
    return pf.fragment_pairs_from_arrays(obs, np.zeros((p, 2, length), np.int32),
                                         np.broadcast_to(ids[:, None, None], (p, 2, length)))


def _stored_ids(buf):
    pairs, prefs, filled = pf.buffer.buffer_ordered(buf)
    n = int(np.asarray(filled).sum())
    return np.asarray(pairs.obs[:n, 0, 0, 0]).tolist(), np.asarray(prefs[:n]).tolist()


def test_imitation_queue_max_size_5():
    buf = pf.buffer_init(5, _pairs([0]))
    for i in range(6):
        assert int(pf.buffer_size(buf)) == min(i, 5)
        buf = pf.buffer_push(buf, _pairs([i]), jnp.array([i / 10], jnp.float32))
        assert int(pf.buffer_size(buf)) == min(i + 1, 5)
    ids, prefs = _stored_ids(buf)
    assert ids == [1, 2, 3, 4, 5]  # the first comparison was evicted
    np.testing.assert_allclose(prefs, [0.1, 0.2, 0.3, 0.4, 0.5])


def test_more_than_capacity_keeps_newest_and_capacity_zero_refused():
    buf = pf.buffer_init(4, _pairs([0]))
    buf = pf.buffer_push(buf, _pairs([1, 2]), jnp.zeros(2, jnp.float32))
    buf = pf.buffer_push(buf, _pairs(range(10, 17)), jnp.arange(7, dtype=jnp.float32))
    ids, prefs = _stored_ids(buf)
    assert ids == [13, 14, 15, 16] and prefs == [3, 4, 5, 6]
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        pf.buffer_init(0, _pairs([0]))


def test_push_count_equals_push_of_the_prefix():
    """One push path: ``count`` (traced or not) writes the first ``count`` pairs, exactly like
    pushing the prefix (this replaced the loop's ``push_first``)."""
    push = jax.jit(pf.buffer_push)
    pairs = _pairs(range(100, 106))
    prefs = jnp.arange(6, dtype=jnp.float32) / 10
    for cap in (3, 4, 8):
        for pre in (0, 2, 5):
            for count in (0, 1, 3, 6):
                buf = pf.buffer_init(cap, _pairs([0]))
                if pre:
                    buf = pf.buffer_push(buf, _pairs(range(pre)), jnp.arange(pre, dtype=jnp.float32))
                ref = pf.buffer_push(buf, jax.tree.map(lambda x: x[:count], pairs), prefs[:count])
                for got in (push(buf, pairs, prefs, jnp.int32(count)), pf.buffer_push(buf, pairs, prefs, count)):
                    jax.tree.map(np.testing.assert_array_equal, got, ref)
    with pytest.raises(ValueError, match=r"count must be an integer and finite and in \[0, 6\], got 7"):
        pf.buffer_push(pf.buffer_init(3, _pairs([0])), pairs, prefs, 7)


def test_imitation_error_messages():
    buf = pf.buffer_init(3, _pairs([0]))
    with pytest.raises(ValueError, match=r"Unexpected preferences shape \(3,\), expected \(2,\)"):
        pf.buffer_push(buf, _pairs([1, 2]), np.empty(3, np.float32))
    with pytest.raises(ValueError, match="preferences should have dtype float32"):
        pf.buffer_push(buf, _pairs([1, 2]), np.empty(2, np.float64))
    with pytest.raises(ValueError, match=r"pairs\.obs must have per-pair shape"):
        pf.buffer_push(buf, _pairs([1], length=3), np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        pf.buffer_init(-1, _pairs([0]))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 3, 5]), st.lists(st.sampled_from([0, 1, 2, 3, 7]), min_size=1, max_size=6))
def test_fifo_keeps_the_newest(capacity, push_sizes):
    buf = pf.buffer_init(capacity, _pairs([0]))
    model: list[int] = []
    next_id = 0
    for n in push_sizes:
        ids = list(range(next_id, next_id + n))
        next_id += n
        buf = _push_jit(buf, _pairs(ids), jnp.asarray(ids, jnp.float32)) if n else buf
        model = (model + ids)[-capacity:]
    got_ids, got_prefs = _stored_ids(buf)
    assert got_ids == model and got_prefs == model
    assert int(pf.buffer_size(buf)) == len(model)


_push_jit = jax.jit(pf.buffer_push)


def test_valid_flags_are_stored_and_masked():
    buf = pf.buffer_init(4, _pairs([0]))
    pairs = _pairs([1, 2, 3]).replace(valid=jnp.array([True, False, True]))
    buf = pf.buffer_push(buf, pairs, jnp.zeros(3, jnp.float32))
    np.testing.assert_array_equal(pf.buffer_mask(buf), [True, False, True, False])


def test_buffer_contract_and_checkpoint(tmp_path):
    ex = _pairs([0, 0])
    check_state_contract(
        init=lambda: pf.buffer_init(5, ex),
        update=lambda b, p, y: pf.buffer_push(b, p, y),
        update_args=(_pairs([1, 2]), jnp.array([0.0, 1.0], jnp.float32)),
        update_args_alt=(_pairs([3, 4]), jnp.array([0.5, 0.5], jnp.float32)),
        batched_init=lambda: jax.vmap(lambda _: pf.buffer_init(5, ex))(jnp.arange(3)),
        tmp_path=tmp_path,
    )
    buf = pf.buffer_push(pf.buffer_init(5, ex), _pairs(range(7)), jnp.arange(7, dtype=jnp.float32))
    path = tmp_path / "prefs.ckpt"
    checkpoint.save(path, buf)
    back = checkpoint.load(path, pf.buffer_init(5, ex))
    jax.tree.map(np.testing.assert_array_equal, back, buf)
    assert back.prefs.dtype == jnp.float32
    assert _stored_ids(back) == _stored_ids(buf)
