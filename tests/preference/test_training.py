"""RewardTrainer: imitation's batching / epochs / bagging / regularisers, the pure core, contracts."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxweight import preference as pf
from jaxweight.preference import splits
from jaxweight.preference import training as tr
from jaxweight.preference.model import binary_cross_entropy
from tests.contracts import assert_checkpoint_roundtrip, check_state_contract

L = 3
NET = pf.RewardMLP(hidden_sizes=(4,), observation_space=pf.Box((2,)), action_space=pf.Discrete(2))


def _buffer(n, capacity=16, seed=0, valid=None):
    """n random pairs whose true reward is the action (learnable), pushed into a buffer."""
    rng = np.random.default_rng(seed)
    bcfg = pf.buffer.config(capacity)
    if n == 0:
        return pf.buffer.init(bcfg, None, _buffer(1).pairs)
    acts = rng.integers(0, 2, (n, 2, L))
    rews = acts.astype(np.float32)
    pairs = pf.fragment_pairs_from_arrays(rng.normal(size=(n, 2, L + 1, 2)), acts, rews, valid=valid)
    prefs, _ = pf.synthetic_preferences(seed, pairs, temperature=0.0)
    return pf.buffer.step(pf.buffer.init(bcfg, None, pairs), pairs, prefs, bcfg)


EX = tuple(x[:1] for x in _buffer(1).pairs.transitions())


def _leaves_equal(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _close(a, b, rtol=1e-5, atol=1e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def _grad(cfg, params, pairs, prefs, mask):
    """The gradient the trainer takes of one minibatch: ``sum_i mask_i BCE_i / batch_size``."""
    cpairs, cprefs = tr._clean(pairs, jnp.asarray(prefs, jnp.float32), mask)
    return tr._piece(cfg, params, cpairs, cprefs, mask)


def _close_params(a, b, rtol=1e-5, atol=1e-6):
    """Params agree, except the output bias: a constant reward shift cancels in the Bradley-Terry
    model, so its true gradient is 0 and Adam turns float rounding in it into +-lr steps."""
    drop = lambda p: {**p["params"], "dense_final": {"kernel": p["params"]["dense_final"]["kernel"]}}  # noqa: E731
    _close(drop(a), drop(b), rtol, atol)


# ------------------------------------------------------------- settings
def test_epochs_rounding_and_errors():
    assert tr.num_epochs(1, 2.5) == 2 and tr.num_epochs(1, 3.5) == 4  # round half to even, like Python
    assert tr.num_epochs(3, 0.5) == 2 and tr.num_epochs(1, 200.0) == 200
    for e, m in ((1, 0.4), (2, 0.25), (1, 0.0)):
        with pytest.raises(ValueError, match="Must train for at least one epoch."):
            tr.num_epochs(e, m)
    trainer = pf.RewardTrainer(NET, progress=False)
    with pytest.raises(ValueError, match="Must train for at least one epoch."):
        trainer.train(trainer.init(0, EX), 0, _buffer(4), epoch_multiplier=0.3)


def test_config_errors():
    with pytest.raises(ValueError, match="Batch size must be a multiple of minibatch size."):
        pf.RewardTrainer(NET, batch_size=6, minibatch_size=4)
    with pytest.raises(ValueError, match="Must be at least 2 member"):
        pf.RewardTrainer(NET, num_members=1)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        pf.RewardTrainer(NET, batch_size=0)
    with pytest.raises(ValueError, match="strength must be non-zero"):
        pf.lp_regularizer(0.0)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        pf.lp_regularizer(0.1, lambda_updater=pf.IntervalParamScaler(0.1, (1.1, 1.5)), val_split=1.0)
    with pytest.raises(ValueError, match="must also specify a validation split"):
        pf.lp_regularizer(0.1, lambda_updater=pf.IntervalParamScaler(0.1, (1.1, 1.5)))
    with pytest.raises(ValueError, match="must also pass a regularizer parameter updater"):
        pf.weight_decay_regularizer(0.1, val_split=0.2)
    with pytest.raises(ValueError, match="p must be a positive integer"):
        pf.lp_regularizer(0.1, p=0)
    with pytest.raises(ValueError, match="scaling_factor must be in"):
        pf.IntervalParamScaler(1.0, (1.1, 1.5))
    with pytest.raises(ValueError, match="tolerable_interval must be a tuple whose"):
        pf.IntervalParamScaler(0.1, (1.5, 1.1))


def test_adamw_is_torch_adamw_with_decay_001():
    hp = tr.config(NET)
    np.testing.assert_allclose([hp.learning_rate, hp.weight_decay, hp.b1, hp.b2, hp.eps],
                               [1e-3, 0.01, 0.9, 0.999, 1e-8])
    opt = tr._optimizer(hp)
    p = {"w": jnp.array([1.0, -2.0, 0.5])}
    state = opt.init(p)
    pn, m, v = np.array([1.0, -2.0, 0.5]), np.zeros(3), np.zeros(3)
    for t, g in enumerate([np.array([0.1, 0.2, -0.3]), np.array([-1.0, 0.5, 2.0]), np.array([0.0, 0.1, 0.2])], 1):
        upd, state = opt.update({"w": jnp.asarray(g, jnp.float32)}, state, p)
        p = optax.apply_updates(p, upd)
        # torch.optim.AdamW.step
        pn = pn * (1 - 1e-3 * 0.01)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g**2
        pn = pn - 1e-3 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        np.testing.assert_allclose(p["w"], pn, rtol=1e-5)


# ------------------------------------------------------------- batching
def _reference_epoch(config, state, key, buffer, data):
    """imitation's epoch written as a plain loop (test reference): same permutation, one step per
    batch_size pairs, loss = sum over the batch / batch_size."""
    k_perm, _ = jax.random.split(key)
    n = int(data.n_train)
    order = np.asarray(splits._masked_permutation(k_perm, data.n_train, buffer.capacity))
    items = np.asarray(data.train_idx)[order][:n]
    params, opt_state = state.params, state.opt_state
    opt = tr._optimizer(config)
    b = config.batch_size

    def loss(p, idx):
        pairs = jax.tree.map(lambda x: x[idx], buffer.pairs)
        probs, _ = pf.preference_probabilities(config.module, p, pairs)
        return jnp.sum(binary_cross_entropy(probs, buffer.prefs[idx])) / b

    steps = 0
    grad = jax.jit(jax.grad(loss))
    for s in range(0, n, b):
        g = grad(params, jnp.asarray(items[s:s + b]))
        upd, opt_state = opt.update(g, opt_state, params)
        params = optax.apply_updates(params, upd)
        steps += 1
    return params, steps


@pytest.mark.parametrize("n", [10, 12])
def test_epoch_matches_reference_loop(n):
    # 10 pairs, batch 4 -> ceil(10/4) = 3 steps, the last with 2 pairs and NOT renormalised
    trainer = pf.RewardTrainer(NET, batch_size=4, minibatch_size=2, progress=False)
    buf = _buffer(n)
    state = trainer.init(1, EX)
    key = jax.random.key(5)
    new, metrics = jax.jit(tr.epoch)(state, key, buf, trainer.config)
    k_prep, k_epochs = jax.random.split(key)
    data = splits.prepare(k_prep, buf, trainer.config)
    ref_params, ref_steps = _reference_epoch(trainer.config, state, jax.random.fold_in(k_epochs, 0), buf, data)
    assert int(new.steps) == ref_steps == -(-n // 4)
    _close_params(new.params, ref_params)
    assert 0.0 <= float(metrics["train/accuracy"]) <= 1.0


def test_minibatch_accumulation_equals_full_batch():
    # imitation's test_gradient_accumulation: batch 6 with minibatches of 3 (or 1) gives the same network
    buf = _buffer(11)
    results = []
    for mb in (6, 3):
        trainer = pf.RewardTrainer(NET, batch_size=6, minibatch_size=mb, epochs=2, progress=False)
        state, _ = trainer.train(trainer.init(0, EX), 3, buf)
        results.append(state.params)
    _close_params(results[0], results[1])
    # and one explicit step: the per-minibatch gradients add up to the full-batch gradient
    cfg = pf.RewardTrainer(NET, batch_size=6).config
    params = NET.init(jax.random.key(0), *EX)
    pairs = jax.tree.map(lambda x: x[:6], buf.pairs)
    prefs, mask = buf.prefs[:6], jnp.array([True] * 5 + [False])
    full, _ = _grad(cfg, params, pairs, prefs, mask)
    halves = [_grad(cfg, params, jax.tree.map(lambda x: x[s], pairs), prefs[s], mask[s])[0]
              for s in (slice(0, 3), slice(3, 6))]
    _close(full, jax.tree.map(jnp.add, *halves))


def test_no_data_leaves_state_bit_identical():
    trainer = pf.RewardTrainer(NET, num_members=2, batch_size=4, progress=False)
    state = trainer.init(0, EX)
    for buf in (_buffer(0), _buffer(5, valid=np.zeros(5, bool))):
        # the pure epoch trains nothing and leaves the state as it was; the host trainer refuses
        new, _ = jax.jit(tr.epoch)(state, 1, buf, trainer.config, epochs=2)
        assert _leaves_equal(new.params, state.params) and _leaves_equal(new.opt_state, state.opt_state)
        assert int(new.steps) == 0
        with pytest.raises(ValueError, match="cannot train the reward model"):
            trainer.train(state, 1, buf, epoch_multiplier=2.0)


# --------------------------------------------------------------- bagging
def test_bagging_resamples_with_replacement_per_member():
    valid = np.ones(40, bool)
    valid[::4] = False  # 30 valid pairs, 10 invalid
    buf = _buffer(40, capacity=48, valid=valid)
    cfg = pf.RewardTrainer(NET, num_members=4).config
    data = splits.prepare(0, buf, cfg)
    assert int(data.n_train) == 30 and data.train_idx.shape == (4, 48)
    idx = np.asarray(data.train_idx)[:, :30]
    allowed = set(np.flatnonzero(np.asarray(pf.buffer.mask(buf))).tolist())
    assert set(idx.reshape(-1).tolist()) <= allowed  # only valid stored pairs
    uniq = [len(set(row.tolist())) for row in idx]
    assert all(u < 30 for u in uniq)  # with replacement: duplicates
    np.testing.assert_allclose(np.mean(uniq) / 30, 1 - (1 - 1 / 30) ** 30, atol=0.12)
    assert len({tuple(r) for r in idx}) == 4  # one bootstrap per member
    again = np.asarray(splits.prepare(1, buf, cfg).train_idx)[:, :30]
    assert not np.array_equal(again, idx)  # fresh on every call
    # frequencies over many draws are uniform over the valid pairs
    big = np.asarray(jax.vmap(lambda k: splits.prepare(k, buf, cfg).train_idx[:, :30])(
        jax.random.split(jax.random.key(0), 200))).reshape(-1)
    counts = np.bincount(big, minlength=48)[sorted(allowed)]
    assert counts.min() > 0.7 * counts.mean() and counts.max() < 1.3 * counts.mean()
    no_bag = splits.prepare(0, buf, pf.RewardTrainer(NET, num_members=4, bagging=False).config)
    np.testing.assert_array_equal(np.sort(np.asarray(no_bag.train_idx)[0, :30]), sorted(allowed))


def test_ensemble_step_equals_per_member_steps():
    ens = pf.RewardTrainer(NET, num_members=3, batch_size=4, minibatch_size=2)
    single = pf.RewardTrainer(NET, batch_size=4, minibatch_size=2)
    state = ens.init(2, EX)
    buf = _buffer(12)
    idx = jnp.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    pairs = jax.tree.map(lambda x: x[idx], buf.pairs)
    new, m = jax.jit(tr.step)(state, pairs, buf.prefs[idx], ens.config)
    step1 = jax.jit(tr.step)
    for k in range(3):
        s_k = tr.init(single.config, params=jax.tree.map(lambda x: x[k], state.params))
        s_k = s_k.replace(opt_state=jax.tree.map(lambda x: x[k], state.opt_state))
        ref, mk = step1(s_k, jax.tree.map(lambda x: x[k], pairs), buf.prefs[idx[k]], single.config)
        _close_params(jax.tree.map(lambda x: x[k], new.params), ref.params)
        np.testing.assert_allclose(m["loss"][k], mk["loss"], rtol=1e-5)


# --------------------------------------------------------------- metrics
def test_metrics_names_final_and_member_std(capsys):
    trainer = pf.RewardTrainer(NET, num_members=2, batch_size=4, epochs=1, progress=True)
    state, metrics = trainer.train(trainer.init(0, EX), 0, _buffer(10), epoch_multiplier=3.0)
    for k in range(3):
        for name in ("loss", "accuracy", "gt_reward_loss"):
            assert f"reward/epoch-{k}/train/{name}" in metrics
            assert f"reward/epoch-{k}/train/{name}_std" in metrics
    for name in ("loss", "accuracy", "gt_reward_loss"):
        assert metrics[f"reward/final/train/{name}"] == metrics[f"reward/epoch-2/train/{name}"]
    assert int(state.steps) == 3 * 3
    assert "Training reward model" in capsys.readouterr().err  # progress bar for multi-epoch runs
    single = pf.RewardTrainer(NET, batch_size=4, progress=False)
    _, m1 = single.train(single.init(0, EX), 0, _buffer(10), epoch_multiplier=2.0)
    assert "Training reward model" not in capsys.readouterr().err
    assert not any(k.endswith("_std") for k in m1)
    assert set(m1) == {f"reward/{p}/train/{n}" for p in ("epoch-0", "epoch-1", "final")
                       for n in ("loss", "accuracy", "gt_reward_loss")} | {
        f"reward/{p}/n_invalid" for p in ("epoch-0", "epoch-1", "final")}


@pytest.mark.parametrize("members", [None, 3])
def test_trainer_improves_on_learnable_rewards(members):
    # imitation's test_that_trainer_improves, on the reward net alone: the true reward is the action
    trainer = pf.RewardTrainer(NET, num_members=members, batch_size=8, epochs=1, learning_rate=1e-2, progress=False)
    buf = _buffer(64, capacity=64)
    state = trainer.init(0, EX)
    state, first = trainer.train(state, 0, buf)
    state, later = trainer.train(state, 1, buf, epoch_multiplier=40.0)
    assert later["reward/final/train/loss"] < 0.5 * first["reward/final/train/loss"]
    assert later["reward/final/train/accuracy"] > 0.9


# ------------------------------------------------------------ regularizers
def test_lp_penalty_and_weight_decay_regularizers():
    buf = _buffer(8)
    pairs, prefs, mask = jax.tree.map(lambda x: x[:4], buf.pairs), buf.prefs[:4], jnp.ones(4, bool)
    params = NET.init(jax.random.key(0), *EX)
    plain = tr.config(NET, batch_size=4)
    g0, _ = _grad(plain, params, pairs, prefs, mask)
    opt = tr._optimizer(plain)
    # Lp: lam * |theta|^2 added to the minibatch loss, so its gradient 2 lam theta to the gradient
    lp = tr.config(NET, batch_size=4, regularizer=pf.lp_regularizer(0.3, p=2))
    st = tr.init(lp, params=params)
    new, _ = jax.jit(tr.step)(st, pairs, prefs, lp)
    upd, _ = opt.update(jax.tree.map(lambda g, p: g + 0.3 * 2 * p, g0, params), st.opt_state, params)
    _close_params(new.params, optax.apply_updates(params, upd))
    penalty = sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(params))
    np.testing.assert_allclose(float(pf.regularization.lp_penalty(params)), penalty, rtol=1e-6)
    one = _buffer(4, capacity=4)
    _, out = jax.jit(tr.epoch)(tr.init(lp, params=params), 0, one, lp)
    np.testing.assert_allclose(out["train/regularized_loss"], out["train/loss"] + 0.3 * penalty, rtol=1e-5)
    # empty minibatch: no step, no penalty
    same, _ = jax.jit(tr.step)(st, pairs, prefs, lp, mask=jnp.zeros(4, bool))
    _close(same.params, params, rtol=0, atol=0)
    # weight decay: theta <- theta - lam * lr * theta after the minibatch, before the optimiser step
    wd = tr.config(NET, batch_size=4, regularizer=pf.weight_decay_regularizer(0.5))
    st = tr.init(wd, params=params)
    new, _ = jax.jit(tr.step)(st, pairs, prefs, wd)
    decayed = jax.tree.map(lambda p: p * (1 - 0.5 * 1e-3), params)
    upd, _ = opt.update(g0, st.opt_state, decayed)
    _close_params(new.params, optax.apply_updates(decayed, upd))


def _imitation_interval(lam, train_loss, val_loss, sf, lo, hi):
    eps = np.finfo(float).eps
    if train_loss < eps and val_loss < eps:
        return lam
    if train_loss < eps <= val_loss:
        return lam * (1 + sf)
    ratio = val_loss / train_loss
    if ratio > hi:
        return lam * (1 + sf)
    if ratio < lo:
        return lam * (1 - sf)
    return lam


def test_interval_param_scaler_rule():
    upd = pf.IntervalParamScaler(0.1, (1.1, 1.5))
    cfg = tr.config(NET, regularizer=pf.lp_regularizer(0.2, lambda_updater=upd, val_split=0.25))
    cases = [(1.0, 1.2), (1.0, 2.0), (1.0, 0.5), (0.0, 0.0), (0.0, 1.0), (2.0, 2.2), (2.0, 3.0)]
    for tl, vl in cases:
        got = pf.regularization.interval_update(jnp.float32(0.2), jnp.float32(tl), jnp.float32(vl),
                                                cfg.reg_scaling_factor, cfg.reg_interval_low, cfg.reg_interval_high)
        np.testing.assert_allclose(got, _imitation_interval(0.2, tl, vl, 0.1, 1.1, 1.5), rtol=1e-6)


def test_validation_split_training_and_error():
    reg = pf.lp_regularizer(0.1, lambda_updater=pf.IntervalParamScaler(0.1, (1.1, 1.5)), val_split=0.2)
    trainer = pf.RewardTrainer(NET, num_members=2, batch_size=4, regularizer=reg, progress=False)
    state = trainer.init(0, EX)
    with pytest.raises(ValueError, match="Not enough data samples to split into training and validation"):
        trainer.train(state, 0, _buffer(4))  # int(4 * 0.2) = 0 validation pairs
    buf = _buffer(10)
    data = splits.prepare(0, buf, trainer.config)
    assert int(data.n_val) == 2 and int(data.n_train) == 8  # int(10 * 0.2) = 2, as imitation
    for m in range(2):  # train and validation pairs of a member are disjoint draws of its bootstrap sample
        tr_idx = np.asarray(data.train_idx[m, :8])
        va_idx = np.asarray(data.val_idx[m, :2])
        assert set(tr_idx.tolist() + va_idx.tolist()) <= set(range(10))
    new, metrics = trainer.train(state, 0, buf, epoch_multiplier=2.0)
    for key in ("reward/final/val/loss", "reward/final/val/accuracy", "reward/final/regularization_lambda",
                "reward/final/train/regularized_loss", "reward/final/regularization_lambda_std"):
        assert key in metrics
    lam = np.asarray(new.reg_lambda)
    assert lam.shape == (2,)
    # two epochs, each scaling lambda by 0.9, 1 or 1.1
    assert all(any(np.isclose(x, 0.1 * f, rtol=1e-5) for f in (0.81, 0.99, 1.21, 0.9, 1.1, 1.0)) for x in lam)
    assert int(new.steps) == 2 * 2  # ceil(8 / 4) steps per epoch on the training split


# ------------------------------------------------------------- contracts
def test_trainer_contract_donation_and_checkpoint(tmp_path):
    # eps = 1: Adam's normalisation would turn float rounding in near-zero gradients (dead units, the
    # output bias) into +-lr steps, so jit / vmap / eager could only be compared at that tolerance
    cfg = tr.config(NET, num_members=2, batch_size=4, minibatch_size=2, eps=1.0)
    buf = _buffer(9)
    state0 = tr.init(cfg, 0, EX)
    # hyperparameters are array leaves of the config: new values never recompile
    cfg_alt = cfg.replace(learning_rate=jnp.float32(0.05), noise_prob=jnp.float32(0.1), discount=jnp.float32(0.9))
    check_state_contract(
        init=lambda: tr.init(cfg, 0, EX),
        update=lambda s, k, b, c: tr.epoch(s, k, b, c, epochs=2),
        update_args=(jax.random.key(1), buf, cfg),
        update_args_alt=(jax.random.key(2), _buffer(7, seed=3), cfg_alt),
        batched_init=lambda: jax.vmap(lambda k: tr.init(cfg, k, EX))(jax.random.split(jax.random.key(0), 2)),
        tmp_path=tmp_path,
        rtol=1e-5,
        atol=1e-6,
    )
    # the step too: eager == jit, no retrace for new hyperparameters
    idx = jnp.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    pairs, prefs = jax.tree.map(lambda x: x[idx], buf.pairs), buf.prefs[idx]
    check_state_contract(init=lambda: tr.init(cfg, 0, EX), update=tr.step, update_args=(pairs, prefs, cfg),
                         update_args_alt=(pairs, prefs, cfg_alt), rtol=1e-5, atol=1e-6)
    # vmap over a hyperparameter: a learning-rate sweep in one program; lr = 0 changes nothing
    lrs = jnp.array([0.0, 1e-2], jnp.float32)
    swept, _ = jax.vmap(lambda lr: tr.epoch(state0, 0, buf, cfg.replace(learning_rate=lr), epochs=2))(lrs)
    _close(jax.tree.map(lambda x: x[0], swept.params), state0.params, rtol=0, atol=0)
    assert not _leaves_equal(jax.tree.map(lambda x: x[1], swept.params), state0.params)
    # donation: the jitted epoch reuses the state's memory
    run = jax.jit(tr.epoch, donate_argnums=0)
    donated = tr.init(cfg, 0, EX)
    trained, _ = run(donated, jax.random.key(1), buf, cfg)
    assert all(x.is_deleted() for x in jax.tree.leaves(donated))
    assert all(not x.is_deleted() for x in jax.tree.leaves(cfg))
    assert_checkpoint_roundtrip(trained, tmp_path, target=tr.init(cfg, 0, EX))


def test_config_is_checked_in_config_and_constructor():
    for build in (lambda **kw: tr.config(NET, **kw), lambda **kw: tr.TrainerConfig(NET, **kw)):
        with pytest.raises(ValueError, match="learning_rate must be"):
            build(learning_rate=-0.1)
        with pytest.raises(ValueError, match="b1 must be"):
            build(b1=1.0)
        with pytest.raises(ValueError, match="Batch size must be a multiple of minibatch size."):
            build(batch_size=6, minibatch_size=4)
    # traced values are not checked at construction (only under jaxweight.checked)
    assert jax.jit(lambda lr: tr.config(NET).replace(learning_rate=lr).learning_rate)(jnp.float32(-1.0)) == -1.0


def test_host_train_equals_one_jitted_epoch_call():
    trainer = pf.RewardTrainer(NET, num_members=2, batch_size=4, epochs=1, progress=False)
    cfg, buf = trainer.config, _buffer(10)
    state = trainer.init(0, EX)
    host, metrics = trainer.train(state, 7, buf, epoch_multiplier=3.0)
    run = jax.jit(lambda s, k, b, e: tr.epoch(s, k, b, cfg, epochs=e))
    pure, last = run(state, jax.random.key(7), buf, jnp.int32(3))
    _close(host, pure, rtol=0, atol=0)
    np.testing.assert_allclose(metrics["reward/final/train/loss"], np.asarray(last["train/loss"]).mean(), rtol=1e-6)
    one, _ = run(state, jax.random.key(7), buf, jnp.int32(1))  # same program, another count
    assert int(one.steps) == 3 and int(pure.steps) == 9
    flat = tr.metrics_dict(last, cfg)
    assert set(flat) == {"preference/loss", "preference/accuracy", "preference/gt_reward_loss", "preference/n_invalid"}
    assert all(isinstance(v, float) for v in flat.values())


def test_non_finite_masked_pairs_do_not_poison_the_gradient():
    buf = _buffer(8)
    pairs = jax.tree.map(lambda x: x[:4], buf.pairs)
    bad = pairs.replace(obs=pairs.obs.at[3].set(jnp.nan), rews=pairs.rews.at[3].set(jnp.inf))
    prefs = buf.prefs[:4].at[3].set(jnp.nan)
    mask = jnp.array([True, True, True, False])
    cfg = tr.config(NET, batch_size=4)
    state = tr.init(cfg, 0, EX)
    got, m_bad = jax.jit(tr.step)(state, bad, prefs, cfg, mask=mask)
    ref, _ = jax.jit(tr.step)(state, pairs, buf.prefs[:4], cfg, mask=mask)
    _close(got, ref, rtol=0, atol=0)
    assert all(np.isfinite(float(m_bad[k])) for k in ("loss", "accuracy", "gt_reward_loss"))
    # masked in, the bad pair is left out and counted
    got2, m2 = jax.jit(tr.step)(state, bad, prefs, cfg)
    _close(got2, ref, rtol=0, atol=0)
    assert int(m2["n_invalid"]) == 1


def test_progress_and_callback_are_explicit(capsys):
    seen = []
    trainer = pf.RewardTrainer(NET, batch_size=4, callback=lambda e, n, m: seen.append((e, n, float(m["train/loss"]))))
    trainer.train(trainer.init(0, EX), 0, _buffer(8), epoch_multiplier=3.0)
    assert [(e, n) for e, n, _ in seen] == [(0, 3), (1, 3), (2, 3)]
    assert capsys.readouterr().err == ""  # no progress bar unless asked for
