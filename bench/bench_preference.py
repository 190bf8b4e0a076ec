"""Benchmark of jaxweight.preference against imitation's per-pair, per-member loops.

Workload (CartPole-sized, as the issue asks): observations of 4 floats,
discrete actions with 2 values, fragments of L = 50 steps, an ensemble of 5
reward MLPs with hidden sizes (32, 32).

1. Active selection over C candidate pairs: sample the candidates, score each
   by the ensemble's disagreement (``logit`` variance) and keep the top
   ``C / sample_factor``.
2. One reward-training epoch of the 5-member ensemble on N stored pairs
   (bootstrap per member, batch 32, AdamW).
3. Both at 10^3, 10^4, 10^5 pairs.
4. The epoch at 10^4 pairs against its floor (:func:`floor_epoch`): the same
   math (bootstrap, shuffle, ceil(N / B) AdamW steps of the 5 members, the
   MLP and the Bradley-Terry BCE written out) as one minimal jitted function,
   timed alternately in the same run; goal: epoch <= 1.5x floor.

Baseline: imitation is not installed here (``pip install jaxweight[peers]``
pulls in torch), so the baseline is a NumPy port written the way imitation
v1.0.1 runs: ``RandomFragmenter``'s Python loop (``rng.choice`` over the list
of episodes with a fresh weight array per fragment), ``flatten_trajectories``
per fragment, every member's ``predict_processed`` per fragment,
``variance_estimate`` per pair, and for training the per-pair forward of
``PreferenceModel`` with the BCE loss, accuracy and ground-truth loss of
``CrossEntropyRewardLoss``, then AdamW steps with torch semantics. The
backward pass of the baseline is written by hand in NumPy (same MLP, same
math, same float32 parameters copied from the flax nets); NumPy has no
autograd, and a hand-written backward is cheaper than torch's autograd, so
the baseline is if anything faster than imitation itself. Baseline times at
10^5 pairs are extrapolated linearly from the measured 10^4 run (the
per-pair loops are linear in the number of pairs) and marked as such.

The episodes for active selection follow imitation's loop: a round that
asks for ``n`` pairs samples ``2 * n * L`` transitions (oversampling 1) and
draws ``sample_factor * n`` candidates from them. The goal is judged at
``sample_factor = 10`` (PEBBLE / B-Pref's default); ``sample_factor = 2``
(imitation's script default) is reported alongside.
"""

from __future__ import annotations

import math
import os

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench._common import main, record, time_call, time_jax
from jaxweight import preference as pf
from jaxweight.preference import training as tr

OBS, N_ACT, L, M, HIDDEN, BATCH = 4, 2, 50, 5, (32, 32), 32
EPISODE = 200  # CartPole's episode length


# ------------------------------------------------------------------ data
def _episodes(num_steps: int, seed: int = 0):
    """Random CartPole-like episodes of 200 steps totalling >= num_steps transitions."""
    rng = np.random.default_rng(seed)
    n = max(1, math.ceil(num_steps / EPISODE))
    obs = rng.normal(size=(n, EPISODE + 1, OBS)).astype(np.float32)
    acts = rng.integers(0, N_ACT, (n, EPISODE)).astype(np.int32)
    rews = np.ones((n, EPISODE), np.float32)
    terminal = rng.random(n) < 0.5
    return obs, acts, rews, terminal


def _trajectories(obs, acts, rews, terminal) -> pf.Trajectories:
    n = obs.shape[0]
    return pf.Trajectories(obs=jnp.asarray(obs), acts=jnp.asarray(acts), rews=jnp.asarray(rews),
                           lengths=jnp.full((n,), EPISODE, jnp.int32), terminal=jnp.asarray(terminal))


def _random_pairs(num_pairs: int, seed: int = 1) -> pf.FragmentPairs:
    rng = np.random.default_rng(seed)
    return pf.FragmentPairs(
        obs=jnp.asarray(rng.normal(size=(num_pairs, 2, L + 1, OBS)).astype(np.float32)),
        acts=jnp.asarray(rng.integers(0, N_ACT, (num_pairs, 2, L)).astype(np.int32)),
        rews=jnp.asarray(rng.normal(size=(num_pairs, 2, L)).astype(np.float32)),
        terminal=jnp.asarray(rng.random((num_pairs, 2)) < 0.1),
        valid=jnp.ones((num_pairs,), bool),
    )


