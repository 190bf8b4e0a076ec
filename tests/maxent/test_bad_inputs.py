"""Bad inputs for jaxweight.maxent (weighting and controllers).

Each case asserts the specific outcome: the error type and a fragment of its
message (the same eagerly and under ``jaxweight.checked(jax.jit(...))``), or
finite outputs, the invalid-count metric and an unchanged controller state.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxweight
from jaxweight import maxent as M

NAN, INF = float("nan"), float("inf")
S0 = M.init(M.config(0.5, 0.04))
SCHED = M.TauSchedule(target_entropy=1.0, learning_rate=0.1, minimum_value=0.05, maximum_value=2.0, warmup_steps=0)
KL = M.KLController(target=0.05, horizon=10, step_size=0.2)


Q = jnp.full((2, 4), 0.25)
REF = -jnp.ones((2, 4))


def _tau(**kw):
    return M.TauSchedule(**{**dict(target_entropy=1.0, learning_rate=0.1, warmup_steps=0), **kw})


def _meta(**kw):
    return M.MetaController(**{**dict(enabled=True, learning_rate=0.1), **kw})


# ------------------------------------------------ bad hyperparameters, eager == checked jit
# (name, function of the bad value, bad value, message fragment)
HYPER = [
    ("tau_negative", lambda v: M.config(v, 0.0), -0.1, "tau must be finite and >= 0.0"),
    ("tau_nan", lambda v: M.config(v, 0.0), NAN, "tau must be finite and >= 0.0"),
    ("beta_negative", lambda v: M.config(0.5, v), -1.0, "beta must be finite and >= 0.0"),
    ("beta_inf", lambda v: M.config(0.5, v), INF, "beta must be finite and >= 0.0"),
    ("denom_negative", lambda v: M.config(0.5, 0.0, denom=v), -2.0, "denom must be finite and >= 0.0"),
    ("tau_lr_negative", lambda v: M.config(schedule=_tau(learning_rate=v)), -0.1,
     "learning_rate must be finite and >= 0.0"),
    ("tau_lr_nan", lambda v: M.config(schedule=_tau(learning_rate=v)), NAN,
     "learning_rate must be finite and >= 0.0"),
    ("tau_min_negative", lambda v: M.config(schedule=_tau(minimum_value=v)), -0.5,
     "minimum_value must be finite and >= 0.0"),
    ("tau_bounds_reversed", lambda v: M.config(schedule=_tau(minimum_value=v, maximum_value=1.0)), 2.0,
     "minimum_value must be <= maximum_value"),
    ("tau_max_nan", lambda v: M.config(schedule=_tau(maximum_value=v)), NAN,
     "maximum_value must be finite"),
    ("warmup_fraction", lambda v: M.config(schedule=_tau(warmup_steps=v)), 2.5,
     "warmup_steps must be an integer"),
    ("anneal_horizon_negative", lambda v: M.config(schedule=_tau(target_entropy_horizon=v)), -3.0,
     "target_entropy_horizon must be finite and >= 0.0"),
    ("target_inf", lambda v: M.config(schedule=_tau(target_entropy=v)), INF,
     "target_entropy must be finite"),
    ("kl_target_negative", lambda v: M.config(kl=M.KLController(v, 10, 0.2)), -0.1,
     "kl target must be finite and >= 0.0"),
    ("kl_step_nan", lambda v: M.config(kl=M.KLController(0.1, 10, v)), NAN,
     "kl step_size must be finite and >= 0.0"),
    ("kl_horizon_zero_active", lambda v: M.config(kl=M.KLController(0.1, v, 0.2)), 0.0,
     "kl horizon (with target and step_size > 0) must be finite and >= 1.0"),
    ("kl_horizon_negative", lambda v: M.config(kl=M.KLController(0.1, v, 0.2)), -5.0,
     "kl horizon must be finite and >= 0.0"),
    ("meta_lr_negative", lambda v: M.config(meta=_meta(learning_rate=v)), -0.1,
     "meta learning_rate must be finite and >= 0.0"),
    ("meta_tau_lr_nan", lambda v: M.config(meta=_meta(tau_learning_rate=v)), NAN,
     "meta tau_learning_rate must be finite and >= 0.0"),
    ("meta_clip_negative", lambda v: M.config(meta=_meta(beta_grad_clip=v)), -1.0,
     "meta beta_grad_clip must be finite and >= 0.0"),
    ("meta_tau_bounds_reversed", lambda v: M.config(meta=_meta(tau_min=v, tau_max=1.0)), 3.0,
     "meta tau_min must be <= meta tau_max"),
    ("q_temperature_negative", lambda v: M.q_distribution(jnp.ones((2, 3)), temperature=v), -1.0,
     "temperature must be finite and >= 0.0"),
    ("q_temperature_nan", lambda v: M.q_distribution(jnp.ones((2, 3)), temperature=v), NAN,
     "temperature must be finite and >= 0.0"),
    ("q_epsilon_negative", lambda v: M.q_distribution(jnp.ones((2, 3)), epsilon=v), -1e-3,
     "epsilon must be finite and >= 0.0"),
    ("adv_eps_negative", lambda v: M.group_advantages(jnp.ones((2, 3)), eps=v), -1e-4,
     "eps must be finite and >= 0.0"),
    ("adv_eps_nan", lambda v: M.group_advantages(jnp.ones((2, 3)), eps=v), NAN, "eps must be finite and >= 0.0"),
    ("seed_alpha_nan", lambda v: M.seed_grpo_scale(jnp.ones(2), v, 4), NAN, "alpha must be finite and >= 0.0"),
    # weight_matrix: a leaf function, so traced tau / beta / denom are checked too; only non-finite
    # values are refused (every finite one has maxent_grpo's meaning, see below)
    ("wm_tau_nan", lambda v: M.weight_matrix(Q, REF, tau=v, beta=0.1), NAN, "tau must be finite, got nan"),
    ("wm_tau_inf", lambda v: M.weight_matrix(Q, REF, tau=v, beta=0.1), INF, "tau must be finite, got inf"),
    ("wm_beta_nan", lambda v: M.weight_matrix(Q, REF, tau=0.5, beta=v), NAN, "beta must be finite, got nan"),
    ("wm_beta_-inf", lambda v: M.weight_matrix(Q, REF, tau=0.5, beta=v), -INF, "beta must be finite, got -inf"),
    ("wm_denom_nan", lambda v: M.weight_matrix(Q, REF, tau=0.5, beta=0.1, denom=v), NAN,
     "denom must be finite, got nan"),
    ("target_nan", lambda v: M.config(schedule=_tau(target_entropy=v)), NAN,
     "target_entropy must be finite and >= 0.0, got nan"),
    ("seed_G_nan", lambda v: M.seed_grpo_scale(jnp.ones(2), 0.1, v), NAN, "num_generations must be finite, got nan"),
    ("seed_G_inf", lambda v: M.seed_grpo_scale(jnp.ones(2), 0.1, v), INF, "num_generations must be finite, got inf"),
    ("meta_kl_target_nan", lambda v: M.analytic_meta_grads(1.0, 0.8, 0.1, v)[1], NAN,
     "kl_target must be finite, got nan"),
    ("meta_kl_target_inf", lambda v: M.analytic_meta_grads(1.0, 0.8, 0.1, v)[1], INF,
     "kl_target must be finite, got inf"),
]


@pytest.mark.parametrize("mode", ["eager", "checked_jit"])
@pytest.mark.parametrize("name, fn, value, fragment", HYPER, ids=[h[0] for h in HYPER])
def test_bad_hyperparameter_same_message(name, fn, value, fragment, mode):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        if mode == "eager":
            fn(value)
        else:
            jaxweight.checked(jax.jit(fn))(jnp.float32(value))


@pytest.mark.parametrize("kw, fragment", [
    (lambda: dict(tau=-1.0), "tau must be finite and >= 0.0"),
    (lambda: dict(beta=NAN), "beta must be finite and >= 0.0"),
    (lambda: dict(q_epsilon=-1.0), "q_epsilon must be finite and >= 0.0"),
    (lambda: dict(eps=INF), "eps must be finite and >= 0.0"),
    (lambda: dict(scale="token"), "scale must be one of"),
    (lambda: dict(schedule=M.TauSchedule(minimum_value=3.0, maximum_value=1.0)),
     "minimum_value must be <= maximum_value"),
    (lambda: dict(schedule=M.TauSchedule(learning_rate=-0.5)), "learning_rate must be finite and >= 0.0"),
    (lambda: dict(kl=M.KLController(0.1, 0, 0.2)), "kl horizon"),
    (lambda: dict(meta=M.MetaController(tau_min=1.0, tau_max=0.5)), "meta tau_min must be <= meta tau_max"),
    (lambda: dict(meta=M.MetaController(update_interval=0)), "meta update_interval must be >= 1"),
    (lambda: dict(schedule=M.TauSchedule(target_entropy=-1)), "target_entropy must be finite and >= 0.0, got -1$"),
    (lambda: dict(schedule=M.TauSchedule(target_entropy_start=-0.5)), "target_entropy_start must be finite and >= 0.0"),
    (lambda: dict(schedule=M.TauSchedule(target_entropy_final=-2.0)), "target_entropy_final must be finite and >= 0.0"),
    (lambda: dict(kl=M.KLController(target=-1)), "kl target must be finite and >= 0.0, got -1"),
    (lambda: dict(meta=M.MetaController(learning_rate=NAN)), "meta learning_rate must be finite and >= 0.0, got nan"),
], ids=["tau", "beta", "q_epsilon", "eps", "scale", "bounds", "lr", "kl_horizon", "meta_bounds", "interval",
        "target_negative", "target_start_negative", "target_final_negative", "kl_target_negative", "meta_lr_nan"])
def test_config_refuses(kw, fragment):
    """Refused by ``config`` and by the settings classes' constructors alike."""
    with pytest.raises(ValueError, match=fragment):
        M.config(**{"tau": 0.5, "beta": 0.0, **kw()})


