"""How good is a learned reward: correlation with the true reward and accuracy on comparisons.

The learned reward of a preference model is defined only up to a positive
affine map, so these measures are invariant to it. Ensembles are judged by
their member mean (:func:`~jaxweight.preference.ensemble_reward`).

Example::

    import jax, numpy as np
    from jaxweight.preference import Box, Discrete, RewardMLP, example_inputs, fragment_pairs_from_arrays
    from jaxweight.preference.evaluation import preference_accuracy
    rng = np.random.default_rng(0)
    pairs = fragment_pairs_from_arrays(rng.normal(size=(16, 2, 4, 3)), rng.integers(0, 2, (16, 2, 3)),
                                       rng.normal(size=(16, 2, 3)))
    net = RewardMLP(hidden_sizes=(4,), observation_space=Box((3,)), action_space=Discrete(2))
    params = net.init(jax.random.key(0), *example_inputs(pairs))
    acc, decided = preference_accuracy(net, params, pairs)   # f32[] in [0, 1], i32[] = 16
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from .._util import check_value
from .data import FragmentPairs, Trajectories, _discounted_returns, example_inputs
from .reward_nets import _ensemble_reward, num_members

Array = jax.Array

__all__ = ["predicted_rewards", "reward_correlation", "preference_accuracy"]


def predicted_rewards(module: nn.Module, params: Any, trajectories: Trajectories, ensemble: bool | None = None) -> Array:
    """Learned reward of every transition: ``f32[N, T]`` (the member mean for ensembles).

    Args:
      module: reward module.
      params: its params (member-stacked for ensembles).
      trajectories: padded episodes (padding steps get rewards too; mask them
        with ``trajectories.step_mask()``).
      ensemble: whether ``params`` is member-stacked (default: guessed from the
        leading axis of the first leaf against ``module.init``'s shapes).
    """
    inputs = trajectories.transitions()
    if ensemble is None:
        ensemble = _is_ensemble(module, params, trajectories)
    return _ensemble_reward(module, params, inputs, None, ensemble)


def _is_ensemble(module, params, data) -> bool:
    return num_members(module, params, example_inputs(data)) is not None


def reward_correlation(module: nn.Module, params: Any, trajectories: Trajectories, ensemble: bool | None = None) -> Array:
    """Pearson correlation ``f32[]`` of learned and true rewards over the real transitions of ``trajectories``.

    The learned reward of a preference model is only defined up to a
    positive affine map, so correlation (not error) measures its quality.
    """
    pred = predicted_rewards(module, params, trajectories, ensemble)
    mask = trajectories.step_mask().astype(jnp.float32)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    true = jnp.asarray(trajectories.rews, jnp.float32)
    mp, mt = jnp.sum(pred * mask) / n, jnp.sum(true * mask) / n
    dp, dt = (pred - mp) * mask, (true - mt) * mask
    return jnp.sum(dp * dt) / jnp.sqrt(jnp.maximum(jnp.sum(dp * dp) * jnp.sum(dt * dt), 1e-30))


def preference_accuracy(
    module: nn.Module, params: Any, pairs: FragmentPairs, *, discount: Any = 1.0, ensemble: bool | None = None
) -> tuple[Array, Array]:
    """Accuracy of the learned reward on comparisons, against the noiseless teacher.

    A pair is decided when its true (discounted) returns differ; the model is
    right when the fragment with the higher predicted return (member mean) is
    the one with the higher true return. Ties carry no preference and are
    left out (a noisy teacher labels them at random).

    Args:
      module: reward module.
      params: its params.
      pairs: ``[P, ...]`` fragment pairs (only ``valid`` ones count).
      discount: discount of both returns, in ``[0, 1]`` (may be traced).
      ensemble: whether ``params`` is member-stacked (default: guessed).

    Returns:
      ``(accuracy f32[], decided i32[])``: the fraction of decided pairs ranked
      right, and how many were decided (the accuracy is 0 when ``decided`` is 0:
      nothing was measured; no NaN sentinel).

    Raises:
      ValueError: ``discount`` outside ``[0, 1]`` or NaN (eagerly, or through
        ``jaxweight.checked`` when traced).
    """
    check_value(discount, "discount", ge=0.0, le=1.0)
    inputs = pairs.transitions()
    if ensemble is None:
        ensemble = _is_ensemble(module, params, pairs)
    r = _ensemble_reward(module, params, inputs, None, ensemble)
    pred = _discounted_returns(r, discount)  # [P, 2]
    true = _discounted_returns(pairs.rews, discount)
    decided = jnp.asarray(pairs.valid, bool) & (true[:, 0] != true[:, 1])
    right = (pred[:, 0] > pred[:, 1]) == (true[:, 0] > true[:, 1])
    n = jnp.sum(decided, dtype=jnp.int32)
    acc = jnp.sum(right & decided) / jnp.maximum(n, 1).astype(jnp.float32)
    return acc.astype(jnp.float32), n
