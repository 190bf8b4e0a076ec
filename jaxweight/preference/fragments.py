"""Fragmenters: random fragment pairs and ensemble-disagreement active selection.

:func:`random_fragments` (imitation ``RandomFragmenter``, jittable) picks each
fragment's episode with probability proportional to its length and a uniform
start. :func:`active_selection` (``ActiveSelectionFragmenter``) scores
``int(sample_factor * num_pairs)`` candidates by the ensemble's disagreement
in one call, member rewards computed once per trajectory step.

Example::

    import numpy as np
    from jaxweight.preference import (Box, Discrete, RewardMLP, active_selection_scored, ensemble_init,
                                      example_inputs, random_fragments, trajectories_from_arrays)
    rng = np.random.default_rng(0)
    trajs = trajectories_from_arrays([rng.normal(size=(21, 3)) for _ in range(4)],
                                     [rng.integers(0, 2, 20) for _ in range(4)], [np.ones(20)] * 4)
    pairs = random_fragments(0, trajs, fragment_length=5, num_pairs=8)      # FragmentPairs [8, 2, 6, 3]
    net = RewardMLP(hidden_sizes=(4,), observation_space=Box((3,)), action_space=Discrete(2))
    params = ensemble_init(0, net, example_inputs(pairs), num_members=3)
    picked, scores = active_selection_scored(1, params, net, trajs, 5, 4, sample_factor=2, uncertainty_on="all")
    assert picked.num_pairs == 4 and set(scores) >= {"logit", "probability", "label"}

References:
  imitation ``algorithms/preference_comparisons.py`` (``RandomFragmenter``,
  ``ActiveSelectionFragmenter``); Lee et al. (2021) B-Pref / PEBBLE
  (disagreement sampling).
"""

from __future__ import annotations

import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .._util import as_key, check_static_int, check_value, concrete
from .data import FragmentPairs, Trajectories
from .model import _check_bt, binary_entropy
from .reward_nets import ensemble_apply, num_members

Array = jax.Array

__all__ = [
    "random_fragments",
    "sample_fragment_indices",
    "gather_fragments",
    "active_selection",
    "active_selection_scored",
    "variance_estimate",
    "uncertainty_scores",
    "UNCERTAINTY_MODES",
]

logger = logging.getLogger("jaxweight.preference")

UNCERTAINTY_MODES = ("logit", "probability", "label")
_CHUNK = 8192  # rows per reward-net call when scoring candidates (keeps activations in cache)
_ALL_SCORES = ("logit", "probability", "label", "disagreement", "entropy")


def _as_trajectories(trajectories: Any) -> Trajectories:
    if not isinstance(trajectories, Trajectories):
        raise ValueError(f"trajectories must be Trajectories, got {type(trajectories).__name__}")
    return trajectories.check()


def _host_checks(lengths: np.ndarray, fragment_length: int, num_pairs: int, warning_threshold: int) -> None:
    eligible = lengths >= fragment_length
    if not eligible.any():
        raise ValueError(f"No trajectories are long enough for the desired fragment length of {fragment_length}.")
    discarded = int((~eligible).sum())
    if discarded:
        logger.info(
            "Discarded %d out of %d trajectories because they are shorter than the desired length of %d.",
            discarded, len(lengths), fragment_length,
        )
    available = int(lengths[eligible].sum())
    needed = 2 * num_pairs * fragment_length
    if available < needed:
        logger.warning(
            "Fewer transitions available than needed for desired number of fragment pairs. "
            "Some transitions will appear multiple times."
        )
    elif warning_threshold and available < warning_threshold * needed:
        logger.warning(
            "Samples will contain %d transitions in total and only %d are available. Because we sample "
            "with replacement, a significant number of transitions are likely to appear multiple times.",
            needed, available,
        )


def _pad_horizon(trajectories: Trajectories, fragment_length: int) -> Trajectories:
    """Pad ``T`` up to ``L`` so windows keep their static shape when no episode is long enough."""
    if fragment_length <= trajectories.horizon:
        return trajectories
    pad = fragment_length - trajectories.horizon
    return jax.tree.map(
        lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) if x.ndim >= 2 else x, trajectories
    )


