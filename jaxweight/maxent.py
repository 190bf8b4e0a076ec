"""MaxEnt-GRPO reward weighting on dense masked ``[P, G]`` arrays.

maxent_grpo trains a policy with GRPO over ``G`` completions per prompt. Next
to group-normalised advantages it builds a listwise target ``q`` (a softmax of
the rewards of each group) and maximum-entropy sequence weights

    w  ~  q^(1/tau) * pi_ref^(beta/tau)        (one softmax per group)

whose entropy a controller (:mod:`jaxweight.controllers`) steers toward a
target. The original walks over groups in Python; here every quantity is one
vectorised function of ``f32[P, G]`` arrays with a validity ``mask`` (ragged
groups are padding), so a whole batch, a batch of sweeps or a gradient with
respect to ``tau``/``beta`` is one compiled call.

Conventions:

- An entry is *valid* iff it is masked in and its inputs are finite. Invalid
  entries never affect other entries and get 0 in every output; ``n`` is the
  number of valid entries of a row. Non-finite rewards are counted
  (:attr:`RewardStatistics.num_nonfinite`), never propagated.
- Math in float32; outputs are float32.
- Continuous hyperparameters (``tau``, ``beta``, ``denom``, ``temperature``,
  ``epsilon``, ``eps``) may be traced arrays: new values never recompile and
  can be ``jax.vmap``-ed over. Modes (``scale``, ``baseline``, ``ddof``,
  token normalisation) are static.

The one-call training step is :func:`maxent_step` (advantages, ``q``,
weights, entropy statistics, diagnostics and the controller update).

Example::

    import jax.numpy as jnp
    from jaxweight import maxent, controllers

    rewards, mask = maxent.pad_groups([[1., 0., 0., 1.], [2., 0.]])   # ragged -> [2, 4] + mask
    ref_logp = jnp.array([[-1.2, -0.4, -2.0, -0.9], [-0.3, -1.0, 0.0, 0.0]])
    adv = maxent.group_advantages(rewards, mask)              # f32[2, 4]
    q = maxent.q_distribution(rewards, mask, temperature=0.5)
    w = maxent.weight_matrix(q, ref_logp, mask=mask, tau=0.5, beta=0.04)
    ent = maxent.weight_entropy(w, mask)

    # or all of it, plus the tau controller, in one jitted call:
    state = controllers.init_controller(tau=0.5, beta=0.04)
    out = maxent.maxent_step(state, rewards, ref_logp, mask=mask,
                             schedule=controllers.TauSchedule(target_entropy=0.5, learning_rate=0.1))

References:
  maxent-grpo, ``maxent_grpo.rewards.maxent`` / ``maxent_grpo.training``,
  https://github.com/liv-daliberti/maxent-grpo ;
  Shao et al., "DeepSeekMath" (GRPO), arXiv:2402.03300 ;
  Liu et al., "Understanding R1-Zero-Like Training" (Dr.GRPO), arXiv:2503.20783 ;
  Ahmadian et al., "Back to Basics" (RLOO), arXiv:2402.14740 ;
  Chen et al., "SEED-GRPO", arXiv:2505.12346.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ._util import check_rank, check_same_shape
from .controllers import ControllerState, KLController, TauSchedule, update_beta, update_tau

Array = jax.Array

__all__ = [
    "SCALES",
    "BASELINES",
    "NO_ANSWER",
    "group_advantages",
    "reward_moments",
    "zero_truncated",
    "truncation_flags",
    "q_distribution",
    "weight_matrix",
    "uniform_weights",
    "WeightEntropy",
    "weight_entropy",
    "effective_sample_size",
    "semantic_entropy",
    "seed_grpo_scale",
    "extract_answer",
    "cluster_ids",
    "pad_groups",
    "RewardStatistics",
    "compute_reward_statistics",
    "MaxEntStepOutput",
    "maxent_step",
]

SCALES = ("group", "batch", "none")
BASELINES = ("mean", "leave_one_out")
NO_ANSWER = "NO_ANSWER_FOUND"

_Q_FLOOR = 1e-12
_W_FLOOR = 1e-12
_T_FLOOR = 1e-8
_ZERO_STD = 1e-8


# ------------------------------------------------------------------ helpers
def _matrix(x: Any, name: str) -> Array:
    check_rank(x, 2, name)
    return jnp.asarray(x, jnp.float32)


def _mask(mask: Any, ref: Array, ref_name: str, name: str = "mask") -> Array:
    if mask is None:
        return jnp.ones(ref.shape, bool)
    check_rank(mask, 2, name)
    check_same_shape(ref, mask, ref_name, name)
    return jnp.asarray(mask, bool)


def _other(x: Any, ref: Array, ref_name: str, name: str) -> Array:
    check_rank(x, 2, name)
    check_same_shape(ref, x, ref_name, name)
    return jnp.asarray(x, jnp.float32)


def _check_scale(scale: str, baseline: str, ddof: Any) -> int:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if isinstance(ddof, bool) or not isinstance(ddof, int | np.integer) or ddof < 0:
        raise ValueError(f"ddof must be a static int >= 0, got {ddof!r}")
    return int(ddof)


def _rowsum(x: Array) -> Array:
    return jnp.sum(x, axis=-1)


def _pool(sums: Sequence[Array] = (), maxes: Sequence[Array] = ()) -> tuple[list[Array], list[Array]]:
    """Sums and maxes of several f32[P] vectors, one stacked reduction each.

    A handful of scalar diagnostics computed one by one would each be a
    separate (tiny) kernel; stacked they cost one.
    """
    s = list(jnp.sum(jnp.stack([jnp.asarray(x, jnp.float32) for x in sums]), axis=1)) if sums else []
    m = list(jnp.max(jnp.stack([jnp.asarray(x, jnp.float32) for x in maxes]), axis=1,
                     initial=-jnp.inf)) if maxes else []
    return s, m


class _Moments(flax.struct.PyTreeNode):
    """Row moments in units of a power-of-two row scale ``s``.

    ``cs = (u - mean) / s`` on valid entries (0 elsewhere), ``ss_s = sum cs^2``.
    """

    n: Array  # f32[P] valid count
    s: Array  # f32[P] power-of-two row scale
    mean: Array  # f32[P] row mean (raw units)
    ss_s: Array  # f32[P] sum of squared deviations (scaled)
    cs: Array  # f32[P, G] centred scaled values (0 where invalid)


def _count_rows(mask_in: Array, finite: Array, valid_w: Array | None = None) -> tuple[Array, Array, Array]:
    """Per-row ``(n_valid, n_valid_w, n_nonfinite)`` as float32.

    For ``G <= 255`` the three integer counts are packed into one float32 sum
    (base 256; every partial sum is an integer < 2^24, so it is exact in any
    order) so the whole mask is reduced in a single pass.
    """
    valid = mask_in & finite
    bad = mask_in & ~finite
    vw = valid if valid_w is None else valid_w
    g = mask_in.shape[-1]
    if g <= 255:
        b = 256.0
        packed = jnp.where(valid, jnp.where(vw, b + 1.0, b), jnp.where(bad, b * b, 0.0))
        tot = jnp.sum(packed, axis=-1)
        nf = jnp.floor(tot / (b * b))
        rest = tot - nf * (b * b)
        n = jnp.floor(rest / b)
        return n, rest - n * b, nf
    count = functools.partial(jnp.sum, axis=-1, dtype=jnp.float32)
    n = count(valid)
    return n, (n if valid_w is None else count(vw)), count(bad)


def _row_max(u0: Array, valid: Array) -> Array:
    """f32[P] max of the valid entries of each row (0 for an empty row)."""
    mx = jnp.max(jnp.where(valid, u0, -jnp.inf), axis=-1, initial=-jnp.inf)
    return jax.lax.stop_gradient(jnp.where(jnp.isfinite(mx), mx, 0.0))


def _row_moments(u0: Array, valid: Array, n: Array, umax: Array) -> _Moments:
    """Two-pass row moments of ``u0`` (zero off ``valid``), overflow-safe.

    Values are shifted by the row max ``umax`` (which the q-distribution needs
    anyway): a constant group then has deviations that are exactly 0, and the
    shifted mean is summed in units of a power of two >= G (exact, cannot
    overflow). Deviations are divided by a power of two
    ``s >= n * (max - mean)`` (plus the mean's rounding error), which bounds
    every ``|u - mean|`` because the deviations below the mean add up to
    those above it, so their squares never overflow; dividing by a power of
    two is exact, so nothing is lost where the plain formula would not have
    overflowed.
    """
    g = u0.shape[-1]
    k = float(2.0 ** int(np.ceil(np.log2(max(g, 1)))))
    v = jnp.where(valid, u0 - umax[:, None], 0.0)  # <= 0
    mean_v = jnp.sum(v * (1.0 / k), axis=-1) * k / jnp.maximum(n, 1.0)
    d = jnp.maximum(-mean_v, 0.0)
    err = n * (n + 1.0) * 2.0**-22 * d  # > the float32 rounding error of mean_v
    spread = jnp.where(n > 1, (n + 1.0) * (d + 2.0 * err), 0.0)
    _, ex = jnp.frexp(spread)
    ex = jnp.clip(ex, -125, 125)
    inv_s = jnp.ldexp(jnp.float32(1.0), -ex)
    s = jnp.ldexp(jnp.float32(1.0), ex)
    cs = jnp.where(valid, (v - mean_v[:, None]) * inv_s[:, None], 0.0)
    return _Moments(n=n, s=s, mean=umax + mean_v, ss_s=_rowsum(cs * cs), cs=cs)


def _batch_moments(m: _Moments, extra_sums: Sequence[Array] = ()) -> tuple[Array, Array, Array, Array, list]:
    """Pooled ``(N, S, mean, SS, extra)`` of all valid entries, in units of a power of two ``S``.

    Combines the row moments with the parallel-variance formula (no second
    pass over the data). ``S`` bounds every row's mean and spread, so the
    between-row squares cannot overflow either. ``extra_sums`` (f32[P]
    vectors) are summed in the same reduction and returned as ``extra``.
    """
    nonempty = m.n > 0
    (mag,) = _pool(maxes=[jnp.where(nonempty, jnp.maximum(jnp.abs(m.mean), m.s), 0.0)])[1]
    _, ex = jnp.frexp(jnp.maximum(mag, 0.0))
    ex = jnp.clip(ex, -125, 125)
    S = jnp.ldexp(jnp.float32(1.0), ex)
    inv = jnp.ldexp(jnp.float32(1.0), -ex)
    r = m.s * inv
    mean_r = m.mean * inv
    sums, _ = _pool(sums=[m.n, m.n * mean_r, *extra_sums])
    N, total = sums[0], sums[1]
    mean = total / jnp.maximum(N, 1.0)
    ss = jnp.sum(m.ss_s * r * r + m.n * jnp.square(mean_r - mean) * nonempty)
    return N, S, mean, ss, sums[2:]


def _std_from(ss: Array, n: Array, ddof: int) -> Array:
    dof = n - ddof
    return jnp.where(dof > 0, jnp.sqrt(ss / jnp.maximum(dof, 1.0)), 0.0)


def _advantages_from(m: _Moments, valid: Array, scale: str, eps: Array, ddof: int,
                     baseline: str) -> Array:
    cs = m.cs
    if baseline == "leave_one_out":
        factor = jnp.where(m.n > 1, m.n / jnp.maximum(m.n - 1.0, 1.0), 0.0)
        cs = cs * factor[:, None]
    if scale == "none":
        a = cs * m.s[:, None]
    elif scale == "group":
        std_s = _std_from(m.ss_s, m.n, ddof)
        # c / (std + eps) written in scaled units: cs / (std_s + eps / s)
        a = cs / (std_s + eps / m.s)[:, None]
    else:  # batch
        N, s_max, _, ss, _ = _batch_moments(m)
        std_b = _std_from(ss, N, ddof)
        r = m.s / s_max
        a = cs * (r / (std_b + eps / s_max))[:, None]
    # groups of size 1 (and empty rows) get 0 whatever the scale
    return jnp.where(valid & (m.n > 1)[:, None], a, 0.0)


# ---------------------------------------------------------------- advantages
def group_advantages(
    utilities: Any,
    mask: Any = None,
    *,
    scale: str = "group",
    eps: Any = 1e-4,
    ddof: int = 1,
    baseline: str = "mean",
) -> Array:
    """Group-relative advantages (GRPO / Dr.GRPO / RLOO, TRL / verl / OpenRLHF options).

    With ``b`` the mean of the valid utilities of the row and ``c = u - b``
    (``baseline="leave_one_out"``: ``c = n / (n - 1) * (u - b)``, the RLOO
    baseline):

    - ``scale="group"``: ``A = c / (std of the row + eps)`` (GRPO);
    - ``scale="batch"``: ``A = c / (std of all valid utilities + eps)``
      (TRL ``scale_rewards="batch"``);
    - ``scale="none"``: ``A = c`` (Dr.GRPO).

    ``std`` uses ``ddof`` (0 when ``n - ddof <= 0``). Groups of size 1 and empty
    rows give 0. Defaults match TRL (``eps=1e-4``, ``ddof=1``); verl uses
    ``eps=1e-6``, OpenRLHF's ``group_norm`` ``eps=1e-9``. Magnitudes up to the
    float32 range do not overflow (moments are taken in power-of-two scaled
    units).

    Args:
      utilities: f32[P, G] rewards.
      mask: bool[P, G] or None; invalid = masked out or non-finite.
      scale: ``"group"``, ``"batch"`` or ``"none"``.
      eps: f32[] added to the std (may be traced).
      ddof: static int, delta degrees of freedom of the std.
      baseline: ``"mean"`` or ``"leave_one_out"``.

    Returns:
      f32[P, G] advantages, 0 on invalid entries.

    Example::

        group_advantages(jnp.array([[1., 0., 0., 1.]]))   # [[0.866, -0.866, -0.866, 0.866]]
    """
    ddof = _check_scale(scale, baseline, ddof)
    u = _matrix(utilities, "utilities")
    m_in = _mask(mask, u, "utilities")
    finite = jnp.isfinite(u)
    valid = m_in & finite
    n, _, _ = _count_rows(m_in, finite)
    u0 = jnp.where(valid, u, 0.0)
    mom = _row_moments(u0, valid, n, _row_max(u0, valid))
    return _advantages_from(mom, valid, scale, jnp.asarray(eps, jnp.float32), ddof, baseline)


def reward_moments(utilities: Any, mask: Any = None) -> tuple[Array, Array]:
    """Mean and **population** std of all valid utilities.

    Args:
      utilities: f32[P, G].
      mask: bool[P, G] or None.

    Returns:
      ``(mean f32[], std f32[])``; ``n <= 1`` gives std 0, ``n = 0`` gives (0, 0).
    """
    u = _matrix(utilities, "utilities")
    m_in = _mask(mask, u, "utilities")
    finite = jnp.isfinite(u)
    valid = m_in & finite
    n, _, _ = _count_rows(m_in, finite)
    u0 = jnp.where(valid, u, 0.0)
    return _moments_from(_row_moments(u0, valid, n, _row_max(u0, valid)))[:2]


def _moments_from(m: _Moments, extra_sums: Sequence[Array] = ()) -> tuple[Array, Array, list]:
    N, S, mean, ss, extra = _batch_moments(m, extra_sums)
    std = _std_from(ss, N, 0)
    return mean * S, jnp.where(N > 1, std * S, 0.0), extra


def zero_truncated(utilities: Any, truncated: Any) -> Array:
    """``where(truncated, 0, utilities)``: rewards of truncated completions set to 0.

    Args:
      utilities: f32[P, G].
      truncated: bool[P, G] (:func:`truncation_flags` builds it on the host).
    """
    u = _matrix(utilities, "utilities")
    t = _mask(truncated, u, "utilities", "truncated")
    return jnp.where(t, 0.0, u)


def _pad(rows: Any, fill: Any, dtype: Any) -> np.ndarray:
    """Nested (possibly ragged) ``[P][G]`` sequence -> ``[P, Gmax]`` array."""
    if isinstance(rows, np.ndarray | jax.Array):
        return np.asarray(rows, dtype)
    rows = [list(r) if isinstance(r, Sequence | np.ndarray) and not isinstance(r, str) else [r]
            for r in rows]
    g = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), g), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def pad_groups(groups: Sequence[Sequence[float]], fill: float = np.nan) -> tuple[np.ndarray, np.ndarray]:
    """Host helper: ragged per-prompt lists -> ``(f32[P, Gmax], mask bool[P, Gmax])``.

    Example::

        u, mask = pad_groups([[1.0, 0.0, 1.0], [0.5]])   # u.shape == (2, 3)
    """
    mask = _pad([[True] * len(g) for g in groups], False, bool)
    vals = _pad([list(g) for g in groups], fill, np.float32)
    return vals, mask


def truncation_flags(
    finish_reasons: Sequence[Any],
    token_counts: Any,
    max_completion_len: int,
    explicit: Any = None,
) -> np.ndarray:
    """Host helper: which completions were truncated (their reward is then zeroed).

    An entry is truncated if its ``explicit`` flag is truthy, else if
    ``finish_reason.strip().lower() == "length"``, else if
    ``max_completion_len > 0`` and ``token_count >= max_completion_len``.

    Args:
      finish_reasons: ``[P][G]`` (ragged ok) or flat sequence of strings / None.
      token_counts: matching numbers of completion tokens.
      max_completion_len: generation length limit (``<= 0``: not used).
      explicit: optional matching truthy flags (None entries fall through).

    Returns:
      bool array of the padded shape (padding False).
    """
    nested = len(finish_reasons) > 0 and not isinstance(finish_reasons[0], str | type(None))
    rows = finish_reasons if nested else [finish_reasons]
    toks = token_counts if nested else [token_counts]
    expl = explicit if explicit is None or nested else [explicit]
    out = []
    for i, reasons in enumerate(rows):
        row = []
        for j, reason in enumerate(reasons):
            flag = None if expl is None else expl[i][j]
            if flag is not None and bool(flag):
                row.append(True)
                continue
            if isinstance(reason, str) and reason.strip().lower() == "length":
                row.append(True)
                continue
            tok = toks[i][j]
            row.append(bool(max_completion_len > 0 and tok is not None and tok >= max_completion_len))
        out.append(row)
    arr = _pad(out, False, bool)
    return arr if nested else arr[0]


# ------------------------------------------------------------ q distribution
def _q_from(u: Array, valid: Array, n: Array, temperature: Array, epsilon: Array,
            umax: Array | None = None) -> tuple[Array, Array]:
    """``(q, log q)`` of valid entries; invalid entries 0 / 0. ``umax``: f32[P] row max."""
    t = jnp.maximum(temperature, _T_FLOOR)
    if umax is None:
        umax = _row_max(u, valid)
    umax = umax[:, None]
    # subtract the max before dividing by T: (u - max) / T never overflows upward
    e = jnp.where(valid, jnp.exp(jnp.where(valid, u - umax, 0.0) / t), 0.0)
    # the row max contributes exp(0) = 1, so the sum is >= 1 on non-empty rows
    total = jnp.sum(e, axis=-1, keepdims=True)
    nk = n[:, None]
    cap = jnp.where(nk > 0, 1.0 / jnp.maximum(nk, 1.0) - 1e-8, 0.0)
    eps = jnp.clip(epsilon, 0.0, cap)
    # p * (1 - e n) + e sums to (1 - e n) + e n = 1 exactly in real arithmetic, so the
    # final renormalisation of the spec only moves q by rounding; it is folded away
    # here to save a pass over the data.
    q = jnp.where(valid, e * ((1.0 - eps * nk) / jnp.maximum(total, _Q_FLOOR)) + eps, 0.0)
    logq = jnp.where(valid, jnp.log(jnp.where(valid, jnp.maximum(q, _Q_FLOOR), 1.0)), 0.0)
    return q, logq


def q_distribution(
    utilities: Any,
    mask: Any = None,
    *,
    temperature: Any = 1.0,
    epsilon: Any = 1e-6,
) -> Array:
    """Listwise target ``q``: a smoothed softmax of each group's utilities.

    ``T = max(temperature, 1e-8)``; ``p = softmax(u / T)`` over the valid entries
    (max-subtracted, so ``1e30`` or ``T = 0`` never overflow);
    ``e = clip(epsilon, 0, 1/n - 1e-8)``; ``p = p * (1 - e*n) + e``;
    ``q = p / max(sum p, 1e-12)``. The cap on ``e`` keeps the order of ``q``
    the order of ``u`` (at the cap the row is nearly uniform).

    Args:
      utilities: f32[P, G] rewards (after zero-truncation; never advantages).
      mask: bool[P, G] or None.
      temperature: f32[] softmax temperature (traceable; 0 = argmax, ties shared).
      epsilon: f32[] smoothing floor.

    Returns:
      f32[P, G], each non-empty row a distribution over its valid entries.

    Example::

        q_distribution(jnp.array([[.5, 1., 2.]]), temperature=0.5)   # [[.042, .114, .844]]
    """
    u = _matrix(utilities, "utilities")
    valid = _mask(mask, u, "utilities") & jnp.isfinite(u)
    n = jnp.sum(valid, axis=-1, dtype=jnp.float32)
    q, _ = _q_from(u, valid, n, jnp.asarray(temperature, jnp.float32), jnp.asarray(epsilon, jnp.float32))
    return q


# -------------------------------------------------------------------- weights
def _resolve_denom(tau: Array, denom: Any) -> Array:
    tau_d = jnp.where(tau > 0, tau, _T_FLOOR)
    if denom is None:
        return tau_d
    d = jnp.asarray(denom, jnp.float32)
    return jnp.where(d > 0, d, tau_d)


def _weights_from(logq: Array, ref: Array | None, tok: Array | None, valid: Array, n: Array,
                  tau: Array, beta: Array, denom: Any) -> tuple[Array, Array, Array | None]:
    """Weights (0 off the mask) plus ``log max(w, 1e-12)`` (finite everywhere).

    Returns ``(w, lw, row_max)``; ``row_max`` (the largest weight of each row) is
    known in closed form without token normalisation and ``None`` with it.
    A row whose largest score is +-inf shares its mass equally among the
    entries equal to that score (all -inf: uniform).
    """
    d = _resolve_denom(tau, denom)
    num = logq
    if ref is not None:
        num = num + jnp.where(beta > 0, beta, 0.0) * ref
    s = jnp.where(valid, num / d, -jnp.inf)
    mx = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True, initial=-jnp.inf))
    # an infinite max (overflowed scores) shares the mass among the entries equal to it
    z = jnp.where(jnp.isfinite(mx), s - mx, jnp.where(s == mx, 0.0, -jnp.inf))
    e = jnp.where(valid, jnp.exp(z), 0.0)
    if tok is not None:
        tok = jnp.maximum(tok, 1.0)
        e = e * tok
    tot = jnp.sum(e, axis=-1, keepdims=True)
    tot = jnp.where(tot > 0, tot, 1.0)
    w = e / tot
    # log w = z [+ log tok] - log(sum): no transcendental on the scores, and log(tok)
    # does not depend on tau / beta / temperature, so a vmapped sweep computes it once
    lw = z - jnp.log(tot)
    if tok is not None:
        lw = lw + jnp.log(tok)
    lw = jnp.maximum(lw, jnp.log(jnp.float32(_W_FLOOR)))
    row_max = jnp.where(n > 0, 1.0 / tot[:, 0], 0.0) if tok is None else None
    return w, lw, row_max


def weight_matrix(
    q: Any,
    ref_logp: Any,
    token_counts: Any = None,
    mask: Any = None,
    *,
    tau: Any,
    beta: Any,
    denom: Any = None,
    include_reference_term: bool = True,
    normalize_by_tokens: bool = True,
) -> Array:
    """MaxEnt sequence weights ``w ~ q^(1/d) * pi_ref^(beta/d)`` per group.

    ``d = denom if denom > 0 else (tau if tau > 0 else 1e-8)``;
    ``s = (log max(q, 1e-12) + [include_reference_term and beta > 0] * beta * ref_logp) / d``;
    ``w = softmax(s)`` over each row's valid entries; with
    ``normalize_by_tokens`` and ``token_counts``: ``w *= max(tok, 1)`` and the
    row is renormalised. A row whose scores are all ``-inf`` gets uniform
    weights. maxent_grpo's call sites use ``normalize_by_tokens=False``.

    An entry is valid if masked in and ``q`` is finite, and (with the reference
    term) ``ref_logp`` is finite, and (with token normalisation) its token
    count is finite. ``jax.grad`` with respect to ``tau``, ``beta`` and
    ``denom`` is finite (invalid inputs are replaced before any arithmetic).

    Args:
      q: f32[P, G] listwise target (:func:`q_distribution`).
      ref_logp: f32[P, G] length-normalised reference sequence log-probs.
      token_counts: f32[P, G] completion lengths or None.
      mask: bool[P, G] or None.
      tau: f32[] temperature (traceable).
      beta: f32[] reference coefficient (traceable).
      denom: f32[] denominator or None (= tau).
      include_reference_term: static, use the ``beta * ref_logp`` term.
      normalize_by_tokens: static, multiply by token counts and renormalise.

    Returns:
      f32[P, G] weights; each non-empty row sums to 1, invalid entries are 0.

    Example::

        w = weight_matrix(q, ref_logp, tau=0.5, beta=0.1)
        dw_dtau = jax.jacfwd(lambda t: weight_matrix(q, ref_logp, tau=t, beta=0.1))(0.5)
    """
    qa = _matrix(q, "q")
    valid = _mask(mask, qa, "q") & jnp.isfinite(qa)
    ref = None
    if include_reference_term:
        ref = _other(ref_logp, qa, "q", "ref_logp")
        valid = valid & jnp.isfinite(ref)
    else:
        check_rank(ref_logp, 2, "ref_logp")
        check_same_shape(qa, ref_logp, "q", "ref_logp")
    tok = None
    if normalize_by_tokens and token_counts is not None:
        tok = _other(token_counts, qa, "q", "token_counts")
        valid = valid & jnp.isfinite(tok)
    elif token_counts is not None:
        check_same_shape(qa, token_counts, "q", "token_counts")
    n = jnp.sum(valid, axis=-1, dtype=jnp.float32)
    logq = jnp.where(valid, jnp.log(jnp.maximum(jnp.where(valid, qa, 1.0), _Q_FLOOR)), 0.0)
    ref = None if ref is None else jnp.where(valid, ref, 0.0)
    tok = None if tok is None else jnp.where(valid, tok, 1.0)
    tau = jnp.asarray(tau, jnp.float32)
    beta = jnp.asarray(beta, jnp.float32)
    return _weights_from(logq, ref, tok, valid, n, tau, beta, denom)[0]


def uniform_weights(mask: Any) -> Array:
    """``1/n`` on the masked-in entries of each row, 0 elsewhere.

    Args:
      mask: bool[P, G].

    Returns:
      f32[P, G].
    """
    check_rank(mask, 2, "mask")
    m = jnp.asarray(mask, bool)
    n = jnp.sum(m, axis=-1, keepdims=True, dtype=jnp.float32)
    return jnp.where(m, 1.0 / jnp.maximum(n, 1.0), 0.0)


# -------------------------------------------------------------------- entropy
@flax.struct.dataclass
class WeightEntropy:
    """Entropy statistics of a weight matrix.

    Attributes:
      mean, min, max: f32[] over rows with at least one valid entry (0 if none).
      per_group: f32[P] ``-sum w log max(w, 1e-12)`` (not renormalised).
      normalized: f32[] mean over all rows of ``H(w') / ln n`` (``w'`` the
        floored, renormalised row; rows with ``n <= 1`` count 0).
      advantage: f32[P, G] ``w - 1/n`` on valid entries, 0 elsewhere.
    """

    mean: Array
    min: Array
    max: Array
    per_group: Array
    normalized: Array
    advantage: Array


def _entropy_from(w: Array, lw: Array, valid: Array, n: Array, rows_normalised: bool,
                  extra_sums: Sequence[Array] = (), extra_maxes: Sequence[Array] = ()):
    """Entropy statistics from weights ``w`` (0 off the mask) and ``lw = log max(w, 1e-12)``.

    With ``rows_normalised`` (every non-empty row sums to 1, as the weights of
    :func:`weight_matrix` do) the floored, renormalised entropy equals the
    plain one up to ``G * 1e-12 * 28`` (far below float32 resolution), so it
    is not computed twice. ``extra_sums`` / ``extra_maxes`` (f32[P]) ride along
    in the same pooled reductions; with any given, returns
    ``(WeightEntropy, sums, maxes)``.
    """
    per_group = 0.0 - _rowsum(w * lw)
    nonempty = n > 0
    if rows_normalised:
        h_norm = per_group
    else:
        # H(w') with w' = wc / S, reusing log(wc): H = log S - sum(wc log wc) / S
        wc = jnp.where(valid, jnp.maximum(w, _W_FLOOR), 0.0)
        S = _rowsum(wc)
        Sg = jnp.where(S > 0, S, 1.0)
        h_norm = jnp.log(Sg) - _rowsum(wc * lw) / Sg
    ratio = jnp.where(n > 1, h_norm / jnp.log(jnp.maximum(n, 2.0)), 0.0)
    sums, maxes = _pool(
        sums=[nonempty, jnp.where(nonempty, per_group, 0.0), ratio, *extra_sums],
        maxes=[jnp.where(nonempty, -per_group, -jnp.inf), jnp.where(nonempty, per_group, -jnp.inf), *extra_maxes],
    )
    rows, total, ratio_sum = sums[:3]
    has = rows > 0
    mean = jnp.where(has, total / jnp.maximum(rows, 1.0), 0.0)
    mn = jnp.where(has, -maxes[0], 0.0)
    mx = jnp.where(has, maxes[1], 0.0)
    normalized = ratio_sum / max(n.shape[0], 1)
    adv = jnp.where(valid, w - 1.0 / jnp.maximum(n, 1.0)[:, None], 0.0)
    ent = WeightEntropy(mean=mean, min=mn, max=mx, per_group=per_group, normalized=normalized, advantage=adv)
    if extra_sums or extra_maxes:
        return ent, sums[3:], maxes[2:]
    return ent


def weight_entropy(weights: Any, mask: Any = None) -> WeightEntropy:
    """Entropy statistics of per-group weights (maxent_grpo ``WeightStats``).

    Args:
      weights: f32[P, G].
      mask: bool[P, G] or None; non-finite weights count as masked.

    Returns:
      :class:`WeightEntropy`.

    Example::

        weight_entropy(jnp.array([[.1, .2, .7]])).mean   # 0.8018
    """
    w = _matrix(weights, "weights")
    valid = _mask(mask, w, "weights") & jnp.isfinite(w)
    n = jnp.sum(valid, axis=-1, dtype=jnp.float32)
    wv = jnp.where(valid, w, 0.0)
    lw = jnp.where(valid, jnp.log(jnp.where(valid, jnp.maximum(wv, _W_FLOOR), 1.0)), 0.0)
    return _entropy_from(wv, lw, valid, n, rows_normalised=False)


def _ess_from(w: Array, valid: Array) -> Array:
    wv = jnp.where(valid, w, 0.0)
    s1 = _rowsum(wv)
    s2 = _rowsum(wv * wv)
    return jnp.where(s2 > 0, s1 * s1 / jnp.where(s2 > 0, s2, 1.0), 0.0)


def effective_sample_size(weights: Any, mask: Any = None) -> Array:
    """Kish effective sample size ``(sum w)^2 / sum w^2`` of each row.

    Args:
      weights: f32[P, G] non-negative weights.
      mask: bool[P, G] or None.

    Returns:
      f32[P] in ``[1, n]``; empty or all-zero rows give 0.
    """
    w = _matrix(weights, "weights")
    valid = _mask(mask, w, "weights") & jnp.isfinite(w)
    return _ess_from(w, valid)


# ------------------------------------------------------------------ SEED-GRPO
def _masked_lse(x: Array, m: Array, axis: int) -> Array:
    """logsumexp over ``m``; empty -> -inf; any +inf -> +inf (never NaN)."""
    xm = jnp.where(m, x, -jnp.inf)
    mx = jnp.max(xm, axis=axis, keepdims=True, initial=-jnp.inf)
    mx_safe = jnp.where(jnp.isfinite(mx), mx, 0.0)
    s = jnp.sum(jnp.where(m, jnp.exp(jnp.where(m, xm - mx_safe, -jnp.inf)), 0.0), axis=axis, keepdims=True)
    out = jnp.where(jnp.isfinite(mx), jnp.log(jnp.where(s > 0, s, 1.0)) + mx_safe, mx)
    return jnp.squeeze(out, axis)


def semantic_entropy(cluster_ids: Any, seq_logp: Any, mask: Any = None) -> Array:
    """Semantic entropy of each group (SEED-GRPO).

    ``Z`` = logsumexp of the row's valid ``seq_logp``; for each cluster ``k``
    present, ``c_k = logsumexp(seq_logp of k's members) - Z``;
    ``H = -sum_k exp(c_k) c_k``, skipping non-finite terms. Ids outside
    ``[0, G)`` and NaN log-likelihoods count as masked; an empty row or a
    non-finite ``Z`` gives 0.

    Args:
      cluster_ids: i32[P, G] (:func:`cluster_ids` on the host; padding -1).
      seq_logp: f32[P, G] sequence log-likelihoods (length-normalised or not).
      mask: bool[P, G] or None.

    Returns:
      f32[P].

    References:
      Chen et al., "SEED-GRPO: Semantic Entropy Enhanced GRPO", arXiv:2505.12346.
    """
    check_rank(cluster_ids, 2, "cluster_ids")
    ids = jnp.asarray(cluster_ids, jnp.int32)
    lp = _other(seq_logp, ids, "cluster_ids", "seq_logp")
    g = ids.shape[1]
    valid = _mask(mask, lp, "seq_logp") & (ids >= 0) & (ids < g) & ~jnp.isnan(lp)
    z = _masked_lse(lp, valid, axis=1)  # [P]
    member = (ids[:, :, None] == jnp.arange(g, dtype=jnp.int32)) & valid[:, :, None]  # [P, G, K]
    lse_k = _masked_lse(lp[:, :, None], member, axis=1)  # [P, K]
    present = jnp.any(member, axis=1)
    ok_z = jnp.isfinite(z)
    c = lse_k - jnp.where(ok_z, z, 0.0)[:, None]
    term = jnp.exp(c) * c
    keep = present & jnp.isfinite(term)
    h = -jnp.sum(jnp.where(keep, term, 0.0), axis=1)
    return jnp.where(ok_z, h, 0.0)


def seed_grpo_scale(
    entropy: Any,
    alpha: Any = 0.0417,
    num_generations: Any = None,
    normalize_by_max_entropy: bool = True,
) -> Array:
    """SEED-GRPO advantage scale ``1 / (1 + a * H)``.

    ``Hmax = ln G`` if ``G > 1`` else 0; ``a = alpha / Hmax`` when normalising
    and ``Hmax > 0``, else ``alpha``. Non-finite scales become 1.

    Args:
      entropy: f32[P] semantic entropies (:func:`semantic_entropy`).
      alpha: f32[] strength.
      num_generations: G, generations per prompt (required; may be traced).
      normalize_by_max_entropy: static, divide ``alpha`` by ``ln G``.

    Returns:
      f32[P] multipliers of the advantages.
    """
    if num_generations is None:
        raise ValueError("num_generations (G, the generations per prompt) is required")
    h = jnp.asarray(entropy, jnp.float32)
    a, _ = _seed_alpha(alpha, num_generations, normalize_by_max_entropy)
    sc = 1.0 / (1.0 + a * h)
    return jnp.where(jnp.isfinite(sc), sc, 1.0)


def _seed_alpha(alpha: Any, g: Any, normalize: bool) -> tuple[Array, Array]:
    g = jnp.asarray(g, jnp.float32)
    hmax = jnp.where(g > 1, jnp.log(jnp.maximum(g, 1.0)), 0.0)
    alpha = jnp.asarray(alpha, jnp.float32)
    if normalize:
        a = jnp.where(hmax > 0, alpha / jnp.where(hmax > 0, hmax, 1.0), alpha)
    else:
        a = alpha
    return a, hmax


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER = re.compile(r"(?si)<answer>\s*(.*?)\s*</answer>")


def _balanced(text: str, start: int) -> str | None:
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_answer(text: str | None) -> str:
    """Host helper: the final answer of a completion (SEED-GRPO clustering key).

    The payload of the **last** ``\\boxed{...}`` / ``\\fbox{...}`` whose braces
    balance (stripped), else the first ``<answer>...</answer>`` (case-insensitive,
    across lines), else :data:`NO_ANSWER` (``"NO_ANSWER_FOUND"``).

    Example::

        extract_answer(r"so \\boxed{\\frac{1}{2}}")   # '\\frac{1}{2}'
    """
    if not text:
        return NO_ANSWER
    for m in reversed(list(_BOX.finditer(text))):
        body = _balanced(text, m.end())
        if body is not None:
            return body.strip()
    m = _ANSWER.search(text)
    if m is not None:
        return m.group(1)
    return NO_ANSWER


def cluster_ids(answers: Sequence[Sequence[str]]) -> np.ndarray:
    """Host helper: cluster id of each answer within its group.

    Exact string match, ids in first-seen order; every :data:`NO_ANSWER` gets
    its own fresh id after the largest real id (a group without answers gets
    ``0..n-1``). Ragged groups are padded with -1.

    Args:
      answers: ``[P][G]`` strings (e.g. ``extract_answer`` of each completion).

    Returns:
      i32[P, Gmax].

    Example::

        cluster_ids([["4", "5", "4", "NO_ANSWER_FOUND"]])   # [[0, 1, 0, 2]]
    """
    rows = []
    for group in answers:
        seen: dict[str, int] = {}
        ids = []
        for a in group:
            if a == NO_ANSWER:
                ids.append(None)
            else:
                ids.append(seen.setdefault(a, len(seen)))
        nxt = len(seen)
        out = []
        for i in ids:
            if i is None:
                out.append(nxt)
                nxt += 1
            else:
                out.append(i)
        rows.append(out)
    return _pad(rows, -1, np.int32)


# ----------------------------------------------------------- reward statistics
@flax.struct.dataclass
class RewardStatistics:
    """Everything :func:`compute_reward_statistics` computes in one call.

    Attributes:
      utilities: f32[P, G] rewards after zero-truncation (0 where invalid).
      valid: bool[P, G] masked in and finite.
      advantages: f32[P, G] (SEED-scaled when SEED is on).
      q: f32[P, G] listwise target from the (truncated) utilities.
      mean, std: f32[] moments of all valid utilities (population std).
      zero_std: bool[P] non-empty rows with population std <= 1e-8.
      frac_zero_std: f32[] fraction of non-empty rows with zero std
        (TRL's ``frac_reward_zero_std``).
      num_nonfinite: i32[] masked-in entries whose reward was NaN / inf
        (excluded).
      seed_entropy: f32[P] semantic entropy (0 when SEED is off).
      seed_scale: f32[P] advantage multiplier (1 when off).
      seed_alpha_effective, seed_max_entropy: f32[] (0 when off).
    """

    utilities: Array
    valid: Array
    advantages: Array
    q: Array
    mean: Array
    std: Array
    zero_std: Array
    frac_zero_std: Array
    num_nonfinite: Array
    seed_entropy: Array
    seed_scale: Array
    seed_alpha_effective: Array
    seed_max_entropy: Array


def _zero_std_rows(m: _Moments) -> tuple[Array, Array]:
    """bool[P] zero-std rows (non-empty, population std <= 1e-8) and f32[P] non-empty flags."""
    pop = m.s * jnp.sqrt(m.ss_s / jnp.maximum(m.n, 1.0))
    nonempty = m.n > 0
    return nonempty & (pop <= _ZERO_STD), nonempty


def _utility_inputs(utilities: Any, mask: Any, truncated: Any) -> tuple[Array, Array, Array]:
    """``(u f32[P, G], mask bool[P, G], finite bool[P, G])`` after validation and zero-truncation."""
    u = _matrix(utilities, "utilities")
    m_in = _mask(mask, u, "utilities")
    if truncated is not None:
        u = zero_truncated(u, truncated)
    return u, m_in, jnp.isfinite(u)


def _utility_statistics(u: Array, valid: Array, n: Array, nf: Array, scale: str, eps: Any, ddof: int,
                        baseline: str):
    """Zero the invalid utilities, then row max, moments, the zero-std statistics and the advantages."""
    u = jnp.where(valid, u, 0.0)
    umax = _row_max(u, valid)
    mom = _row_moments(u, valid, n, umax)
    stats = _moments_and_zero_std(mom, nf)
    adv = _advantages_from(mom, valid, scale, jnp.asarray(eps, jnp.float32), ddof, baseline)
    return u, umax, mom, stats, adv


def _moments_and_zero_std(m: _Moments, nf: Array) -> tuple[Array, Array, Array, Array, Array]:
    """``(mean, std, zero_std, frac_zero_std, num_nonfinite)`` with one pooled reduction."""
    zero, nonempty = _zero_std_rows(m)
    mean, std, (zeros, rows, nfs) = _moments_from(m, [zero, nonempty, nf])
    frac = jnp.where(rows > 0, zeros / jnp.maximum(rows, 1.0), 0.0)
    return mean, std, zero, frac, nfs.astype(jnp.int32)


def compute_reward_statistics(
    utilities: Any,
    mask: Any = None,
    *,
    truncated: Any = None,
    q_temperature: Any = 1.0,
    q_epsilon: Any = 1e-6,
    scale: str = "group",
    eps: Any = 1e-4,
    ddof: int = 1,
    baseline: str = "mean",
    seed_cluster_ids: Any = None,
    seed_logp_sum: Any = None,
    seed_token_counts: Any = None,
    seed_alpha: Any = 0.0417,
    seed_normalize_by_max_entropy: bool = True,
    seed_length_normalize: bool = True,
    seed_num_generations: Any = None,
) -> RewardStatistics:
    """Reward pipeline of maxent_grpo in one fused call.

    Order: zero-truncation -> moments -> advantages -> SEED scaling of the
    advantages (on when ``seed_cluster_ids`` is given) -> ``q`` (from the
    truncated utilities, never from advantages). A truncated entry's reward
    becomes 0 (and is then valid even if it was NaN).

    SEED log-likelihood = ``logp_sum / tok`` where ``tok > 0`` and
    ``seed_length_normalize``, else ``logp_sum``; ``G`` =
    ``seed_num_generations`` if > 0, else the largest valid group size.

    Args:
      utilities: f32[P, G] reward totals.
      mask: bool[P, G] or None.
      truncated: bool[P, G] or None (:func:`truncation_flags`).
      q_temperature, q_epsilon: see :func:`q_distribution` (traceable).
      scale, eps, ddof, baseline: see :func:`group_advantages`.
      seed_cluster_ids: i32[P, G] or None (:func:`cluster_ids`).
      seed_logp_sum: f32[P, G] summed sequence log-probs (required with SEED).
      seed_token_counts: f32[P, G] or None.
      seed_alpha: SEED strength.
      seed_normalize_by_max_entropy, seed_length_normalize: static flags.
      seed_num_generations: G for the max entropy (<= 0 / None: from the mask).

    Returns:
      :class:`RewardStatistics`.

    Example::

        stats = compute_reward_statistics(rewards, mask, q_temperature=0.5)
        stats.advantages, stats.q, stats.frac_zero_std
    """
    ddof = _check_scale(scale, baseline, ddof)
    u, m_in, finite = _utility_inputs(utilities, mask, truncated)
    valid = m_in & finite
    n, _, nf = _count_rows(m_in, finite)
    u, umax, mom, (mean, std, zero, frac, num_nonfinite), adv = _utility_statistics(
        u, valid, n, nf, scale, eps, ddof, baseline)
    p = u.shape[0]
    h = jnp.zeros((p,), jnp.float32)
    sc = jnp.ones((p,), jnp.float32)
    a_eff = jnp.float32(0.0)
    hmax = jnp.float32(0.0)
    if seed_cluster_ids is not None:
        if seed_logp_sum is None:
            raise ValueError("seed_logp_sum is required when seed_cluster_ids is given")
        ids = jnp.asarray(seed_cluster_ids, jnp.int32)
        check_same_shape(u, ids, "utilities", "seed_cluster_ids")
        lp = _other(seed_logp_sum, u, "utilities", "seed_logp_sum")
        if seed_length_normalize and seed_token_counts is not None:
            tok = _other(seed_token_counts, u, "utilities", "seed_token_counts")
            lp = jnp.where(tok > 0, lp / jnp.where(tok > 0, tok, 1.0), lp)
        h = semantic_entropy(ids, lp, m_in)
        if seed_num_generations is None:
            g = jnp.max(mom.n) if p else jnp.float32(0.0)
        else:
            gn = jnp.asarray(seed_num_generations, jnp.float32)
            g = jnp.where(gn > 0, gn, jnp.max(mom.n) if p else 0.0)
        a_eff, hmax = _seed_alpha(seed_alpha, g, seed_normalize_by_max_entropy)
        sc = jnp.where(jnp.isfinite(1.0 / (1.0 + a_eff * h)), 1.0 / (1.0 + a_eff * h), 1.0)
        adv = adv * sc[:, None]
    q, _ = _q_from(u, valid, mom.n, jnp.asarray(q_temperature, jnp.float32),
                   jnp.asarray(q_epsilon, jnp.float32), umax)
    return RewardStatistics(
        utilities=u, valid=valid, advantages=adv, q=q, mean=mean, std=std,
        zero_std=zero, frac_zero_std=frac, num_nonfinite=num_nonfinite,
        seed_entropy=h, seed_scale=sc,
        seed_alpha_effective=jnp.asarray(a_eff, jnp.float32),
        seed_max_entropy=jnp.asarray(hmax, jnp.float32),
    )


# ------------------------------------------------------------------ fused step
@flax.struct.dataclass
class MaxEntStepOutput:
    """Result of :func:`maxent_step`.

    Attributes:
      advantages: f32[P, G] group advantages.
      q: f32[P, G] listwise target.
      weights: f32[P, G] MaxEnt weights (computed with the *incoming* tau/beta).
      entropy: :class:`WeightEntropy` of ``weights``.
      ess: f32[P] effective sample size of each row.
      ess_mean: f32[] mean ESS over non-empty rows.
      max_weight: f32[] largest weight.
      frac_zero_std: f32[] fraction of non-empty groups with zero reward std.
      zero_std: bool[P].
      mean, std: f32[] reward moments (population std).
      num_nonfinite: i32[] masked-in non-finite rewards (excluded).
      valid: bool[P, G] entries that took part.
      state: the updated :class:`~jaxweight.controllers.ControllerState`.
    """

    advantages: Array
    q: Array
    weights: Array
    entropy: WeightEntropy
    ess: Array
    ess_mean: Array
    max_weight: Array
    frac_zero_std: Array
    zero_std: Array
    mean: Array
    std: Array
    num_nonfinite: Array
    valid: Array
    state: ControllerState


@functools.partial(
    jax.jit,
    static_argnames=("scale", "ddof", "baseline", "include_reference_term", "normalize_by_tokens"),
)
def maxent_step(
    state: ControllerState,
    utilities: Any,
    ref_logp: Any,
    token_counts: Any = None,
    mask: Any = None,
    *,
    schedule: TauSchedule | None = None,
    global_step: Any = 0,
    kl: KLController | None = None,
    measured_kl: Any = None,
    q_temperature: Any = 1.0,
    q_epsilon: Any = 1e-6,
    truncated: Any = None,
    lr_scale: Any = 1.0,
    scale: str = "group",
    eps: Any = 1e-4,
    ddof: int = 1,
    baseline: str = "mean",
    include_reference_term: bool = True,
    normalize_by_tokens: bool = True,
) -> MaxEntStepOutput:
    """One fused, jitted MaxEnt-GRPO weighting step (statistics, weights, controllers).

    Computes, in a single compiled call: zero-truncation, reward moments,
    group advantages, ``q``, the weights with the state's ``tau`` / ``beta`` /
    ``denom``, their entropy statistics, ESS, max weight, the zero-std
    fraction, and then the controller updates -- tau toward
    ``schedule``'s target from the measured mean weight entropy
    (:func:`~jaxweight.controllers.update_tau`), and beta from
    ``measured_kl`` (:func:`~jaxweight.controllers.update_beta`) -- exactly the
    order of maxent_grpo's training loop (weights use the incoming tau).

    Every continuous argument (state leaves, ``q_temperature``, ``q_epsilon``,
    ``eps``, schedule values, ``global_step``) is traced, so new values never
    recompile and ``jax.vmap`` over a batch of states and temperatures runs a
    whole hyperparameter sweep in one call::

        states = jax.vmap(controllers.init_controller)(taus, betas)          # [S]
        out = jax.vmap(lambda s, t: maxent_step(s, u, ref, tok, mask, q_temperature=t))(
            states, temps)                                                    # out.weights: [S, P, G]

    Args:
      state: :class:`~jaxweight.controllers.ControllerState`.
      utilities: f32[P, G] rewards.
      ref_logp: f32[P, G] length-normalised reference log-probs.
      token_counts: f32[P, G] or None (token normalisation of the weights).
      mask: bool[P, G] or None.
      schedule: :class:`~jaxweight.controllers.TauSchedule` or None (no tau update).
      global_step: i32[] step for warmup / annealing.
      kl: :class:`~jaxweight.controllers.KLController` or None.
      measured_kl: f32[] or None (no beta update).
      q_temperature, q_epsilon: see :func:`q_distribution`.
      truncated: bool[P, G] or None (zero-truncation).
      lr_scale: multiplier of the tau learning rate.
      scale, eps, ddof, baseline: see :func:`group_advantages` (static modes).
      include_reference_term, normalize_by_tokens: see :func:`weight_matrix`.

    Returns:
      :class:`MaxEntStepOutput`.
    """
    ddof = _check_scale(scale, baseline, ddof)
    u, m_in, finite = _utility_inputs(utilities, mask, truncated)
    valid_u = m_in & finite
    # the weights additionally need a usable reference log-prob / token count
    valid = valid_u
    ref = None
    if include_reference_term:
        ref = _other(ref_logp, u, "utilities", "ref_logp")
        valid = valid & jnp.isfinite(ref)
    tok = None
    if normalize_by_tokens and token_counts is not None:
        tok = _other(token_counts, u, "utilities", "token_counts")
        valid = valid & jnp.isfinite(tok)
    n, n_w, nf = _count_rows(m_in, finite, valid)
    u, umax, mom, (mean, std, zero, frac, num_nonfinite), adv = _utility_statistics(
        u, valid_u, n, nf, scale, eps, ddof, baseline)
    q, logq = _q_from(u, valid_u, n, jnp.asarray(q_temperature, jnp.float32),
                      jnp.asarray(q_epsilon, jnp.float32), umax)

    ref = None if ref is None else jnp.where(valid, ref, 0.0)
    tok = None if tok is None else jnp.where(valid, tok, 1.0)
    w, lw, row_max = _weights_from(logq, ref, tok, valid, n_w, state.tau, state.beta, state.denom)
    # rows sum to 1, so the Kish ESS is 1 / sum w^2
    s2 = _rowsum(w * w)
    ess = jnp.where(s2 > 0, 1.0 / jnp.where(s2 > 0, s2, 1.0), 0.0)
    if row_max is None:
        row_max = jnp.max(w, axis=-1, initial=0.0)
    ent, (ess_sum,), (max_w,) = _entropy_from(w, lw, valid, n_w, rows_normalised=True,
                                              extra_sums=[ess], extra_maxes=[row_max])
    rows = jnp.sum(n_w > 0, dtype=jnp.float32)
    ess_mean = jnp.where(rows > 0, ess_sum / jnp.maximum(rows, 1.0), 0.0)
    max_w = jnp.maximum(max_w, 0.0)

    new_state = state
    if schedule is not None:
        new_state = update_tau(new_state, ent.mean, global_step, schedule, lr_scale)
    if kl is not None and measured_kl is not None:
        new_state = update_beta(new_state, measured_kl, kl)
    return MaxEntStepOutput(
        advantages=adv, q=q, weights=w, entropy=ent, ess=ess, ess_mean=ess_mean,
        max_weight=max_w, frac_zero_std=frac, zero_std=zero, mean=mean, std=std,
        num_nonfinite=num_nonfinite, valid=valid, state=new_state,
    )
