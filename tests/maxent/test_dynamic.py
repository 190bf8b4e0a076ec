"""maxent.select_groups (dynamic sampling): informative groups first, static shapes, masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import maxent as M


def test_informative_first_in_row_order(jit_or_eager):
    r = jnp.array([[1., 1., 1.], [0., 1., 0.], [0., 0., 0.], [2., 2., 3.], [1., 1., 1.]])
    sel = jit_or_eager(M.select_groups, static_argnames="num")(r, num=3)
    assert sel.index.tolist() == [1, 3, 0]                       # the 2 informative, then the first other
    assert sel.keep.tolist() == [True, True, False, True, False]
    assert sel.informative.tolist() == [False, True, False, True, False] and int(sel.num_informative) == 2


def test_random_ties_and_all_informative_when_enough():
    rng = np.random.default_rng(0)
    r = (rng.random((64, 8)) < 0.3).astype(np.float32)
    inf = r.std(1) > 0
    k = int(inf.sum()) - 5
    picks = set()
    for s in range(4):
        sel = M.select_groups(r, num=k, key=jax.random.key(s))
        idx = np.asarray(sel.index)
        assert len(set(idx.tolist())) == k and inf[idx].all()     # only informative rows when there are enough
        picks.add(tuple(sorted(idx.tolist())))
    assert len(picks) > 1                                          # the key changes which ones


def test_mask_and_non_finite_rewards():
    r = jnp.array([[1., 0., np.nan], [1., 1., 0.], [np.nan, 1., 1.]])
    mask = jnp.array([[True, False, True], [True, True, True], [True, True, True]])
    sel = M.select_groups(r, num=1, mask=mask)
    # row 0: one valid finite reward; row 2: equal finite rewards; only row 1 has variance
    assert sel.informative.tolist() == [False, True, False] and sel.index.tolist() == [1]


def test_bad_num():
    with pytest.raises(ValueError, match="num"):
        M.select_groups(jnp.zeros((4, 2)), num=5)
    with pytest.raises(ValueError, match="num"):
        M.select_groups(jnp.zeros((4, 2)), num=0)