def test_step_checks_concrete_hyperparameters():
    u = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="q_temperature must be finite and >= 0.0"):
        M.config(q_temperature=-1.0)
    with pytest.raises(ValueError, match="q_temperature must be finite and >= 0.0"):
        M.compute_reward_statistics(u, q_temperature=NAN)
    with pytest.raises(ValueError, match="eps must be finite and >= 0.0"):
        M.compute_reward_statistics(u, eps=NAN)
    with pytest.raises(ValueError, match="seed_num_generations must be finite, got inf"):
        M.compute_reward_statistics(u, seed_cluster_ids=jnp.zeros((2, 3), jnp.int32), seed_logp_sum=u,
                                    seed_num_generations=INF)


@pytest.mark.parametrize("mode", ["eager", "checked_jit"])
@pytest.mark.parametrize("kw", [dict(tau=0.0), dict(tau=0.5, denom=0.0)], ids=["tau0", "denom0"])
def test_weight_matrix_spec_fallbacks_still_accepted(mode, kw):
    """maxent_grpo's ``d = tau if tau > 0 else 1e-8`` (and ``denom <= 0 -> tau``) at 0 is the spec: not an error."""
    def f(v):
        return M.weight_matrix(Q, REF, beta=0.1, **{**kw, "tau": v})

    w = f(kw["tau"]) if mode == "eager" else jaxweight.checked(jax.jit(f))(jnp.float32(kw["tau"]))
    np.testing.assert_allclose(np.asarray(w).sum(1), 1.0, rtol=1e-6)


