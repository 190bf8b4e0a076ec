"""Property-based sweep of bad values over the public functions and every component ``step``.

For each data argument, hypothesis corrupts a random set of entries with a bad value
(NaN, +-inf) and asserts the policy: every output finite, the corrupted entries
counted, the state unchanged when nothing valid was given. Huge finite values
(+-1e30, +-3e38) must give finite outputs with nothing counted. Each setting of each
``config`` gets generated values and must raise a ``ValueError`` naming it exactly when
the value is outside its documented range. Wrong ranks and mismatched lengths must
raise a ``ValueError`` naming the argument. Examples are bounded (``max_examples``) and
the data functions are jitted once per shape, so the sweep runs in well under a minute.
"""

from __future__ import annotations

import math
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jaxweight import awr  # noqa: E402
from jaxweight import curriculum as cur  # noqa: E402
from jaxweight import maxent  # noqa: E402
from jaxweight import random_weighting as rw  # noqa: E402
from jaxweight import sync  # noqa: E402
from jaxweight.preference import buffer as pbuf  # noqa: E402
from jaxweight.preference import training as ptr  # noqa: E402
from jaxweight.preference.data import fragment_pairs_from_arrays  # noqa: E402
from jaxweight.preference.reward_nets import Box, Discrete, RewardMLP  # noqa: E402

SWEEP = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BAD = st.sampled_from([math.nan, math.inf, -math.inf])
HUGE = st.sampled_from([1e30, -1e30, 3e38, -3e38])


def _finite(tree) -> bool:
    return all(bool(np.all(np.isfinite(np.asarray(x, np.float64)))) for x in jax.tree.leaves(tree)
               if np.issubdtype(np.asarray(x).dtype, np.inexact))


def _same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
                                      for x, y in zip(la, lb))


def _positions(shape):
    """A non-empty bool mask of ``shape`` (which entries to corrupt)."""
    n = int(np.prod(shape))
    return st.lists(st.booleans(), min_size=n, max_size=n).filter(any).map(lambda b: np.reshape(b, shape))


# ====================================================================== maxent
P, G = 3, 4
RNG = np.random.default_rng(0)
M_REWARDS = RNG.normal(size=(P, G)).astype(np.float32)
M_REF = -RNG.uniform(0.1, 2.0, size=(P, G)).astype(np.float32)
M_TOK = RNG.integers(1, 20, size=(P, G)).astype(np.float32)
M_CFG = maxent.config(tau=0.5, beta=0.04, schedule=maxent.TauSchedule(target_entropy=0.8, learning_rate=0.1,
                                                                      warmup_steps=0),
                      kl=maxent.KLController(target=0.1, horizon=10, step_size=0.2))
M_STATE = maxent.init(M_CFG)


@jax.jit
def _maxent_step(rewards, ref_logp, token_counts, measured_kl):
    return maxent.step(M_STATE, rewards, ref_logp, M_CFG, token_counts=token_counts, global_step=3,
                       measured_kl=measured_kl)


def _maxent_outputs(out):
    # kl echoes the input (has_kl says whether one was measured); entropy_target is 0 when no
    # target is set (has_entropy_target)
    return (out.advantages, out.q, out.weights, out.entropy, out.ess, out.ess_mean, out.max_weight, out.mean,
            out.std, out.tau, out.beta)


@SWEEP
@given(arg=st.sampled_from(["rewards", "ref_logp", "token_counts"]), value=BAD, where=_positions((P, G)))
def test_maxent_step_masks_counts_and_keeps_state(arg, value, where):
    data = dict(rewards=M_REWARDS, ref_logp=M_REF, token_counts=M_TOK)
    data[arg] = np.where(where, np.float32(value), data[arg])
    new, out = _maxent_step(data["rewards"], data["ref_logp"], data["token_counts"], jnp.float32(0.2))
    assert _finite(_maxent_outputs(out)) and _finite(new)
    assert int(out.n_invalid) == int(where.sum())
    assert not np.any(np.asarray(out.valid)[where]) and np.all(np.asarray(out.weights)[where] == 0)
    if where.all():
        assert _same(new, M_STATE)


