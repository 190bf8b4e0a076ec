"""The library's hot paths as compiled programs at three sizes, for the roofline and the device suite.

Each builder returns a :class:`HotPath`: the jitted function, its arguments and whether its
first argument is a state threaded through calls (donated, as a training loop would). Sizes:

- ``quick``: seconds on a CPU (the suite's check in CI),
- ``cpu``: the sizes of the CPU benchmarks (``bench/bench_<module>.py``),
- ``gpu``: accelerator scale (1e5 trajectories x 1000 steps x 10 components, a curriculum
  pool of 1e7, MaxEnt 8192 x 64 and the policy loss over 8192 x 64 x 512 tokens, 1e5
  candidate pairs, 1 GB of weights).

Public names of jaxweight only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SIZES = ("quick", "cpu", "gpu")


@dataclass
class HotPath:
    """One compiled program to time: ``fn(*args)``; with ``threaded``, ``args[0]`` is a state
    replaced by the first output on every call (donated)."""

    name: str
    size: str
    fn: Callable
    args: tuple
    threaded: bool = False
    note: str = ""
    extra: dict = field(default_factory=dict)


def _pick(size: str, quick, cpu, gpu):
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    return {"quick": quick, "cpu": cpu, "gpu": gpu}[size]


# ---------------------------------------------------------------- random weights
def random_weight_schedule(size: str) -> HotPath:
    from jaxweight import random_weighting as rw

    T, S = _pick(size, (1000, 100), (10_000, 100), (100_000, 1000))
    cfg = rw.config()
    K = cfg.num_components
    fn = jax.jit(lambda k: rw.sample_schedule(k, cfg, T, S))
    return HotPath("random-weight schedule", f"{T}x{S}x{K}", fn, (jax.random.key(0),),
                   note="rw.sample_schedule: every trajectory's and step's log-weights in one call")


# ---------------------------------------------------------------- curriculum
def curriculum_step(size: str) -> HotPath:
    from jaxweight import curriculum as cur

    n = _pick(size, 10_000, 1_000_000, 10_000_000)
    batch = 1024
    rng = np.random.default_rng(0)
    cfg = cur.config("easy_first", 5, capacity=n)
    counts = rng.integers(1, 5, n, dtype=np.int32)
    total = int(counts.sum(dtype=np.int64))
    state = cur.init(cfg).replace(ema=jnp.asarray(rng.random(n, dtype=np.float32)), count=jnp.asarray(counts),
                                  last_update=jnp.zeros(n, jnp.int32), total_updates=jnp.asarray(total, jnp.int32),
                                  last_rebin_count=jnp.asarray(total, jnp.int32))
    state = cur.recompute_bins(state, cfg)
    ids = jnp.asarray(rng.integers(0, n, batch, dtype=np.int32))
    scores = jnp.asarray(rng.random(batch, dtype=np.float32))

    def body(s, k, i, x):
        s, out = cur.step(s, k, i, x, cfg, step=500, total_steps=1000, num=batch)
        return s, out.item_ids

    return HotPath("curriculum step", f"N={n:.0e}, batch {batch}", jax.jit(body, donate_argnums=0),
                   (state, jax.random.key(0), ids, scores), threaded=True,
                   note="cur.step donated: update 1024 scores, rebin when due, sample 1024")


# ---------------------------------------------------------------- maxent
def _maxent_batch(p: int, g: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    u = (rng.integers(0, 2, (p, g)) + rng.normal(0, 0.1, (p, g))).astype(np.float32)
    ref = (-rng.uniform(0.1, 3.0, (p, g))).astype(np.float32)
    tok = rng.integers(1, 512, (p, g)).astype(np.float32)
    mask = rng.uniform(size=(p, g)) > 0.05
    return tuple(jnp.asarray(x) for x in (u, ref, tok, mask))


def maxent_step(size: str) -> HotPath:
    from jaxweight import maxent as M

    P, G = _pick(size, (64, 8), (1024, 64), (8192, 64))
    cfg = M.config(0.5, 0.04, q_temperature=0.7,
                   schedule=M.TauSchedule(target_entropy=3.0, learning_rate=0.1, minimum_value=0.05,
                                          maximum_value=2.0, warmup_steps=0),
                   kl=M.KLController(target=0.05, horizon=10, step_size=0.2))
    u, ref, tok, mask = _maxent_batch(P, G)

    def body(s, u, ref, tok, mask):
        return M.step(s, u, ref, cfg, token_counts=tok, mask=mask, global_step=5, measured_kl=0.07)

    return HotPath("maxent fused step", f"{P}x{G}", jax.jit(body), (M.init(cfg), u, ref, tok, mask),
                   note="maxent.step: advantages, q, weights, entropy stats, tau and beta controllers")


def maxent_policy_loss(size: str) -> HotPath:
    from jaxweight import maxent as M

    P, G, L = _pick(size, (16, 8, 32), (256, 8, 512), (8192, 64, 512))
    N = P * G
    rng = np.random.default_rng(1)
    logp = jnp.asarray(-rng.uniform(0.0, 3.0, (N, L)).astype(np.float32))
    beh = logp + jnp.asarray(rng.normal(0, 0.05, (N, L)).astype(np.float32))
    ref = logp + jnp.asarray(rng.normal(0, 0.05, (N, L)).astype(np.float32))
    lengths = rng.integers(1, L + 1, N)
    mask = jnp.asarray(np.arange(L)[None, :] < lengths[:, None])
    signal = jnp.asarray(rng.normal(size=N).astype(np.float32))
    weights = jnp.asarray(rng.uniform(0.1, 1.0, (P, G)).astype(np.float32))

    def loss_and_grad(lp, b, s, m, r, w):
        (loss, _), g = jax.value_and_grad(
            lambda x: M.policy_loss(x, b, s, m, ref_logp=r, kl_coef=0.04, weights=w), has_aux=True)(lp)
        return loss, g

    return HotPath("maxent weighted policy loss (value and grad)", f"{P}x{G}x{L} tokens", jax.jit(loss_and_grad),
                   (logp, beh, signal, mask, ref, weights),
                   note="maxent.policy_loss with xDr.GRPO candidate weights, k3 KL; gradient w.r.t. the log-probs")


# ---------------------------------------------------------------- preference
_OBS, _NACT, _L, _M = 4, 2, 50, 5


def _net():
    from jaxweight import preference as pf

    return pf.RewardMLP(hidden_sizes=(32, 32), observation_space=pf.Box((_OBS,)), action_space=pf.Discrete(_NACT))


def active_selection(size: str) -> HotPath:
    from jaxweight import preference as pf

    num_candidates = _pick(size, 1_000, 10_000, 100_000)
    factor = 10
    num_pairs = num_candidates // factor
    episode = 200
    n = max(1, math.ceil(2 * num_candidates * _L / episode))  # enough distinct fragments
    rng = np.random.default_rng(0)
    trajs = pf.Trajectories(obs=jnp.asarray(rng.normal(size=(n, episode + 1, _OBS)).astype(np.float32)),
                            acts=jnp.asarray(rng.integers(0, _NACT, (n, episode)).astype(np.int32)),
                            rews=jnp.ones((n, episode), jnp.float32), lengths=jnp.full((n,), episode, jnp.int32),
                            terminal=jnp.asarray(rng.random(n) < 0.5))
    net = _net()
    params = pf.ensemble_init(jax.random.key(1), net, pf.example_inputs(trajs), _M)
    fn = jax.jit(lambda k, p, t: pf.active_selection(k, p, net, t, _L, num_pairs, float(factor), "logit",
                                                     warning_threshold=0))
    return HotPath("active selection", f"{num_candidates} candidate pairs, {_M} members, L={_L}", fn,
                   (jax.random.key(0), params, trajs),
                   note="preference.active_selection: ensemble rewards of every candidate, the most uncertain kept")


def ensemble_epoch(size: str) -> HotPath:
    from jaxweight import preference as pf
    from jaxweight.preference import training as tr

    num_pairs = _pick(size, 1_000, 10_000, 100_000)
    rng = np.random.default_rng(1)
    pairs = pf.FragmentPairs(obs=jnp.asarray(rng.normal(size=(num_pairs, 2, _L + 1, _OBS)).astype(np.float32)),
                             acts=jnp.asarray(rng.integers(0, _NACT, (num_pairs, 2, _L)).astype(np.int32)),
                             rews=jnp.asarray(rng.normal(size=(num_pairs, 2, _L)).astype(np.float32)),
                             terminal=jnp.asarray(rng.random((num_pairs, 2)) < 0.1),
                             valid=jnp.ones((num_pairs,), bool))
    prefs, _ = pf.synthetic_preferences(0, pairs)
    bcfg = pf.buffer.config(num_pairs)
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, pairs), pairs, prefs, bcfg)
    trainer = pf.RewardTrainer(_net(), num_members=_M, batch_size=32, progress=False)
    state = trainer.init(0, pf.example_inputs(pairs))
    cfg = trainer.config
    fn = jax.jit(lambda s, k, b: tr.epoch(s, k, b, cfg)[0], donate_argnums=0)
    return HotPath("ensemble epoch", f"{num_pairs} pairs, {_M} members, batch 32", fn,
                   (state, jax.random.key(2), buf), threaded=True,
                   note="preference.training.epoch: bootstrap per member, shuffle, ceil(N/32) AdamW steps (a scan)")


# ---------------------------------------------------------------- sync
def weight_sync(size: str) -> HotPath:
    from jaxweight import sync

    mb = _pick(size, 4, 100, 1024)
    n_leaves = 16
    per = (mb << 20) // 4 // n_leaves
    learner = {f"w{i}": jnp.full((per,), float(i), jnp.float32) for i in range(n_leaves)}
    actor = jax.tree.map(jnp.zeros_like, learner)
    cfg = sync.config(1)

    def body(actor, state, learner):
        state, actor, fired = sync.step(state, learner, actor, cfg)
        return actor, state

    return HotPath("weight sync (jitted step, fires every call)", f"{mb} MiB in {n_leaves} leaves",
                   jax.jit(body, donate_argnums=0), (actor, sync.init(cfg), learner), threaded=True,
                   note="sync.step under jit with the actor donated: the actor's buffers take the learner's values")


# ---------------------------------------------------------------- the agent and the loop
def _demo_loop(size: str):
    """The ``preferences`` demo's loop on CartPole (one seed): its config and a fresh state."""
    from jaxweight.demos import preferences as D
    from jaxweight.preference import loop

    s = D.settings("cartpole", quick=(size == "quick"), seeds=1)
    pc = D.build(s)
    cfg = pc.config_for(s.total_timesteps, s.total_comparisons)
    # every leaf its own buffer, so the state can be donated (a fresh state shares some)
    return cfg, jax.tree.map(jnp.copy, loop.init(cfg, jax.random.key(0)))