def _np_weights(q, ref, tau, beta, denom):
    """maxent_grpo's weight rule transcribed in NumPy (float64), one row at a time."""
    d = denom if (denom is not None and denom > 0) else (tau if tau > 0 else 1e-8)
    s = np.log(np.maximum(np.asarray(q, float), 1e-12))
    if beta > 0:
        s = s + beta * np.asarray(ref, float)
    e = np.exp(s / d - (s / d).max())
    return e / e.sum()


@pytest.mark.parametrize("mode", ["eager", "checked_jit"])
@pytest.mark.parametrize("kw", [dict(tau=0.5, beta=-0.3), dict(tau=0.5, beta=0.2, denom=-2.0),
                                dict(tau=-1.0, beta=0.2), dict(tau=-1.0, beta=0.2, denom=0.7),
                                dict(tau=0.0, beta=-1.0, denom=-1.0)],
                         ids=["beta-0.3", "denom-2", "tau-1", "tau-1_denom0.7", "all_nonpositive"])
def test_weight_matrix_gives_maxent_grpos_result_where_config_refuses(mode, kw):
    """``beta <= 0`` drops the reference term, ``denom <= 0`` falls back to tau, ``tau <= 0`` to 1e-8:
    maxent_grpo's meaning, given by the stateless formula (``maxent.config`` refuses these as mistakes)."""
    q = jnp.array([[0.1, 0.2, 0.7], [0.25, 0.25, 0.5]])
    ref = jnp.array([[-1.0, -2.0, -0.5], [-0.3, -0.3, -3.0]])

    def f(tau, beta, denom):
        return M.weight_matrix(q, ref, tau=tau, beta=beta, denom=denom)

    def run(*args):
        if mode == "eager":
            return f(*args)
        return jaxweight.checked(jax.jit(f))(*(None if a is None else jnp.float32(a) for a in args))

    args = (kw["tau"], kw["beta"], kw.get("denom"))
    w = run(*args)
    for i in range(2):
        np.testing.assert_allclose(w[i], _np_weights(q[i], ref[i], *args), rtol=2e-6, atol=1e-30)
    if "denom" not in kw or kw["denom"] <= 0:  # the fallback equals passing tau (or 1e-8) as denom itself
        d = kw["tau"] if kw["tau"] > 0 else 1e-8
        np.testing.assert_array_equal(w, run(1.0, kw["beta"], d))
    with pytest.raises(ValueError, match=r"beta must be finite and >= 0.0, got -0.3"):
        M.config(0.5, -0.3)  # the config keeps refusing them: there they can only be mistakes
    with pytest.raises(ValueError, match=r"denom must be finite and >= 0.0, got -2.0"):
        M.config(0.5, 0.2, denom=-2.0)