def _net():
    return pf.RewardMLP(hidden_sizes=HIDDEN, observation_space=pf.Box((OBS,)), action_space=pf.Discrete(N_ACT))


def _example(net_inputs_from):
    return tuple(x[:1, :1] for x in net_inputs_from)


# ------------------------------------------------ the NumPy baseline (imitation's loops)
class _Traj:
    """Stands in for imitation's TrajectoryWithRew."""

    __slots__ = ("obs", "acts", "rews", "infos", "terminal")

    def __init__(self, obs, acts, rews, infos, terminal):
        self.obs, self.acts, self.rews, self.infos, self.terminal = obs, acts, rews, infos, terminal

    def __len__(self):
        return len(self.acts)


def _flatten_trajectories(trajectories):
    """imitation.data.rollout.flatten_trajectories for array observations."""
    parts = {key: [] for key in ("obs", "next_obs", "acts", "dones", "infos")}
    for traj in trajectories:
        parts["acts"].append(traj.acts)
        parts["obs"].append(traj.obs[:-1])
        parts["next_obs"].append(traj.obs[1:])
        dones = np.zeros(len(traj.acts), dtype=bool)
        dones[-1] = traj.terminal
        parts["dones"].append(dones)
        parts["infos"].append(np.array([{}] * len(traj)) if traj.infos is None else traj.infos)
    cat = {key: np.concatenate(v) for key, v in parts.items()}
    assert len({len(v) for v in cat.values()}) == 1
    return cat


class _NumpyMLP:
    """One reward MLP with the flax member's float32 parameters, forward and hand-written backward."""

    def __init__(self, member_params):
        p = member_params["params"]
        # writable float32 copies (the optimiser updates them in place)
        self.w = [np.array(p[f"dense{i}"]["kernel"]) for i in range(len(HIDDEN))] + [
            np.array(p["dense_final"]["kernel"])]
        self.b = [np.array(p[f"dense{i}"]["bias"]) for i in range(len(HIDDEN))] + [
            np.array(p["dense_final"]["bias"])]

    @staticmethod
    def preprocess(trans):
        """RewardNet.preprocess: float observations, one-hot actions (stable-baselines3 preprocess_obs)."""
        state = trans["obs"].astype(np.float32)
        action = np.eye(N_ACT, dtype=np.float32)[trans["acts"]]
        next_state = trans["next_obs"].astype(np.float32)
        done = trans["dones"].astype(np.float32)
        return state, action, next_state, done

    def forward(self, state, action):
        x = np.concatenate([state.reshape(len(state), -1), action.reshape(len(action), -1)], axis=1)
        cache = [x]
        h = x
        for i in range(len(HIDDEN)):
            z = h @ self.w[i] + self.b[i]
            h = np.maximum(z, 0)
            cache += [z, h]
        return (h @ self.w[-1] + self.b[-1])[:, 0], cache

    def backward(self, cache, d_r, grads):
        d = d_r[:, None]
        h = cache[-1]
        grads[0][-1] += h.T @ d
        grads[1][-1] += d.sum(0)
        dh = d @ self.w[-1].T
        for i in reversed(range(len(HIDDEN))):
            z, h_in = cache[1 + 2 * i], cache[2 * i]
            dz = dh * (z > 0)
            grads[0][i] += h_in.T @ dz
            grads[1][i] += dz.sum(0)
            if i:
                dh = dz @ self.w[i].T


def _np_probability(r1, r2, noise=0.0, discount=1.0, threshold=50.0):
    """PreferenceModel.probability (with the discount == 1 fast path)."""
    if discount == 1:
        diff = (r2 - r1).sum(axis=0)
    else:
        disc = discount ** np.arange(len(r1))
        if r1.ndim == 2:
            disc = disc.reshape(-1, 1)
        diff = (disc * (r2 - r1)).sum(axis=0)
    diff = np.clip(diff, -threshold, threshold)
    return noise * 0.5 + (1 - noise) * (1 / (1 + np.exp(diff))), diff


def _np_random_fragmenter(rng, trajectories, fragment_length, num_pairs):
    """imitation RandomFragmenter.__call__ (warning_threshold checks omitted: they only log)."""
    trajectories = [t for t in trajectories if len(t) >= fragment_length]
    weights = [len(t) for t in trajectories]
    fragments = []
    for _ in range(2 * num_pairs):
        traj = rng.choice(trajectories, p=np.array(weights) / sum(weights))
        n = len(traj)
        start = rng.integers(0, n - fragment_length, endpoint=True)
        end = start + fragment_length
        terminal = (end == n) and traj.terminal
        fragments.append(_Traj(traj.obs[start:end + 1], traj.acts[start:end],
                               traj.rews[start:end], None, terminal))
    it = iter(fragments)
    return list(zip(it, it))


