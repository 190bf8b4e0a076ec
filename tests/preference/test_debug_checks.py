"""Every preference component runs under ``jax_debug_nans`` and ``jax_debug_infs`` on ordinary input.

CONVENTIONS: no NaN or inf as a sentinel in a state or an output ("not measured
yet" is a count or a flag), because users debug with ``jax_debug_nans``. Each
test runs a component with both flags on, eagerly (every primitive is checked,
so an intermediate ``-inf`` such as ``log(0)`` or a ``-inf`` mask fires) and
jitted (the outputs are checked), and asserts that every float leaf of the
result is finite. The inputs are ordinary but reach the places a sentinel hides:
saturated Bradley-Terry probabilities (``p`` exactly 0 or 1 in float32),
all-tie pairs (no decided pair), a loop round without evaluation.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import preference as pf
from jaxweight.preference import buffer as pbuf
from jaxweight.preference import fragments as fr
from jaxweight.preference import gatherers
from jaxweight.preference import training as tr
from jaxweight.preference.evaluation import predicted_rewards, preference_accuracy, reward_correlation

L = 3
NET = pf.RewardMLP(hidden_sizes=(4,), observation_space=pf.Box((2,)), action_space=pf.Discrete(2))
RNG = np.random.default_rng(0)
# returns up to ~+-150 apart: the teacher's and the model's probabilities saturate to exactly 0 / 1
PAIRS = pf.fragment_pairs_from_arrays(
    RNG.normal(size=(8, 2, L + 1, 2)).astype(np.float32), RNG.integers(0, 2, (8, 2, L)).astype(np.int32),
    (RNG.normal(size=(8, 2, L)) * 30).astype(np.float32),
)
TIES = PAIRS.replace(rews=jnp.ones_like(PAIRS.rews))  # equal true returns: no pair is decided
PREFS = np.array([0, 1, 0.5, 1, 0, 1, 0.25, 1], np.float32)
TRAJS = pf.trajectories_from_arrays([RNG.normal(size=(9, 2)).astype(np.float32) for _ in range(4)],
                                    [RNG.integers(0, 2, 8) for _ in range(4)],
                                    [(RNG.normal(size=8) * 30).astype(np.float32) for _ in range(4)])
ENS = pf.ensemble_init(0, NET, pf.example_inputs(PAIRS), 3)


@contextlib.contextmanager
def debug_checks():
    with jax.debug_nans(True), jax.debug_infs(True):
        yield


def non_finite(tree) -> list[str]:
    """Paths of the float leaves of ``tree`` holding a NaN or an inf."""
    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dtype = getattr(x, "dtype", None) or np.asarray(x).dtype
        if jnp.issubdtype(dtype, jnp.inexact) and not np.all(np.isfinite(np.asarray(x))):
            out.append(jax.tree_util.keystr(path))
    return out


def checked(f, *args, **kwargs):
    """``f(*args)`` under both debug flags; its result, after asserting every float leaf is finite."""
    with debug_checks():
        out = jax.block_until_ready(f(*args, **kwargs))
    assert non_finite(out) == []
    return out


# ------------------------------------------------------------------ stateless parts
def test_reward_nets_and_ensembles():
    """Jitted only: the nets hold no masking logic; their callers' math is checked eagerly below."""
    inputs = PAIRS.transitions()
    shaped = pf.basic_shaped_reward_net(observation_space=pf.Box((2,)), action_space=pf.Discrete(2),
                                        reward_hidden_sizes=(4,), potential_hidden_sizes=(4,))
    shaped_params = shaped.init(jax.random.key(1), *inputs)

    @jax.jit
    def f(params, sp):
        r = pf.ensemble_apply(NET, params, *inputs)
        mean, var = pf.ensemble_moments(r)
        spaces = (pf.preprocess(pf.Discrete(3), jnp.array([0, 2])),
                  pf.preprocess(pf.MultiDiscrete((2, 3)), jnp.ones((2, 2), jnp.int32)),
                  pf.preprocess(pf.MultiBinary(3), jnp.ones((3,), jnp.int32)),
                  pf.preprocess(pf.Box((2, 2, 3), 0, 255, "uint8"), jnp.full((2, 2, 3), 255, jnp.uint8)))
        return (r, mean, var, pf.add_std(mean, var, 1.0), pf.ensemble_reward(NET, params, *inputs, alpha=-0.5),
                shaped.apply(sp, *inputs), spaces, pf.preference_probabilities(NET, params, PAIRS, ensemble=True))

    r, mean, var, *_ = checked(f, ENS, shaped_params)
    assert r.shape == (8, 2, L, 3) and bool(jnp.all(var >= 0))


