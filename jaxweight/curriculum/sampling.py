"""What to train on next: bin probabilities by strategy, bins, and items from the pool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._util import as_key, check_static_int, check_value
from ._config import CurriculumConfig, _check_state, _temperature
from ._select import _bins_of, _desc_keys
from ._tree import _block_counts, _block_sums, _choose, _descend, _tree
from .state import CurriculumState, bin_boundaries

Array = jax.Array

__all__ = ["bin_probabilities", "sample_bin", "sample"]


_TIMED = ("easy_first", "competence_based", "competence_sqrt")  # strategies that read the progress


def _check_progress(cfg: CurriculumConfig, step: Any, total_steps: Any) -> tuple[Array, Array]:
    """Finite progress values (ValueError when concrete, a checkify check when traced).

    ``uniform`` and ``prioritized`` do not read the progress: None stands for 0 of 1.
    """
    if step is None or total_steps is None:
        if cfg.strategy in _TIMED:
            raise ValueError(f"strategy {cfg.strategy!r} needs the training progress: pass step= and "
                             f"total_steps=, got step={step!r}, total_steps={total_steps!r}")
        step, total_steps = (0 if step is None else step), (1 if total_steps is None else total_steps)
    check_value(step, "step")
    check_value(total_steps, "total_steps")
    return jnp.asarray(step, jnp.float32), jnp.asarray(total_steps, jnp.float32)


def _progress(current_step: Array, total_steps: Array) -> Array:
    ts = jnp.maximum(total_steps, 1.0)
    p = jnp.clip(current_step / ts, 0.0, 1.0)
    return jnp.where(jnp.isnan(p), jnp.float32(0.0), p)  # NaN progress (traced) reads as 0


def bin_probabilities(cfg: CurriculumConfig, *, step: Any = None, total_steps: Any = None,
                      tempered: bool = True) -> Array:
    """Sampling probabilities of the bins: f32[n_bins] (sums to 1).

    With ``p = clip(step / max(1, total_steps), 0, 1)`` and ``n = n_bins``:

    - ``uniform``: ``1/n`` (temperature ignored);
    - ``easy_first``: ``(1 - p) exp(-2i / max(1, n - 1)) + p/n``;
    - ``competence_based``: ``exp(-(i - p (n - 1))^2 / 2)``;
    - ``competence_sqrt``: ``clip(c n - i, 0, 1)`` with
      ``c = min(1, sqrt(step (1 - c0^2) / max(1, total) + c0^2))``;

    normalised, then if ``tempered`` and ``T != 1``,
    ``softmax(log(max(w, 1e-10)) / T)`` (atropos's ``sample_bin``). With
    ``T == 1`` this is atropos's ``_compute_bin_probabilities``.

    Args:
      cfg: the config (its strategy must not be ``prioritized``).
      step, total_steps: training progress, finite; may be traced (a traced
        NaN is refused by ``jaxweight.checked`` and otherwise reads as
        progress 0). Required by the strategies that move with time.
      tempered: apply the temperature.

    Raises:
      ValueError: for ``prioritized`` (its distribution depends on the pool;
        use :func:`sample`), a missing or non-finite concrete progress.

    References:
      atropos ``CurriculumScheduler``; Platanios et al. 2019 (arXiv:1903.09848).

    Example::

        from jaxweight import curriculum as cur

        p = cur.bin_probabilities(cur.config("easy_first", 5, capacity=10), step=0, total_steps=100)
        assert abs(float(p[0]) - 0.428656) < 1e-5      # atropos's easy_first at p = 0
    """
    if cfg.strategy == "prioritized":
        raise ValueError(
            "bin_probabilities is undefined for strategy 'prioritized' (its distribution "
            "depends on the pool); use sample"
        )
    cs, ts = _check_progress(cfg, step, total_steps)
    return _probabilities(cfg, cs, ts, bool(tempered))


def _probabilities(cfg, current_step, total_steps, tempered):
    n = cfg.n_bins
    i = jnp.arange(n, dtype=jnp.float32)
    p = _progress(current_step, total_steps)
    if cfg.strategy == "uniform":
        return jnp.full((n,), 1.0 / n, jnp.float32)
    if cfg.strategy == "easy_first":
        w = (1.0 - p) * jnp.exp(-2.0 * i / max(1, n - 1)) + p / n
    elif cfg.strategy == "competence_based":
        w = jnp.exp(-0.5 * jnp.square(i - p * (n - 1)))
    else:  # competence_sqrt
        c0 = jnp.clip(jnp.asarray(cfg.competence_c0, jnp.float32), 1e-6, 1.0)
        t = jnp.maximum(jnp.nan_to_num(current_step, nan=0.0), 0.0)
        tt = jnp.maximum(total_steps, 1.0)
        c = jnp.minimum(1.0, jnp.sqrt(t * (1.0 - c0 * c0) / tt + c0 * c0))
        c = jnp.where(jnp.isnan(c), c0, c)
        w = jnp.clip(c * n - i, 0.0, 1.0)
    w = w / jnp.sum(w)
    if tempered:
        temp = _temperature(cfg)
        tw = jax.nn.softmax(jnp.log(jnp.maximum(w, 1e-10)) / temp)
        w = jnp.where(temp == 1.0, w, tw)
    return w.astype(jnp.float32)


def sample_bin(key: Any, cfg: CurriculumConfig, *, step: Any = None, total_steps: Any = None,
               shape: Sequence[int] = ()) -> Array:
    """Draw target bins (atropos ``sample_bin``): i32[shape], always in ``[0, n_bins)``.

    ``uniform`` draws a uniform integer in ``[0, n_bins)``; the others draw
    from ``categorical(log bin_probabilities(...))``. (Stateless, so the key
    comes first.)

    Example::

        from jaxweight import curriculum as cur

        cfg = cur.config("easy_first", 5, capacity=10)
        bins = cur.sample_bin(0, cfg, step=10, total_steps=1000, shape=(64,))
        assert bins.shape == (64,) and int(bins.min()) >= 0 and int(bins.max()) < 5
    """
    key = as_key(key)
    shape = tuple(shape)
    if cfg.strategy == "uniform":
        return jax.random.randint(key, shape, 0, cfg.n_bins, dtype=jnp.int32)
    p = bin_probabilities(cfg, step=step, total_steps=total_steps)
    # log 0 as a large finite negative instead of -inf (jax_debug_infs): with a Gumbel draw of at
    # most ~17 and log p >= -104 for any p > 0, such a bin never wins, as with -inf
    logp = jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), jnp.float32(-1e30))
    return jnp.clip(jax.random.categorical(key, logp, shape=shape), 0, cfg.n_bins - 1).astype(jnp.int32)


# ============================================================ item sampling
def _eligible(eligible: Any, n: int) -> Array:
    if eligible is None:
        return jnp.ones((n,), bool)
    e = jnp.asarray(eligible, bool)
    if e.shape != (n,):
        raise ValueError(f"eligible must have shape ({n},), got {e.shape}")
    return e


def _restrict(p: Array, nonempty: Array) -> Array:
    """Probabilities restricted to non-empty bins; if those carry none, mass to the nearest one.

    Non-finite probabilities (never from :func:`bin_probabilities` with a
    valid config) fall back to uniform over the non-empty bins, so a draw
    always lands in a non-empty bin.
    """
    n = p.shape[0]
    p = jnp.where(jnp.isfinite(p) & (p > 0), p, 0.0)
    pr = jnp.where(nonempty, p, 0.0)
    tot = jnp.sum(pr)
    i = jnp.arange(n)
    dist = jnp.abs(i[:, None] - i[None, :]).astype(jnp.float32)
    dist = jnp.where(nonempty[None, :], dist, jnp.float32(n))  # farther than any bin (no inf)
    nearest = jnp.argmin(dist, axis=1)  # ties go to the easier bin
    moved = jnp.zeros((n,), jnp.float32).at[nearest].add(p)
    mtot = jnp.sum(moved)
    uniform = nonempty.astype(jnp.float32) / jnp.maximum(jnp.sum(nonempty), 1).astype(jnp.float32)
    return jnp.where(tot > 0, pr / jnp.where(tot > 0, tot, 1.0),
                     jnp.where(mtot > 0, moved / jnp.where(mtot > 0, mtot, 1.0), uniform))


def sample(state: CurriculumState, key: Any, cfg: CurriculumConfig, *, num: int, step: Any = None,
           total_steps: Any = None, eligible: Any = None) -> Array:
    """Draw ``num`` item ids by the curriculum: i32[num] (with replacement).

    Bin strategies: each draw picks a bin from :func:`bin_probabilities`
    restricted to bins that hold at least one eligible item (renormalised; if
    those bins carry no probability, e.g. ``competence_sqrt`` early on with an
    empty easiest bin, each bin's mass moves to its nearest non-empty bin),
    then an item uniformly inside that bin. Untracked eligible items live in
    bin ``n_bins // 2`` (as in :func:`item_bin`), so with nothing tracked the
    draws are uniform over eligible items.

    ``prioritized`` (Prioritized Level Replay) over the tracked eligible
    items: ``score = -|ema - competence_threshold|`` (``priority="frontier"``;
    ``"hard"``: ``-ema``; ``"easy"``: ``ema``), ``rank`` = 1 + position in
    descending score (ties: lower id first), ``P_S ∝ rank^(-1/T)``,
    ``P_C ∝ total_updates - last_update`` (``P_S`` if all 0) and
    ``P = (1 - staleness_coeff) P_S + staleness_coeff P_C``. With no tracked
    eligible item the draws are uniform over eligible items; feeding unseen
    items is the caller's job (PLR's "new level" branch).

    Cost: one binning pass over the pool per call (``prioritized``: one
    ranking sort, O(N log N)), then O(log N) per draw.

    Args:
      state: the scheduler state.
      key: PRNG key or int seed.
      cfg: the config.
      num: number of draws (static).
      step, total_steps: training progress, finite (may be traced; a traced
        NaN is refused by ``jaxweight.checked`` and reads as 0 otherwise);
        required by the strategies that move with time.
      eligible: optional bool[N]: items that may be drawn (default all).

    Returns:
      i32[num] item ids, always in ``[0, N)``; -1 where no item is eligible.

    Raises:
      ValueError: state and config disagree on capacity or bins, a
        non-finite concrete step, bad ``num`` / ``eligible`` / ``key``.

    References:
      Jiang et al. 2021 (arXiv:2010.03934); Platanios et al. 2019 (arXiv:1903.09848).

    Example::

        from jaxweight import curriculum as cur

        cfg = cur.config("competence_sqrt", capacity=1000)
        ids = cur.sample(cur.init(cfg), 0, cfg, num=256, step=10, total_steps=10_000)
        assert ids.shape == (256,) and int(ids.min()) >= 0
    """
    _check_state(state, cfg)
    num = check_static_int(num, "num", minimum=0)
    key = as_key(key)
    elig = _eligible(eligible, cfg.capacity)
    current_step, total_steps = _check_progress(cfg, step, total_steps)
    n = cfg.capacity
    if cfg.strategy == "prioritized":
        items, any_elig = _sample_prioritized(key, state, cfg, num, elig)
    else:
        items, any_elig = _sample_binned(key, state, cfg, current_step, total_steps, num, elig)
    # a last guard: whatever the inputs, an id is in [0, N) or -1 (nothing eligible)
    return jnp.where(any_elig, jnp.clip(items, 0, n - 1), -1).astype(jnp.int32)


def _sample_binned(key, state, cfg, current_step, total_steps, num, elig):
    n, nb = cfg.capacity, cfg.n_bins
    b = bin_boundaries(state, cfg)
    bins = _bins_of(state.ema, state.count > 0, b, nb)
    bins = jnp.where(elig, bins, -1)
    levels = _tree(_block_counts(bins, nb))
    counts = jnp.sum(levels[-1], axis=0)
    p = _restrict(_probabilities(cfg, current_step, total_steps, True), counts > 0)
    # One draw of uniforms for everything (the bin by inverse CDF, then one per
    # tree level): every separate PRNG call adds noticeably to the compile time.
    u = jax.random.uniform(key, (num, len(levels) + 2), jnp.float32)
    chosen = jax.vmap(_choose, in_axes=(None, 0))(p, u[:, 0])

    def leaf_w(leaf, c):
        return (bins[leaf] == c).astype(jnp.float32)

    items = jax.vmap(lambda c, uu: _descend(levels, leaf_w, n, c, uu))(chosen, u[:, 1:])
    return items, jnp.sum(counts) > 0


def _priority_key(ema: Array, cfg: CurriculumConfig) -> Array:
    """``-score`` of ``prioritized`` (ascending = descending score)."""
    if cfg.priority == "frontier":
        return jnp.abs(ema - jnp.asarray(cfg.competence_threshold, jnp.float32))
    if cfg.priority == "hard":
        return ema
    return -ema


def _sample_prioritized(key, state, cfg, num, elig):
    n = cfg.capacity
    cand = elig & (state.count > 0)
    n_cand = jnp.sum(cand, dtype=jnp.int32)
    # ascending order of the score key as u32 (-0.0 and +0.0 tie: lower id first); the
    # others go last with the largest key (no +inf sentinel, so jax_debug_infs holds)
    sk = jnp.where(cand, ~_desc_keys(_priority_key(jnp.where(cand, state.ema, 0.0), cfg)),
                   jnp.uint32(0xFFFFFFFF))
    _, order = lax.sort((sk, jnp.arange(n, dtype=jnp.int32)), num_keys=2)
    r = jnp.arange(n, dtype=jnp.float32)
    rank_w = jnp.where(r < n_cand, jnp.exp(-jnp.log1p(r) / _temperature(cfg)), 0.0)
    stale = jnp.where(cand, (state.total_updates - state.last_update).astype(jnp.float32), 0.0)
    stale = jnp.maximum(stale, 0.0)
    # channels: 0 = rank distribution (indexed by rank), 1 = staleness (by id), 2 = eligible
    leaves = jnp.stack([rank_w, stale, elig.astype(jnp.float32)], axis=1)
    levels = _tree(_block_sums(leaves))
    use_stale = jnp.sum(levels[-1][:, 1]) > 0
    coeff = jnp.clip(jnp.nan_to_num(jnp.asarray(cfg.staleness_coeff, jnp.float32), nan=0.0), 0.0, 1.0)
    u = jax.random.uniform(key, (num, len(levels) + 2), jnp.float32)  # one PRNG call (see above)
    pick_stale = (u[:, 0] < coeff) & use_stale
    channel = jnp.where(n_cand > 0, jnp.where(pick_stale, 1, 0), 2).astype(jnp.int32)
    u = u[:, 1:]

    def leaf_w(leaf, c):
        return leaves[leaf, c]

    pos = jax.vmap(lambda c, uu: _descend(levels, leaf_w, n, c, uu))(channel, u)
    items = jnp.where(channel == 0, order[jnp.minimum(pos, n - 1)], pos)
    return items, jnp.sum(levels[-1][:, 2]) > 0
