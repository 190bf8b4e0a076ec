"""Dynamic sampling: from an oversampled set of groups, keep the ``num`` most informative.

A group whose rewards are all equal has zero GRPO advantage and gives no gradient (DAPO's
observation); sampling ``P > num`` groups and training on ``num`` of them, those with
non-zero reward variance first, spends the update on groups that carry a signal. Shapes
stay static: the result is ``num`` row indices into the ``P`` groups (ties broken at random,
or by row order without a key) plus a bool[P] mask of the kept rows, so a caller trains on
``x[index]`` and still updates a curriculum from all ``P`` groups.

Example::

    import jax, jax.numpy as jnp
    from jaxweight import maxent

    rewards = jnp.array([[1., 1.], [0., 1.], [0., 0.], [1., 0.]])   # f32[P=4, G=2]
    sel = jax.jit(maxent.select_groups, static_argnames="num")(rewards, num=2)
    assert sorted(sel.index.tolist()) == [1, 3] and int(sel.num_informative) == 2

References: DAPO (dynamic sampling), arXiv:2503.14476.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from .._util import as_key, check_static_int
from ._common import ZERO_STD, mask_of, matrix

__all__ = ["GroupSelection", "select_groups"]


@flax.struct.dataclass
class GroupSelection:
    """The groups kept by :func:`select_groups`.

    Attributes:
      index: i32[num] rows kept, informative ones first.
      keep: bool[P] the kept rows.
      informative: bool[P] rows with non-zero reward variance over their valid entries.
      num_informative: i32[] informative rows among the P.
    """

    index: jax.Array
    keep: jax.Array
    informative: jax.Array
    num_informative: jax.Array


def select_groups(rewards: Any, *, num: int, mask: Any = None, key: Any = None) -> GroupSelection:
    """Keep ``num`` of ``P`` groups: non-zero reward variance first, then the rest.

    A group is informative when its valid, finite rewards have a population std above
    ``1e-8`` (at least two distinct values). Among equals, rows are taken in random order
    with ``key``, else in row order.

    Args:
      rewards: f32[P, G] rewards of each group.
      num: static number of groups to keep, ``1 <= num <= P``.
      mask: bool[P, G] valid entries, or None (all valid).
      key: PRNG key (or int seed) for the tie-breaking order, or None.

    Returns:
      :class:`GroupSelection`.
    """
    r = matrix(rewards, "rewards")
    m = mask_of(mask, r, "rewards") & jnp.isfinite(r)
    p = r.shape[0]
    num = check_static_int(num, "num", minimum=1)
    if num > p:
        raise ValueError(f"num must be <= the number of groups P={p}, got {num}")
    cnt = jnp.sum(m, -1)
    mean = jnp.sum(jnp.where(m, r, 0.0), -1) / jnp.maximum(cnt, 1)
    var = jnp.sum(jnp.where(m, (r - mean[:, None]) ** 2, 0.0), -1) / jnp.maximum(cnt, 1)
    informative = (cnt >= 2) & (jnp.sqrt(var) > ZERO_STD)
    if key is None:
        tie = 1.0 - jnp.arange(p, dtype=jnp.float32) / p       # row order
    else:
        tie = jax.random.uniform(as_key(key), (p,))             # in [0, 1)
    _, index = jax.lax.top_k(informative.astype(jnp.float32) * 2.0 + tie, num)
    index = index.astype(jnp.int32)
    keep = jnp.zeros((p,), bool).at[index].set(True)
    return GroupSelection(index=index, keep=keep, informative=informative,
                          num_informative=jnp.sum(informative, dtype=jnp.int32))