@pytest.mark.slow
def test_bradley_terry_saturated_probabilities_and_loss(jit_or_eager):
    def f(r1, r2, probs, prefs):
        single = pf.probability(r1, r2)                  # D = -300: clipped, p = 1 exactly in float32
        members = pf.probability(jnp.stack([r1, r2], 1), jnp.stack([r2, r1], 1), noise_prob=0.1, discount=0.9)
        grad = jax.grad(lambda a: pf.cross_entropy_loss(pf.probability(a, r2)[None], jnp.zeros(1))[0])(r1)
        loss, metrics = pf.cross_entropy_loss(probs, prefs, gt_probs=probs[::-1])
        return single, members, grad, loss, metrics

    r1, r2 = jnp.array([100.0, 100.0, 100.0]), jnp.zeros(3)
    single, members, grad, loss, *_ = checked(jit_or_eager(f), r1, r2, jnp.array([0.0, 1.0, 0.5, 1.0]),
                                               jnp.array([1.0, 0.0, 0.5, 1.0]))
    assert float(single) == 1.0 and members.shape == (2,)
    np.testing.assert_allclose(float(loss), (100.0 + 100.0 + np.log(2.0)) / 4, rtol=1e-6)  # log clamped at -100


def test_teacher_with_saturated_and_tied_pairs(jit_or_eager):
    def f(key, pairs):
        outs = [pf.synthetic_teacher(key, pairs, temperature=t, sample=s) for t in (0.0, 1.0) for s in (True, False)]
        outs.append(pf.synthetic_teacher(key, pairs, temperature=0.5, discount=0.9, mistake_prob=0.1,
                                         equal_threshold=1.0, skip_threshold=-1000.0))
        return outs

    for pairs in (PAIRS, TIES):
        outs = checked(jit_or_eager(f), jax.random.key(0), pairs)
        assert all(0.0 <= float(o.entropy) <= np.log(2) + 1e-6 for o in outs)
    # the tied pairs: every answer is 0.5 and the entropy is ln 2
    np.testing.assert_allclose(np.asarray(outs[1].prefs), 0.5)
    np.testing.assert_allclose(float(outs[1].entropy), np.log(2.0), rtol=1e-6)


def test_fragmenters_and_active_selection():
    @jax.jit
    def f(key, params):
        frags = pf.random_fragments(key, TRAJS, L, 4, warning_threshold=0)
        picked, scores = pf.active_selection_scored(key, params, NET, TRAJS, L, 4, 2.0, "all", warning_threshold=0)
        return frags, picked, scores

    frags, picked, scores = checked(f, jax.random.key(3), ENS)
    assert bool(jnp.all(frags.valid)) and set(scores) == {"logit", "probability", "label", "disagreement", "entropy"}
    assert bool(jnp.all(jnp.diff(scores["logit"]) <= 0))  # ranked by the logit score, highest first


def test_uncertainty_scores_of_saturated_members(jit_or_eager):
    """Members that agree with certainty (mean probability exactly 1): entropy 0, no ``log(0)`` on the way."""
    r1 = jnp.full((L, 3), 100.0)
    scores = checked(jit_or_eager(lambda a, b: fr.uncertainty_scores(a, b)), r1, jnp.zeros((L, 3)))
    assert {k: float(v) for k, v in scores.items()} == {"logit": 0.0, "probability": 0.0, "label": 0.0,
                                                        "disagreement": 0.0, "entropy": 0.0}


def test_active_selection_ranks_nan_scores_last_without_an_inf():
    """NaN data (the caller's, so only ``jax_debug_infs`` is on) gives NaN scores that rank last, without a
    ``-inf`` stand-in on the way (eager: every primitive is checked)."""
    trajs = TRAJS.replace(obs=TRAJS.obs.at[3].set(jnp.nan))  # pairs cut from trajectory 3 score NaN
    with jax.debug_infs(True):  # every candidate is returned, ranked
        _, scores = pf.active_selection_scored(jax.random.key(3), ENS, NET, trajs, L, 8, 1.0, "logit",
                                               warning_threshold=0)
    s = np.asarray(scores["logit"])
    nan = np.isnan(s)
    assert not np.isinf(s).any() and 0 < nan.sum() < s.size
    assert not nan[: s.size - nan.sum()].any()  # the NaN scores come last