@pytest.mark.parametrize("value,frag", [(NAN, "max_completion_len must be finite, got nan"),
                                        (INF, "max_completion_len must be finite, got inf")])
def test_truncation_flags_max_len_eager_and_traced(value, frag):
    with pytest.raises(ValueError, match=frag):
        M.truncation_flags(["stop", "length"], [3, 5], value)
    with pytest.raises(ValueError, match=r"max_completion_len must be static \(a concrete number, not traced under "
                                         r"jax.jit\) and finite, got a traced float32\[\]"):
        jaxweight.checked(jax.jit(lambda m: jnp.asarray(M.truncation_flags(["stop"], [3], m))))(jnp.float32(value))


# --------------------------------------------------------------- bad data in the step
def _batch():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(4, 5)).astype(np.float32)
    ref = -rng.uniform(0.1, 2.0, (4, 5)).astype(np.float32)
    tok = rng.integers(1, 30, (4, 5)).astype(np.float32)
    return u, ref, tok


CFG = M.config(0.5, 0.04, schedule=SCHED, kl=KL)


def _step(s, u, ref, tok=None, mask=None, cfg=CFG, **kw):
    return M.step(s, u, ref, cfg, token_counts=tok, mask=mask, **kw)


@pytest.mark.parametrize("bad", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["reward", "ref_logp", "token_count"])
def test_nonfinite_entry_masked_and_counted(where, bad):
    u, ref, tok = _batch()
    arrays = {"reward": u.copy(), "ref_logp": ref.copy(), "token_count": tok.copy()}
    arrays[where][1, 2] = bad
    new, out = _step(S0, arrays["reward"], arrays["ref_logp"], arrays["token_count"], global_step=3,
                     measured_kl=0.06)
    assert int(out.n_invalid) == 1
    assert int(out.n_nonfinite) == (1 if where == "reward" else 0)
    assert not bool(out.valid[1, 2]) and float(out.weights[1, 2]) == 0.0
    for leaf in jax.tree.leaves(out):
        assert np.all(np.isfinite(np.asarray(leaf, float)))
    # the same as masking that entry out: nothing spreads to other entries or groups
    mask = np.ones((4, 5), bool)
    mask[1, 2] = False
    clean_state, clean = _step(S0, u, ref, tok, mask, global_step=3, measured_kl=0.06)
    np.testing.assert_allclose(out.weights, clean.weights, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(new.tau, clean_state.tau, rtol=1e-6)
    if where == "reward":
        np.testing.assert_allclose(out.advantages, clean.advantages, rtol=1e-6, atol=1e-7)


@pytest.mark.slow  # over the fast tier's budget (tests/conftest.py)
@pytest.mark.parametrize("big", [3e38, -3e38])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_huge_reward_gives_finite_weights(scale, big):
    u, ref, tok = _batch()
    u[0, 0] = big
    new, out = _step(S0, u, ref, tok, cfg=CFG.replace(scale=scale), global_step=3)
    for name in ("advantages", "q", "weights", "ess", "mean", "std"):
        assert np.all(np.isfinite(np.asarray(getattr(out, name)))), name
    assert np.all(np.isfinite(np.asarray(out.entropy.per_group)))
    np.testing.assert_allclose(np.asarray(out.weights).sum(1), 1.0, rtol=1e-5)
    assert int(out.n_invalid) == 0
    assert float(new.tau) != float(S0.tau)  # the controller still moved
    if scale != "batch":  # other groups are untouched by the huge one
        ref_rows = M.group_advantages(u[1:], scale=scale)
        np.testing.assert_allclose(out.advantages[1:], ref_rows, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["all_masked", "rewards_nan", "ref_nan", "tokens_inf"])
def test_all_invalid_batch_leaves_state_identical(case):
    u, ref, tok = _batch()
    mask = None
    if case == "all_masked":
        mask = np.zeros(u.shape, bool)
    elif case == "rewards_nan":
        u[:] = NAN
    elif case == "ref_nan":
        ref[:] = NAN
    else:
        tok[:] = INF
    s = M.update_tau(S0, 1.3, 0, SCHED)  # EMA set
    new, out = _step(s, u, ref, tok, mask, global_step=9, measured_kl=0.5)
    assert int(out.entropy.count) == 0  # the measurement says it measured nothing
    for a, b in zip(jax.tree.leaves(M.update_tau(s, out.entropy, 9, SCHED)), jax.tree.leaves(s), strict=True):
        np.testing.assert_array_equal(a, b)  # the tau rule alone ignores it too
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(s)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(out.weights, 0.0)
    assert int(out.n_invalid) == (0 if case == "all_masked" else u.size)
    assert np.all(np.isfinite(np.asarray(out.entropy.per_group)))


@pytest.mark.parametrize("case", ["all_masked", "rewards_nan"])
def test_all_invalid_first_batch_starts_the_ema_at_tau(case):
    """maxent_grpo's rule holds on the first call even for an empty batch: the unset entropy
    EMA starts at tau, and nothing else changes (beta ignores the KL of a batch that measured nothing)."""
    u, ref, tok = _batch()
    mask = np.zeros(u.shape, bool) if case == "all_masked" else None
    if case == "rewards_nan":
        u[:] = NAN
    assert not bool(S0.has_entropy_ema)
    new, out = _step(S0, u, ref, tok, mask, global_step=9, measured_kl=0.5)
    assert int(out.entropy.count) == 0
    assert bool(new.has_entropy_ema) and float(new.entropy_ema) == float(S0.tau)
    for a, b in zip(jax.tree.leaves(new.replace(entropy_ema=S0.entropy_ema, has_entropy_ema=S0.has_entropy_ema)),
                    jax.tree.leaves(S0), strict=True):
        np.testing.assert_array_equal(a, b)
    again, _ = _step(new, u, ref, tok, mask, global_step=10, measured_kl=0.5)  # later ones change nothing
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(new), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [NAN, INF])
def test_controller_nonfinite_measurements_leave_state(bad):
    s = M.update_tau(S0, 1.3, 0, SCHED)
    for new in (M.update_tau(s, bad, 5, SCHED), M.update_beta(s, bad, KL), M.meta_update(s, bad, bad, _meta())[0]):
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(s)):
            np.testing.assert_array_equal(a, b)