def _np_active_selection(rng, members, trajectories, fragment_length, num_pairs, sample_factor):
    """imitation ActiveSelectionFragmenter.__call__ with uncertainty_on='logit' on a RewardEnsemble."""
    pairs = _np_random_fragmenter(rng, trajectories, fragment_length, int(sample_factor * num_pairs))
    var = np.zeros(len(pairs))
    for i, (f1, f2) in enumerate(pairs):
        rews = []
        for frag in (f1, f2):
            trans = _flatten_trajectories([frag])
            # RewardEnsemble.predict_processed_all: every member's predict_processed
            per_member = []
            for net in members:
                state, action, _, _ = net.preprocess(trans)
                per_member.append(net.forward(state, action)[0])
            rews.append(np.stack(per_member, axis=-1))
        var[i] = (rews[0].sum(0) - rews[1].sum(0)).var(ddof=1)
    idx = np.argsort(var)[::-1]
    return [pairs[j] for j in idx[:num_pairs]]


class _TorchAdamW:
    """torch.optim.AdamW(lr=1e-3) (weight_decay=0.01) on a list of arrays."""

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
        self.params, self.lr, self.b1, self.b2, self.eps, self.wd = params, lr, b1, b2, eps, wd
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads):
        self.t += 1
        bc1, bc2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            p *= 1 - self.lr * self.wd
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p -= self.lr * (m / bc1) / (np.sqrt(v / bc2) + self.eps)


def _np_bce(p, y):
    with np.errstate(divide="ignore"):
        return -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log1p(-p), -100))


def _np_train_member(rng, net, opt, fragments, prefs, batch_size):
    """One epoch of imitation's BasicRewardTrainer._train for one member (minibatch = batch)."""
    n = len(prefs)
    perm = rng.permutation(n)  # DataLoader(shuffle=True)
    losses = []
    for s in range(0, n, batch_size):
        batch = [(fragments[i], prefs[i]) for i in perm[s:s + batch_size]]  # preference_collate_fn
        pairs = [b[0] for b in batch]
        y = np.array([b[1] for b in batch], np.float32)
        # PreferenceModel.forward: per pair, model and ground-truth probabilities
        probs = np.empty(len(pairs), np.float32)
        gt_probs = np.empty(len(pairs), np.float32)
        caches = []
        for i, (f1, f2) in enumerate(pairs):
            c = []
            rs = []
            for frag in (f1, f2):
                trans = _flatten_trajectories([frag])
                state, action, _, _ = net.preprocess(trans)
                r, cache = net.forward(state, action)
                rs.append(r)
                c.append(cache)
            probs[i], diff = _np_probability(rs[0], rs[1])
            gt_probs[i], _ = _np_probability(f1.rews, f2.rews)
            caches.append((c, diff))
        # CrossEntropyRewardLoss: loss, accuracy, gt_reward_loss
        loss = _np_bce(probs, y).mean()
        _accuracy = ((probs > 0.5) == (y > 0.5)).mean()
        _gt_loss = _np_bce(gt_probs, y).mean()
        losses.append(loss)
        # backward (hand-written), loss scaled by len(batch) / batch_size
        scale = len(pairs) / batch_size / len(pairs)
        grads = [[np.zeros_like(w) for w in net.w], [np.zeros_like(b) for b in net.b]]
        for i, (c, diff) in enumerate(caches):
            p = probs[i]
            d_p = scale * (-(y[i] / max(p, 1e-12)) + (1 - y[i]) / max(1 - p, 1e-12))
            d_diff = d_p * (-p * (1 - p)) * (abs(diff) < 50)
            net.backward(c[0], np.full(L, -d_diff, np.float32), grads)
            net.backward(c[1], np.full(L, d_diff, np.float32), grads)
        opt.step(grads[0] + grads[1])
    return float(np.mean(losses))


def _np_train_epoch(rng, members, opts, fragments, prefs, batch_size):
    """EnsembleTrainer._train for one epoch: a bootstrap sample per member, members one after another."""
    n = len(prefs)
    for net, opt in zip(members, opts):
        bag = rng.integers(0, n, n)  # RandomSampler(replacement=True, num_samples=n)
        _np_train_member(rng, net, opt, [fragments[i] for i in bag], prefs[bag], batch_size)