def test_evaluation_without_a_decided_pair(jit_or_eager):
    def f(params):
        acc, decided = preference_accuracy(NET, params, TIES, ensemble=True)
        return acc, decided, reward_correlation(NET, params, TRAJS), predicted_rewards(NET, params, TRAJS)

    acc, decided, corr, _ = checked(jit_or_eager(f), ENS)
    assert int(decided) == 0 and float(acc) == 0.0  # nothing measured: the count says so, not a NaN
    assert -1.0 <= float(corr) <= 1.0


def test_schedules(jit_or_eager):
    for name in pf.QUERY_SCHEDULES:
        with debug_checks():
            plan = pf.allocate_comparisons(100, 5, 0.1, name)
        assert sum(plan) == 100 and len(plan) == 6
    rounded = checked(jit_or_eager(lambda x: (pf.oric(x), pf.get_schedule("inverse_quadratic")(x))),
                      jnp.array([1.5, 1.5, 2.0]))
    assert int(jnp.sum(rounded[0])) == 5


# ------------------------------------------------------------------ components
def test_buffer_component(jit_or_eager):
    cfg = pbuf.config(6)
    empty = checked(lambda: pbuf.init(cfg, None, PAIRS))
    assert checked(pbuf.metrics_dict, empty, cfg) == {"buffer/size": 0.0, "buffer/valid": 0.0, "buffer/capacity": 6.0}
    push = jit_or_eager(lambda b, p, y, n: pbuf.step(b, p, y, cfg, count=n))
    full = checked(push, empty, PAIRS, PREFS, 8)  # wraps around: the newest 6 stay
    checked(jit_or_eager(lambda b: (pbuf.mask(b), pbuf.ordered(b))), full)
    assert checked(pbuf.metrics_dict, full, cfg)["buffer/size"] == 6.0


@pytest.mark.slow
def test_reward_trainer_component():
    """``init`` eagerly, ``step`` and ``epoch`` jitted (their loss math is checked eagerly above) with an Lp
    regulariser and a lambda updater (validation split), the host :class:`RewardTrainer` on the same config
    (the same compiled epoch), ``metrics_dict``."""
    reg = pf.lp_regularizer(0.01, lambda_updater=pf.IntervalParamScaler(0.1, (1.1, 1.5)), val_split=0.25)
    trainer = pf.RewardTrainer(NET, num_members=2, batch_size=4, regularizer=reg)
    cfg = trainer.config
    buf = pbuf.step(pbuf.init(pbuf.config(8), None, PAIRS), PAIRS, PREFS, pbuf.config(8))
    state = checked(tr.init, cfg, 0, PAIRS)
    idx = jnp.arange(8).reshape(2, 4)
    state, out = checked(jax.jit(tr.step), state, jax.tree.map(lambda x: x[idx], PAIRS), jnp.asarray(PREFS)[idx], cfg)
    assert int(state.steps) == 1 and out["loss"].shape == (2,)
    state, out = checked(jax.jit(tr.epoch), state, jax.random.key(1), buf, cfg, epochs=2, start=0)
    flat = checked(tr.metrics_dict, out, cfg)
    assert {"preference/loss", "preference/val/loss", "preference/regularization_lambda"} <= set(flat)
    steps = int(state.steps)
    state, metrics = checked(trainer.train, state, 2, buf, 2.0)
    assert {"reward/final/train/loss_std", "reward/final/val/loss"} <= set(metrics) and int(state.steps) > steps


def test_reward_normaliser():
    for kind in ("running", "ema"):
        ncfg = pf.normalization.config(kind)
        fresh = checked(pf.normalization.init, ncfg)
        checked(pf.normalization.metrics_dict, fresh, ncfg)  # nothing seen yet: a count, not a NaN
        st, _ = checked(pf.normalization.step, fresh, jnp.array([1.0, 2.0, 3.0]), ncfg)
        checked(pf.normalization.apply, st, jnp.array([0.5]), ncfg)
        assert checked(pf.normalization.metrics_dict, st, ncfg)["reward_norm/mean"] == pytest.approx(2.0)