# -------------------------------------------------------------------- wrong shapes
SHAPES = [
    ("utilities_rank1", lambda: M.group_advantages(jnp.ones(3)), "utilities must have rank 2"),
    ("mask_shape", lambda: _step(S0, jnp.ones((2, 3)), jnp.ones((2, 3)), None, jnp.ones((3, 2), bool)),
     "mask must have the same shape as rewards"),
    ("ref_shape", lambda: _step(S0, jnp.ones((2, 3)), jnp.ones((2, 4))),
     "ref_logp must have the same shape as rewards"),
    ("tokens_shape", lambda: _step(S0, jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 2))),
     "token_counts must have the same shape as rewards"),
    ("cluster_ids_shape", lambda: M.compute_reward_statistics(
        jnp.ones((2, 3)), seed_cluster_ids=jnp.zeros((2, 4), jnp.int32), seed_logp_sum=jnp.ones((2, 3))),
     "seed_cluster_ids must have the same shape as utilities"),
    ("weights_rank3", lambda: M.weight_entropy(jnp.ones((2, 3, 4))), "weights must have rank 2"),
    ("tau_vector", lambda: M.init(M.config(jnp.ones(3), 0.1)), "one config"),
    ("cfg_wrong_type", lambda: M.step(S0, jnp.ones((2, 3)), jnp.ones((2, 3)), SCHED),
     "cfg must be a maxent.MaxEntConfig"),
]