@SWEEP
@given(arg=st.sampled_from(["rewards", "ref_logp", "token_counts"]), value=HUGE, where=_positions((P, G)))
def test_maxent_step_huge_finite_inputs_give_finite_outputs(arg, value, where):
    data = dict(rewards=M_REWARDS, ref_logp=M_REF, token_counts=M_TOK)
    data[arg] = np.where(where, np.float32(value), data[arg])
    new, out = _maxent_step(data["rewards"], data["ref_logp"], data["token_counts"], jnp.float32(0.2))
    assert _finite(_maxent_outputs(out)) and _finite(new)
    assert int(out.n_invalid) == 0
    w = np.asarray(out.weights)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)


@SWEEP
@given(kl=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_maxent_step_bad_measured_kl_leaves_beta(kl):
    new, out = _maxent_step(M_REWARDS, M_REF, M_TOK, jnp.float32(kl))
    ref, _ = _maxent_step(M_REWARDS, M_REF, M_TOK, None)
    assert _finite(new) and float(new.beta) == float(ref.beta) == float(M_STATE.beta)


@jax.jit
def _maxent_functions(u, ref, tok, ids):
    mask = jnp.ones(u.shape, bool)
    q = maxent.q_distribution(u, mask, temperature=0.5)
    return dict(
        adv=maxent.group_advantages(u, mask),
        moments=maxent.reward_moments(u, mask),
        q=q,
        w=maxent.weight_matrix(q, ref, tok, mask, tau=0.5, beta=0.04),
        ent=maxent.weight_entropy(q, mask),
        ess=maxent.effective_sample_size(jnp.where(jnp.isfinite(u), jnp.abs(u), 0.0), mask),
        sem=maxent.semantic_entropy(ids, ref, mask),
        stats=maxent.compute_reward_statistics(u, mask, q_temperature=0.5),
    )


M_IDS = RNG.integers(0, 3, size=(P, G)).astype(np.int32)


@SWEEP
@given(arg=st.sampled_from(["u", "ref", "tok"]), value=st.one_of(BAD, HUGE), where=_positions((P, G)))
def test_maxent_functions_give_finite_outputs(arg, value, where):
    data = dict(u=M_REWARDS, ref=M_REF, tok=M_TOK)
    data[arg] = np.where(where, np.float32(value), data[arg])
    out = _maxent_functions(data["u"], data["ref"], data["tok"], M_IDS)
    assert _finite(out)
    bad = ~np.isfinite(data["u"])
    assert int(out["stats"].n_nonfinite) == int(bad.sum())
    assert np.all(np.asarray(out["q"])[bad] == 0) and np.all(np.asarray(out["adv"])[bad] == 0)


@SWEEP
@given(measured=st.one_of(BAD, st.none()), which=st.sampled_from(["tau", "beta", "meta"]))
def test_controllers_skip_non_finite_measurements(measured, which):
    cfg = maxent.config(tau=0.5, beta=0.1, schedule=maxent.TauSchedule(target_entropy=0.8, learning_rate=0.1,
                                                                      warmup_steps=0),
                        kl=maxent.KLController(target=0.1, horizon=10, step_size=0.2),
                        meta=maxent.MetaController(enabled=True, learning_rate=0.1))
    # a warmed-up state (EMA set): an unset EMA takes tau on a first non-finite measurement,
    # maxent_grpo's history default, and nothing else moves
    state = maxent.update_tau(maxent.init(cfg), 1.0, 1, cfg)
    if which == "tau":
        new = maxent.update_tau(state, measured if measured is not None else math.nan, 5, cfg)
    elif which == "beta":
        new = maxent.update_beta(state, measured if measured is not None else math.nan, cfg)
    else:
        new, changed = maxent.meta_update(state, measured, measured, cfg)
        assert not bool(changed)
    assert _same(new, state)


# ================================================================== curriculum
N, B = 16, 8
C_CFG = cur.config("prioritized", 4, capacity=N, rebin_interval=2)
C_STATE = cur.init(C_CFG)
C_IDS = np.arange(B, dtype=np.int32)
C_SCORES = np.linspace(0.0, 1.0, B).astype(np.float32)


@partial(jax.jit, static_argnames="num")
def _cur_step(ids, scores, num=4):
    return cur.step(C_STATE, jax.random.key(0), ids, scores, C_CFG, num=num, step=1, total_steps=10)


@SWEEP
@given(value=st.one_of(BAD, st.sampled_from([-1, N, N + 5, 2**31 - 1, -(2**31)])), where=_positions((B,)))
def test_curriculum_step_masks_counts_and_keeps_state(value, where):
    ids, scores = C_IDS, C_SCORES
    if isinstance(value, int):
        ids = np.where(where, np.int32(value), ids).astype(np.int32)
    else:
        scores = np.where(where, np.float32(value), scores)
    new, out = _cur_step(ids, scores)
    assert _finite(new) and int(out.stats.n_invalid) == int(where.sum())
    assert int(out.stats.n_applied) == B - int(where.sum())
    ids_out = np.asarray(out.item_ids)
    assert np.all((ids_out >= 0) & (ids_out < N))
    if where.all():
        assert _same(new.ema, C_STATE.ema) and _same(new.count, C_STATE.count)


@SWEEP
@given(value=HUGE, where=_positions((B,)))
def test_curriculum_huge_scores_are_applied_and_finite(value, where):
    new, out = _cur_step(C_IDS, np.where(where, np.float32(value), C_SCORES))
    assert _finite(new) and int(out.stats.n_invalid) == 0


# ========================================================================= awr
A_CFG = awr.config(2, hidden_sizes=(4,))
A_X = RNG.normal(size=(B, 3)).astype(np.float32)
A_LW = RNG.normal(size=(B, 2)).astype(np.float32)
A_ADV = RNG.normal(size=(B,)).astype(np.float32)
A_STATE = awr.init(A_CFG, 0, A_X)


@jax.jit
def _awr_step(x, lw, adv):
    return awr.step(A_STATE, x, lw, adv, A_CFG)


@SWEEP
@given(arg=st.sampled_from(["features", "log_weights", "advantages"]), value=BAD,
       rows=_positions((B,)))
def test_awr_step_masks_counts_and_keeps_state(arg, value, rows):
    data = dict(features=A_X, log_weights=A_LW, advantages=A_ADV)
    x = data[arg]
    m = rows.reshape(rows.shape + (1,) * (x.ndim - 1))
    data[arg] = np.where(m, np.float32(value), x)
    new, out = _awr_step(data["features"], data["log_weights"], data["advantages"])
    assert _finite(out) and _finite(new.policy)
    assert int(out["n_invalid"]) == int(rows.sum())
    if rows.all():
        assert _same(new.policy, A_STATE.policy) and _same(new.opt_state, A_STATE.opt_state)


@SWEEP
@given(arg=st.sampled_from(["features", "log_weights", "advantages"]), value=HUGE, rows=_positions((B,)))
def test_awr_step_huge_finite_inputs(arg, value, rows):
    data = dict(features=A_X, log_weights=A_LW, advantages=A_ADV)
    x = data[arg]
    data[arg] = np.where(rows.reshape(rows.shape + (1,) * (x.ndim - 1)), np.float32(value), x)
    new, out = _awr_step(data["features"], data["log_weights"], data["advantages"])
    assert _finite(out) and _finite(new.policy) and int(out["n_invalid"]) == 0


# ================================================================== preference
NP, L = 4, 3
P_NET = RewardMLP(hidden_sizes=(4,), observation_space=Box((2,)), action_space=Discrete(2), use_action=True)
P_PAIRS = fragment_pairs_from_arrays(RNG.normal(size=(NP, 2, L + 1, 2)).astype(np.float32),
                                     RNG.integers(0, 2, (NP, 2, L)).astype(np.int32))
P_PREFS = np.asarray([0.0, 1.0, 0.5, 0.25], np.float32)
P_CFG = ptr.config(P_NET, batch_size=NP)
P_STATE = ptr.init(P_CFG, 0, P_PAIRS)


@jax.jit
def _pref_step(obs, acts, prefs):
    return ptr.step(P_STATE, P_PAIRS.replace(obs=obs, acts=acts), prefs, P_CFG)


@SWEEP
@given(arg=st.sampled_from(["obs", "acts", "prefs"]), rows=_positions((NP,)),
       value=st.sampled_from([math.nan, math.inf, -math.inf, 1.5, -0.5, 7, -1]))
def test_reward_training_step_masks_counts_and_keeps_state(arg, rows, value):
    obs, acts, prefs = np.asarray(P_PAIRS.obs), np.asarray(P_PAIRS.acts), P_PREFS
    if arg == "acts":
        value = 7 if not isinstance(value, int) else value  # an action outside Discrete(2)
        acts = np.where(rows[:, None, None], value, acts).astype(np.int32)
    elif arg == "obs":
        value = value if not math.isfinite(value) else math.nan  # any finite observation is valid
        obs = np.where(rows[:, None, None, None], np.float32(value), obs)
    else:
        prefs = np.where(rows, np.float32(value), prefs)
    new, out = _pref_step(obs, acts, prefs)
    assert _finite(out) and _finite(new.params)
    assert int(out["n_invalid"]) == int(rows.sum())
    if rows.all():
        assert _same(new.params, P_STATE.params) and int(new.steps) == int(P_STATE.steps)


@SWEEP
@given(rows=_positions((NP,)), value=st.sampled_from([math.nan, 1.5, -0.5, math.inf]))
def test_buffer_refuses_concrete_bad_preferences_and_masks_traced_ones(rows, value):
    bcfg = pbuf.config(8)
    buf = pbuf.init(bcfg, None, P_PAIRS)
    prefs = np.where(rows, np.float32(value), P_PREFS)
    with pytest.raises(ValueError, match=r"prefs must be probabilities in \[0.0, 1.0\]"):
        pbuf.step(buf, P_PAIRS, prefs, bcfg)
    stored = jax.jit(pbuf.step, static_argnums=3)(buf, P_PAIRS, jnp.asarray(prefs), bcfg)
    assert np.array_equal(np.asarray(pbuf.mask(stored))[:NP], ~rows)
    assert pbuf.metrics_dict(stored, bcfg)["buffer/valid"] == NP - int(rows.sum())


def test_reward_training_on_an_empty_buffer():
    from jaxweight import preference as pf

    bcfg = pbuf.config(8)
    empty = pbuf.init(bcfg, None, P_PAIRS)
    new, out = jax.jit(ptr.epoch)(P_STATE, jax.random.key(0), empty, P_CFG)
    assert _same(new, P_STATE) and int(out["n_invalid"]) == 0  # the pure epoch: nothing trained
    trainer = pf.RewardTrainer(P_NET, batch_size=NP)
    with pytest.raises(ValueError, match="cannot train the reward model: the buffer is empty"):
        trainer.train(trainer.init(0, P_PAIRS), 0, empty)
    bad = pbuf.step(empty, P_PAIRS.replace(obs=jnp.full_like(P_PAIRS.obs, jnp.nan)), P_PREFS, bcfg)
    with pytest.raises(ValueError, match="all 4 stored pairs are invalid"):
        trainer.train(trainer.init(0, P_PAIRS), 0, bad)


def test_env_step_refuses_concrete_and_masks_traced_bad_actions():
    pytest.importorskip("gymnax")
    from jaxweight.rl.envs import env_step, make_env

    for name, bad, good in (("cartpole", 7, 1), ("pendulum", np.array([np.nan], np.float32),
                                                  np.array([0.5], np.float32))):
        env, params = make_env(name, horizon=10)
        obs, state = env.reset(jax.random.key(0), params)
        with pytest.raises(ValueError, match="action must be"):
            env_step(env, jax.random.key(1), state, bad, params)
        run = jax.jit(lambda s, a: env_step(env, jax.random.key(1), s, a, params))  # noqa: B023
        o2, s2, r2, d2, info = run(state, jnp.asarray(bad))
        assert _same(s2, state) and np.array_equal(o2, obs) and float(r2) == 0.0 and not bool(d2)
        assert bool(info["invalid_action"])
        _, s3, _, _, info = run(state, jnp.asarray(good))
        assert not bool(info["invalid_action"]) and not _same(s3, state)


# =================================================================== settings
# (builder, argument, accepted(value) -> bool): the documented ranges
def _nonneg(v):
    return math.isfinite(v) and v >= 0


def _pos(v):
    return math.isfinite(v) and v > 0


def _unit(v):
    return math.isfinite(v) and 0 <= v <= 1


SETTINGS = [
    (lambda v: maxent.config(tau=v), "tau", _nonneg),
    (lambda v: maxent.config(beta=v), "beta", _nonneg),
    (lambda v: maxent.config(denom=v), "denom", _nonneg),
    (lambda v: maxent.config(q_temperature=v), "q_temperature", _nonneg),
    (lambda v: maxent.config(q_epsilon=v), "q_epsilon", _nonneg),
    (lambda v: maxent.config(eps=v), "eps", _nonneg),
    (lambda v: maxent.TauSchedule(learning_rate=v), "learning_rate", _nonneg),
    (lambda v: maxent.TauSchedule(target_entropy=v), "target_entropy", _nonneg),
    (lambda v: maxent.TauSchedule(target_entropy_final=v), "target_entropy_final", _nonneg),
    (lambda v: maxent.TauSchedule(minimum_value=v), "minimum_value", _nonneg),
    (lambda v: maxent.TauSchedule(target_entropy_horizon=v), "target_entropy_horizon", _nonneg),
    (lambda v: maxent.KLController(target=v), "kl target", _nonneg),
    (lambda v: maxent.KLController(step_size=v), "kl step_size", _nonneg),
    (lambda v: maxent.MetaController(learning_rate=v), "meta learning_rate", _nonneg),
    (lambda v: maxent.MetaController(tau_min=v), "meta tau_min", _nonneg),
    (lambda v: maxent.weight_matrix(jnp.full((1, 2), 0.5), jnp.zeros((1, 2)), tau=v, beta=0.1), "tau", math.isfinite),
    (lambda v: maxent.weight_matrix(jnp.full((1, 2), 0.5), jnp.zeros((1, 2)), tau=0.5, beta=v), "beta", math.isfinite),
    (lambda v: maxent.q_distribution(jnp.zeros((1, 2)), temperature=v), "temperature", _nonneg),
    (lambda v: maxent.group_advantages(jnp.zeros((1, 2)), eps=v), "eps", _nonneg),
    (lambda v: maxent.seed_grpo_scale(jnp.zeros((1,)), alpha=v, num_generations=4), "alpha", _nonneg),
    (lambda v: cur.config(capacity=4, temperature=v), "temperature", _pos),
    (lambda v: cur.config(capacity=4, ema_alpha=v), "ema_alpha", _unit),
    (lambda v: cur.config(capacity=4, competence_threshold=v), "competence_threshold", _unit),
    (lambda v: cur.config(capacity=4, competence_c0=v), "competence_c0", lambda v: math.isfinite(v) and 0 < v <= 1),
    (lambda v: cur.config(capacity=4, staleness_coeff=v), "staleness_coeff", _unit),
    (lambda v: awr.config(2, temperature=v), "temperature", _pos),
    (lambda v: awr.config(2, max_weight=v), "max_weight", _pos),
    (lambda v: awr.config(2, learning_rate=v), "learning_rate", _pos),
    (lambda v: awr.config(2, weight_decay=v), "weight_decay", _nonneg),
    (lambda v: rw.xray_scale_config(target_scale=v), "target_scale", _pos),
    (lambda v: rw.xray_scale_config(smoothing=v), "smoothing", _unit),
    (lambda v: rw.config(trajectory_sigmas=v), "trajectory_sigmas", _nonneg),
    (lambda v: rw.config(step_sigmas=v), "step_sigmas", _nonneg),
    (lambda v: ptr.config(P_NET, learning_rate=v), "learning_rate", _nonneg),
    (lambda v: ptr.config(P_NET, noise_prob=v), "noise_prob", _unit),
    (lambda v: ptr.config(P_NET, discount=v), "discount", _unit),
    (lambda v: ptr.config(P_NET, threshold=v), "threshold", _pos),
    (lambda v: ptr.config(P_NET, b1=v), "b1", lambda v: math.isfinite(v) and 0 <= v < 1),
]
VALUES = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-3, 0.0, 0.5, 1.0, 1.5, 2.0, 1e30, -1e30])


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(case=st.sampled_from(SETTINGS), value=VALUES)
def test_every_setting_is_refused_exactly_outside_its_range(case, value):
    build, name, accepted = case
    if accepted(value):
        build(value)
        return
    with pytest.raises(ValueError, match=re.escape(name)):
        build(value)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(value=st.sampled_from([0, -1, -5, 2.5, math.nan]))