def ppo_update(size: str) -> HotPath:
    from jaxweight.preference import loop

    cfg, state = _demo_loop(size)
    gen = cfg.generator
    steps = int(gen.config.num_envs * gen.config.num_steps)
    reward = loop.agent_reward(state, cfg)
    extra = {} if cfg.agent_hparams is None else {"hparams": cfg.agent_hparams}
    fn = jax.jit(lambda g, k: gen.train(g, k, jnp.asarray(steps, jnp.int32), reward, **extra), donate_argnums=0)
    return HotPath("PPO update (rollout + epochs)", f"CartPole, {gen.config.num_envs} envs x {gen.config.num_steps} steps",
                   fn, (state.gen, jax.random.key(1)), threaded=True,
                   note="the preferences demo's PPO: one rollout on the learned reward, then its update epochs")


def loop_round(size: str) -> HotPath:
    from jaxweight.preference import loop

    cfg, state = _demo_loop(size)
    fn = jax.jit(lambda s, k: loop.step(s, k, cfg), donate_argnums=0)
    return HotPath("preference-loop round", f"CartPole, {cfg.plan.num_rounds} rounds, 1 seed", fn,
                   (state, jax.random.key(2)), threaded=True,
                   note="preference.loop.step: collect, select, label, push, fit the reward, fit the agent")


BUILDERS: dict[str, Callable[[str], HotPath]] = {
    "random_weight_schedule": random_weight_schedule,
    "curriculum_step": curriculum_step,
    "maxent_step": maxent_step,
    "maxent_policy_loss": maxent_policy_loss,
    "active_selection": active_selection,
    "ensemble_epoch": ensemble_epoch,
    "weight_sync": weight_sync,
    "ppo_update": ppo_update,
    "loop_round": loop_round,
}


def measure(hp: HotPath, n: int = 10) -> dict[str, Any]:
    """Compile (timed), warm up, then the median of ``n`` timed calls; the compiled program's cost."""
    import time

    from _roofline import cost

    jitted = hp.fn
    t0 = time.perf_counter()
    compiled = jitted.lower(*hp.args).compile()
    compile_s = time.perf_counter() - t0
    c = cost(compiled)
    args = list(hp.args)

    def call():
        out = compiled(*args)
        if hp.threaded:
            args[0] = out[0] if isinstance(out, tuple) else out
        return jax.block_until_ready(out)

    for _ in range(2):
        call()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    times.sort()
    return {"median_s": times[len(times) // 2], "min_s": times[0], "max_s": times[-1], "n": n,
            "compile_s": compile_s, "cost": c}
