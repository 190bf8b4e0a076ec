"""Which stored comparisons each member trains and validates on in one training call.

Imitation's reward trainer bootstraps the data of every ensemble member (``N``
draws with replacement, fresh on every call) and, with a lambda updater,
splits each member's items into ``N - int(N * val_split)`` training and
``int(N * val_split)`` validation pairs. Pairs with bad data (non-finite
inputs, preferences outside ``[0, 1]``, out-of-range discrete values) are
left out and counted. Used by :func:`jaxweight.preference.training.epoch`.

Example::

    import numpy as np
    from jaxweight.preference import Box, Discrete, RewardMLP, buffer, fragment_pairs_from_arrays, training
    from jaxweight.preference.splits import prepare
    pairs = fragment_pairs_from_arrays(np.random.rand(6, 2, 4, 3), np.random.randint(0, 2, (6, 2, 3)))
    bcfg = buffer.config(8)
    buf = buffer.step(buffer.init(bcfg, None, pairs), pairs, np.ones(6, np.float32), bcfg)
    cfg = training.config(RewardMLP(observation_space=Box((3,)), action_space=Discrete(2)), num_members=3)
    data = prepare(0, buf, cfg)
    assert data.train_idx.shape == (3, 8) and int(data.n_train) == 6
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import as_key
from ._training_config import TrainerConfig, _vm
from .buffer import PreferenceBuffer
from .data import FragmentPairs, preference_ok
from .reward_nets import valid_inputs

Array = jax.Array

__all__ = ["TrainData", "prepare"]


@struct.dataclass
class TrainData:
    """Which buffer slots each member trains / validates on in one training call (from :func:`prepare`).

    Attributes:
      train_idx: ``i32[C]`` (``[M, C]``) buffer slots; the first ``n_train`` are used.
      n_train: ``i32[]`` number of training pairs (the same for every member).
      val_idx: ``i32[C]`` (``[M, C]``) validation slots; the first ``n_val`` are used.
      n_val: ``i32[]``.
      n_invalid: ``i32[]`` stored pairs left out because their data is bad.
    """

    train_idx: Array
    n_train: Array
    val_idx: Array
    n_val: Array
    n_invalid: Array


def _pair_ok(config: TrainerConfig, pairs: FragmentPairs, prefs: Array) -> Array:
    """``bool[..., P]``: pairs training can use (finite in-range inputs, preference in [0, 1])."""
    ok = preference_ok(prefs)
    lead = ok.ndim
    return ok & valid_inputs(config.module, pairs.obs, pairs.acts, lead)


def _masked_permutation(key: Array, n: Array, size: int) -> Array:
    """A permutation of ``range(size)`` whose first ``n`` entries are a uniform permutation of ``range(n)``."""
    u = jax.random.uniform(key, (size,))
    u = jnp.where(jnp.arange(size) < n, u, 2.0)
    return jnp.argsort(u).astype(jnp.int32)


def _val_table(config: TrainerConfig, capacity: int) -> np.ndarray:
    # int(N * val_split) with Python floats, exactly as imitation, for every possible N
    return np.array([int(n * config.val_split) for n in range(capacity + 1)], np.int32)


def _filled(buffer: PreferenceBuffer) -> Array:
    """``bool[capacity]``: filled slots holding a pair flagged valid."""
    return (jnp.arange(buffer.capacity) < buffer.size) & buffer.pairs.valid


def _usable(config: TrainerConfig, buffer: PreferenceBuffer) -> tuple[Array, Array]:
    """``(bool[capacity] slots to train on, i32[] filled valid slots left out for bad data)``."""
    # filled slots with a valid pair; a bad preference is left out here (and counted)
    filled = _filled(buffer)
    ok = _pair_ok(config, buffer.pairs, buffer.prefs)
    return filled & ok, jnp.sum(filled & ~ok, dtype=jnp.int32)


def prepare(key: Any, buffer: PreferenceBuffer, config: TrainerConfig) -> TrainData:
    """Bootstrap resamples (ensembles) and the validation split of one training call (jittable).

    The valid stored pairs (filled, flagged valid, minus pairs with bad data) are the
    ``N`` training items. For an ensemble with ``bagging`` each member draws
    ``N`` of them with replacement; with a lambda updater each member's items
    are then split at random into ``N - int(N * val_split)`` training and
    ``int(N * val_split)`` validation pairs (imitation splits every member's
    bootstrap sample).
    """
    key = as_key(key)
    cap = buffer.capacity
    mask, n_invalid = _usable(config, buffer)
    n = jnp.sum(mask, dtype=jnp.int32)
    base = jnp.argsort(~mask, stable=True).astype(jnp.int32)  # valid slots first, in slot order
    if config.has_updater:
        n_val = jnp.asarray(_val_table(config, cap))[n]
    else:
        n_val = jnp.zeros((), jnp.int32)
    n_train = n - n_val

    def member(k):
        k_bag, k_split = jax.random.split(k)
        if config.ensemble and config.bagging:
            draws = jax.random.randint(k_bag, (cap,), 0, jnp.maximum(n, 1), dtype=jnp.int32)
            items = base[draws]
        else:
            items = base
        if config.has_updater:
            items = items[_masked_permutation(k_split, n, cap)]
            val = jnp.roll(items, -n_train)
        else:
            val = jnp.zeros_like(items)
        return items, val

    keys = jax.random.split(key, config.num_members) if config.ensemble else key
    train_idx, val_idx = _vm(config, member)(keys)
    return TrainData(train_idx=train_idx, n_train=n_train, val_idx=val_idx, n_val=n_val, n_invalid=n_invalid)