def sample_fragment_indices(
    key: Any, lengths: Array, terminal: Array, fragment_length: int, num_pairs: int
) -> tuple[Array, Array, Array, Array]:
    """Episode index, start and terminal flag of ``2 * num_pairs`` random fragments.

    Args:
      key: PRNG key or int seed.
      lengths: ``i32[N]`` episode lengths.
      terminal: ``bool[N]`` terminal flags.
      fragment_length: ``L >= 1`` (static).
      num_pairs: ``P >= 0`` (static).

    Returns:
      ``(traj i32[P, 2], start i32[P, 2], terminal bool[P, 2], valid bool[P])``;
      ``valid`` is False everywhere when no episode has ``L`` steps.
    """
    key = as_key(key)
    lengths = jnp.asarray(lengths, jnp.int32)
    n2 = 2 * num_pairs
    eligible = lengths >= fragment_length
    weights = jnp.where(eligible, lengths, 0)
    # inverse-CDF sampling on integer weights: exactly proportional to length, O(log N) per draw
    # (categorical sampling would draw N Gumbel variables per fragment)
    cum = jnp.cumsum(weights)
    total = cum[-1] if weights.shape[0] else jnp.zeros((), jnp.int32)
    any_eligible = total > 0
    k_traj, k_start = jax.random.split(key)
    u = jax.random.randint(k_traj, (n2,), 0, jnp.maximum(total, 1), dtype=jnp.int32)
    traj = jnp.searchsorted(cum, u, side="right").astype(jnp.int32)
    traj = jnp.minimum(traj, max(lengths.shape[0] - 1, 0))
    n = lengths[traj] if lengths.shape[0] else jnp.zeros((n2,), jnp.int32)
    span = jnp.maximum(n - fragment_length + 1, 1)
    start = jax.random.randint(k_start, (n2,), 0, span, dtype=jnp.int32)
    term_src = jnp.asarray(terminal, bool)[traj] if lengths.shape[0] else jnp.zeros((n2,), bool)
    term = (start + fragment_length == n) & term_src
    valid = jnp.broadcast_to(any_eligible, (num_pairs,))
    return traj.reshape(num_pairs, 2), start.reshape(num_pairs, 2), term.reshape(num_pairs, 2), valid


def gather_fragments(
    trajectories: Trajectories, traj: Array, start: Array, terminal: Array, valid: Array, fragment_length: int
) -> FragmentPairs:
    """Cut the fragments ``obs[traj, start : start + L + 1]`` etc. out of ``trajectories``.

    ``traj``, ``start``, ``terminal``: ``[P, 2]``; ``valid``: ``bool[P]``.
    """
    t_obs = jnp.arange(fragment_length + 1, dtype=jnp.int32)
    horizon = trajectories.horizon
    # clamp keeps out-of-range windows (only possible for invalid pairs) inside the array
    idx_o = jnp.minimum(start[..., None] + t_obs, horizon)
    idx_a = jnp.minimum(start[..., None] + t_obs[:-1], max(horizon - 1, 0))
    tr = traj[..., None]
    return FragmentPairs(
        obs=trajectories.obs[tr, idx_o],
        acts=trajectories.acts[tr, idx_a],
        rews=trajectories.rews[tr, idx_a].astype(jnp.float32),
        terminal=terminal,
        valid=valid,
    )


def random_fragments(
    key: Any, trajectories: Trajectories, fragment_length: int, num_pairs: int, *, warning_threshold: int = 10
) -> FragmentPairs:
    """Sample ``num_pairs`` pairs of fragments uniformly at random with replacement.

    Each of the ``2P`` fragments independently picks episode ``n`` with
    probability proportional to ``lengths[n]`` among episodes with
    ``lengths[n] >= L`` (shorter ones are never used), then ``start`` uniformly
    on ``[0, lengths[n] - L]`` inclusive; the fragment holds ``L + 1``
    observations ``obs[n, start : start + L + 1]`` and ``L`` actions / rewards;
    it is terminal only if it ends the episode (``start + L == lengths[n]``) and
    the episode is terminal. Fragments ``2i`` and ``2i + 1`` form pair ``i``.

    Args:
      key: PRNG key or int seed.
      trajectories: padded episodes.
      fragment_length: ``L >= 1`` (static).
      num_pairs: ``P >= 1`` (static).
      warning_threshold: log a warning when fewer than ``warning_threshold * 2PL``
        transitions are available (0 disables; imitation's default is 10).

    Returns:
      ``FragmentPairs`` with ``P`` pairs. Under ``jit`` with no episode long
      enough, every pair has ``valid = False`` instead of raising.

    Raises:
      ValueError: ``L < 1`` or ``P < 1``; with concrete ``lengths``: "No
        trajectories are long enough for the desired fragment length of {L}."

    The host-side messages of the original (discarded episodes, too few
    transitions) go to the ``jaxweight.preference`` logger when ``lengths`` is concrete.
    """
    fragment_length = check_static_int(fragment_length, "fragment_length", 1)
    num_pairs = check_static_int(num_pairs, "num_pairs", 1)
    _as_trajectories(trajectories)
    lengths_np = concrete(trajectories.lengths)
    if lengths_np is not None:
        _host_checks(lengths_np, fragment_length, num_pairs, warning_threshold)
    return _random_fragments_core(as_key(key), trajectories, fragment_length, num_pairs)


