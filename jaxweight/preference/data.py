"""Trajectories and fragment pairs as padded arrays, and converters from per-episode lists.

imitation's lists of ``TrajectoryWithRew`` become single pytrees of padded arrays:
:class:`Trajectories` ``(obs [N, T+1, ...], acts [N, T, ...], rews f32[N, T],
lengths i32[N], terminal bool[N])`` (episode ``n`` owns steps ``t < lengths[n]``)
and :class:`FragmentPairs` ``(obs [P, 2, L+1, ...], acts [P, 2, L, ...], rews
f32[P, 2, L], terminal bool[P, 2], valid bool[P])`` (``valid`` marks pairs that
exist, since code under ``jit`` cannot drop rows). Transitions are
``obs[:-1] -> obs[1:]``; ``done`` is False except the last, which is ``terminal``.

Example::

    import numpy as np
    from jaxweight.preference import trajectories_from_arrays
    trajs = trajectories_from_arrays(
        obs=[np.zeros((11, 4)), np.ones((8, 4))],       # T_n + 1 observations each
        acts=[np.zeros(10, int), np.ones(7, int)],
        rews=[np.ones(10), np.zeros(7)],
        terminal=[True, False],
    )
    trajs.lengths      # Array([10, 7], dtype=int32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .._util import check_rank, check_value, concrete

Array = jax.Array

__all__ = [
    "Trajectories",
    "FragmentPairs",
    "trajectories_from_arrays",
    "fragment_pairs_from_arrays",
    "concatenate_trajectories",
    "concatenate_pairs",
    "discounted_returns",
    "example_inputs",
]


def _canon_dtype(x: np.ndarray) -> np.dtype:
    """float -> float32, bool stays bool, signed/unsigned ints keep their width but 64 -> 32 bit."""
    if np.issubdtype(x.dtype, np.floating):
        return np.dtype(np.float32)
    if x.dtype == np.int64:
        return np.dtype(np.int32)
    if x.dtype == np.uint64:
        return np.dtype(np.uint32)
    return x.dtype


def _expect(x: Any, shape: tuple[int, ...], name: str, what: str) -> None:
    if tuple(jnp.shape(x)) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({what}), got {tuple(jnp.shape(x))}")


def _expect_lead(x: Any, lead: tuple[int, ...], name: str) -> None:
    if tuple(jnp.shape(x))[: len(lead)] != tuple(lead):
        shown = ", ".join(map(str, lead))
        raise ValueError(f"{name} must have shape ({shown}, ...), got {tuple(jnp.shape(x))}")


@struct.dataclass
class Trajectories:
    """A batch of episodes as padded arrays.

    Attributes:
      obs: ``[N, T+1, *obs_shape]`` observations (float data is float32;
        integer data such as uint8 images or discrete observations keeps its
        dtype and is converted by :func:`jaxweight.preference.preprocess`).
      acts: ``[N, T, *act_shape]`` actions (int32 for discrete spaces, float32 otherwise).
      rews: ``f32[N, T]`` ground-truth rewards (zeros if unknown).
      lengths: ``i32[N]`` number of transitions of each episode (``<= T``).
      terminal: ``bool[N]`` whether the episode ended in a terminal state
        (as opposed to being truncated).
    """

    obs: Array
    acts: Array
    rews: Array
    lengths: Array
    terminal: Array

    @property
    def num_trajectories(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def horizon(self) -> int:
        """``T``: the padded number of transitions per episode."""
        return int(self.rews.shape[1])

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return tuple(self.obs.shape[2:])

    @property
    def act_shape(self) -> tuple[int, ...]:
        return tuple(self.acts.shape[2:])

    def check(self) -> Trajectories:
        """Refuse fields whose shapes disagree (static; free under ``jit``). Returns ``self``.

        Raises:
          ValueError: naming the field, its shape and the expected one (e.g.
            ``terminal`` flags for a different number of episodes than ``lengths``).
        """
        n = int(jnp.shape(self.lengths)[0]) if jnp.ndim(self.lengths) == 1 else None
        if n is None:
            raise ValueError(f"lengths must have shape (N,), got {jnp.shape(self.lengths)}")
        t = jnp.shape(self.rews)[1] if jnp.ndim(self.rews) == 2 else None
        if t is None or jnp.shape(self.rews)[0] != n:
            raise ValueError(f"rews must have shape ({n}, T), got {jnp.shape(self.rews)}")
        _expect(self.terminal, (n,), "terminal", "one flag per episode, like lengths")
        _expect_lead(self.obs, (n, t + 1), "obs")
        _expect_lead(self.acts, (n, t), "acts")
        return self

    def step_mask(self) -> Array:
        """``bool[N, T]``: True on real (non-padding) transitions."""
        return jnp.arange(self.horizon)[None, :] < self.lengths[:, None]

    def dones(self) -> Array:
        """``bool[N, T]``: True on the last transition of terminal episodes only."""
        t = jnp.arange(self.horizon)[None, :]
        return (t == self.lengths[:, None] - 1) & self.terminal[:, None]

    def transitions(self) -> tuple[Array, Array, Array, Array]:
        """``(state, action, next_state, done)`` with batch shape ``[N, T]`` (padding included)."""
        return self.obs[:, :-1], self.acts, self.obs[:, 1:], self.dones()


@struct.dataclass
class FragmentPairs:
    """``P`` pairs of fixed-length trajectory fragments.

    Attributes:
      obs: ``[P, 2, L+1, *obs_shape]`` observations of both fragments.
      acts: ``[P, 2, L, *act_shape]`` actions.
      rews: ``f32[P, 2, L]`` ground-truth rewards (used by synthetic teachers and
        for the ``gt_reward_loss`` metric).
      terminal: ``bool[P, 2]`` whether a fragment ends in a terminal state.
      valid: ``bool[P]`` whether the pair exists (see the module docstring).
    """

    obs: Array
    acts: Array
    rews: Array
    terminal: Array
    valid: Array

    @property
    def num_pairs(self) -> int:
        return int(self.rews.shape[0])

    @property
    def fragment_length(self) -> int:
        return int(self.rews.shape[-1])

    def check(self) -> FragmentPairs:
        """Refuse fields whose shapes disagree (static; free under ``jit``). Returns ``self``.

        Raises:
          ValueError: naming the field, its shape and the expected one.
        """
        if jnp.ndim(self.rews) != 3 or jnp.shape(self.rews)[1] != 2:
            raise ValueError(f"rews must have shape (P, 2, L), got {jnp.shape(self.rews)}")
        p, _, length = jnp.shape(self.rews)
        _expect(self.terminal, (p, 2), "terminal", "one flag per fragment")
        _expect(self.valid, (p,), "valid", "one flag per pair")
        _expect_lead(self.obs, (p, 2, length + 1), "obs")
        _expect_lead(self.acts, (p, 2, length), "acts")
        return self

    def dones(self) -> Array:
        """``bool[P, 2, L]``: False except the last step, which equals ``terminal``."""
        length = self.fragment_length
        last = jnp.arange(length) == length - 1
        return last & self.terminal[..., None]

    def transitions(self) -> tuple[Array, Array, Array, Array]:
        """``(state, action, next_state, done)`` with batch shape ``[P, 2, L]``."""
        return self.obs[:, :, :-1], self.acts, self.obs[:, :, 1:], self.dones()


# ---------------------------------------------------------------- converters
def trajectories_from_arrays(
    obs: Sequence[Any],
    acts: Sequence[Any],
    rews: Sequence[Any] | None = None,
    terminal: Sequence[bool] | bool = True,
    *,
    horizon: int | None = None,
) -> Trajectories:
    """Pad lists of per-episode arrays into :class:`Trajectories` (host helper).

    Args:
      obs: ``N`` arrays ``[T_n + 1, *obs_shape]``.
      acts: ``N`` arrays ``[T_n, *act_shape]``.
      rews: ``N`` arrays ``[T_n]`` of ground-truth rewards, or None (zeros).
      terminal: one flag per episode, or one flag for all (default True).
      horizon: padded length ``T`` (default: the longest episode).

    Returns:
      The padded batch (padding is zeros).

    Raises:
      ValueError: empty input, mismatched list lengths, ``len(obs[n]) !=
        len(acts[n]) + 1``, ``len(rews[n]) != len(acts[n])``, inconsistent
        per-step shapes, or an episode longer than ``horizon``.
    """
    n = len(obs)
    if n == 0:
        raise ValueError("obs must contain at least one episode")
    if len(acts) != n:
        raise ValueError(f"acts must have one entry per episode ({n}), got {len(acts)}")
    if rews is not None and len(rews) != n:
        raise ValueError(f"rews must have one entry per episode ({n}), got {len(rews)}")
    obs_np = [np.asarray(o) for o in obs]
    acts_np = [np.asarray(a) for a in acts]
    lengths = np.array([len(a) for a in acts_np], dtype=np.int32)
    for i, (o, a) in enumerate(zip(obs_np, acts_np)):
        if o.ndim == 0 or len(o) != len(a) + 1:
            raise ValueError(
                f"obs[{i}] must have len(acts[{i}]) + 1 = {len(a) + 1} observations, got shape {o.shape}"
            )
        if o.shape[1:] != obs_np[0].shape[1:]:
            raise ValueError(f"obs[{i}] has per-step shape {o.shape[1:]}, expected {obs_np[0].shape[1:]}")
        if a.shape[1:] != acts_np[0].shape[1:]:
            raise ValueError(f"acts[{i}] has per-step shape {a.shape[1:]}, expected {acts_np[0].shape[1:]}")
    rews_np = (
        [np.zeros(len(a), np.float32) for a in acts_np]
        if rews is None
        else [np.asarray(r, dtype=np.float32).reshape(-1) for r in rews]
    )
    for i, (r, a) in enumerate(zip(rews_np, acts_np)):
        if len(r) != len(a):
            raise ValueError(f"rews[{i}] must have len(acts[{i}]) = {len(a)} entries, got {len(r)}")
    t_max = int(lengths.max())
    horizon = t_max if horizon is None else int(horizon)
    if horizon < t_max:
        raise ValueError(f"horizon must be >= the longest episode ({t_max}), got {horizon}")
    if isinstance(terminal, bool | np.bool_):
        term = np.full(n, bool(terminal))
    else:
        term = np.asarray(terminal, dtype=bool).reshape(-1)
        if term.shape != (n,):
            raise ValueError(f"terminal must have shape ({n},), got {term.shape}")

    o_dt, a_dt = _canon_dtype(obs_np[0]), _canon_dtype(acts_np[0])
    o_out = np.zeros((n, horizon + 1, *obs_np[0].shape[1:]), o_dt)
    a_out = np.zeros((n, horizon, *acts_np[0].shape[1:]), a_dt)
    r_out = np.zeros((n, horizon), np.float32)
    for i in range(n):  # host-side packing of a ragged list; no per-item device work
        k = lengths[i]
        o_out[i, : k + 1] = obs_np[i]
        a_out[i, :k] = acts_np[i]
        r_out[i, :k] = rews_np[i]
    return Trajectories(
        obs=jnp.asarray(o_out), acts=jnp.asarray(a_out), rews=jnp.asarray(r_out),
        lengths=jnp.asarray(lengths), terminal=jnp.asarray(term),
    )


def fragment_pairs_from_arrays(
    obs: Any, acts: Any, rews: Any | None = None, terminal: Any | None = None, valid: Any | None = None
) -> FragmentPairs:
    """Build :class:`FragmentPairs` from stacked arrays, with dtype canonicalisation.

    Args:
      obs: ``[P, 2, L+1, ...]``.
      acts: ``[P, 2, L, ...]``.
      rews: ``[P, 2, L]`` or None (zeros).
      terminal: ``[P, 2]`` or None (False).
      valid: ``[P]`` or None (True).
    """
    obs = np.asarray(obs)
    acts = np.asarray(acts)
    if obs.ndim < 3 or obs.shape[1] != 2:
        raise ValueError(f"obs must have shape (P, 2, L+1, ...), got {obs.shape}")
    p, _, l1 = obs.shape[:3]
    if acts.ndim < 3 or acts.shape[:3] != (p, 2, l1 - 1):
        raise ValueError(f"acts must have shape ({p}, 2, {l1 - 1}, ...), got {acts.shape}")
    rews = np.zeros((p, 2, l1 - 1), np.float32) if rews is None else np.asarray(rews, np.float32)
    if rews.shape != (p, 2, l1 - 1):
        raise ValueError(f"rews must have shape ({p}, 2, {l1 - 1}), got {rews.shape}")
    terminal = np.zeros((p, 2), bool) if terminal is None else np.asarray(terminal, bool)
    if terminal.shape != (p, 2):
        raise ValueError(f"terminal must have shape ({p}, 2), got {terminal.shape}")
    valid = np.ones((p,), bool) if valid is None else np.asarray(valid, bool)
    if valid.shape != (p,):
        raise ValueError(f"valid must have shape ({p},), got {valid.shape}")
    return FragmentPairs(
        obs=jnp.asarray(obs.astype(_canon_dtype(obs))), acts=jnp.asarray(acts.astype(_canon_dtype(acts))),
        rews=jnp.asarray(rews), terminal=jnp.asarray(terminal), valid=jnp.asarray(valid),
    )


# ---------------------------------------------------------------- utilities
def concatenate_trajectories(parts: Sequence[Trajectories]) -> Trajectories:
    """Stack several :class:`Trajectories` along ``N``, padding ``T`` to the longest."""
    if len(parts) == 0:
        raise ValueError("parts must contain at least one Trajectories")
    t_max = max(p.horizon for p in parts)

    def pad(x, extra, axis=1):
        if extra == 0:
            return x
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, extra)
        return jnp.pad(x, widths)

    return Trajectories(
        obs=jnp.concatenate([pad(p.obs, t_max - p.horizon) for p in parts]),
        acts=jnp.concatenate([pad(p.acts, t_max - p.horizon) for p in parts]),
        rews=jnp.concatenate([pad(p.rews, t_max - p.horizon) for p in parts]),
        lengths=jnp.concatenate([p.lengths for p in parts]),
        terminal=jnp.concatenate([p.terminal for p in parts]),
    )


def concatenate_pairs(parts: Sequence[FragmentPairs]) -> FragmentPairs:
    """Stack several :class:`FragmentPairs` of the same fragment length along ``P``."""
    if len(parts) == 0:
        raise ValueError("parts must contain at least one FragmentPairs")
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def discounted_returns(rews: Array, discount: Any = 1.0) -> Array:
    """``sum_t discount**t * rews[..., t]`` over the last axis, in float32.

    Args:
      rews: ``f[..., L]`` rewards.
      discount: scalar discount factor in ``[0, 1]`` (may be traced).

    Returns:
      ``f32[...]``.

    Raises:
      ValueError: ``discount`` outside ``[0, 1]`` or NaN (eagerly, or through
        ``jaxweight.checked`` when traced).
    """
    check_rank(rews, tuple(range(1, 8)), "rews")
    check_value(discount, "discount", ge=0.0, le=1.0)
    return _discounted_returns(rews, discount)


def _discounted_returns(rews: Array, discount: Any) -> Array:
    """:func:`discounted_returns` with a checked ``discount`` (the teacher's jitted core)."""
    rews = jnp.asarray(rews, jnp.float32)
    length = rews.shape[-1]
    weights = jnp.asarray(discount, jnp.float32) ** jnp.arange(length, dtype=jnp.float32)
    return jnp.sum(rews * weights, axis=-1)


def example_inputs(data: Trajectories | FragmentPairs) -> tuple[Array, Array, Array, Array]:
    """``(state, action, next_state, done)`` of one transition of ``data`` (batch shape ``(1,)``),
    for ``module.init`` / ``ensemble_init`` / ``RewardTrainer.init``."""
    s, a, s2, d = data.transitions()
    lead = d.ndim
    one = lambda x: x.reshape((-1,) + x.shape[lead:])[:1]  # noqa: E731
    return one(s), one(a), one(s2), one(d)


def preference_ok(prefs: Any) -> Array:
    """``bool[...]``: preferences a model can train on (finite probabilities in ``[0, 1]``); jittable."""
    p = jnp.asarray(prefs, jnp.float32)
    return jnp.isfinite(p) & (p >= 0.0) & (p <= 1.0)


def check_preferences(prefs: Any, name: str = "prefs", count: Any = None) -> None:
    """Refuse concrete preferences (the first ``count``) that are NaN or outside ``[0, 1]``.

    Traced ones are not checked here: the functions that take them leave such entries
    out and count them (:func:`preference_ok`).

    Raises:
      ValueError: ``"prefs must be probabilities in [0.0, 1.0] (finite), got prefs[3]=1.5 (1 of 12 ...)"``.
    """
    c = concrete(prefs)
    if c is None:
        return
    n = c.size if count is None else concrete(count)
    if n is None:
        return
    c = np.asarray(c, np.float64).reshape(-1)[: int(n)]
    bad = ~(np.isfinite(c) & (c >= 0.0) & (c <= 1.0))
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(f"{name} must be probabilities in [0.0, 1.0] (finite), got {name}[{i}]={float(c[i])!r} "
                         f"({int(bad.sum())} of {c.size} out of range)")