# ------------------------------------------------------------------ the loop
def _tie_dataset_config():
    """A dataset loop whose rewards are all 1 (every pair a tie) and which cannot evaluate an agent."""
    from jaxweight.preference import loop as lp
    from jaxweight.preference.datasets import DatasetGenerator

    trajs = TRAJS.replace(rews=jnp.ones_like(TRAJS.rews))
    tcfg = tr.config(NET, num_members=2, batch_size=4)
    return lp.config(DatasetGenerator(trajs), NET, 1, 0, 8, trainer=tcfg, fragment_length=L,
                     initial_comparison_frac=0.5, initial_epoch_multiplier=1.0)


@pytest.mark.slow
def test_loop_step_reports_unmeasured_metrics_by_counts():
    """``loop.init`` and ``loop.step`` jitted (how they run; the eager math is checked above)."""
    from jaxweight.preference import loop as lp

    cfg = _tie_dataset_config()
    state = checked(jax.jit(lp.init), cfg, jax.random.key(0))
    state, out = checked(jax.jit(lp.step), state, jax.random.key(1), cfg)
    assert int(out["fresh_decided"]) == 0 and float(out["fresh_accuracy"]) == 0.0  # all ties: nothing judged
    assert int(out["gt_episodes"]) == 0 and float(out["gt_return"]) == 0.0  # no agent to evaluate
    assert int(state.round) == 1 and int(out["num_pairs"]) == 4
    flat = checked(lp.metrics_dict, out, cfg)
    assert flat["preference/loop/fresh_accuracy"] == 0.0 and flat["preference/loop/gt_episodes"] == 0.0


@pytest.mark.slow
def test_driver_phase_programs_with_an_agent():
    """``init`` and the driver's phase programs of two rounds (tiny CartPole agent), each checked:
    round 0 with the synthetic teacher's ``collect``, round 1 with a host teacher's
    ``collect_pairs`` and ``push`` (answers of the noiseless teacher, one pair skipped)."""
    from jaxweight.preference import driver as dr
    from jaxweight.preference import loop as lp
    from jaxweight.rl.envs import make_env
    from jaxweight.preference.env_rewards import reward_net
    from jaxweight.preference.generators import AgentGenerator
    from jaxweight.rl.ppo import PPOConfig

    env, params = make_env("cartpole", horizon=8)
    net = reward_net(env, params, hidden_sizes=(4,))
    ppo = PPOConfig(num_envs=2, num_steps=4, num_minibatches=1, update_epochs=1, hidden_sizes=(4,))
    gen = AgentGenerator(env, params, config=ppo).with_reward(lp.learned_reward_fn(net, True))
    cfg = lp.config(gen, net, 1, 8, 8, trainer=tr.config(net, num_members=2, batch_size=4), fragment_length=L,
                    initial_comparison_frac=0.5, initial_epoch_multiplier=1.0, eval_episodes=1)
    assert set(dr._PHASE_PROGRAMS) == set(dr._PROGRAMS[1:]) | set(dr._HOST_TEACHER_PROGRAMS[1:]) == {
        "collect", "collect_pairs", "push", "fit_reward", "fit_agent", "finish"}
    programs = {name: jax.jit(p) for name, p in dr._PHASE_PROGRAMS.items()}
    run_key = jax.random.key(1)
    state = checked(lp.init, cfg, jax.random.key(0))
    for i in range(cfg.plan.num_rounds):
        parts = {}
        phases = list(lp._PHASES)
        if i == 1:   # a host teacher: collect_pairs, answers on the host, push
            pairs, predicted, parts = checked(programs["collect_pairs"], state, run_key, cfg, jnp.int32(i))
            assert np.all(np.isfinite(np.asarray(predicted)))
            prefs, _ = gatherers.synthetic_preferences(0, pairs, temperature=0.0)
            valid = np.asarray(pairs.valid).copy()
            valid[0] = False
            state, out = checked(programs["push"], state, run_key, cfg, jnp.int32(i), pairs,
                                 jnp.asarray(prefs), jnp.asarray(valid))
            parts = {**parts, **out}
            phases = phases[1:]
        for name in phases:
            state, out = checked(programs[name], state, run_key, cfg, jnp.int32(i))
            parts.update(out)
        state, out = checked(programs["finish"], state, run_key, cfg, jnp.int32(i), parts)
        assert set(out) == set(lp.ROUND_METRICS) and int(out["gt_episodes"]) == 1
        assert int(out["agent_steps_trained"]) > 0
    assert int(state.round) == 2