def _random_fragments_core(key, trajectories, fragment_length, num_pairs):
    traj, start, term, valid = sample_fragment_indices(
        key, trajectories.lengths, trajectories.terminal, fragment_length, num_pairs
    )
    trajectories = _pad_horizon(trajectories, fragment_length)
    return gather_fragments(trajectories, traj, start, term, valid, fragment_length)


# ------------------------------------------------------------- uncertainty
def uncertainty_scores(
    rews1: Array, rews2: Array, *, noise_prob: Any = 0.0, discount: Any = 1.0, threshold: Any = 50.0
) -> dict[str, Array]:
    """Every disagreement score of one pair in one pass.

    Args:
      rews1, rews2: ``f32[L, M]`` member rewards of the two fragments.

    Returns:
      ``{"logit", "probability", "label", "disagreement", "entropy"}`` (each ``f32[]``):
      ``logit`` = variance (ddof 1) over members of the undiscounted return
      difference; ``probability`` = variance (ddof 0) of the members'
      :func:`probability`; ``label`` = ``q (1 - q)`` with ``q`` the fraction of
      members with probability > 0.5; ``disagreement`` = std (ddof 0) of the
      probabilities (PEBBLE); ``entropy`` = binary entropy of the mean probability.

    Raises:
      ValueError: ``noise_prob`` or ``discount`` outside ``[0, 1]``, ``threshold <= 0``
        or NaN / inf (eagerly, or through ``jaxweight.checked`` when traced).
    """
    _check_bt(noise_prob, discount, threshold)
    r1 = jnp.asarray(rews1, jnp.float32)
    r2 = jnp.asarray(rews2, jnp.float32)
    return _scores_from_returns(r1.sum(0) - r2.sum(0), _discounted_diff(r2 - r1, discount), noise_prob, threshold)


def _discounted_diff(diff: Array, discount: Any) -> Array:
    """``sum_t discount**t * diff[..., t, :]`` over the time axis (-2): ``[..., L, M] -> [..., M]``."""
    length = diff.shape[-2]
    w = jnp.asarray(discount, jnp.float32) ** jnp.arange(length, dtype=jnp.float32)
    return jnp.einsum("...lm,l->...m", diff, w)


def _scores_from_returns(logit_diff: Array, disc_diff: Array, noise_prob: Any, threshold: Any) -> dict[str, Array]:
    """The scores from per-member return differences ``[..., M]``: undiscounted ``R1 - R2`` and
    discounted ``R2 - R1`` (the Bradley-Terry ``D`` before clipping)."""
    logit = jnp.var(logit_diff, axis=-1, ddof=1)
    threshold = jnp.asarray(threshold, jnp.float32)
    noise = jnp.asarray(noise_prob, jnp.float32)
    p = noise * 0.5 + (1.0 - noise) * jax.nn.sigmoid(-jnp.clip(disc_diff, -threshold, threshold))
    prob_var = jnp.var(p, axis=-1)
    q = jnp.mean((p > 0.5).astype(jnp.float32), axis=-1)
    pm = jnp.mean(p, axis=-1)
    ent = binary_entropy(pm)
    return {"logit": logit, "probability": prob_var, "label": q * (1.0 - q), "disagreement": jnp.sqrt(prob_var),
            "entropy": ent}


def _check_mode(uncertainty_on: str, allow_all: bool) -> None:
    ok = UNCERTAINTY_MODES + (("all",) if allow_all else ())
    if uncertainty_on not in ok:
        raise ValueError(
            f"{uncertainty_on} not supported.\n  `uncertainty_on` should be from `logit`, `probability`, or `label`"
        )


