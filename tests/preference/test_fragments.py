"""random_fragments statistics and errors; active selection scores and ranking."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import preference as pf


def _time_trajs(lengths, terminal, obs_dim=1, horizon=None):
    """Episodes whose observation at step t is t (and reward 100 * n + t) so windows are recognisable."""
    obs = [np.stack([np.arange(n + 1, dtype=np.float32)] * obs_dim, 1) for n in lengths]
    acts = [np.arange(n) % 2 for n in lengths]
    rews = [100.0 * i + np.arange(n) for i, n in enumerate(lengths)]
    return pf.trajectories_from_arrays(obs, acts, rews, terminal, horizon=horizon)


def test_fragments_terminal_only_for_terminal_suffix():
    # imitation's test_fragments_terminal: obs = arange(4) terminal, arange(3) not terminal
    trajs = _time_trajs([3, 2], [True, False])
    pairs = pf.random_fragments(0, trajs, 2, 200)
    last_obs = np.asarray(pairs.obs[:, :, -1, 0])
    traj_of = np.asarray(pairs.rews[:, :, 0]) // 100
    is_first = traj_of == 0
    np.testing.assert_array_equal(np.asarray(pairs.terminal), (last_obs == 3) & is_first)
    assert np.asarray(pairs.terminal).any() and (~np.asarray(pairs.terminal)).any()
    d = np.asarray(pairs.dones())
    np.testing.assert_array_equal(d[..., -1], np.asarray(pairs.terminal))
    assert not d[..., :-1].any()


def test_fragment_windows_are_consistent():
    trajs = _time_trajs([9, 6, 12], [True, True, False], obs_dim=2)
    pairs = pf.random_fragments(1, trajs, 4, 50)
    assert pairs.obs.shape == (50, 2, 5, 2) and pairs.acts.shape == (50, 2, 4) and pairs.rews.shape == (50, 2, 4)
    obs = np.asarray(pairs.obs[..., 0])
    start = obs[..., 0]
    np.testing.assert_array_equal(obs, start[..., None] + np.arange(5))  # L + 1 consecutive observations
    np.testing.assert_array_equal(np.asarray(pairs.rews) % 100, start[..., None] + np.arange(4))
    np.testing.assert_array_equal(np.asarray(pairs.acts), (start[..., None] + np.arange(4)) % 2)
    assert bool(pairs.valid.all())


def test_fragment_statistics_start_and_length_weighting():
    # lengths 3 (too short for L=4), 5, 10 -> eligible weights 5 : 10; starts uniform on [0, n - L]
    trajs = _time_trajs([3, 5, 10], [False, False, False])
    pairs = pf.random_fragments(jax.random.key(3), trajs, 4, 6000)
    traj_of = (np.asarray(pairs.rews[:, :, 0]) // 100).reshape(-1).astype(int)
    start = np.asarray(pairs.obs[:, :, 0, 0]).reshape(-1).astype(int)
    assert not (traj_of == 0).any()  # too short: never used
    frac_long = (traj_of == 2).mean()
    np.testing.assert_allclose(frac_long, 10 / 15, atol=0.02)  # proportional to length (12000 draws, ~5 sigma)
    for k, n in ((1, 5), (2, 10)):
        s = start[traj_of == k]
        assert s.min() == 0 and s.max() == n - 4  # inclusive end point
        counts = np.bincount(s, minlength=n - 3)
        expected = len(s) / (n - 3)
        assert np.all(np.abs(counts - expected) < 6 * np.sqrt(expected))


def test_too_short_error_and_jit_validity():
    trajs = _time_trajs([3, 2], [True, True])
    with pytest.raises(ValueError, match="No trajectories are long enough for the desired fragment length of 4."):
        pf.random_fragments(0, trajs, 4, 2)
    with pytest.raises(ValueError, match="No trajectories are long enough"):
        pf.random_fragments(0, trajs, 10000, 2)  # longer than the padded horizon too
    jitted = jax.jit(pf.random_fragments, static_argnums=(2, 3))
    out = jitted(jax.random.key(0), trajs, 4, 2)
    assert out.obs.shape == (2, 2, 5, 1) and not bool(out.valid.any())
    ok = jitted(jax.random.key(0), trajs, 2, 3)
    assert bool(ok.valid.all())
    eager = pf.random_fragments(jax.random.key(0), trajs, 2, 3)
    jax.tree.map(np.testing.assert_array_equal, ok, eager)  # jit == eager, same key -> same pairs
    with pytest.raises(ValueError, match="fragment_length must be >= 1"):
        pf.random_fragments(0, trajs, 0, 2)
    for bad in (-1, 0):  # no empty work: a fragmenter that returns no pairs is refused
        with pytest.raises(ValueError, match="num_pairs must be >= 1"):
            pf.random_fragments(0, trajs, 1, bad)


def test_host_warnings_of_the_original(caplog):
    trajs = _time_trajs([10, 2], [True, True])
    with caplog.at_level(logging.INFO, logger="jaxweight.preference"):
        pf.random_fragments(0, trajs, 3, 1)  # 6 needed, 10 available < 10 * 6
    msgs = [r.getMessage() for r in caplog.records]
    assert any("Discarded 1 out of 2 trajectories" in m for m in msgs)
    assert any("Samples will contain 6 transitions in total and only 10 are available" in m for m in msgs)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxweight.preference"):
        pf.random_fragments(0, trajs, 3, 5)
        pf.random_fragments(0, trajs, 3, 1, warning_threshold=0)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and msgs[0].startswith("Fewer transitions available than needed")


def test_key_controls_sampling_and_int_seed():
    trajs = _time_trajs([20, 20], [False, False])
    a = pf.random_fragments(5, trajs, 3, 10)
    b = pf.random_fragments(jax.random.key(5), trajs, 3, 10)
    c = pf.random_fragments(6, trajs, 3, 10)
    np.testing.assert_array_equal(a.obs, b.obs)
    assert not np.array_equal(a.obs, c.obs)


# -------------------------------------------------------- active selection
def test_spec_example_3_variance_estimates():
    r1 = jnp.array([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]])
    r2 = jnp.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    np.testing.assert_allclose(pf.variance_estimate(r1, r2, "logit"), 6.3333335, rtol=1e-6)
    np.testing.assert_allclose(pf.variance_estimate(r1, r2, "probability"), 0.09923158, rtol=1e-5)
    np.testing.assert_allclose(pf.variance_estimate(r1, r2, "label"), 0.22222222, rtol=1e-6)
    allv = pf.fragments.uncertainty_scores(r1, r2)
    p = np.array([0.880797, 0.268941, 0.982014])
    np.testing.assert_allclose(allv["disagreement"], p.std(), rtol=1e-5)
    pm = p.mean()
    np.testing.assert_allclose(allv["entropy"], -(pm * np.log(pm) + (1 - pm) * np.log(1 - pm)), rtol=1e-5)


def test_variance_estimate_options_and_errors():
    rng = np.random.default_rng(0)
    r1, r2 = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    p = 0.1 * 0.5 + 0.9 / (1 + np.exp(np.clip(((0.8 ** np.arange(5))[:, None] * (r2 - r1)).sum(0), -1, 1)))
    got = pf.variance_estimate(jnp.asarray(r1), jnp.asarray(r2), "probability", noise_prob=0.1, discount=0.8,
                               threshold=1.0)
    np.testing.assert_allclose(got, p.var(), rtol=1e-4)
    # the logit score ignores noise, discount and clipping (as imitation)
    np.testing.assert_allclose(pf.variance_estimate(jnp.asarray(r1), jnp.asarray(r2), "logit", discount=0.1),
                               (r1.sum(0) - r2.sum(0)).var(ddof=1), rtol=1e-5)
    msg = r".* not supported\.\n\s+`uncertainty_on` should be from .*"  # imitation's test regex
    with pytest.raises(ValueError, match=msg):
        pf.variance_estimate(jnp.asarray(r1), jnp.asarray(r2), "uncertainty_on")
    with pytest.raises(ValueError, match="M >= 2"):
        pf.variance_estimate(jnp.zeros((5, 1)), jnp.zeros((5, 1)))


@pytest.fixture(scope="module")
def ensemble():
    rng = np.random.default_rng(0)
    lengths = [30, 25, 40, 12]
    obs = [rng.normal(size=(n + 1, 3)).astype(np.float32) for n in lengths]
    acts = [rng.integers(0, 2, n) for n in lengths]
    trajs = pf.trajectories_from_arrays(obs, acts, [rng.normal(size=n) for n in lengths], [True, False, True, True])
    net = pf.RewardMLP(hidden_sizes=(8,), observation_space=pf.Box((3,)), action_space=pf.Discrete(2))
    ex = tuple(x[:1, :1] for x in trajs.transitions())
    params = pf.ensemble_init(1, net, ex, 4)
    return trajs, net, params


def _active(*args, scored=False, **kw):
    if scored:
        return pf.active_selection_scored(*args, **kw)
    return pf.active_selection(*args, **kw)


def test_active_selection_is_the_scored_pairs(ensemble):
    trajs, net, params = ensemble
    new = pf.active_selection_scored(3, params, net, trajs, 5, 4, 2.0, "all")
    jax.tree.map(np.testing.assert_array_equal, pf.active_selection(3, params, net, trajs, 5, 4, 2.0, "all"), new[0])


def test_active_selection_ranks_candidates(ensemble):
    trajs, net, params = ensemble
    key = jax.random.key(7)
    picked, scores = _active(key, params, net, trajs, 5, 6, 4.0, "all", scored=True)
    assert picked.num_pairs == 6 and set(scores) == {"logit", "probability", "label", "disagreement", "entropy"}
    # the candidates are random_fragments(split(key)[0], ..., C) and the picks are their top-6 by logit
    cand = pf.random_fragments(jax.random.split(key)[0], trajs, 5, 24)
    r = jax.jit(lambda p, c: pf.fragment_rewards(net, p, c, ensemble=True))(params, cand)  # [C, 2, L, M]
    all_scores = jax.jit(jax.vmap(pf.fragments.uncertainty_scores))(r[:, 0], r[:, 1])
    s = np.asarray(all_scores["logit"])
    order = np.argsort(-s, kind="stable")[:6]
    np.testing.assert_allclose(scores["logit"], s[order], rtol=1e-5)
    np.testing.assert_array_equal(picked.obs, np.asarray(cand.obs)[order])
    assert np.all(np.diff(np.asarray(scores["logit"])) <= 0)  # descending
    single, sc = _active(key, params, net, trajs, 5, 6, 4.0, "label", scored=True)
    o = np.argsort(-np.asarray(all_scores["label"]), kind="stable")[:6]
    np.testing.assert_array_equal(single.obs, np.asarray(cand.obs)[o])
    assert set(sc) == {"label"}
    for name in ("probability", "label", "disagreement"):  # "all" computes every score of the same candidates
        np.testing.assert_allclose(scores[name], np.asarray(all_scores[name])[order], rtol=1e-5, atol=1e-7)
    by_entropy = _active(key, params, net, trajs, 5, 6, 4.0, "all", select_by="entropy")
    o = np.argsort(-np.asarray(all_scores["entropy"]), kind="stable")[:6]
    np.testing.assert_array_equal(by_entropy.obs, np.asarray(cand.obs)[o])


def test_active_selection_per_step_equals_per_fragment(ensemble):
    trajs, net, params = ensemble
    a, sa = _active(3, params, net, trajs, 6, 5, 3.0, "all", scored=True, rewards_per="step")
    b, sb = _active(3, params, net, trajs, 6, 5, 3.0, "all", scored=True, rewards_per="fragment")
    jax.tree.map(np.testing.assert_array_equal, a, b)
    for k in sa:
        np.testing.assert_allclose(sa[k], sb[k], rtol=1e-5, atol=1e-6)


def test_active_selection_ties_take_lower_index(ensemble):
    trajs, net, params = ensemble
    same = jax.tree.map(lambda x: jnp.broadcast_to(x[:1], x.shape), params)  # identical members: all scores 0
    picked = _active(2, same, net, trajs, 4, 3, 2.0, "logit")
    cand = pf.random_fragments(jax.random.split(jax.random.key(2))[0], trajs, 4, 6)
    np.testing.assert_array_equal(picked.obs, np.asarray(cand.obs)[:3])


def test_active_selection_errors(ensemble):
    trajs, net, params = ensemble
    single = jax.tree.map(lambda x: x[0], params)
    with pytest.raises(ValueError, match=r"active_selection needs ensemble params \(leading member axis >= 2\)."):
        pf.active_selection(0, single, net, trajs, 4, 3, 2.0)
    with pytest.raises(ValueError, match=r".* not supported\.\n\s+`uncertainty_on` should be from .*"):
        pf.active_selection(0, params, net, trajs, 4, 3, 2.0, "uncertainty_on")
    with pytest.raises(ValueError, match=r"sample_factor must be finite and >= 1.0, got 0.5"):
        pf.active_selection(0, params, net, trajs, 4, 3, 0.5)
    with pytest.raises(ValueError, match="No trajectories are long enough"):
        pf.active_selection(0, params, net, trajs, 400, 3, 2.0)
    with pytest.raises(ValueError, match="select_by"):
        pf.active_selection(0, params, net, trajs, 4, 3, 2.0, "all", select_by="nope")
