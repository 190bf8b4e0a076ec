"""Bad inputs on the reward-model side of jaxweight.preference (issue H).

Every case asserts the specific outcome: the error type and a fragment of its
message (the same eagerly and through ``jaxweight.checked(jax.jit(...))``), or
finite outputs, the invalid-count metric and unchanged state.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxweight
from jaxweight import preference as pf
from jaxweight.preference import fragments as fr
from jaxweight.preference import reward_nets as rn
from jaxweight.preference import training as tr

L = 3
NET = pf.RewardMLP(hidden_sizes=(4,), observation_space=pf.Box((2,)), action_space=pf.Discrete(2))


def _pairs(n=12, seed=0, act_dtype=np.int32):
    rng = np.random.default_rng(seed)
    acts = rng.integers(0, 2, (n, 2, L)).astype(act_dtype)
    return pf.fragment_pairs_from_arrays(rng.normal(size=(n, 2, L + 1, 2)), acts, acts.astype(np.float32))


PAIRS = _pairs()
PREFS = pf.synthetic_preferences(0, PAIRS, temperature=0.0)[0]
EX = pf.example_inputs(PAIRS)
TRAINER = pf.RewardTrainer(NET, num_members=3, batch_size=4)
CFG = TRAINER.config
STATE = TRAINER.init(0, EX)


BCFG = pf.buffer.config(16)


def _buffer(pairs=PAIRS, prefs=PREFS):
    """A buffer holding ``pairs`` as a jitted push stores them: traced preferences are not checked, so a
    bad one is stored (and left out by training); an eager push refuses it."""
    return jax.jit(pf.buffer.step)(pf.buffer.init(BCFG, None, PAIRS), pairs, jnp.asarray(prefs), BCFG)


def _push(buf, pairs, prefs, count=None):
    return pf.buffer.step(buf, pairs, prefs, BCFG, count=count)


def _leaves_equal(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _all_finite(tree):
    return all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(tree))


def _message(fn, *args):
    with pytest.raises(ValueError) as info:
        fn(*args)
    return str(info.value).split(" (`check` failed)")[0].strip()


# --------------------------------------------- hyperparameters: eager == checked(jit)
# (values exactly representable in float32: the traced message prints the f32 value)
_TRAIN_HP = [
    ("learning_rate", -1.0, "learning_rate must be finite and >= 0.0"),
    ("learning_rate", float("nan"), "learning_rate must be finite and >= 0.0"),
    ("learning_rate", float("inf"), "learning_rate must be finite and >= 0.0"),
    ("weight_decay", -0.5, "weight_decay must be finite and >= 0.0"),
    ("noise_prob", 1.5, r"noise_prob must be finite and in \[0.0, 1.0\]"),
    ("noise_prob", -0.25, r"noise_prob must be finite and in \[0.0, 1.0\]"),
    ("discount", 1.5, r"discount must be finite and in \[0.0, 1.0\]"),
    ("threshold", 0.0, "threshold must be finite and > 0.0"),
    ("b1", 1.0, "b1 must be finite and"),
    ("eps", -1.0, "eps must be finite and >= 0.0"),
]


@pytest.mark.parametrize("name,value,match", _TRAIN_HP, ids=[f"{n}={v}" for n, v, _ in _TRAIN_HP])
def test_trainer_hparam_eager_and_checked_jit_agree(name, value, match):
    eager = _message(lambda: tr.config(NET, **{name: value}))
    assert re.search(match, eager), eager
    assert re.search(match, _message(lambda: pf.RewardTrainer(NET, **{name: value})))
    assert _message(lambda: tr.TrainerConfig(NET, **{name: value})) == eager  # the class checks too
    # the same value swept as a traced leaf of the config, inside jit
    pairs = jax.tree.map(lambda x: x[:4], PAIRS)
    cfg = tr.config(NET, batch_size=4)
    st = tr.init(cfg, params=jax.tree.map(lambda x: x[0], STATE.params))

    def step(v):
        return tr.step(st, pairs, PREFS[:4], cfg.replace(**{name: v}))[1]

    jitted = _message(jaxweight.checked(jax.jit(step)), jnp.float32(value))
    assert jitted == eager


def test_epoch_checks_traced_hparams_under_checked_jit():
    buf = _buffer()
    run = jaxweight.checked(jax.jit(lambda lr: tr.epoch(STATE, 0, buf, CFG.replace(learning_rate=lr))))
    with pytest.raises(ValueError, match="learning_rate must be finite and >= 0.0, got -1.0"):
        run(jnp.float32(-1.0))
    state, m = run(jnp.float32(1e-3))  # a good value passes
    assert _all_finite(state.params) and int(m["n_invalid"]) == 0


_TEACHER = [
    ("temperature", -1.0, "temperature must be finite and >= 0.0"),
    ("temperature", float("nan"), "temperature must be finite and >= 0.0"),
    ("discount", -0.5, r"discount must be finite and in \[0.0, 1.0\]"),
    ("threshold", 0.0, "threshold must be finite and > 0.0"),
    ("mistake_prob", 1.5, r"mistake_prob must be finite and in \[0.0, 1.0\]"),
    ("mistake_prob", -0.5, r"mistake_prob must be finite and in \[0.0, 1.0\]"),
    ("equal_threshold", -1.0, "equal_threshold must be finite and >= 0.0"),
]


@pytest.mark.parametrize("name,value,match", _TEACHER, ids=[f"{n}={v}" for n, v, _ in _TEACHER])
def test_teacher_settings_eager_and_checked_jit_agree(name, value, match):
    eager = _message(lambda: pf.synthetic_preferences(0, PAIRS, **{name: value}))
    assert re.search(match, eager), eager
    jitted = _message(jaxweight.checked(jax.jit(lambda v: pf.synthetic_teacher(0, PAIRS, **{name: v}).prefs)),
                      jnp.float32(value))
    assert jitted == eager


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5, float("nan")])
def test_reward_norm_decay_eager_and_checked_jit_agree(decay):
    eager = _message(lambda: pf.normalization.config("ema", decay))
    assert "decay must be finite and in (0.0, 1.0)" in eager
    assert _message(lambda: pf.normalization.RewardNormConfig("ema", decay)) == eager
    jitted = _message(jaxweight.checked(jax.jit(lambda d: pf.normalization.config("ema", d).decay)), jnp.float32(decay))
    assert jitted == eager


_R1 = jnp.asarray([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]])  # spec example 2: [L=2, M=3]
_R2 = jnp.asarray([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
_SINGLE = jax.tree.map(lambda x: x[0], STATE.params)
_BT_FNS = {
    "probability": lambda kw: pf.probability(jnp.arange(3.0), jnp.zeros(3), **kw),
    "preference_probabilities": lambda kw: pf.preference_probabilities(NET, _SINGLE, PAIRS, **kw)[0],
    "variance_estimate": lambda kw: pf.variance_estimate(_R1, _R2, "probability", **kw),
    "uncertainty_scores": lambda kw: fr.uncertainty_scores(_R1, _R2, **kw)["probability"],
}
_BT_HP = [
    ("noise_prob", 1.5, r"noise_prob must be finite and in \[0.0, 1.0\], got 1.5"),
    ("noise_prob", -0.25, r"noise_prob must be finite and in \[0.0, 1.0\], got -0.25"),
    ("noise_prob", float("nan"), r"noise_prob must be finite and in \[0.0, 1.0\], got nan"),
    ("discount", 1.5, r"discount must be finite and in \[0.0, 1.0\], got 1.5"),
    ("discount", float("inf"), r"discount must be finite and in \[0.0, 1.0\], got inf"),
    ("threshold", 0.0, r"threshold must be finite and > 0.0, got 0.0"),
    ("threshold", -1.0, r"threshold must be finite and > 0.0, got -1.0"),
    ("threshold", float("nan"), r"threshold must be finite and > 0.0, got nan"),
]


@pytest.mark.parametrize("fn", list(_BT_FNS))
@pytest.mark.parametrize("name,value,match", _BT_HP, ids=[f"{n}={v}" for n, v, _ in _BT_HP])
def test_bradley_terry_settings_eager_and_checked_jit_agree(fn, name, value, match):
    """probability & co. used to accept noise_prob=1.5 (a probability outside [0, 1]) silently."""
    f = _BT_FNS[fn]
    eager = _message(lambda: f({name: value}))
    assert re.search(match, eager), eager
    jitted = _message(jaxweight.checked(jax.jit(lambda v: f({name: v}))), jnp.float32(value))
    assert jitted == eager


def test_bradley_terry_good_traced_settings_pass_checked_jit():
    got = jaxweight.checked(jax.jit(lambda n: pf.probability(jnp.array([1., 2., 3.]), jnp.array([0., 1., 1.]),
                                                             noise_prob=n)))(jnp.float32(0.0))
    np.testing.assert_allclose(float(got), 0.9820138, rtol=1e-6)


@pytest.mark.parametrize("value,match", [(-1.0, "temperature must be finite and >= 0.0, got -1.0"),
                                         (float("nan"), "temperature must be finite and >= 0.0, got nan")])
def test_synthetic_preferences_traced_temperature_is_the_checkify_value_error(value, match):
    eager = _message(lambda: pf.synthetic_preferences(0, PAIRS, temperature=value))
    assert eager == match
    run = jaxweight.checked(jax.jit(lambda t: pf.synthetic_preferences(0, PAIRS, temperature=t)[0]))
    assert _message(run, jnp.float32(value)) == eager
    assert run(jnp.float32(0.5)).shape == (12,)  # a good traced value passes


_TRACEABLE = [
    ("discounted_returns discount=1.5", lambda v: pf.discounted_returns(PAIRS.rews, v), 1.5,
     r"discount must be finite and in \[0.0, 1.0\], got 1.5"),
    ("discounted_returns discount=nan", lambda v: pf.discounted_returns(PAIRS.rews, v), float("nan"),
     r"discount must be finite and in \[0.0, 1.0\], got nan"),
    ("add_std alpha=nan", lambda v: pf.add_std(jnp.ones(2), jnp.ones(2), v), float("nan"),
     "alpha must be finite, got nan"),
    ("add_std alpha=inf", lambda v: pf.add_std(jnp.ones(2), jnp.ones(2), v), float("inf"),
     "alpha must be finite, got inf"),
    ("ensemble_reward alpha=nan", lambda v: pf.ensemble_reward(NET, STATE.params, *EX, alpha=v), float("nan"),
     "alpha must be finite, got nan"),
    ("normalization eps<0", lambda v: pf.normalization.config(eps=v).eps, -1.0,
     "eps must be finite and >= 0.0, got -1.0"),
    ("normalization eps=nan", lambda v: pf.normalization.config(eps=v).eps,
     float("nan"), "eps must be finite and >= 0.0, got nan"),
]


@pytest.mark.parametrize("fn,value,match", [c[1:] for c in _TRACEABLE], ids=[c[0] for c in _TRACEABLE])
def test_traceable_settings_eager_and_checked_jit_agree(fn, value, match):
    eager = _message(lambda: fn(value))
    assert re.search(match, eager), eager
    assert _message(jaxweight.checked(jax.jit(fn)), jnp.float32(value)) == eager


def _result(x):
    """An array result for ``jax.jit`` of a builder that returns a Python object."""
    del x
    return jnp.zeros(())


# (label, builder of the bad value, bad value, eager message, range text of the traced message)
_HOST = [
    ("sample_factor", lambda v: pf.active_selection(0, STATE.params, NET, _trajs(), 2, 2, v).rews, 0.5,
     "sample_factor must be finite and >= 1.0, got 0.5", "finite and >= 1.0"),
    ("sample_factor nan", lambda v: pf.active_selection(0, STATE.params, NET, _trajs(), 2, 2, v).rews, float("nan"),
     "sample_factor must be finite and >= 1.0, got nan", "finite and >= 1.0"),
    ("epoch_multiplier", lambda v: jnp.asarray(tr.num_epochs(1, v)), -1.0,
     "epoch_multiplier must be finite and >= 0.0, got -1.0", "finite and >= 0.0"),
    ("lp initial_lambda<0", lambda v: _result(pf.lp_regularizer(v)), -0.5,
     "initial_lambda must be finite and >= 0.0, got -0.5", "finite and >= 0.0"),
    ("lp initial_lambda=nan", lambda v: _result(pf.lp_regularizer(v)), float("nan"),
     "initial_lambda must be finite and >= 0.0, got nan", "finite and >= 0.0"),
    ("weight_decay initial_lambda<0", lambda v: _result(pf.weight_decay_regularizer(v)), -0.5,
     "initial_lambda must be finite and >= 0.0, got -0.5", "finite and >= 0.0"),
    ("val_split=nan", lambda v: _result(pf.lp_regularizer(0.1, lambda_updater=pf.IntervalParamScaler(0.1, (1.1, 1.5)),
                                                          val_split=v)), float("nan"),
     "val_split must be finite, got nan", "finite"),
    ("scaling_factor=nan", lambda v: _result(pf.IntervalParamScaler(v, (1.1, 1.5))), float("nan"),
     "scaling_factor must be finite, got nan", "finite"),
    ("scaling_factor=1.5", lambda v: _result(pf.IntervalParamScaler(v, (1.1, 1.5))), 1.5,
     "scaling_factor must be in (0, 1) within machine precision.", "finite"),
    ("tolerable_interval=(nan, 1.5)", lambda v: _result(pf.IntervalParamScaler(0.1, (v, 1.5))), float("nan"),
     "tolerable_interval[0] must be finite, got nan", "finite"),
    ("discount_factor=1.5", lambda v: _result(pf.basic_shaped_reward_net(pf.Box((2,)), discount_factor=v)), 1.5,
     "discount_factor must be finite and in [0.0, 1.0], got 1.5", "finite and in [0.0, 1.0]"),
    ("ShapedRewardNet discount_factor=nan", lambda v: _result(pf.ShapedRewardNet(NET, pf.PotentialMLP(), v)),
     float("nan"), "discount_factor must be finite and in [0.0, 1.0], got nan", "finite and in [0.0, 1.0]"),
    ("initial_fraction=1.5", lambda v: jnp.asarray(pf.allocate_comparisons(100, 5, v)), 1.5,
     "initial_fraction must be finite and in [0.0, 1.0], got 1.5", "finite and in [0.0, 1.0]"),
    ("initial_fraction=nan", lambda v: jnp.asarray(pf.allocate_comparisons(100, 5, v)), float("nan"),
     "initial_fraction must be finite and in [0.0, 1.0], got nan", "finite and in [0.0, 1.0]"),
]


@pytest.mark.parametrize("fn,value,eager_msg,rng", [c[1:] for c in _HOST], ids=[c[0] for c in _HOST])
def test_host_settings_refused_eagerly_and_when_traced(fn, value, eager_msg, rng):
    """Settings that set a size or live on a Python object: a bad value raises at once; a traced one is a
    ValueError naming it (not a ConcretizationTypeError / TracerBoolConversionError)."""
    assert _message(lambda: fn(value)) == eager_msg
    name = eager_msg.split(" must be")[0]
    jitted = _message(jaxweight.checked(jax.jit(fn)), jnp.float32(value))
    assert jitted.startswith(f"{name} must be static (a concrete number, not traced under jax.jit) and {rng}, "
                             "got a traced float32[]"), jitted


def test_ensemble_apply_chunk_size_must_be_a_static_int():
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        pf.ensemble_apply(NET, STATE.params, *EX, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size must be a static Python int"):
        jaxweight.checked(jax.jit(lambda c: pf.ensemble_apply(NET, STATE.params, *EX, chunk_size=c)))(jnp.int32(2))


# --------------------------------------------------------- static settings
_STATIC = [
    ("batch_size=0", lambda: pf.RewardTrainer(NET, batch_size=0), "batch_size must be >= 1"),
    ("minibatch_size=0", lambda: pf.RewardTrainer(NET, minibatch_size=0), "minibatch_size must be >= 1"),
    ("minibatch>batch", lambda: pf.RewardTrainer(NET, batch_size=4, minibatch_size=8),
     r"minibatch_size must be <= batch_size \(4\), got 8"),
    ("batch%minibatch", lambda: pf.RewardTrainer(NET, batch_size=6, minibatch_size=4),
     "Batch size must be a multiple of minibatch size."),
    ("epochs=0", lambda: pf.RewardTrainer(NET, epochs=0), "epochs must be >= 1"),
    ("num_members=1", lambda: pf.RewardTrainer(NET, num_members=1), "Must be at least 2 member in the ensemble."),
    ("num_members=0", lambda: pf.RewardTrainer(NET, num_members=0), "Must be at least 2 member in the ensemble."),
    ("ensemble_init M=1", lambda: pf.ensemble_init(0, NET, EX, 1), "Must be at least 2 member in the ensemble."),
    ("epoch_multiplier<0", lambda: tr.num_epochs(1, -1.0), "epoch_multiplier must be finite and >= 0.0"),
    ("epoch_multiplier nan", lambda: tr.num_epochs(1, float("nan")), "epoch_multiplier must be finite"),
    ("epoch_multiplier rounds to 0", lambda: TRAINER.train(STATE, 0, _buffer(), 0.4), "Must train for at least one"),
    ("epoch epochs=0", lambda: tr.epoch(STATE, 0, _buffer(), CFG, epochs=0), "epochs must be"),
    ("capacity=0", lambda: pf.buffer.config(0), "capacity must be >= 1, got 0"),
    ("capacity=-3", lambda: pf.buffer.config(-3), "capacity must be >= 1"),
    ("initial_lambda<0", lambda: tr.TrainerConfig(NET, initial_lambda=-0.5), "initial_lambda must be finite and >= 0.0"),
    ("count>P", lambda: _push(_buffer(), PAIRS, PREFS, 13), r"count must be .*in \[0, 12\], got 13"),
    ("count<0", lambda: _push(_buffer(), PAIRS, PREFS, -1), r"count must be .*in \[0, 12\], got -1"),
    ("prefs dtype", lambda: _push(_buffer(), PAIRS, np.zeros(12)), "preferences should have dtype float32"),
    ("prefs shape", lambda: _push(_buffer(), PAIRS, PREFS[:5]), r"Unexpected preferences shape \(5,\)"),
    ("regularizer type", lambda: pf.RewardTrainer(NET, regularizer=0.1), "regularizer must be a Regularizer"),
    ("module type", lambda: pf.RewardTrainer("mlp"), "module must be a flax.linen Module"),
]


@pytest.mark.parametrize("fn,match", [c[1:] for c in _STATIC], ids=[c[0] for c in _STATIC])
def test_static_settings_refused(fn, match):
    with pytest.raises(ValueError, match=match):
        fn()


def _trajs(lengths=(6, 5)):
    n, t = len(lengths), max(lengths)
    return pf.Trajectories(obs=jnp.zeros((n, t + 1, 2)), acts=jnp.zeros((n, t), jnp.int32), rews=jnp.zeros((n, t)),
                           lengths=jnp.asarray(lengths, jnp.int32), terminal=jnp.ones((n,), bool))


_FRAGMENTS = [
    ("fragment_length=0", lambda: pf.random_fragments(0, _trajs(), 0, 2), "fragment_length must be >= 1"),
    ("num_pairs=0", lambda: pf.random_fragments(0, _trajs(), 2, 0), "num_pairs must be >= 1"),
    ("too long", lambda: pf.random_fragments(0, _trajs(), 9, 2), "No trajectories are long enough"),
    ("terminal flags mismatch", lambda: pf.random_fragments(0, _trajs().replace(terminal=jnp.ones((3,), bool)), 2, 2),
     r"terminal must have shape \(2,\)"),
    ("lengths vs obs", lambda: pf.random_fragments(0, _trajs().replace(obs=jnp.zeros((3, 7, 2))), 2, 2),
     r"obs must have shape \(2, 7, ...\)"),
    ("from_arrays terminal", lambda: pf.trajectories_from_arrays(
        [np.zeros((3, 2)), np.zeros((4, 2))], [np.zeros(2), np.zeros(3)], terminal=[True]),
     r"terminal must have shape \(2,\)"),
    ("sample_factor<1", lambda: pf.active_selection(0, STATE.params, NET, _trajs(), 2, 2, 0.5),
     "sample_factor must be finite and >= 1.0"),
    ("active noise_prob", lambda: pf.active_selection(0, STATE.params, NET, _trajs(), 2, 2, 2.0, noise_prob=2.0),
     r"noise_prob must be finite and in \[0.0, 1.0\]"),
    ("teacher P=0", lambda: pf.synthetic_preferences(0, jax.tree.map(lambda x: x[:0], PAIRS)), "P == 0"),
    ("push pairs mismatch", lambda: _push(_buffer(), PAIRS.replace(valid=PAIRS.valid[:3]), PREFS),
     r"valid must have shape \(12,\)"),
]


@pytest.mark.parametrize("fn,match", [c[1:] for c in _FRAGMENTS], ids=[c[0] for c in _FRAGMENTS])
def test_fragment_and_data_settings_refused(fn, match):
    with pytest.raises(ValueError, match=match):
        fn()


# --------------------------------------------------------- reward-net inputs
def test_wrong_observation_size_names_it():
    plain = pf.RewardMLP(hidden_sizes=(4,))
    params = plain.init(jax.random.key(0), jnp.zeros((1, 2)), jnp.zeros((1, 1)), jnp.zeros((1, 2)), jnp.zeros((1,)))
    with pytest.raises(ValueError, match=r"RewardMLP got 4 input features \(state 3 \+ action 1\) but its params expect 3"):
        plain.apply(params, jnp.zeros((5, 3)), jnp.zeros((5, 1)), jnp.zeros((5, 3)), jnp.zeros((5,)))
    with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., 2\)"):
        NET.apply(jax.tree.map(lambda x: x[0], STATE.params), jnp.zeros((5, 3)), jnp.zeros((5,), jnp.int32),
                  jnp.zeros((5, 3)), jnp.zeros((5,)))


@pytest.mark.parametrize("action", [2, -1])
def test_discrete_action_out_of_range_eager_error(action):
    params = jax.tree.map(lambda x: x[0], STATE.params)
    acts = jnp.array([0, action, 1], jnp.int32)
    with pytest.raises(ValueError, match=rf"action has value {action} outside the range of Discrete"):
        NET.apply(params, jnp.zeros((3, 2)), acts, jnp.zeros((3, 2)), jnp.zeros((3,)))
    # under jit: no error; the trainer masks and counts such pairs (see below)
    out = jax.jit(NET.apply)(params, jnp.zeros((3, 2)), acts, jnp.zeros((3, 2)), jnp.zeros((3,)))
    assert bool(jnp.all(jnp.isfinite(out)))


# ------------------------------------------------- bad data inside training
def _corrupt(kind):
    """One bad stored pair (index 5) of each kind."""
    pairs, prefs = PAIRS, PREFS
    if kind == "nan_obs":
        pairs = pairs.replace(obs=pairs.obs.at[5, 1, 2, 0].set(jnp.nan))
    elif kind == "inf_obs":
        pairs = pairs.replace(obs=pairs.obs.at[5, 0, 0, 1].set(jnp.inf))
    elif kind == "nan_pref":
        prefs = prefs.at[5].set(jnp.nan)
    elif kind == "pref_above_1":
        prefs = prefs.at[5].set(1.5)
    elif kind == "pref_below_0":
        prefs = prefs.at[5].set(-0.25)
    elif kind == "action_out_of_range":
        pairs = pairs.replace(acts=pairs.acts.at[5, 0, 1].set(7))
    elif kind == "negative_action":
        pairs = pairs.replace(acts=pairs.acts.at[5, 1, 0].set(-2))
    return pairs, prefs


_KINDS = ["nan_obs", "inf_obs", "nan_pref", "pref_above_1", "pref_below_0", "action_out_of_range", "negative_action"]
_train_jit = jax.jit(lambda s, k, b: tr.epoch(s, k, b, CFG, epochs=2))


@pytest.mark.parametrize("kind", _KINDS)
def test_bad_stored_pair_is_left_out_and_counted(kind):
    pairs, prefs = _corrupt(kind)
    bad = _buffer(pairs, prefs)
    state, m = _train_jit(STATE, jax.random.key(1), bad)
    assert _all_finite(state.params) and _all_finite(state.opt_state)
    assert int(m["n_invalid"]) == 1
    assert all(np.isfinite(np.asarray(m[k])).all() for k in ("train/loss", "train/accuracy", "train/gt_reward_loss"))
    # exactly the result of training without that pair (marked invalid instead)
    ref_buf = _buffer(pairs.replace(valid=pairs.valid.at[5].set(False)), jnp.where(jnp.isfinite(prefs), prefs, 0.5))
    ref, _ = _train_jit(STATE, jax.random.key(1), ref_buf)
    assert _leaves_equal(state.params, ref.params) and _leaves_equal(state.opt_state, ref.opt_state)
    assert tr.metrics_dict(m, CFG)["preference/n_invalid"] == 1.0


@pytest.mark.parametrize("kind", ["nan_obs", "nan_pref"])
def test_host_trainer_reports_invalid_pairs(kind):
    state, metrics = TRAINER.train(STATE, 0, _buffer(*_corrupt(kind)))
    assert metrics["reward/final/n_invalid"] == 1.0
    assert np.isfinite(metrics["reward/final/train/loss"]) and _all_finite(state.params)


@pytest.mark.parametrize("kind, where, value", [("action_out_of_range", "5, 0, 1", 7),
                                                ("negative_action", "5, 1, 0", -2)])
def test_concrete_action_outside_the_space_is_refused_at_entry_naming_it(kind, where, value):
    """A Discrete(2) net fed action 7: the host trainer, and ``epoch`` / ``step`` on concrete data, name the
    argument, the index, the value and the space before training (no "all pairs are invalid")."""
    pairs, prefs = _corrupt(kind)
    buf = _buffer(pairs, prefs)
    msg = (rf"buffer\.pairs\.acts\[{where}\] has value {value}, outside the action space Discrete\(2\) of the "
           r"reward net \(valid actions: 0 \.\. 1\)")
    with pytest.raises(ValueError, match=msg):
        TRAINER.train(STATE, 0, buf)
    with pytest.raises(ValueError, match=msg):
        tr.epoch(STATE, 0, buf, CFG)
    idx = jnp.arange(12).reshape(3, 4)  # pair 5 is row 1 of member 1's batch
    step_msg = rf"pairs\.acts\[1, 1, {where[3:]}\] has value {value}, outside the action space Discrete\(2\)"
    with pytest.raises(ValueError, match=step_msg):
        tr.step(STATE, jax.tree.map(lambda x: x[idx], pairs), prefs[idx], CFG)
    # traced data is left out and counted instead (test_bad_stored_pair_is_left_out_and_counted)
    _, m = _train_jit(STATE, jax.random.key(1), buf)
    assert int(m["n_invalid"]) == 1


def test_all_stored_actions_outside_the_space_name_the_space_not_all_invalid():
    """The report of the issue: every stored pair holds action 7 for a Discrete(2) net."""
    pairs = jax.tree.map(lambda x: x[:2], PAIRS)
    pairs = pairs.replace(acts=jnp.full_like(pairs.acts, 7))
    bcfg = pf.buffer.config(4)
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, pairs), pairs, PREFS[:2], bcfg)
    trainer = pf.RewardTrainer(NET, batch_size=2)
    with pytest.raises(ValueError, match=r"buffer\.pairs\.acts\[0, 0, 0\] has value 7, outside the action space "
                                         r"Discrete\(2\) .*valid actions: 0 \.\. 1\); 12 such value"):
        trainer.train(trainer.init(0, EX), 0, buf)


def test_discrete_observations_outside_the_space_are_named_too():
    net = pf.RewardMLP(hidden_sizes=(4,), observation_space=pf.MultiDiscrete((3, 2)), action_space=pf.Discrete(2))
    obs = np.zeros((4, 2, L + 1, 2), np.int32)
    pairs = pf.fragment_pairs_from_arrays(obs, np.zeros((4, 2, L), np.int32))
    trainer = pf.RewardTrainer(net, batch_size=4)
    state = trainer.init(0, pairs)
    bad = pairs.replace(obs=pairs.obs.at[2, 1, 3, 1].set(2))  # position 1 has 2 categories
    bcfg = pf.buffer.config(4)
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, bad), bad, np.ones(4, np.float32), bcfg)
    with pytest.raises(ValueError, match=r"buffer\.pairs\.obs\[2, 1, 3, 1\] has value 2, outside the observation "
                                         r"space MultiDiscrete\(\[3, 2\]\)"):
        trainer.train(state, 0, buf)
    # a slot that is not filled is not checked: the same data pushed as invalid pairs trains nothing but
    # raises the empty-data error, not the range error
    flagged = bad.replace(valid=jnp.zeros(4, bool))
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, bad), flagged, np.ones(4, np.float32), bcfg)
    with pytest.raises(ValueError, match="all 4 stored pairs are invalid"):
        trainer.train(state, 0, buf)


@pytest.mark.slow  # over the fast tier's budget (tests/conftest.py)
@pytest.mark.parametrize("where", ["obs", "pref"])
def test_one_nan_in_an_ensemble_batch_leaves_every_member_finite(where):
    idx = jnp.arange(12).reshape(3, 4)  # one batch of 4 per member
    pairs = jax.tree.map(lambda x: x[idx], PAIRS)
    prefs = PREFS[idx]
    if where == "obs":
        pairs = pairs.replace(obs=pairs.obs.at[:, 2, 0, 0, 0].set(jnp.nan))
    else:
        prefs = prefs.at[:, 2].set(jnp.nan)
    for step in (tr.step, jax.jit(tr.step)):
        new, m = step(STATE, pairs, prefs, CFG)
        assert _all_finite(new.params) and _all_finite(new.opt_state)
        np.testing.assert_array_equal(m["n_invalid"], [1, 1, 1])
        assert not _leaves_equal(new.params, STATE.params) and int(new.steps) == 1


@pytest.mark.parametrize("where", ["obs", "pref", "mask"])
def test_batch_without_a_valid_pair_leaves_state_exactly_unchanged(where):
    idx = jnp.arange(12).reshape(3, 4)
    pairs, prefs, mask = jax.tree.map(lambda x: x[idx], PAIRS), PREFS[idx], None
    if where == "obs":
        pairs = pairs.replace(obs=jnp.full_like(pairs.obs, jnp.nan))
    elif where == "pref":
        prefs = jnp.full_like(prefs, 2.0)
    else:
        mask = jnp.zeros((3, 4), bool)
    new, m = jax.jit(tr.step)(STATE, pairs, prefs, CFG, mask=mask)
    assert _leaves_equal(new.params, STATE.params) and _leaves_equal(new.opt_state, STATE.opt_state)
    assert int(new.steps) == 0
    np.testing.assert_array_equal(m["n_invalid"], [0, 0, 0] if where == "mask" else [4, 4, 4])


def test_all_bad_buffer_leaves_state_unchanged():
    bad = _buffer(PAIRS.replace(obs=jnp.full_like(PAIRS.obs, jnp.nan)), PREFS)
    state, m = _train_jit(STATE, jax.random.key(1), bad)
    assert _leaves_equal(state.params, STATE.params) and _leaves_equal(state.opt_state, STATE.opt_state)
    assert int(m["n_invalid"]) == 12 and int(state.steps) == 0


def test_huge_finite_inputs_give_finite_weights():
    pairs = PAIRS.replace(obs=PAIRS.obs.at[3].set(3e38))
    state, m = _train_jit(STATE, jax.random.key(1), _buffer(pairs, PREFS))
    assert _all_finite(state.params) and int(m["n_invalid"]) == 0


def test_step_counts_invalid_pairs():
    cfg = tr.config(NET, batch_size=4)
    state = tr.init(cfg, params=jax.tree.map(lambda x: x[0], STATE.params))
    pairs = jax.tree.map(lambda x: x[:4], PAIRS)
    bad = pairs.replace(obs=pairs.obs.at[1].set(jnp.nan))
    new, out = jax.jit(tr.step)(state, bad, PREFS[:4], cfg)
    assert _all_finite(new.params) and int(out["n_invalid"]) == 1 and int(new.steps) == 1


# ------------------------------------------------------- normaliser, teacher
@pytest.mark.parametrize("kind", ["running", "ema"])
def test_reward_normaliser_ignores_non_finite_entries(kind):
    cfg = pf.normalization.config(kind)
    st = pf.normalization.init(cfg)
    clean = pf.normalization.step(st, jnp.array([1.0, 2.0, 3.0]), cfg)[0]
    dirty = pf.normalization.step(st, jnp.array([1.0, jnp.nan, 2.0, jnp.inf, 3.0, -jnp.inf]), cfg)[0]
    assert _leaves_equal(dirty, clean) and int(dirty.count) == 3
    assert _leaves_equal(pf.normalization.step(st, jnp.full((4,), jnp.nan), cfg)[0], st)  # nothing finite: unchanged
    _, out = pf.normalization.step(dirty, jnp.array([jnp.nan, 1.0]), cfg)
    assert np.isfinite(np.asarray(out)[1])


def test_teacher_leaves_pairs_with_non_finite_rewards_unanswered():
    pairs = PAIRS.replace(rews=PAIRS.rews.at[2, 0, 1].set(jnp.nan).at[7, 1, 0].set(jnp.inf))
    out = pf.synthetic_teacher(0, pairs, temperature=1.0)
    assert int(out.n_invalid) == 2 and not bool(out.valid[2]) and not bool(out.valid[7])
    assert bool(jnp.all(jnp.isfinite(out.prefs))) and np.isfinite(float(out.entropy))
    assert out.to_dict()["preference/teacher/n_invalid"] == 2.0


def test_valid_inputs_marks_bad_items():
    pairs, _ = _corrupt("action_out_of_range")
    ok = rn.valid_inputs(NET, pairs.obs, pairs.acts)
    np.testing.assert_array_equal(np.flatnonzero(~np.asarray(ok)), [5])


# ------------------------------------------------------- preferences, empty buffers, actions
@pytest.mark.parametrize("value", [1.5, -0.5, float("nan"), float("inf")])
def test_concrete_bad_preferences_are_refused_and_traced_ones_masked(value):
    prefs = PREFS.at[3].set(value)
    with pytest.raises(ValueError, match=re.escape("prefs must be probabilities in [0.0, 1.0] (finite), got prefs[3]=")):
        pf.buffer.step(pf.buffer.init(BCFG, None, PAIRS), PAIRS, prefs, BCFG)
    # only the pushed ones are checked: a bad preference past ``count`` is not stored
    pf.buffer.step(pf.buffer.init(BCFG, None, PAIRS), PAIRS, prefs, BCFG, count=3)
    buf = _buffer(PAIRS, prefs)  # traced: stored, then left out and counted
    assert not bool(pf.buffer.mask(buf)[3]) and int(jnp.sum(pf.buffer.mask(buf))) == 11
    assert pf.buffer.metrics_dict(buf, BCFG)["buffer/valid"] == 11.0
    state, m = _train_jit(STATE, jax.random.key(1), buf)
    assert int(m["n_invalid"]) == 1 and _all_finite(state.params)


def test_training_on_an_empty_buffer_refuses_on_the_host_and_changes_nothing_in_the_pure_epoch():
    empty = pf.buffer.init(BCFG, None, PAIRS)
    with pytest.raises(ValueError, match="cannot train the reward model: the buffer is empty"):
        TRAINER.train(STATE, 0, empty)
    state, m = _train_jit(STATE, jax.random.key(1), empty)
    assert _leaves_equal(state, STATE) and int(m["n_invalid"]) == 0
    all_bad = _buffer(PAIRS.replace(obs=jnp.full_like(PAIRS.obs, jnp.nan)), PREFS)
    with pytest.raises(ValueError, match="all 12 stored pairs are invalid"):
        TRAINER.train(STATE, 0, all_bad)


def test_env_step_refuses_a_concrete_action_out_of_range_and_contains_a_traced_one():
    pytest.importorskip("gymnax")
    from jaxweight.rl.envs import env_step, make_env

    env, params = make_env("cartpole", horizon=5)
    obs, state = env.reset(jax.random.key(0), params)
    for bad in (7, -1, 0.5):
        with pytest.raises(ValueError, match=re.escape("action must be an integer in [0, 1] for the action space "
                                                       "Discrete of FixedHorizonCartPole-5, got")):
            env_step(env, jax.random.key(1), state, bad, params)
    run = jax.jit(lambda s, a: env_step(env, jax.random.key(1), s, a, params))
    o, s, r, d, info = run(state, jnp.int32(7))
    assert _leaves_equal(s, state) and np.array_equal(o, obs) and float(r) == 0.0 and not bool(d)
    assert bool(info["invalid_action"]) and not bool(run(state, jnp.int32(1))[4]["invalid_action"])


def test_cross_entropy_loss_refuses_concrete_bad_targets_and_masks_traced_ones():
    probs = jnp.array([0.5, 0.7, 0.2, 0.9])
    with pytest.raises(ValueError, match=re.escape("prefs must be probabilities in [0.0, 1.0] (finite), got prefs[1]=1.5")):
        pf.cross_entropy_loss(probs, jnp.array([0.5, 1.5, 0.0, 0.0]))
    loss_fn = jax.jit(pf.cross_entropy_loss)
    loss, m = loss_fn(probs, jnp.array([0.5, 1.5, jnp.nan, 0.0]))
    ref, _ = loss_fn(probs, jnp.array([0.5, 0.0, 0.0, 0.0]), jnp.array([True, False, False, True]))
    assert int(m["n_invalid"]) == 2 and float(loss) == pytest.approx(float(ref), rel=1e-6)
    g = jax.grad(lambda p: loss_fn(p, jnp.array([0.5, -1.0, jnp.nan, 0.0]))[0])(probs)
    assert np.all(np.isfinite(np.asarray(g))) and float(g[1]) == 0.0 and float(g[2]) == 0.0


def test_step_names_pairs_and_prefs_of_the_wrong_type_or_shape():
    """``step`` checks what it is given before reading it: a bare array as ``pairs`` (once an
    AttributeError on ``obs``), preferences in the place of pairs or the reverse, and batches of the
    wrong size each raise a ValueError naming the argument, eagerly and under ``jit``."""
    idx = jnp.arange(12).reshape(3, 4)  # 3 members x batch 4
    pairs, prefs = jax.tree.map(lambda x: x[idx], PAIRS), PREFS[idx]
    tr.step(STATE, pairs, prefs, CFG)  # the right batch runs
    jit_step = jaxweight.checked(jax.jit(tr.step))
    for run in (tr.step, jit_step):
        for bare in (pairs.obs, np.asarray(pairs.obs)):
            with pytest.raises(ValueError, match=r"pairs must be a FragmentPairs \(e\.g\. from fragment_pairs_from_"
                                                 r"arrays\), got an array of shape \(3, 4, 2, 4, 2\)"):
                run(STATE, bare, prefs, CFG)
        with pytest.raises(ValueError, match=r"pairs must be a FragmentPairs .*got dict"):
            run(STATE, {"obs": pairs.obs}, prefs, CFG)
        with pytest.raises(ValueError, match=r"prefs must be f32\[3, 4\] preferences, got a FragmentPairs"):
            run(STATE, pairs, pairs, CFG)
        with pytest.raises(ValueError, match=r"pairs\.rews must have shape \(3, 4, 2, L\) .*got \(12, 2, 3\)"):
            run(STATE, PAIRS, prefs, CFG)
        with pytest.raises(ValueError, match=r"pairs\.obs must have shape \(3, 4, 2, L\+1, \.\.\.\) .*got \(3, 4\)"):
            run(STATE, pairs.replace(obs=pairs.obs[:, :, 0, 0, 0]), prefs, CFG)
        with pytest.raises(ValueError, match=r"prefs must have shape \(3, 4\), got \(3, 2\)"):
            run(STATE, pairs, prefs[:, :2], CFG)