def test_integer_settings_are_refused_below_one_or_fractional(value):
    with pytest.raises(ValueError, match="interval"):
        sync.config(interval=value)
    with pytest.raises(ValueError, match="rebin_interval"):
        cur.config(capacity=4, rebin_interval=value)


# ===================================================================== shapes
def _shape_cases():
    u = jnp.zeros((P, G))
    return [
        ("maxent.step", "ref_logp", lambda x: maxent.step(M_STATE, u, x, M_CFG)),
        ("maxent.step", "token_counts", lambda x: maxent.step(M_STATE, u, jnp.zeros((P, G)), M_CFG, token_counts=x)),
        ("maxent.step", "mask", lambda x: maxent.step(M_STATE, u, jnp.zeros((P, G)), M_CFG, mask=x > 0)),
        ("weight_matrix", "ref_logp", lambda x: maxent.weight_matrix(u + 0.25, x, tau=0.5, beta=0.1)),
        ("group_advantages", "mask", lambda x: maxent.group_advantages(u, x > 0)),
        ("curriculum.update", "scores", lambda x: cur.update(C_STATE, jnp.arange(P), x.reshape(-1)[:P + 1]
                                                             if x.ndim == 2 else x, C_CFG)),
        ("awr.step", "advantages", lambda x: awr.step(A_STATE, A_X, A_LW, x, A_CFG)),
        ("training.step", "prefs", lambda x: ptr.step(P_STATE, P_PAIRS, x, P_CFG)),
    ]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(case=st.sampled_from(range(8)), shape=st.sampled_from([(P,), (P, G + 1), (P + 1, G), (P, G, 1), (0,), ()]))