def variance_estimate(
    rews1: Array,
    rews2: Array,
    uncertainty_on: str = "logit",
    *,
    noise_prob: Any = 0.0,
    discount: Any = 1.0,
    threshold: Any = 50.0,
) -> Array:
    """The per-pair uncertainty score :func:`active_selection` ranks by (imitation's ``variance_estimate``).

    Args:
      rews1, rews2: ``f32[L, M]`` member rewards of the two fragments (``M >= 2``).
      uncertainty_on: ``"logit"`` (variance, ddof 1, of the undiscounted return
        differences), ``"probability"`` (variance, ddof 0, of the members'
        Bradley-Terry probabilities) or ``"label"`` (``q (1 - q)`` of the
        members' votes ``p > 0.5``).

    Returns:
      ``f32[]``; vmap over pairs for a batch.

    Raises:
      ValueError: an unknown mode, wrong shapes; ``noise_prob`` or ``discount``
        outside ``[0, 1]``, ``threshold <= 0`` or NaN / inf (eagerly, or through
        ``jaxweight.checked`` when traced).

    Example (spec example 3): members as columns ``R1 = [[1,0,2],[1,0,2]]``,
    ``R2 = [[0,0,0],[0,1,0]]`` give logit 6.3333335, probability 0.09923158, label 0.22222222.
    """
    _check_mode(uncertainty_on, allow_all=False)
    if jnp.ndim(rews1) != 2 or jnp.shape(rews1)[1] < 2:
        raise ValueError(f"rews1 must have shape (L, M) with M >= 2 members, got {jnp.shape(rews1)}")
    if jnp.shape(rews1) != jnp.shape(rews2):
        raise ValueError(f"rews2 must have the same shape as rews1 {jnp.shape(rews1)}, got {jnp.shape(rews2)}")
    return uncertainty_scores(rews1, rews2, noise_prob=noise_prob, discount=discount, threshold=threshold)[uncertainty_on]


def active_selection(
    key: Any,
    params: Any,
    module: nn.Module,
    trajectories: Trajectories,
    fragment_length: int,
    num_pairs: int,
    sample_factor: float,
    uncertainty_on: str = "logit",
    *,
    noise_prob: Any = 0.0,
    discount: Any = 1.0,
    threshold: Any = 50.0,
    select_by: str = "logit",
    warning_threshold: int = 10,
    rewards_per: str = "auto",
) -> FragmentPairs:
    """Pick the ``num_pairs`` candidate pairs the ensemble disagrees on most.

    :func:`active_selection_scored` (same arguments) also returns the scores.

    ``C = int(sample_factor * num_pairs)`` candidates come from
    :func:`random_fragments`; member rewards ``r1, r2: [C, L, M]`` (under
    ``stop_gradient``) are scored with :func:`uncertainty_scores` and the
    ``num_pairs`` highest scores are kept in descending order (ties: lower
    candidate index first).

    Args:
      key: PRNG key or int seed.
      params: ensemble params (leading member axis ``M >= 2``, from ``ensemble_init``).
      module: the reward module.
      trajectories: padded episodes to cut candidates from.
      fragment_length: ``L`` (static).
      num_pairs: pairs to return (static).
      sample_factor: candidates per returned pair (static; ``C >= num_pairs``).
      uncertainty_on: ``"logit"``, ``"probability"``, ``"label"``, or ``"all"``
        (every score in one pass; ranks by ``select_by``).
      noise_prob, discount, threshold: Bradley-Terry settings for the
        probability-based scores (may be traced).
      select_by: the score to rank by when ``uncertainty_on="all"``; one of
        ``"logit"``, ``"probability"``, ``"label"``, ``"disagreement"``, ``"entropy"``.
      warning_threshold: see :func:`random_fragments`.
      rewards_per: ``"step"`` (score every trajectory step once and gather
        windows), ``"fragment"`` (score the ``2CL`` candidate steps) or
        ``"auto"`` (whichever has fewer rows). Both give the same rewards.

    Returns:
      ``FragmentPairs`` of ``num_pairs`` pairs. NaN scores rank last.

    Raises:
      ValueError: params without a member axis >= 2 ("active_selection needs
        ensemble params (leading member axis >= 2)."), unknown ``uncertainty_on``
        (imitation's message), ``C < num_pairs``, and the errors of
        :func:`random_fragments`.
    """
    return active_selection_scored(
        key, params, module, trajectories, fragment_length, num_pairs, sample_factor, uncertainty_on,
        noise_prob=noise_prob, discount=discount, threshold=threshold, select_by=select_by,
        warning_threshold=warning_threshold, rewards_per=rewards_per,
    )[0]


