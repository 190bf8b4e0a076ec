"""The sampling tree: a 128-ary tree of per-block weights, one draw = one root-to-leaf walk.

Level 1 holds the per-block (128 items) sums of one or more weight channels
(per-bin item counts, or rank / staleness / eligibility weights); each level
above sums 128 nodes of the one below, up to a root of at most 128 nodes. A
draw picks a child per level with a fresh uniform, so it costs O(128 log N)
and the pool itself is never copied or padded.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# Branching factor of the sampling tree: a draw touches 128 entries per level.
_BLOCK = 128


def _pad_rows(x: Array) -> Array:
    """Zero-pad the rows of a (small) tree level to a multiple of the block size."""
    pad = -x.shape[0] % _BLOCK
    return jnp.pad(x, [(0, pad), (0, 0)]) if pad else x


def _block_sums(w: Array) -> Array:
    """Sums of f32[N, C] over blocks of 128 rows: f32[ceil(N/128), C].

    The pool itself is never padded (a padded copy of a fused producer costs
    more than the whole reduction on a CPU); a partial last block is summed
    on its own.
    """
    n = w.shape[0]
    n0 = n - n % _BLOCK
    parts = []
    if n0:
        parts.append(w[:n0].reshape(n0 // _BLOCK, _BLOCK, w.shape[1]).sum(axis=1))
    if n0 < n:
        parts.append(w[n0:].sum(axis=0, keepdims=True))
    return jnp.concatenate(parts) if len(parts) > 1 else parts[0]


def _block_counts(bins: Array, n_bins: int) -> Array:
    """Per-block histogram of ``bins`` (i32[N], -1 = skip): f32[ceil(N/128), n_bins].

    A scatter-add: unlike a one-hot reduction its cost does not grow with n_bins.
    Counts are float32 for the sampling tree: exact up to 2^24 items per node.
    """
    n = bins.shape[0]
    nblk = -(-n // _BLOCK)
    blk = jnp.arange(n, dtype=jnp.int32) // _BLOCK
    idx = jnp.where(bins >= 0, blk * n_bins + bins, nblk * n_bins)
    hist = jnp.zeros((nblk * n_bins,), jnp.int32).at[idx].add(1, mode="drop")
    return hist.reshape(nblk, n_bins).astype(jnp.float32)


def _tree(level1: Array) -> list[Array]:
    """Block sums up to a root level of <= 128 nodes: list of f32[n_l, C] (rows padded)."""
    levels = [_pad_rows(level1)]
    while levels[-1].shape[0] > _BLOCK:
        x = levels[-1]
        levels.append(_pad_rows(x.reshape(-1, _BLOCK, x.shape[1]).sum(axis=1)))
    return levels


def _choose(w: Array, u: Array) -> Array:
    """Index k with probability ``w_k / sum(w)`` from a uniform ``u`` (inverse CDF)."""
    cs = jnp.cumsum(w)
    k = jnp.sum(cs <= u * cs[-1], dtype=jnp.int32)
    last = w.shape[0] - 1 - jnp.argmax(w[::-1] > 0).astype(jnp.int32)
    return jnp.minimum(k, last)


def _descend(levels: list[Array], leaf_weights, n: int, channel: Array, u: Array) -> Array:
    """One draw: child by child from the root, then a leaf (item) of the chosen block.

    Each level picks a child with a fresh uniform ``u[l]`` in proportion to its
    subtree weight, so the leaf comes out with probability ``w_leaf / total``.
    ``leaf_weights(ids, channel)`` gives the weights of in-range leaf ids.
    """
    offs = jnp.arange(_BLOCK, dtype=jnp.int32)
    root = levels[-1]
    root = jnp.pad(root, [(0, _BLOCK - root.shape[0]), (0, 0)])
    idx = _choose(root[:, channel], u[0])
    for j, lvl in enumerate(reversed(levels[:-1])):
        idx = idx * _BLOCK + _choose(lvl[idx * _BLOCK + offs, channel], u[j + 1])
    leaf = idx * _BLOCK + offs
    w = jnp.where(leaf < n, leaf_weights(jnp.minimum(leaf, n - 1), channel), 0.0)
    return idx * _BLOCK + _choose(w, u[len(levels)])