# ------------------------------------- the torch baseline (imitation's code path, when torch is importable)
def _torch():
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    return torch


class _TorchNets:
    """imitation's BasicRewardNet members (``build_mlp``: Linear/ReLU, squeezed) with the flax weights."""

    def __init__(self, th, params):
        self.th = th
        self.members = []
        for k in range(M):
            p = jax.tree.map(lambda x, k=k: np.array(x[k]), params)["params"]
            layers = []
            names = [f"dense{i}" for i in range(len(HIDDEN))] + ["dense_final"]
            for j, name in enumerate(names):
                lin = th.nn.Linear(*p[name]["kernel"].shape)
                with th.no_grad():
                    lin.weight.copy_(th.from_numpy(p[name]["kernel"].T.copy()))
                    lin.bias.copy_(th.from_numpy(p[name]["bias"]))
                layers.append(lin)
                if j < len(HIDDEN):
                    layers.append(th.nn.ReLU())
            self.members.append(th.nn.Sequential(*layers))

    def preprocess(self, trans):
        """RewardNet.preprocess: safe_to_tensor + stable-baselines3 preprocess_obs."""
        th = self.th
        state = th.as_tensor(trans["obs"]).float()
        action = th.nn.functional.one_hot(th.as_tensor(trans["acts"]).long(), N_ACT).float()
        next_state = th.as_tensor(trans["next_obs"]).float()
        done = th.as_tensor(trans["dones"]).to(th.float32)
        return state, action, next_state, done

    def forward(self, net, state, action):
        """BasicRewardNet.forward (use_state, use_action)."""
        th = self.th
        x = th.cat([th.flatten(state, 1), th.flatten(action, 1)], dim=1)
        return net(x).squeeze(1)


def _th_probability(th, r1, r2, noise=0.0, discount=1.0, threshold=50.0):
    """PreferenceModel.probability."""
    diff = (r2 - r1).sum(axis=0) if discount == 1 else (discount ** th.arange(len(r1)) * (r2 - r1)).sum(axis=0)
    diff = th.clip(diff, -threshold, threshold)
    return noise * 0.5 + (1 - noise) * (1 / (1 + diff.exp()))


def _th_active_selection(nets, rng, trajectories, fragment_length, num_pairs, sample_factor):
    """ActiveSelectionFragmenter.__call__ (logit) over a RewardEnsemble, in torch as imitation."""
    th = nets.th
    pairs = _np_random_fragmenter(rng, trajectories, fragment_length, int(sample_factor * num_pairs))
    var = np.zeros(len(pairs))
    for i, (f1, f2) in enumerate(pairs):
        rews = []
        for frag in (f1, f2):
            trans = _flatten_trajectories([frag])
            with th.no_grad():
                per_member = []
                for net in nets.members:  # predict_processed_all -> predict -> predict_th
                    net.eval()
                    state, action, _, _ = nets.preprocess(trans)
                    per_member.append(nets.forward(net, state, action).detach().cpu().numpy().flatten())
                rews.append(th.as_tensor(np.stack(per_member, axis=-1)))
        var[i] = (rews[0].sum(0) - rews[1].sum(0)).var().item()
    idx = np.argsort(var)[::-1]
    return [pairs[j] for j in idx[:num_pairs]]


def _th_train_epoch(nets, opts, rng, fragments, prefs, batch_size):
    """EnsembleTrainer._train, one epoch: bootstrap per member, BasicRewardTrainer loop per member."""
    th = nets.th
    n = len(prefs)
    for net, opt in zip(nets.members, opts):
        net.train()
        bag = rng.integers(0, n, n)
        data = [(fragments[i], prefs[i]) for i in bag]
        perm = rng.permutation(n)
        opt.zero_grad()
        for s in range(0, n, batch_size):
            batch = [data[i] for i in perm[s:s + batch_size]]
            pairs = [b[0] for b in batch]
            y_np = np.array([b[1] for b in batch])
            probs = th.empty(len(pairs), dtype=th.float32)
            gt_probs = th.empty(len(pairs), dtype=th.float32)
            for i, (f1, f2) in enumerate(pairs):  # PreferenceModel.forward
                r = []
                for frag in (f1, f2):
                    trans = _flatten_trajectories([frag])
                    state, action, _, _ = nets.preprocess(trans)
                    r.append(nets.forward(net, state, action))
                probs[i] = _th_probability(th, r[0], r[1])
                gt_probs[i] = _th_probability(th, th.from_numpy(f1.rews), th.from_numpy(f2.rews))
            y = th.as_tensor(y_np, dtype=th.float32)  # CrossEntropyRewardLoss
            _accuracy = ((probs > 0.5) == (y > 0.5)).float().mean().item()
            _gt = th.nn.functional.binary_cross_entropy(gt_probs, y).item()
            loss = th.nn.functional.binary_cross_entropy(probs, y)
            _ = loss.item()
            loss = loss * (len(pairs) / batch_size)
            loss.backward()
            opt.step()
            opt.zero_grad()