@pytest.mark.parametrize("name, fn, fragment", SHAPES, ids=[x[0] for x in SHAPES])
def test_wrong_shapes(name, fn, fragment):
    with pytest.raises(ValueError, match=fragment):
        fn()


@pytest.mark.parametrize("args,msg", [
    ((["stop", "stop"], [1, 2, 3], 10), "token_counts has 3 entries but finish_reasons has 2"),
    ((["stop", "stop", "length"], [1, 2], 10), "token_counts has 2 entries but finish_reasons has 3"),
    ((["stop", "stop"], [1, 2], 10, [True]), "explicit has 1 entries but finish_reasons has 2"),
    ((["stop", "stop"], [1, 2], 10, [True, None, False]), "explicit has 3 entries but finish_reasons has 2"),
    (([["stop", "length"], ["stop", "stop"]], [[1, 2], [3]], 10), "token_counts[1] has 1 entries but finish_reasons[1] has 2"),
    (([["stop"], ["stop"]], [[1]], 10), "token_counts has 1 rows but finish_reasons has 2"),
    (([["stop"], ["stop"]], [[1], [2]], 10, [[None], [True], [False]]), "explicit has 3 rows but finish_reasons has 2"),
    ((["stop"], 5, 10), "token_counts must be a sequence like finish_reasons, got int"),
], ids=["flat_long", "flat_short", "explicit_short", "explicit_long", "row_short", "rows_short", "explicit_rows",
        "not_a_sequence"])
def test_truncation_flags_ragged_inputs_name_the_argument_and_both_lengths(args, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        M.truncation_flags(*args)


def test_truncation_flags_matching_ragged_rows_still_work():
    out = M.truncation_flags([["stop", "length"], ["stop"]], [[1, 2], [30]], 10, [[None, None], [False]])
    np.testing.assert_array_equal(out, [[False, True], [True, False]])


@pytest.mark.parametrize("value", [1e30, 3e38])
def test_huge_token_counts_give_finite_weights_that_sum_to_one(value):
    tok = jnp.ones((2, 4)).at[0, 1].set(value)
    w = M.weight_matrix(jnp.full((2, 4), 0.25), -jnp.ones((2, 4)), tok, tau=0.5, beta=0.1)
    assert np.all(np.isfinite(np.asarray(w)))
    np.testing.assert_allclose(np.asarray(w).sum(1), 1.0, rtol=1e-6)
    assert float(w[0, 1]) == pytest.approx(1.0, rel=1e-6)  # the huge count takes (nearly) all the mass
    ess = M.effective_sample_size(jnp.full((1, 3), value))
    np.testing.assert_allclose(np.asarray(ess), [3.0], rtol=1e-6)