def test_wrong_ranks_and_mismatched_lengths_name_the_argument(case, shape):
    _, name, call = _shape_cases()[case]
    x = jnp.ones(shape, jnp.float32)
    expected_ok = {"awr.step": (B,), "training.step": (NP,), "curriculum.update": (P,)}.get(_shape_cases()[case][0],
                                                                                            (P, G))
    if shape == expected_ok:
        return
    with pytest.raises(ValueError, match=re.escape(name)):
        call(x)


@pytest.mark.parametrize("shape", [(0, G), (P, 0), (0, 0)])
def test_empty_batches_leave_the_maxent_state_unchanged(shape):
    # the first call starts the unset entropy EMA at tau (maxent_grpo's rule), nothing else moves
    new, out = maxent.step(M_STATE, jnp.zeros(shape), jnp.zeros(shape), M_CFG, global_step=3, measured_kl=0.5)
    started = M_STATE.replace(entropy_ema=M_STATE.tau, has_entropy_ema=jnp.ones_like(M_STATE.has_entropy_ema))
    assert _same(new, started) and _finite(_maxent_outputs(out)) and int(out.n_invalid) == 0
    again, out = maxent.step(new, jnp.zeros(shape), jnp.zeros(shape), M_CFG, global_step=4, measured_kl=0.5)
    assert _same(again, new) and _finite(_maxent_outputs(out))


def test_empty_curriculum_and_awr_batches_leave_the_state_unchanged():
    new = cur.update(C_STATE, jnp.zeros((0,), jnp.int32), jnp.zeros((0,)), C_CFG)
    assert _same(new.ema, C_STATE.ema) and _same(new.count, C_STATE.count)
    new, out = awr.step(A_STATE, jnp.zeros((0, 3)), jnp.zeros((0, 2)), jnp.zeros((0,)), A_CFG)
    assert _same(new.policy, A_STATE.policy) and _finite(out) and int(out["n_invalid"]) == 0