# -------------------------------------------------------------- cases
def _members(params):
    return [_NumpyMLP(jax.tree.map(lambda x, k=k: np.asarray(x[k]), params)) for k in range(M)]


def _active_case(num_candidates, sample_factor, net, params, measure_baseline, quick, th=None):
    num_pairs = num_candidates // sample_factor
    obs, acts, rews, terminal = _episodes(2 * num_pairs * L)
    trajs = _trajectories(obs, acts, rews, terminal)
    fn = jax.jit(lambda k, p, t: pf.active_selection(k, p, net, t, L, num_pairs, float(sample_factor), "logit",
                                                     warning_threshold=0))
    t = time_jax(fn, jax.random.key(0), params, trajs, n=5 if quick else 10, warmup=1)
    base = None
    if measure_baseline:
        members = _members(params)
        episodes = [_Traj(obs[i], acts[i], rews[i], None, bool(terminal[i])) for i in range(len(obs))]
        rng = np.random.default_rng(0)
        reps = 1 if num_candidates >= 10_000 else 2
        base = time_call(lambda: _np_active_selection(rng, members, episodes, L, num_pairs, sample_factor),
                         n=reps, warmup=0)
        if th is not None:
            nets = _TorchNets(th, params)
            base_th = time_call(lambda: _th_active_selection(nets, rng, episodes, L, num_pairs, sample_factor),
                                n=reps, warmup=0)
            return t, base, base_th, len(obs) * EPISODE
    return t, base, None, len(obs) * EPISODE


def _train_case(num_pairs, net, measure_baseline, quick, th=None):
    pairs = _random_pairs(num_pairs)
    prefs, _ = pf.synthetic_preferences(0, pairs)
    bcfg = pf.buffer.config(num_pairs)
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, pairs), pairs, prefs, bcfg)
    trainer = pf.RewardTrainer(net, num_members=M, batch_size=BATCH, progress=False)
    state = trainer.init(0, _example(pairs.transitions()))
    epoch = jax.jit(tr.epoch)  # one epoch: bootstrap per member, shuffle, ceil(N / B) AdamW steps
    t = time_jax(lambda s, k, b: epoch(s, k, b, trainer.config), state, jax.random.key(2), buf,
                 n=3 if (quick or num_pairs >= 100_000) else 5, warmup=1)
    base = None
    if measure_baseline:
        members = _members(state.params)
        opts = [_TorchAdamW(m.w + m.b) for m in members]
        p_np = jax.tree.map(np.array, jax.device_get(pairs))  # writable, like imitation's arrays
        fragments = [(_Traj(p_np.obs[i, 0], p_np.acts[i, 0], p_np.rews[i, 0], None, bool(p_np.terminal[i, 0])),
                      _Traj(p_np.obs[i, 1], p_np.acts[i, 1], p_np.rews[i, 1], None, bool(p_np.terminal[i, 1])))
                     for i in range(num_pairs)]
        y = np.asarray(prefs)
        rng = np.random.default_rng(0)
        base = time_call(lambda: _np_train_epoch(rng, members, opts, fragments, y, BATCH), n=1, warmup=0)
        if th is not None:
            nets = _TorchNets(th, state.params)
            th_opts = [th.optim.AdamW(m.parameters(), lr=1e-3) for m in nets.members]
            base_th = time_call(lambda: _th_train_epoch(nets, th_opts, rng, fragments, y, BATCH), n=1, warmup=0)
            return t, base, base_th
    return t, base, None


