"""jaxweight.maxent: spec examples, edge cases, parity options, properties, gradients, the fused step."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxweight import maxent as M
from tests.contracts import assert_no_retrace, assert_trees_close, assert_vmap_matches_loop, check_state_contract

F32 = np.float32
_SETTINGS = ("q_temperature", "q_epsilon", "eps")


def ctl(tau, beta, denom=None):
    """A fresh controller state with these values."""
    return M.init(M.config(tau, beta, denom=denom))


def mstep(state, u, ref, tok=None, mask=None, cfg=None, *, global_step=0, measured_kl=None, **settings):
    """``maxent.step`` with weighting settings given by keyword (they replace ``cfg``'s): ``(state, out)``."""
    cfg = M.config() if cfg is None else cfg
    cfg = cfg.replace(**{k: jnp.asarray(v, jnp.float32) if k in _SETTINGS else v for k, v in settings.items()})
    return M.step(state, u, ref, cfg, token_counts=tok, mask=mask, global_step=global_step, measured_kl=measured_kl)


# ----------------------------------------------------------- float64 references
def ref_advantages(rows, scale="group", eps=1e-4, ddof=1, baseline="mean"):
    """The spec's formula, one Python list per group (ragged), in float64."""
    allv = np.concatenate([np.asarray(r, float) for r in rows]) if rows else np.zeros(0)
    bstd = allv.std(ddof=ddof) if allv.size - ddof > 0 else 0.0
    out = []
    for r in rows:
        r = np.asarray(r, float)
        n = r.size
        if n <= 1:
            out.append(np.zeros(n))
            continue
        c = r - r.mean()
        if baseline == "leave_one_out":
            c = c * n / (n - 1)
        std = r.std(ddof=ddof) if n - ddof > 0 else 0.0
        out.append({"group": c / (std + eps), "batch": c / (bstd + eps), "none": c}[scale])
    return out


def ref_weights(q, ref, tok, tau, beta, denom=None, include_ref=True):
    """A direct NumPy transcription of maxent_grpo's weight rule (any finite tau / beta / denom)."""
    d = denom if (denom is not None and denom > 0) else (tau if tau > 0 else 1e-8)
    s = np.log(np.maximum(np.asarray(q, float), 1e-12))
    if include_ref and beta > 0:
        s = s + beta * np.asarray(ref, float)
    s = s / d
    w = np.exp(s - s.max())
    w /= w.sum()
    if tok is not None:
        w = w * np.maximum(np.asarray(tok, float), 1)
        w /= w.sum()
    return w


def pad(rows, fill=np.nan):
    return M.pad_groups(rows, fill)


# ------------------------------------------------------------- spec examples
def test_spec_example_1_advantages(jit_or_eager):
    u, mask = pad([[1, 0, 0, 1], [2, 2], [5]])
    adv = jit_or_eager(M.group_advantages)(u, mask)
    np.testing.assert_allclose(adv[0], [0.8658754, -0.8658754, -0.8658754, 0.8658754], rtol=1e-6)
    np.testing.assert_array_equal(adv[1:], 0.0)


def test_spec_example_2_q(jit_or_eager):
    q = jit_or_eager(functools.partial(M.q_distribution, temperature=0.5))(jnp.array([[0.5, 1.0, 2.0]]))
    np.testing.assert_allclose(q[0], [0.04201094, 0.11419585, 0.84379321], rtol=1e-6)


def test_spec_example_3_weights(jit_or_eager):
    q = jnp.array([[0.1, 0.2, 0.7], [0.25, 0.25, 0.5]])
    ref = jnp.array([[-1.0, -2.0, -0.5], [-0.3, -0.3, -3.0]])
    wm = jit_or_eager(lambda q, r, t, d: M.weight_matrix(q, r, t, tau=0.5, beta=0.1, denom=d))
    w = wm(q, ref, None, 0.5)
    np.testing.assert_allclose(w[0], [0.017114999, 0.056050286, 0.926834762], rtol=1e-6)
    np.testing.assert_allclose(w[1], [0.2309, 0.2309, 0.5382], atol=1e-4)
    w = wm(q, ref, jnp.array([[10.0, 20.0, 5.0], [0.0, 4.0, 8.0]]), 0.5)
    np.testing.assert_allclose(w, [[0.0289, 0.1892, 0.7820], [0.0423, 0.1691, 0.7886]], atol=1e-4)
    w = wm(q, ref, None, 2.0)
    np.testing.assert_allclose(w, [[0.1977, 0.2660, 0.5363], [0.3091, 0.3091, 0.3819]], atol=1e-4)


def test_spec_example_4_entropy(jit_or_eager):
    w, mask = pad([[0.1, 0.2, 0.7], [0.5, 0.5], [1.0], []], fill=0.0)
    e = jit_or_eager(M.weight_entropy)(w, mask)
    np.testing.assert_allclose(e.mean, 0.49832191, rtol=1e-6)
    assert float(e.min) == 0.0
    np.testing.assert_allclose(e.max, 0.80181855, rtol=1e-6)
    np.testing.assert_allclose(e.advantage, [[-0.2333, -0.1333, 0.3667], [0, 0, 0], [0, 0, 0], [0, 0, 0]],
                               atol=1e-4)
    np.testing.assert_allclose(e.per_group, [0.80181855, math.log(2), 0.0, 0.0], rtol=1e-6)
    # normalised: H/ln n for the 3- and 2-rows, 0 for n <= 1; mean over all 4 rows
    np.testing.assert_allclose(e.normalized, (0.80181855 / math.log(3) + 1.0) / 4, rtol=1e-5)


def test_spec_example_5_seed():
    texts = [r"\boxed{4}", r"\boxed{5}", "<answer>4</answer>", "no idea"]
    answers = [M.extract_answer(t) for t in texts]
    assert answers == ["4", "5", "4", M.NO_ANSWER]
    ids = M.cluster_ids([answers])
    np.testing.assert_array_equal(ids, [[0, 1, 0, 2]])
    assert ids.dtype == np.int32
    logp_sum = jnp.array([[-2.0, -6.0, -1.0, -10.0]])
    tok = jnp.array([[4.0, 3.0, 2.0, 5.0]])
    h = M.semantic_entropy(ids, logp_sum / tok)
    np.testing.assert_allclose(h, [0.601499301180834], rtol=1e-6)
    np.testing.assert_allclose(M.seed_grpo_scale(h, num_generations=4), [0.982228332361468], rtol=1e-6)
    u = jnp.array([[1.0, 0.0, 1.0, 0.0]])
    stats = jax.jit(M.compute_reward_statistics)(u, seed_cluster_ids=ids, seed_logp_sum=logp_sum,
                                                 seed_token_counts=tok)
    np.testing.assert_allclose(stats.seed_alpha_effective, 0.03008019160253489, rtol=1e-6)
    np.testing.assert_allclose(stats.seed_max_entropy, math.log(4), rtol=1e-6)
    np.testing.assert_allclose(stats.seed_scale, [0.982228332361468], rtol=1e-6)
    np.testing.assert_allclose(stats.advantages, M.group_advantages(u) * 0.982228332361468, rtol=1e-6)
    np.testing.assert_allclose(stats.q, M.q_distribution(u), rtol=1e-6)  # q is never SEED-scaled


# ------------------------------------------------------------------- edge cases
def test_group_of_size_one():
    u, mask = jnp.array([[3.0, 0.0]]), jnp.array([[True, False]])
    _, out = mstep(ctl(0.5, 0.1), u, jnp.array([[-1.0, 0.0]]), None, mask)
    np.testing.assert_array_equal(out.advantages, [[0.0, 0.0]])
    np.testing.assert_allclose(out.q, [[1.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(out.weights, [[1.0, 0.0]], rtol=1e-6)
    assert float(out.entropy.per_group[0]) == pytest.approx(0.0, abs=1e-6)
    assert float(out.entropy.normalized) == 0.0 and float(out.ess[0]) == pytest.approx(1.0)
    assert not bool(out.zero_std[0]) or float(out.std) == 0.0


def test_all_equal_group():
    u = jnp.full((2, 4), 0.7)
    stats = M.compute_reward_statistics(u)
    np.testing.assert_array_equal(stats.advantages, 0.0)
    np.testing.assert_allclose(stats.q, 0.25, rtol=1e-6)
    assert bool(jnp.all(stats.zero_std)) and float(stats.frac_zero_std) == 1.0
    # any constant, any group size: deviations are exactly 0, not rounding noise of the mean
    stats_fn = jax.jit(functools.partial(M.compute_reward_statistics, scale="none"))
    for g in (7, 64):
        consts = jnp.array([0.1, 0.7, 1 / 3, 123.456, -1e30])
        st_c = stats_fn(jnp.broadcast_to(consts[:, None], (5, g)))
        np.testing.assert_array_equal(st_c.advantages, 0.0)
        assert bool(jnp.all(st_c.zero_std))
    w = M.weight_matrix(stats.q, jnp.zeros((2, 4)), tau=0.3, beta=0.0)
    np.testing.assert_allclose(w, 0.25, rtol=1e-6)
    np.testing.assert_allclose(M.weight_entropy(w).per_group, math.log(4), rtol=1e-6)


def test_tiny_temperature_and_tau_zero():
    u = jnp.array([[0.1, 0.9, 0.5, 0.9]])
    q = M.q_distribution(u, temperature=1e-9, epsilon=0.0)
    np.testing.assert_allclose(q, [[0.0, 0.5, 0.0, 0.5]], atol=1e-7)  # ties share the mass
    q = M.q_distribution(u, temperature=1e-9)
    assert np.all(np.isfinite(q)) and float(q[0, 0]) == pytest.approx(1e-6, rel=1e-3)
    np.testing.assert_array_equal(M.q_distribution(u, temperature=0.0, epsilon=0.0), [[0.0, 0.5, 0.0, 0.5]])
    w = M.weight_matrix(jnp.array([[0.2, 0.5, 0.3]]), jnp.zeros((1, 3)), tau=0.0, beta=0.0)
    np.testing.assert_allclose(w, [[0.0, 1.0, 0.0]], atol=1e-7)
    # maxent_grpo's meaning of settings config refuses: denom <= 0 -> tau <= 0 -> 1e-8, the same hard limit
    w = M.weight_matrix(jnp.array([[0.2, 0.5, 0.3]]), jnp.zeros((1, 3)), tau=-1.0, beta=-0.5, denom=-2.0)
    np.testing.assert_allclose(w, [[0.0, 1.0, 0.0]], atol=1e-7)


def test_large_magnitudes_no_overflow():
    rows = [[1e30, -1e30, 0.0, 5e29], [3e37, 3e37 + 1e32, -2e37], [1e-30, 2e-30]]
    u, mask = pad(rows)
    stats = jax.jit(M.compute_reward_statistics)(u, mask)
    for leaf in jax.tree.leaves(stats):
        assert np.all(np.isfinite(np.asarray(leaf, float)))
    want = ref_advantages(rows)
    for i, r in enumerate(want):
        np.testing.assert_allclose(stats.advantages[i, : len(r)], r, rtol=2e-6, atol=1e-6)
    flat = np.concatenate([np.asarray(r, float) for r in rows])
    np.testing.assert_allclose(stats.mean, flat.mean(), rtol=1e-6)
    np.testing.assert_allclose(stats.std, flat.std(), rtol=1e-6)
    np.testing.assert_allclose(stats.q[0], [1.0 - 3e-6, 1e-6, 1e-6, 1e-6][:1] + [1e-6] * 3, rtol=1e-5)
    for scale in ("batch", "none"):
        adv = M.group_advantages(u, mask, scale=scale)
        for i, r in enumerate(ref_advantages(rows, scale=scale)):
            np.testing.assert_allclose(adv[i, : len(r)], r, rtol=2e-6, atol=1e-36)


def test_nonfinite_rewards_excluded_and_counted():
    u = jnp.array([[1.0, jnp.nan, 0.0, 2.0], [jnp.inf, 1.0, -jnp.inf, 3.0]])
    mask = jnp.array([[True, True, True, True], [True, True, True, False]])
    stats = jax.jit(M.compute_reward_statistics)(u, mask)
    assert int(stats.n_nonfinite) == 3  # the masked-out entry does not count
    clean = M.compute_reward_statistics(jnp.nan_to_num(u), mask & jnp.isfinite(u))
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(clean)):
        if a.shape:
            np.testing.assert_array_equal(a, b)
    for leaf in jax.tree.leaves(stats):
        assert np.all(np.isfinite(np.asarray(leaf, float)))
    np.testing.assert_array_equal(stats.valid, [[True, False, True, True], [False, True, False, False]])
    assert float(stats.advantages[1, 1]) == 0.0  # its row has one valid entry
    _, out = mstep(ctl(0.5, 0.1), u, jnp.zeros_like(u), None, mask)
    assert int(out.n_nonfinite) == 3 and int(out.n_invalid) == 3
    np.testing.assert_array_equal(out.weights[0, 1], 0.0)


def test_empty_rows_and_batch():
    u = jnp.zeros((3, 4))
    mask = jnp.zeros((3, 4), bool)
    _, out = mstep(ctl(0.5, 0.1), u, u, u, mask)
    assert float(out.kl) == 0.0 and not bool(out.has_kl)  # no KL measured: a flag, not NaN
    assert int(out.entropy.count) == 0 and not bool(out.entropy.valid)
    for leaf in jax.tree.leaves(out.replace(tau=None, beta=None)):
        assert np.all(np.asarray(leaf, float) == 0)
    m, s = M.reward_moments(jnp.zeros((0, 4)))
    assert float(m) == 0.0 and float(s) == 0.0
    e = M.weight_entropy(jnp.zeros((0, 3)))
    assert float(e.mean) == 0.0 and float(e.normalized) == 0.0


def test_truncation():
    u = jnp.array([[1.0, 2.0, jnp.nan]])
    t = M.truncation_flags([["stop", " LENGTH ", None]], [[10, 5, 100]], 50)
    np.testing.assert_array_equal(t, [[False, True, True]])
    np.testing.assert_array_equal(M.zero_truncated(u, t), [[1.0, 0.0, 0.0]])
    stats = M.compute_reward_statistics(u, truncated=t)
    assert int(stats.n_nonfinite) == 0  # the NaN was a truncated completion: reward 0
    np.testing.assert_allclose(stats.utilities, [[1.0, 0.0, 0.0]])
    flat = M.truncation_flags(["stop", "stop", "stop"], [60, 10, 10], 50, explicit=[None, True, False])
    np.testing.assert_array_equal(flat, [True, True, False])
    assert not M.truncation_flags(["stop"], [99], 0)[0]  # limit 0 disables the length rule
    ragged = M.truncation_flags([["length"], ["stop", "stop"]], [[1], [2, 3]], 0)
    np.testing.assert_array_equal(ragged, [[True, False], [False, False]])


def test_reward_moments_population_std():
    u, mask = pad([[1.0, 2.0, 3.0], [4.0]])
    m, s = M.reward_moments(u, mask)
    np.testing.assert_allclose([m, s], [2.5, np.std([1, 2, 3, 4])], rtol=1e-6)
    m, s = M.reward_moments(jnp.array([[7.0]]))
    assert float(m) == 7.0 and float(s) == 0.0


# --------------------------------------------------------------- parity options
RNG = np.random.default_rng(0)
ROWS = [list(RNG.normal(size=n).round(3)) for n in (5, 3, 1, 4, 2)]


@pytest.mark.parametrize("name, kw", [
    ("trl", dict(scale="group", eps=1e-4, ddof=1)),
    ("trl_batch", dict(scale="batch", eps=1e-4, ddof=1)),
    ("dr_grpo", dict(scale="none")),
    ("verl", dict(scale="group", eps=1e-6, ddof=1)),
    ("openrlhf_group_norm", dict(scale="group", eps=1e-9, ddof=1)),
    ("population_std", dict(scale="group", eps=1e-4, ddof=0)),
    ("rloo", dict(scale="none", baseline="leave_one_out")),
])
def test_advantage_parity(name, kw):
    u, mask = pad(ROWS)
    adv = M.group_advantages(u, mask, **kw)
    for i, r in enumerate(ref_advantages(ROWS, **kw)):
        np.testing.assert_allclose(adv[i, : len(r)], r, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(adv[i, len(r):], 0.0)


def test_rloo_is_leave_one_out_baseline():
    r = np.array([1.0, 4.0, 2.0, 0.5])
    adv = M.group_advantages(jnp.asarray(r[None]), scale="none", baseline="leave_one_out")
    loo = np.array([r[i] - np.delete(r, i).mean() for i in range(4)])
    np.testing.assert_allclose(adv[0], loo, rtol=1e-6)


def test_bad_arguments():
    u = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="scale must be one of"):
        M.group_advantages(u, scale="token")
    with pytest.raises(ValueError, match="baseline must be one of"):
        M.group_advantages(u, baseline="median")
    with pytest.raises(ValueError, match="ddof"):
        M.group_advantages(u, ddof=1.5)
    with pytest.raises(ValueError, match="utilities must have rank 2"):
        M.group_advantages(jnp.zeros(3))
    with pytest.raises(ValueError, match="mask must have the same shape as utilities"):
        M.q_distribution(u, jnp.ones((3, 2), bool))
    with pytest.raises(ValueError, match="ref_logp must have the same shape as q"):
        M.weight_matrix(u, jnp.zeros((2, 4)), tau=1.0, beta=0.0)
    with pytest.raises(ValueError, match="token_counts must have the same shape as rewards"):
        mstep(ctl(0.5, 0.1), u, u, jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="num_generations"):
        M.seed_grpo_scale(jnp.zeros(2))
    with pytest.raises(ValueError, match="seed_logp_sum"):
        M.compute_reward_statistics(u, seed_cluster_ids=jnp.zeros((2, 3), jnp.int32))


# ---------------------------------------------------------- weight formula rules
def test_weight_matrix_rules():
    q = np.array([[0.1, 0.6, 0.3]])
    ref = np.array([[-0.2, -3.0, -1.0]])
    tok = np.array([[3.0, 1.0, 0.0]])
    # the formula for every finite setting, as maxent_grpo defines it: beta <= 0 drops the reference
    # term, denom <= 0 falls back to tau, tau <= 0 to 1e-8 (settings maxent.config refuses included)
    for tau, beta, denom in [(0.5, 0.2, None), (0.5, 0.2, 0.8), (0.5, 0.2, 0.0), (0.5, 0.0, None),
                             (0.0, 0.2, None), (2.0, 1.0, 3.0), (0.5, -0.3, None), (0.5, -0.3, 0.8),
                             (0.5, 0.2, -2.0), (1.5, 0.2, -1e-3), (-1.0, 0.2, 0.7), (-1.0, 0.2, None),
                             (-1.0, -1.0, -1.0)]:
        w = M.weight_matrix(q, ref, tok, tau=tau, beta=beta, denom=denom)
        np.testing.assert_allclose(w[0], ref_weights(q[0], ref[0], tok[0], tau, beta, denom), rtol=2e-6,
                                   atol=1e-30, err_msg=str((tau, beta, denom)))
    w = M.weight_matrix(q, ref, tok, tau=0.5, beta=0.2, include_reference_term=False, normalize_by_tokens=False)
    np.testing.assert_allclose(w[0], ref_weights(q[0], ref[0], None, 0.5, 0.2, include_ref=False), rtol=2e-6)


def test_weight_matrix_masks_and_extremes():
    q = jnp.array([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5], [0.5, 0.5, 0.0]])
    ref = jnp.array([[jnp.nan, -1.0, -1.0], [-jnp.inf, -jnp.inf, -jnp.inf], [-1e38, -1e38, -1e38]])
    w = M.weight_matrix(q, ref, tau=1e-3, beta=1.0)
    # NaN reference log-prob: masked
    np.testing.assert_allclose(w[0], [0.0, 0.0, 1.0], atol=1e-7)
    # non-finite reference rows are empty -> zeros (never NaN)
    np.testing.assert_array_equal(w[1], 0.0)
    # scores all -inf after overflow: uniform over the valid entries
    np.testing.assert_allclose(w[2], 1 / 3, rtol=1e-6)
    w = M.weight_matrix(q[2:], ref[2:], mask=jnp.array([[True, False, True]]), tau=1e-3, beta=1.0)
    np.testing.assert_allclose(w[0], [0.5, 0.0, 0.5], rtol=1e-6)
    assert np.all(np.isfinite(w))


def test_q_epsilon_cap_keeps_order():
    u = jnp.array([[0.0, 1.0, 3.0]])
    q = M.q_distribution(u, epsilon=0.5)  # eps * n = 1.5 > 1: capped at 1/n
    assert np.all(np.diff(np.asarray(q[0])) >= 0)
    np.testing.assert_allclose(q[0], 1 / 3, atol=1e-6)
    q = M.q_distribution(u, epsilon=0.1)
    p = np.exp([0.0, 1.0, 3.0]) / np.exp([0.0, 1.0, 3.0]).sum()
    np.testing.assert_allclose(q[0], p * 0.7 + 0.1, rtol=1e-6)
    assert np.all(np.diff(np.asarray(q[0])) > 0)


def test_uniform_weights_and_ess():
    mask = jnp.array([[True, True, False], [False, False, False], [True, True, True]])
    w = M.uniform_weights(mask)
    np.testing.assert_allclose(w, [[0.5, 0.5, 0], [0, 0, 0], [1 / 3] * 3], rtol=1e-6)
    np.testing.assert_allclose(M.effective_sample_size(w, mask), [2.0, 0.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(M.effective_sample_size(jnp.array([[0.2, 0.2, 0.0]])), [2.0], rtol=1e-6)


def test_weight_entropy_unnormalised_rows():
    w = jnp.array([[0.5, 0.5, 0.5], [2.0, 0.0, 0.0]])
    e = M.weight_entropy(w)
    np.testing.assert_allclose(e.per_group, [-1.5 * math.log(0.5), -2 * math.log(2)], rtol=1e-6)
    # normalised uses the floored, renormalised row: uniform -> 1, one-hot -> ~0
    np.testing.assert_allclose(e.normalized, 0.5, atol=1e-6)


# ------------------------------------------------------------------- SEED-GRPO
def test_extract_answer_rules():
    assert M.extract_answer(r"a \boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert M.extract_answer(r"\fbox{ 7 } \boxed{ x^{2} }") == "x^{2}"
    assert M.extract_answer(r"\boxed{3} and \boxed{unbalanced") == "3"
    assert M.extract_answer("x <ANSWER>\n 42 \n</answer> <answer>9</answer>") == "42"
    assert M.extract_answer(r"\boxed{1} <answer>2</answer>") == "1"
    assert M.extract_answer("nothing here") == M.NO_ANSWER
    assert M.extract_answer(None) == M.NO_ANSWER and M.extract_answer("") == M.NO_ANSWER


@pytest.mark.parametrize("text, want", [
    # (a) brace-less boxes are read
    (r"so the answer is \boxed 12", "12"),
    (r"\fbox 3", "3"),
    (r"$\boxed 7$ done", "7"),
    (r"\boxed{1} then \boxed 12", "12"),
    # (b) an empty payload is no answer: the last non-empty box wins, else NO_ANSWER_FOUND
    (r"\boxed{}", "NO_ANSWER_FOUND"),
    (r"\boxed{ }", "NO_ANSWER_FOUND"),
    ("<answer></answer>", "NO_ANSWER_FOUND"),
    ("<answer>  </answer>", "NO_ANSWER_FOUND"),
    (r"\boxed{4} and later \boxed{}", "4"),
    (r"\boxed{4} \boxed{ } \fbox{}", "4"),
    (r"\boxed{} <answer>9</answer>", "9"),
    # (c) a nested box is part of the outer payload
    (r"\boxed{a \boxed{b}}", r"a \boxed{b}"),
    (r"\boxed{1} \boxed{a \boxed{b}}", r"a \boxed{b}"),
    # not a box command
    (r"\boxedx{5}", "NO_ANSWER_FOUND"),
])
def test_extract_answer_matches_maxent_grpo(text, want):
    assert M.extract_answer(text) == want


def test_cluster_ids_rules():
    ids = M.cluster_ids([["a", M.NO_ANSWER, "b", "a", M.NO_ANSWER], [M.NO_ANSWER, M.NO_ANSWER], ["z"]])
    np.testing.assert_array_equal(ids, [[0, 2, 1, 0, 3], [0, 1, -1, -1, -1], [0, -1, -1, -1, -1]])


def test_semantic_entropy_edges():
    ids = jnp.array([[0, 0, 1, -1], [5, 0, 0, 0], [0, 0, 0, 0], [0, 1, 2, 3]])
    lp = jnp.array([[-1.0, -1.0, -1.0, 0.0], [0.0, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0],
                    [jnp.nan, -jnp.inf, -1.0, -1.0]])
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    h = M.semantic_entropy(ids, lp, mask)
    p = np.array([2 / 3, 1 / 3])
    np.testing.assert_allclose(h[0], -(p * np.log(p)).sum(), rtol=1e-6)  # id -1 is masked
    assert float(h[1]) == pytest.approx(0.0, abs=1e-6)  # id 5 >= G is masked: one cluster
    assert float(h[2]) == 0.0  # empty row
    np.testing.assert_allclose(h[3], math.log(2), rtol=1e-6)  # NaN masked, -inf has no mass
    np.testing.assert_allclose(M.seed_grpo_scale(jnp.array([1.0, jnp.nan]), 0.5, 1), [1 / 1.5, 1.0])
    np.testing.assert_allclose(M.seed_grpo_scale(jnp.array([1.0]), 0.5, 8, normalize_by_max_entropy=False),
                               [1 / 1.5])


def test_reward_statistics_fields_seed_off():
    u, mask = pad([[1.0, 1.0, 1.0], [0.0, 1.0], []])
    s = M.compute_reward_statistics(u, mask, q_temperature=0.5, scale="batch")
    np.testing.assert_array_equal(s.zero_std, [True, False, False])
    np.testing.assert_allclose(s.frac_zero_std, 0.5)  # over the 2 non-empty rows
    np.testing.assert_array_equal(s.seed_entropy, 0.0)
    np.testing.assert_array_equal(s.seed_scale, 1.0)
    assert float(s.seed_alpha_effective) == 0.0 and float(s.seed_max_entropy) == 0.0
    np.testing.assert_allclose(s.advantages, M.group_advantages(u, mask, scale="batch"), rtol=1e-6)
    np.testing.assert_allclose(s.q, M.q_distribution(u, mask, temperature=0.5), rtol=1e-6)
    assert s.n_nonfinite.dtype == jnp.int32


# -------------------------------------------------------------- hypothesis
P_, G_ = 4, 6
_vals = hnp.arrays(F32, (P_, G_), elements=st.floats(-5, 5, width=32))
_masks = hnp.arrays(np.bool_, (P_, G_))
_junk = hnp.arrays(F32, (P_, G_), elements=st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -7.0, 0.0]))


@functools.lru_cache(maxsize=None)
def _step():
    cfg = M.config(schedule=M.TauSchedule(target_entropy=1.0, learning_rate=0.1, warmup_steps=0))
    return jax.jit(lambda s, u, r, t, m, temp: mstep(s, u, r, t, m, cfg, q_temperature=temp, global_step=3)[1])


@settings(max_examples=40, deadline=None)
@given(u=_vals, ref=_vals, tok=hnp.arrays(F32, (P_, G_), elements=st.floats(0, 50, width=32)), mask=_masks,
       tau=st.floats(0.01, 5.0), beta=st.floats(0.0, 2.0), temp=st.floats(1e-3, 3.0))
def test_property_weights_entropy_ess(u, ref, tok, mask, tau, beta, temp):
    out = _step()(ctl(tau, beta), u, ref, tok, mask, F32(temp))
    w = np.asarray(out.weights, float)
    n = mask.sum(1)
    assert np.all(w >= 0) and np.all(w[~mask] == 0)
    np.testing.assert_allclose(w.sum(1)[n > 0], 1.0, rtol=1e-5)
    h = np.asarray(out.entropy.per_group)
    assert np.all(h >= -1e-6) and np.all(h <= np.log(np.maximum(n, 1)) + 1e-5)
    ess = np.asarray(out.ess)
    assert np.all(ess[n > 0] >= 1 - 1e-5) and np.all(ess[n > 0] <= n[n > 0] + 1e-4)
    assert np.all(ess[n == 0] == 0)
    q = np.asarray(out.q)
    np.testing.assert_allclose(q.sum(1)[n > 0], 1.0, rtol=1e-5)
    assert 0.0 <= float(out.entropy.normalized) <= 1.0 + 1e-5


@settings(max_examples=40, deadline=None)
@given(u=_vals, ref=_vals, mask=_masks, junk_u=_junk, junk_ref=_junk, junk_tok=_junk, temp=st.floats(1e-3, 3.0))
def test_property_masked_entries_never_affect_others(u, ref, mask, junk_u, junk_ref, junk_tok, temp):
    tok = np.full((P_, G_), 7.0, F32)
    s = ctl(0.4, 0.2)
    a = _step()(s, u, ref, tok, mask, F32(temp))
    b = _step()(s, np.where(mask, u, junk_u), np.where(mask, ref, junk_ref), np.where(mask, tok, junk_tok),
                mask, F32(temp))
    assert_trees_close(a, b)


# --------------------------------------------------------------- gradients
def _fd(fn, x, h=1e-3):
    return (fn(x + h) - fn(x - h)) / (2 * h)


def test_grad_weights_wrt_tau_beta_matches_finite_differences():
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.dirichlet(np.ones(5), 3), jnp.float32)
    ref = jnp.asarray(-rng.uniform(0.1, 2.0, (3, 5)), jnp.float32)
    tok = jnp.asarray(rng.integers(1, 9, (3, 5)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(3, 5)) > 0.2)
    c = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)

    def loss(tau, beta):
        return jnp.sum(c * M.weight_matrix(q, ref, tok, mask, tau=tau, beta=beta))

    def ent(tau, beta):
        return M.weight_entropy(M.weight_matrix(q, ref, None, mask, tau=tau, beta=beta), mask).mean

    for fn in (loss, ent):
        g_tau, g_beta = jax.jit(jax.grad(fn, argnums=(0, 1)))(0.7, 0.3)
        jf = jax.jit(fn)
        np.testing.assert_allclose(g_tau, _fd(lambda t: jf(t, 0.3), 0.7), rtol=2e-3, atol=1e-5)
        np.testing.assert_allclose(g_beta, _fd(lambda b: jf(0.7, b), 0.3), rtol=2e-3, atol=1e-5)
        assert abs(float(g_tau)) > 1e-3


def test_grad_finite_with_junk_under_mask():
    q = jnp.array([[0.3, jnp.nan, 0.7]])
    ref = jnp.array([[-1.0, jnp.inf, -0.5]])
    g = jax.jit(jax.grad(lambda t: M.weight_entropy(M.weight_matrix(q, ref, tau=t, beta=0.5)).mean))(0.5)
    assert np.isfinite(g) and float(g) != 0.0


# -------------------------------------------------------------- fused step
def _batch(p=6, g=5, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 3, (p, g)).astype(F32) + rng.normal(0, 0.1, (p, g)).astype(F32)
    u[0, 1] = np.nan
    ref = -rng.uniform(0.1, 3, (p, g)).astype(F32)
    tok = rng.integers(0, 20, (p, g)).astype(F32)
    mask = rng.uniform(size=(p, g)) > 0.2
    mask[2] = False
    return jnp.asarray(u), jnp.asarray(ref), jnp.asarray(tok), jnp.asarray(mask)


SCHED = M.TauSchedule(target_entropy=1.2, learning_rate=0.2, minimum_value=0.05, maximum_value=3.0,
                      warmup_steps=0)
CFG = M.config(schedule=SCHED)


def test_step_equals_composition_of_public_functions():
    u, ref, tok, mask = _batch()
    s = ctl(0.6, 0.1).replace(denom=jnp.float32(0.9))
    kl = M.KLController(0.05, 10, 0.2)
    cfg = M.config(schedule=SCHED, kl=kl)
    new, out = mstep(s, u, ref, tok, mask, cfg, global_step=4, measured_kl=0.08,
                     q_temperature=0.7, q_epsilon=1e-3, scale="batch", eps=1e-6)

    @jax.jit
    def reference(u, ref, tok, mask):
        stats = M.compute_reward_statistics(u, mask, q_temperature=0.7, q_epsilon=1e-3, scale="batch", eps=1e-6)
        w = M.weight_matrix(stats.q, ref, tok, stats.valid, tau=0.6, beta=0.1, denom=0.9)
        e = M.weight_entropy(w, out.valid)
        want = M.update_beta(M.update_tau(s, e.mean, 4, SCHED), 0.08, kl)
        return stats, w, e, M.effective_sample_size(w, out.valid), want

    stats, w, e, ess, want = reference(u, ref, tok, mask)
    np.testing.assert_allclose(out.advantages, stats.advantages, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out.q, stats.q, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose([out.mean, out.std, out.frac_zero_std], [stats.mean, stats.std, stats.frac_zero_std],
                               rtol=1e-6)
    assert int(out.n_nonfinite) == int(stats.n_nonfinite) == 1
    assert int(out.n_invalid) == 1
    np.testing.assert_allclose(out.weights, w, rtol=2e-6, atol=1e-8)
    for k in ("mean", "min", "max", "per_group", "normalized", "advantage"):
        np.testing.assert_allclose(getattr(out.entropy, k), getattr(e, k), rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(out.ess, ess, rtol=1e-5)
    np.testing.assert_allclose(out.max_weight, jnp.max(w), rtol=1e-6)
    assert_trees_close(new, want, rtol=1e-5, atol=1e-7)
    assert float(new.denom) == pytest.approx(float(new.tau))  # written back
    assert float(out.tau) == float(new.tau) and float(out.beta) == float(new.beta)


def test_step_without_tokens_matches():
    u, ref, tok, mask = _batch(seed=3)
    s = ctl(0.3, 0.2)
    new, out = mstep(s, u, ref, None, mask)
    w, h = jax.jit(lambda u, ref, mask: (lambda w: (w, M.weight_entropy(w, out.valid).per_group))(
        M.weight_matrix(M.q_distribution(u, mask), ref, None, mask, tau=0.3, beta=0.2)))(u, ref, mask)
    np.testing.assert_allclose(out.weights, w, rtol=2e-6, atol=1e-8)
    np.testing.assert_allclose(out.entropy.per_group, h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.max_weight, jnp.max(w), rtol=1e-6)
    # no schedule, no KL: only the EMA is set
    assert bool(new.has_entropy_ema) and float(new.entropy_ema) == pytest.approx(float(out.entropy.mean))
    assert_trees_close(new.replace(entropy_ema=s.entropy_ema, has_entropy_ema=s.has_entropy_ema), s)


def _cfg(tau, beta, temp, eps_q=1e-6):
    return M.config(tau, beta, q_temperature=temp, q_epsilon=eps_q, schedule=SCHED,
                    kl=M.KLController(0.05, 10, 0.2))


def _stack(*cfgs):
    return jax.tree.map(lambda *x: jnp.stack(x), *cfgs)


@pytest.mark.fast
def test_maxent_component_contract(tmp_path):
    """The component contract: jit == eager, vmap over a hyperparameter sweep, no recompile, dtypes, checkpoint."""
    u, ref, tok, mask = _batch()
    cfg = _cfg(0.6, 0.1, 1.0)

    def update(s, c, step):
        return M.step(s, u, ref, c, token_counts=tok, mask=mask, global_step=step, measured_kl=0.08)

    check_state_contract(
        init=lambda: M.init(cfg),
        update=update,
        update_args=(cfg, jnp.int32(2)),
        update_args_alt=(_cfg(1.5, 0.0, 0.3, 1e-2), jnp.int32(3)),
        batched_init=lambda: jax.vmap(M.init)(_stack(*[_cfg(t, b, 1.0)
                                                       for t, b in ((0.2, 0.0), (0.6, 0.1), (1.5, 0.5))])),
        batched_update_in_axes=(0, None),
        batched_update_args=(_stack(*[_cfg(t, b, temp) for t, b, temp in ((0.2, 0.0, 1e-3), (0.6, 0.1, 0.5),
                                                                          (1.5, 0.5, 2.0))]), jnp.int32(2)),
        tmp_path=tmp_path, rtol=1e-6, atol=1e-7,
    )
    # donation: the state can be donated to the jitted step and the config survives
    state = M.init(cfg)
    step = jax.jit(lambda s, c: update(s, c, jnp.int32(2)), donate_argnums=0)
    new, out = step(state, cfg)
    assert state.tau.is_deleted() and not cfg.tau.is_deleted()
    assert float(new.tau) != 0.6 and float(cfg.tau) == pytest.approx(0.6)


def test_sweep_vmap_matches_loop():
    u, ref, tok, mask = _batch()
    taus = jnp.array([0.1, 0.5, 1.0, 2.0])
    betas = jnp.array([0.0, 0.05, 0.2, 1.0])
    temps = jnp.array([1e-3, 0.5, 1.0, 4.0])
    states = jax.vmap(lambda t, b: ctl(t, b))(taus, betas)
    step = jax.jit(lambda s, t: mstep(s, u, ref, tok, mask, CFG, q_temperature=t, global_step=5)[1])
    out = assert_vmap_matches_loop(step, (0, 0), states, temps, rtol=1e-5, atol=1e-6)
    assert out.weights.shape == (4, 6, 5)
    # the sweep really differs along the batch
    assert float(jnp.std(out.entropy.mean)) > 0.01


def test_no_recompile_on_new_hyperparameters():
    u, ref, tok, mask = _batch()

    def fn(s, temp, eps_q):
        return mstep(s, u, ref, tok, mask, CFG, q_temperature=temp, q_epsilon=eps_q, global_step=1)

    s1 = ctl(0.5, 0.1)
    s2 = ctl(1.5, 0.0).replace(denom=jnp.float32(2.0))
    assert_no_retrace(fn, (s1, jnp.float32(1.0), jnp.float32(1e-6)), (s2, jnp.float32(0.1), jnp.float32(1e-2)))


def test_large_constant_rows_pool_without_overflow():
    rows = [[1e30, 1e30, 1e30], [-2e30, -2e30], [3.0, 4.0]]
    u, mask = pad(rows)
    m, s = M.reward_moments(u, mask)
    flat = np.concatenate([np.asarray(r, float) for r in rows])
    np.testing.assert_allclose([m, s], [flat.mean(), flat.std()], rtol=1e-6)
    adv = M.group_advantages(u, mask, scale="batch")
    want = ref_advantages(rows, scale="batch")
    np.testing.assert_array_equal(adv[:2], 0.0)  # constant rows: exactly 0
    # the small row is tiny next to the batch std (~1e-31) but not flushed to zero
    np.testing.assert_allclose(adv[2, :2], want[2], rtol=2e-6)


# ------------------------------------------------------------- bad data, metrics
def test_huge_reward_gives_finite_outputs_every_scale():
    u = jnp.array([[1.0, 0.0, 3e38, 2.0], [1.0, 2.0, 3.0, 4.0], [-3e38, 3e38, 0.0, 1.0]])
    ref = -jnp.ones_like(u)
    for scale in ("group", "batch", "none"):
        _, out = mstep(ctl(0.5, 0.04), u, ref, None, None, CFG, global_step=3, scale=scale)
        for leaf in jax.tree.leaves(out):  # no KL measured: 0 and a flag, never NaN
            assert np.all(np.isfinite(np.asarray(leaf, float))), scale
        np.testing.assert_allclose(np.asarray(out.weights).sum(1), 1.0, rtol=1e-5)
        # the ordinary row is untouched by its huge neighbours with per-group scaling
        if scale != "batch":
            want = M.group_advantages(u[1:2], scale=scale)
            np.testing.assert_allclose(out.advantages[1], want[0], rtol=1e-6)
    adv = M.group_advantages(u[:1])
    np.testing.assert_allclose(adv[0], ref_advantages([[1.0, 0.0, 3e38, 2.0]])[0], rtol=1e-5)


def test_all_masked_batch_leaves_state_exactly_unchanged():
    s = M.update_tau(ctl(0.5, 0.04), 1.3, 0, SCHED)  # a state with an EMA set
    cfg = M.config(schedule=SCHED, kl=M.KLController(0.05, 10, 0.2))
    u = jnp.ones((3, 4))
    for mask, uu in ((jnp.zeros((3, 4), bool), u), (None, jnp.full((3, 4), jnp.nan))):
        new, out = mstep(s, uu, -u, None, mask, cfg, global_step=7, measured_kl=0.5)
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(s)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(out.weights, 0.0)


def test_step_kl_valid_flag():
    """A KL flagged as not measured (``kl_valid=False``) or non-finite moves nothing; a valid one moves beta."""
    u, ref, tok, mask = _batch()
    cfg = M.config(0.5, 0.04, schedule=SCHED, kl=M.KLController(0.05, 10, 0.2))
    s = M.init(cfg)
    none_state, none_out = M.step(s, u, ref, cfg, token_counts=tok, mask=mask, global_step=3)
    for kl, ok in ((0.2, False), (float("nan"), True), (float("inf"), True)):
        new, out = M.step(s, u, ref, cfg, token_counts=tok, mask=mask, global_step=3, measured_kl=kl,
                          kl_valid=ok)
        assert_trees_close(new, none_state)
        assert float(out.kl) == 0.0 and not bool(out.has_kl)
    new, out = jax.jit(M.step)(s, u, ref, cfg, token_counts=tok, mask=mask, global_step=3, measured_kl=0.2,
                               kl_valid=jnp.asarray(True))
    np.testing.assert_allclose(float(new.beta), 0.04 * 1.02, rtol=1e-6)  # err = 3, clipped to 0.2
    assert float(out.kl) == pytest.approx(0.2) and bool(out.has_kl)
    assert bool(out.has_entropy_target) and float(out.entropy_target) == pytest.approx(1.2)


def test_metrics_dict_flat_floats():
    u, ref, tok, mask = _batch()
    cfg = M.config(0.5, 0.04, schedule=SCHED, kl=M.KLController(0.05, 10, 0.2))
    new, out = mstep(M.init(cfg), u, ref, tok, mask, cfg, global_step=3, measured_kl=0.07)
    d = M.metrics_dict(out, cfg)
    for k in ("maxent/weight_entropy", "maxent/tau", "maxent/beta", "maxent/kl", "maxent/n_invalid"):
        assert k in d and isinstance(d[k], float), k
    assert d["maxent/weight_entropy"] == pytest.approx(float(out.entropy.mean))
    assert d["maxent/tau"] == pytest.approx(float(new.tau)) != 0.5
    assert d["maxent/kl"] == pytest.approx(0.07)
    assert d["maxent/n_invalid"] == 1.0  # the NaN reward
    _, no_kl = mstep(M.init(cfg), u, ref, tok, mask, cfg)
    assert "maxent/kl" not in M.metrics_dict(no_kl, cfg) and not bool(no_kl.has_kl)
    _, bad_kl = mstep(M.init(cfg), u, ref, tok, mask, cfg, measured_kl=float("nan"))
    assert "maxent/kl" not in M.metrics_dict(bad_kl, cfg) and float(bad_kl.kl) == 0.0
    st = M.metrics_dict(new, cfg)
    assert st["maxent/tau"] == d["maxent/tau"] and st["maxent/current_target"] == pytest.approx(1.2)
    assert "maxent/has_target" not in st and "maxent/has_entropy_ema" not in st  # flags decide, not logged
    fresh = M.metrics_dict(M.init(cfg), cfg)
    assert "maxent/entropy_ema" not in fresh and "maxent/current_target" not in fresh  # not measured yet
    with pytest.raises(ValueError, match="MaxEntStepOutput or a ControllerState"):
        M.metrics_dict({"tau": 1.0}, cfg)


# ------------------------------------------------- maxent_grpo's rules, restored
def test_q_temperature_zero_is_the_hard_limit_of_maxent_grpo():
    """maxent_grpo: ``softmax(u / max(T, 1e-8))``; T = 0 is the hard (argmax) limit, not an error."""
    u = jnp.array([[0.5, 1.0, 2.0], [3.0, 3.0, -1.0]])
    want = M.q_distribution(u, temperature=1e-8)
    got = M.q_distribution(u, temperature=0.0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, [[1e-6, 1e-6, 1 - 2e-6], [0.5 - 0.5e-6, 0.5 - 0.5e-6, 1e-6]], rtol=1e-5)
    # the same through the config and the step
    _, out = mstep(ctl(0.5, 0.0), u, -jnp.ones_like(u), q_temperature=0.0)
    np.testing.assert_array_equal(out.q, want)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0.0, got -0.1"):
        M.q_distribution(u, temperature=-0.1)


def test_extract_answer_braceless_payload_stops_at_punctuation():
    """maxent_grpo: the brace-less payload runs to the first white space or one of ``,;.!?``."""
    for text, want in ((r"\boxed 12, done", "12"), (r"\boxed 7; so", "7"), (r"\boxed 5.", "5"),
                       (r"\boxed x! ok", "x"), (r"\fbox 9?", "9"), (r"\boxed 12 done", "12")):
        assert M.extract_answer(text) == want, text


def test_public_surface():
    assert set(M.__all__) <= set(dir(M))
    assert not any(name.startswith("_") for name in M.__all__)
    for name in ("row_stats", "weights_from", "check_modes"):
        assert name not in M.__all__