def active_selection_scored(
    key: Any,
    params: Any,
    module: nn.Module,
    trajectories: Trajectories,
    fragment_length: int,
    num_pairs: int,
    sample_factor: float,
    uncertainty_on: str = "logit",
    *,
    noise_prob: Any = 0.0,
    discount: Any = 1.0,
    threshold: Any = 50.0,
    select_by: str = "logit",
    warning_threshold: int = 10,
    rewards_per: str = "auto",
) -> tuple[FragmentPairs, dict[str, Array]]:
    """:func:`active_selection` that also returns the selected pairs' scores.

    Returns:
      ``(pairs, scores)``: ``scores`` maps each computed score name (one, or all
      five with ``uncertainty_on="all"``) to ``f32[num_pairs]``, in the order of ``pairs``.
    """
    _check_mode(uncertainty_on, allow_all=True)
    if select_by not in _ALL_SCORES:
        raise ValueError(f"select_by must be one of {_ALL_SCORES}, got {select_by!r}")
    if rewards_per not in ("auto", "step", "fragment"):
        raise ValueError(f"rewards_per must be 'auto', 'step' or 'fragment', got {rewards_per!r}")
    fragment_length = check_static_int(fragment_length, "fragment_length", 1)
    num_pairs = check_static_int(num_pairs, "num_pairs", 1)
    _as_trajectories(trajectories)
    # sample_factor sets the number of candidates (a shape): it cannot be traced
    check_value(sample_factor, "sample_factor", ge=1.0, static=True)
    _check_bt(noise_prob, discount, threshold)
    n_cand = int(sample_factor * num_pairs)
    if n_cand < num_pairs:
        raise ValueError(
            f"sample_factor * num_pairs = {n_cand} candidates is fewer than num_pairs = {num_pairs}; "
            "sample_factor must be >= 1"
        )
    example = tuple(x[:1, :1] for x in trajectories.transitions())
    m = num_members(module, params, example)
    if m is None or m < 2:
        raise ValueError("active_selection needs ensemble params (leading member axis >= 2).")

    lengths_np = concrete(trajectories.lengths)
    if lengths_np is not None:
        _host_checks(lengths_np, fragment_length, n_cand, warning_threshold)
    mode = rewards_per
    if mode == "auto":
        rows_step = trajectories.num_trajectories * max(trajectories.horizon, fragment_length)
        mode = "step" if rows_step <= 2 * n_cand * fragment_length else "fragment"
    hyper = tuple(jnp.asarray(v, jnp.float32) for v in (noise_prob, discount, threshold))
    picked, scores = _active_core(
        module, as_key(key), params, trajectories, hyper, fragment_length, num_pairs, n_cand, uncertainty_on,
        uncertainty_on if uncertainty_on != "all" else select_by, mode,
    )
    return picked, scores


def _active_core(module, key, params, trajectories, hyper, fragment_length, num_pairs, n_cand, uncertainty_on,
                 rank_by, mode):
    noise_prob, discount, threshold = hyper
    candidates_key, _ = jax.random.split(key)
    traj, start, term, valid = sample_fragment_indices(
        candidates_key, trajectories.lengths, trajectories.terminal, fragment_length, n_cand
    )
    trajectories = _pad_horizon(trajectories, fragment_length)
    horizon = trajectories.horizon
    params = jax.lax.stop_gradient(params)
    if mode == "step":
        # a step's reward does not depend on the window that contains it (its done flag is the
        # episode's), so score every step once and gather the candidates' windows
        per_step = ensemble_apply(module, params, *trajectories.transitions(), chunk_size=_CHUNK)  # [N, T, M]
        t_idx = jnp.minimum(start[..., None] + jnp.arange(fragment_length), horizon - 1)  # [C, 2, L]
        rews = per_step[traj[..., None], t_idx]  # [C, 2, L, M]
    else:
        candidates = gather_fragments(trajectories, traj, start, term, valid, fragment_length)
        rews = ensemble_apply(module, params, *candidates.transitions(), chunk_size=_CHUNK)  # [C, 2, L, M]
    rews = rews.astype(jnp.float32)

    # all candidates at once on [C, M] return differences (same math as uncertainty_scores per pair)
    scores = _scores_from_returns(
        rews[:, 0].sum(1) - rews[:, 1].sum(1), _discounted_diff(rews[:, 1] - rews[:, 0], discount), noise_prob,
        threshold,
    )
    if uncertainty_on != "all":
        scores = {uncertainty_on: scores[uncertainty_on]}
    s = scores[rank_by]
    # every score is >= 0 (or NaN): the lowest finite float ranks NaN last without an inf
    s = jnp.where(jnp.isnan(s), jnp.finfo(s.dtype).min, s)
    # lax.top_k keeps the lower index first among equal values
    _, idx = jax.lax.top_k(s, num_pairs)
    picked = gather_fragments(trajectories, traj[idx], start[idx], term[idx], valid[idx], fragment_length)
    return picked, {k: v[idx] for k, v in scores.items()}