# -------------------------------------------------------------- floor
def _floor_loss(p, obs, acts, prefs, mask):
    """Summed BCE of a batch: the MLP on (obs, one-hot action), returns, sigmoid of the clipped difference."""
    x = jnp.concatenate([obs[:, :, :-1], jax.nn.one_hot(acts, N_ACT, dtype=jnp.float32)], axis=-1)
    for i in range(len(HIDDEN)):
        x = jax.nn.relu(x @ p["params"][f"dense{i}"]["kernel"] + p["params"][f"dense{i}"]["bias"])
    r = (x @ p["params"]["dense_final"]["kernel"] + p["params"]["dense_final"]["bias"])[..., 0]  # [B, 2, L]
    d = jnp.clip(jnp.sum(r[:, 1] - r[:, 0], axis=-1), -50.0, 50.0)
    bce = -(prefs * jax.nn.log_sigmoid(-d) + (1.0 - prefs) * jax.nn.log_sigmoid(d))
    return jnp.sum(jnp.where(mask, bce, 0.0)) / BATCH


def floor_epoch(params, opt_state, key, obs, acts, prefs):
    """One epoch of the ensemble written minimally (same math as ``training.epoch``).

    Per member: N bootstrap draws, a shuffle, then ceil(N / B) AdamW steps
    (torch semantics, lr 1e-3, weight decay 0.01) on the summed BCE / B; the
    last batch is masked. No checks, no bad-data masks, no metrics.
    """
    n = prefs.shape[0]
    steps = -(-n // BATCH)
    opt = optax.adamw(1e-3, weight_decay=0.01)

    def items(k):
        kb, kp = jax.random.split(k)
        draws = jax.random.randint(kb, (n,), 0, n)
        return jnp.pad(draws[jax.random.permutation(kp, n)], (0, steps * BATCH - n)).reshape(steps, BATCH)

    idx = jax.vmap(items)(jax.random.split(key, M))  # [M, S, B]
    mask = (jnp.arange(steps * BATCH) < n).reshape(steps, BATCH)

    def one(c, xs):  # one step of every member
        i, m = xs

        def member(p, o, i):
            g = jax.grad(_floor_loss)(p, obs[i], acts[i], prefs[i], m)
            u, o = opt.update(g, o, p)
            return optax.apply_updates(p, u), o

        return jax.vmap(member)(*c, i), None

    return jax.lax.scan(one, (params, opt_state), (jnp.swapaxes(idx, 0, 1), mask))[0]


def _vs_floor(num_pairs, net, runs):
    """Medians of ``jax.jit(training.epoch)`` and :func:`floor_epoch`, called alternately."""
    pairs = _random_pairs(num_pairs)
    prefs, _ = pf.synthetic_preferences(0, pairs)
    bcfg = pf.buffer.config(num_pairs)
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, pairs), pairs, prefs, bcfg)
    cfg = tr.config(net, num_members=M, batch_size=BATCH)
    state = tr.init(cfg, 0, _example(pairs.transitions()))
    # the floor's loss is the trainer's (BCE of the Bradley-Terry probabilities) on the same batch
    member0 = jax.tree.map(lambda x: x[0], state.params)
    sub = jax.tree.map(lambda x: x[:BATCH], pairs)
    probs, _ = pf.preference_probabilities(net, member0, sub)
    want, _ = pf.cross_entropy_loss(probs, prefs[:BATCH])  # the mean BCE of a full batch
    got = _floor_loss(member0, sub.obs, sub.acts, prefs[:BATCH], jnp.ones((BATCH,), bool))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    epoch = jax.jit(tr.epoch).lower(state, jax.random.key(2), buf, cfg).compile()
    floor_args = (state.params, state.opt_state, jax.random.key(2), pairs.obs, pairs.acts, prefs)
    floor = jax.jit(floor_epoch).lower(*floor_args).compile()
    times = {"epoch": [], "floor": []}
    for r in range(runs + 1):
        t0 = time.perf_counter()
        jax.block_until_ready(epoch(state, jax.random.key(2), buf, cfg))
        t1 = time.perf_counter()
        jax.block_until_ready(floor(*floor_args))
        t2 = time.perf_counter()
        if r:  # the first pair of calls is the warm-up
            times["epoch"].append(t1 - t0)
            times["floor"].append(t2 - t1)
    return {k: statistics.median(v) for k, v in times.items()}


