"""A fixed set of trajectories as a trajectory generator (imitation's ``TrajectoryDataset``).

:class:`DatasetGenerator` follows the generator protocol of
:mod:`jaxweight.preference.generators` (``init``, ``sample``, ``train``,
``trained_steps``) over a :class:`DatasetState`, so the preference loop runs on
recorded trajectories as on an agent; :func:`take_steps` is the fixed-shape
``_get_trajectories`` both use to cut samples to a number of transitions.

References:
  imitation ``algorithms/preference_comparisons.py`` (``TrajectoryDataset``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import as_key
from .data import Trajectories

__all__ = ["take_steps", "DatasetGenerator", "DatasetState"]

Array = jax.Array


def take_steps(trajectories: Trajectories, steps: Any) -> Trajectories:
    """Keep the leading trajectories until they hold ``>= steps`` transitions (imitation ``_get_trajectories``).

    Fixed-shape version: the trajectories after the first one whose cumulative
    length reaches ``steps`` get ``lengths = 0`` and ``terminal = False`` (so the
    fragmenter ignores them). ``steps == 0`` keeps nothing; if all of them
    together hold fewer than ``steps``, all are kept.

    Args:
      trajectories: ``Trajectories`` with ``lengths: i32[N]``.
      steps: ``int`` or traced ``i32[]``.

    Returns:
      ``Trajectories`` of the same shapes.
    """
    lengths = jnp.asarray(trajectories.lengths, jnp.int32)
    csum = jnp.cumsum(lengths)
    # keep n while the transitions before it are still fewer than `steps`
    keep = (csum - lengths) < jnp.asarray(steps, jnp.int32)
    return trajectories.replace(
        lengths=jnp.where(keep, lengths, 0),
        terminal=jnp.asarray(trajectories.terminal, bool) & keep,
    )


# ------------------------------------------------------------------ dataset
@struct.dataclass
class DatasetState:
    """State of :class:`DatasetGenerator`: a fixed dataset learns nothing; ``num_samples`` (``i32[]``)
    is a constant 0 that keeps the state a non-empty pytree of the generator protocol."""

    num_samples: Array


class DatasetGenerator:
    """A fixed set of trajectories, shuffled with the key on every ``sample`` (imitation ``TrajectoryDataset``).

    Args:
      trajectories: ``Trajectories(obs f32[N,T+1,D], acts [N,T,...], rews f32[N,T],
        lengths i32[N], terminal bool[N])``.

    Example::

        import numpy as np
        from jaxweight.preference import trajectories_from_arrays
        from jaxweight.preference.datasets import DatasetGenerator
        trajs = trajectories_from_arrays([np.zeros((11, 2))] * 5, [np.zeros(10, int)] * 5, [np.ones(10)] * 5)
        gen = DatasetGenerator(trajs)
        part = gen.sample(gen.init(0), 1, 25)      # shuffled; the leading episodes hold >= 25 steps
        assert int(part.lengths[:3].sum()) >= 25
    """

    def __init__(self, trajectories: Trajectories):
        lengths = np.asarray(jax.device_get(trajectories.lengths))
        if lengths.ndim != 1 or lengths.size == 0:
            raise ValueError(f"trajectories.lengths must have shape (N,) with N >= 1, got {lengths.shape}")
        self.trajectories = trajectories
        self.num_trajectories = int(lengths.size)
        self.total_steps = int(lengths.sum())
        term = np.asarray(jax.device_get(trajectories.terminal), bool)
        # static facts the loop uses for its variable-horizon and fragment-length checks
        self.horizons = tuple(sorted({int(n) for n in lengths[term]}))
        self.max_length = int(lengths.max())

    def fingerprint(self) -> dict[str, Any]:
        """Size and content hash of the dataset (the loop stores it in checkpoints)."""
        h = hashlib.sha256()
        for leaf in jax.tree.leaves(self.trajectories):
            a = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
            h.update(str((a.shape, a.dtype.str)).encode())
            h.update(a.tobytes())
        return {"num_trajectories": self.num_trajectories, "total_steps": self.total_steps,
                "sha256": h.hexdigest()}

    def init(self, key: Any = None) -> DatasetState:
        del key
        return DatasetState(num_samples=jnp.asarray(0, jnp.int32))

    def sample(self, state: DatasetState, key: Any, steps: Any, *, max_steps: int | None = None) -> Trajectories:
        """All N trajectories in a random order; those after the first ``>= steps`` transitions get length 0.

        Args:
          state: from :meth:`init`.
          key: shuffling key.
          steps: requested transitions (int, or traced ``i32[]``).
          max_steps: unused (the shape is always the dataset's); accepted for
            protocol compatibility.

        Raises:
          ValueError: concrete ``steps`` larger than the dataset holds.
        """
        del state, max_steps
        if isinstance(steps, int | np.integer) and int(steps) > self.total_steps:
            raise ValueError(
                f"Asked for {int(steps)} transitions but only {self.total_steps} available"
            )
        perm = jax.random.permutation(as_key(key), self.num_trajectories)
        shuffled = jax.tree.map(lambda x: jnp.take(jnp.asarray(x), perm, axis=0), self.trajectories)
        return take_steps(shuffled, steps)

    def train(self, state: DatasetState, key: Any, steps: Any, reward_params: Any = None) -> DatasetState:
        """No agent to train: returns ``state`` unchanged."""
        del key, steps, reward_params
        return state

    def trained_steps(self, state: DatasetState) -> Array:
        """``i32[]``: always 0 (a dataset has no agent)."""
        del state
        return jnp.zeros((), jnp.int32)