def _check_baseline_matches(net, params):
    """The NumPy MLP is the same function as the flax net (sanity check of the comparison)."""
    pairs = _random_pairs(2, seed=3)
    r = np.asarray(pf.fragment_rewards(net, params, pairs, ensemble=True))  # [P, 2, L, M]
    p_np = jax.device_get(pairs)
    for k, member in enumerate(_members(params)):
        trans = _flatten_trajectories([_Traj(p_np.obs[0, 1], p_np.acts[0, 1], p_np.rews[0, 1], None, False)])
        s, a, _, _ = member.preprocess(trans)
        np.testing.assert_allclose(member.forward(s, a)[0], r[0, 1, :, k], rtol=1e-4, atol=1e-5)


def _rows(recs, name, size, t, base, extrapolated, label, goal, met_fn, load):
    ratio = (base / t.median) if base else None
    recs.append(record(
        "preference", name, size, t.median, label + (", extrapolated" if extrapolated else ""), base,
        goal=goal, met=met_fn(ratio, t.median) if goal else None,
        compile_s=t["compile_s"], spread_s=[t["q25_s"], t["q75_s"]], load_avg=load,
        note="baseline extrapolated linearly from the measured 1e4 run" if extrapolated else "",
    ))


def run(quick: bool = False) -> list[dict]:
    th = _torch()
    net = _net()
    params = pf.ensemble_init(0, net, _example(_trajectories(*_episodes(1)).transitions()), M)
    _check_baseline_matches(net, params)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    recs: list[dict] = []
    sizes = [1_000] if quick else [1_000, 10_000, 100_000]
    np_label = "numpy per-pair loop (imitation)"
    th_label = "torch per-pair loop (imitation's code path)"
    # goals are judged against imitation's own code path (torch) when torch is importable, else numpy
    goal_on = "torch" if th is not None else "numpy"

    # 1. active selection (and 3. its scaling)
    for factor in ([10] if quick else [10, 2]):
        per = {"numpy": None, "torch": None}
        for c in sizes:
            t, base, base_th, steps = _active_case(c, factor, net, params, c <= 10_000, quick, th)
            size = f"C={c} candidates, {steps} steps, M={M}, L={L}"
            name = f"active_selection(sample_factor={factor})"
            goal = ">= 50x and <= 1 s at C=1e4" if (c == 10_000 and factor == 10) else None
            met = lambda r, s: r is not None and r >= 50 and s <= 1.0  # noqa: E731
            for kind, b, label in (("numpy", base, np_label), ("torch", base_th, th_label)):
                if kind == "torch" and th is None:
                    continue
                if b is not None:
                    per[kind] = b.median / c
                val = b.median if b is not None else (per[kind] * c if per[kind] else None)
                _rows(recs, name, size, t, val, b is None, label, goal if kind == goal_on else None, met, load)

    # 2. one training epoch of the 5-member ensemble (and 3. its scaling)
    per = {"numpy": None, "torch": None}
    for n in sizes:
        t, base, base_th = _train_case(n, net, n <= 10_000, quick, th)
        size = f"N={n} pairs, M={M}, batch {BATCH}, L={L}"
        goal = ">= 20x at N=1e4" if n == 10_000 else None
        met = lambda r, s: r is not None and r >= 20  # noqa: E731
        for kind, b, label in (("numpy", base, np_label + " + hand-written backward"),
                               ("torch", base_th, th_label + " + autograd, AdamW")):
            if kind == "torch" and th is None:
                continue
            if b is not None:
                per[kind] = b.median / n
            val = b.median if b is not None else (per[kind] * n if per[kind] else None)
            _rows(recs, "train_epoch(ensemble)", size, t, val, b is None, label,
                  goal if kind == goal_on else None, met, load)

    # 4. the epoch against its floor
    n = 1_000 if quick else 10_000
    fl = _vs_floor(n, net, 3 if quick else 7)
    recs.append(record(
        "preference", "train_epoch vs floor", f"N={n} pairs, M={M}, batch {BATCH}, L={L}", fl["epoch"],
        "floor (same math, minimal)", fl["floor"], goal="epoch <= 1.5x floor",
        met=fl["epoch"] <= 1.5 * fl["floor"], load_avg=load,
        note=f"jax.jit(training.epoch) {fl['epoch'] * 1e3:.1f} ms vs floor_epoch {fl['floor'] * 1e3:.1f} ms "
             f"({fl['epoch'] / fl['floor']:.2f}x), called alternately"))
    return recs


if __name__ == "__main__":
    main(run)
