"""The library's hot paths as compiled programs at three sizes, for the roofline and the device suite.

Each builder returns a :class:`HotPath`: the jitted function, its arguments and whether its
first argument is a state threaded through calls (donated, as a training loop would). Sizes:

- ``quick``: seconds on a CPU (the suite's check in CI),
- ``cpu``: the sizes of the CPU benchmarks (``bench/bench_<module>.py``),
- ``gpu``: accelerator scale (1e5 trajectories x 1000 steps x 10 components, a curriculum
  pool of 1e7, MaxEnt 8192 x 64 and the policy loss over 8192 x 64 x 512 tokens, 1e5
  candidate pairs, 1 GB of weights).

Every builder also takes ``n``, the path's main size (the sweep of ``bench_roofline.py --sweep``
and :data:`SWEEPS`), and states what the program must move at the least (``min_bytes``: each
input read once, each output written once, a donated state counting the rows it touches) or,
for looped and latency-bound programs, its sequential iterations and its throughput unit.

Public names of jaxweight only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import threefry_2x32

SIZES = ("quick", "cpu", "gpu")


@dataclass
class HotPath:
    """One compiled program to time: ``fn(*args)``; with ``threaded``, ``args[0]`` is a state
    replaced by the first output on every call (donated).

    ``kind``: ``"memory"`` (a fraction of the stream bandwidth from ``min_bytes``) or
    ``"latency"`` (looped or latency-bound: ``iterations`` sequential steps per call, throughput
    ``units`` per call in ``unit``). ``floor``: ``(what, fn, args[, threaded])``, a program whose time bounds
    this one from below in practice (e.g. drawing the same normals alone). ``n``: the main size.
    """

    name: str
    size: str
    fn: Callable
    args: tuple
    threaded: bool = False
    note: str = ""
    extra: dict = field(default_factory=dict)
    kind: str = "memory"
    min_bytes: int | None = None
    iterations: int = 1
    units: float = 1.0
    unit: str = "calls/s"
    floor: tuple | None = None
    n: int = 0


def _pick(size: str, quick, cpu, gpu, n=None, at=None):
    """The builder's sizes: the named size's tuple, or with ``n`` that tuple with ``n`` at index ``at``."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    v = {"quick": quick, "cpu": cpu, "gpu": gpu}[size]
    if n is None:
        return v
    if at is None:
        return int(n)
    return tuple(int(n) if i == at else x for i, x in enumerate(v))


def _io_bytes(fn, args, skip_state: bool = False) -> int:
    """Each input read once and each output written once (from shapes); ``skip_state``: leave out
    ``args[0]`` and the first output (a donated state whose touched rows the caller counts)."""
    from _roofline import tree_bytes

    out = jax.eval_shape(fn, *args)
    if skip_state:
        return tree_bytes(args[1:]) + tree_bytes(out[1:] if isinstance(out, tuple) else ())
    return tree_bytes(args) + tree_bytes(out)


# ---------------------------------------------------------------- random weights
def random_weight_schedule(size: str, n: int | None = None) -> HotPath:
    from jaxweight import random_weighting as rw

    T, S = _pick(size, (1000, 100), (10_000, 100), (100_000, 1000), n, 0)
    cfg = rw.config()
    K = cfg.num_components
    fn = jax.jit(lambda k: rw.sample_schedule(k, cfg, T, S))
    args = (jax.random.key(0),)
    N = T * S * K

    def hashes(kp):  # the schedule's integer work alone: one threefry2x32 hash per weight, its two words xored
        x = threefry_2x32(kp, lax.iota(jnp.uint32, 2 * N))
        return (x[:N] ^ x[N:]).reshape(T, S, K)

    floor_args = (jnp.asarray([0, 42], jnp.uint32),)
    return HotPath("random-weight schedule", f"{T}x{S}x{K}", fn, args, n=T, min_bytes=_io_bytes(fn, args),
                   floor=("jax's threefry2x32 hash alone, one per weight (jax.extend.random.threefry_2x32)",
                          jax.jit(hashes), floor_args),
                   units=T * S * K, unit="weights/s",
                   note="rw.sample_schedule: every trajectory's and step's log-weights in one call")


# ---------------------------------------------------------------- curriculum
def curriculum_step(size: str, n: int | None = None) -> HotPath:
    from _roofline import tree_bytes

    from jaxweight import curriculum as cur

    n = _pick(size, 10_000, 1_000_000, 10_000_000, n)
    batch = 1024
    # every array drawn with jax (on the device, traceable: the GPU sizes are checked with eval_shape)
    k = jax.random.split(jax.random.key(0), 4)
    cfg = cur.config("easy_first", 5, capacity=n)
    counts = jax.random.randint(k[0], (n,), 1, 5, jnp.int32)
    total = jnp.sum(counts, dtype=jnp.int32)
    state = cur.init(cfg).replace(ema=jax.random.uniform(k[1], (n,), jnp.float32), count=counts,
                                  last_update=jnp.zeros(n, jnp.int32), total_updates=total,
                                  last_rebin_count=jnp.array(total, copy=True))  # its own buffer (donated)
    state = cur.recompute_bins(state, cfg)
    ids = jax.random.randint(k[2], (batch,), 0, n, jnp.int32)
    scores = jax.random.uniform(k[3], (batch,), jnp.float32)

    def body(s, k, i, x):
        s, out = cur.step(s, k, i, x, cfg, step=500, total_steps=1000, num=batch)
        return s, out.item_ids

    args = (state, jax.random.key(0), ids, scores)
    # touched rows: every per-item array of the pool, read and written at the batch's rows
    per_item = sum(tree_bytes(x) // n for x in jax.tree.leaves(state) if getattr(x, "shape", ())[:1] == (n,))
    min_bytes = _io_bytes(body, args, skip_state=True) + 2 * batch * per_item
    return HotPath("curriculum step", f"N={n:.0e}, batch {batch}", jax.jit(body, donate_argnums=0), args,
                   threaded=True, n=n, min_bytes=min_bytes, units=2 * batch,
                   floor=("one pass over the pool's per-item arrays (the binning pass every sample makes)",
                          jax.jit(lambda s: jnp.sum(s.ema) + jnp.sum(s.count) + jnp.sum(s.last_update)), (state,)),
                   unit="items/s (scores applied + items drawn)",
                   note="cur.step donated: update 1024 scores, rebin when due, sample 1024")


# ---------------------------------------------------------------- maxent
def _maxent_batch(p: int, g: int, seed: int = 0):
    k = jax.random.split(jax.random.key(seed), 5)
    u = (jax.random.bernoulli(k[0], 0.5, (p, g)).astype(jnp.float32) + 0.1 * jax.random.normal(k[1], (p, g)))
    ref = -jax.random.uniform(k[2], (p, g), minval=0.1, maxval=3.0)
    tok = jax.random.randint(k[3], (p, g), 1, 512).astype(jnp.float32)
    mask = jax.random.uniform(k[4], (p, g)) > 0.05
    return u, ref, tok, mask


def maxent_step(size: str, n: int | None = None) -> HotPath:
    from jaxweight import maxent as M

    P, G = _pick(size, (64, 8), (1024, 64), (8192, 64), n, 0)
    cfg = M.config(0.5, 0.04, q_temperature=0.7,
                   schedule=M.TauSchedule(target_entropy=3.0, learning_rate=0.1, minimum_value=0.05,
                                          maximum_value=2.0, warmup_steps=0),
                   kl=M.KLController(target=0.05, horizon=10, step_size=0.2))
    u, ref, tok, mask = _maxent_batch(P, G)

    def body(s, u, ref, tok, mask):
        return M.step(s, u, ref, cfg, token_counts=tok, mask=mask, global_step=5, measured_kl=0.07)

    args = (M.init(cfg), u, ref, tok, mask)

    def softmaxes(u, ref, mask):  # the step's transcendental core alone: two masked softmaxes over each group
        a = jax.nn.softmax(jnp.where(mask, u / 0.7, -jnp.inf), -1)
        return a, jax.nn.log_softmax(jnp.where(mask, ref + u / 0.5, -jnp.inf), -1)

    return HotPath("maxent fused step", f"{P}x{G}", jax.jit(body), args, n=P, min_bytes=_io_bytes(body, args),
                   floor=("two masked softmaxes over every group alone (exp, log, two reductions)",
                          jax.jit(softmaxes), (u, ref, mask)),
                   units=P * G, unit="completions/s", note="maxent.step: advantages, q, weights, entropy stats, tau and beta controllers")


def maxent_policy_loss(size: str, n: int | None = None) -> HotPath:
    from jaxweight import maxent as M

    P, G, L = _pick(size, (16, 8, 32), (256, 8, 512), (8192, 64, 512), n, 0)
    N = P * G
    k = jax.random.split(jax.random.key(1), 6)
    logp = -jax.random.uniform(k[0], (N, L), maxval=3.0)
    beh = logp + 0.05 * jax.random.normal(k[1], (N, L))
    ref = logp + 0.05 * jax.random.normal(k[2], (N, L))
    lengths = jax.random.randint(k[3], (N,), 1, L + 1)
    mask = jnp.arange(L)[None, :] < lengths[:, None]
    signal = jax.random.normal(k[4], (N,))
    weights = jax.random.uniform(k[5], (P, G), minval=0.1, maxval=1.0)

    def loss_and_grad(lp, b, s, m, r, w):
        (loss, _), g = jax.value_and_grad(
            lambda x: M.policy_loss(x, b, s, m, ref_logp=r, kl_coef=0.04, weights=w), has_aux=True)(lp)
        return loss, g

    args = (logp, beh, signal, mask, ref, weights)

    def exps(lp, b, s, m, r):  # the loss's transcendental core alone: the ratio's and the k3 KL's exp, and grad
        f = lambda x: jnp.sum(jnp.where(m, jnp.exp(x - b) * s[:, None] + jnp.exp(r - x) - (r - x), 0.0))  # noqa: E731
        return jax.value_and_grad(f)(lp)

    return HotPath("maxent weighted policy loss (value and grad)", f"{P}x{G}x{L} tokens", jax.jit(loss_and_grad),
                   args, n=P, min_bytes=_io_bytes(loss_and_grad, args), units=N * L, unit="tokens/s",
                   floor=("the ratio's and the k3 KL's exp per token, value and grad, alone", jax.jit(exps),
                          (logp, beh, signal, mask, ref)),
                   note="maxent.policy_loss with xDr.GRPO candidate weights, k3 KL; gradient w.r.t. the log-probs")


# ---------------------------------------------------------------- preference
_OBS, _NACT, _L, _M = 4, 2, 50, 5


def _net():
    from jaxweight import preference as pf

    return pf.RewardMLP(hidden_sizes=(32, 32), observation_space=pf.Box((_OBS,)), action_space=pf.Discrete(_NACT))


def active_selection(size: str, n: int | None = None) -> HotPath:
    from jaxweight import preference as pf

    num_candidates = _pick(size, 1_000, 10_000, 100_000, n)
    factor = 10
    num_pairs = num_candidates // factor
    episode = 200
    n = max(1, math.ceil(2 * num_candidates * _L / episode))  # enough distinct fragments
    k = jax.random.split(jax.random.key(0), 3)
    trajs = pf.Trajectories(obs=jax.random.normal(k[0], (n, episode + 1, _OBS)),
                            acts=jax.random.randint(k[1], (n, episode), 0, _NACT, jnp.int32),
                            rews=jnp.ones((n, episode), jnp.float32), lengths=jnp.full((n,), episode, jnp.int32),
                            terminal=jax.random.bernoulli(k[2], 0.5, (n,)))
    net = _net()
    params = pf.ensemble_init(jax.random.key(1), net, pf.example_inputs(trajs), _M)
    fn = jax.jit(lambda k, p, t: pf.active_selection(k, p, net, t, _L, num_pairs, float(factor), "logit",
                                                     warning_threshold=0))
    return HotPath("active selection", f"{num_candidates} candidate pairs, {_M} members, L={_L}", fn,
                   (jax.random.key(0), params, trajs), kind="latency", n=num_candidates, units=num_candidates,
                   unit="candidate pairs/s", note="preference.active_selection: ensemble rewards of every candidate, the most uncertain kept")


def ensemble_epoch(size: str, n: int | None = None) -> HotPath:
    from jaxweight import preference as pf
    from jaxweight.preference import training as tr

    num_pairs = _pick(size, 1_000, 10_000, 100_000, n)
    k = jax.random.split(jax.random.key(1), 4)
    pairs = pf.FragmentPairs(obs=jax.random.normal(k[0], (num_pairs, 2, _L + 1, _OBS)),
                             acts=jax.random.randint(k[1], (num_pairs, 2, _L), 0, _NACT, jnp.int32),
                             rews=jax.random.normal(k[2], (num_pairs, 2, _L)),
                             terminal=jax.random.bernoulli(k[3], 0.1, (num_pairs, 2)),
                             valid=jnp.ones((num_pairs,), bool))
    prefs, _ = pf.synthetic_preferences(0, pairs)
    bcfg = pf.buffer.config(num_pairs)
    buf = pf.buffer.step(pf.buffer.init(bcfg, None, pairs), pairs, prefs, bcfg)
    trainer = pf.RewardTrainer(_net(), num_members=_M, batch_size=32, progress=False)
    state = trainer.init(0, pf.example_inputs(pairs))
    cfg = trainer.config
    fn = jax.jit(lambda s, k, b: tr.epoch(s, k, b, cfg)[0], donate_argnums=0)
    return HotPath("ensemble epoch", f"{num_pairs} pairs, {_M} members, batch 32", fn,
                   (state, jax.random.key(2), buf), threaded=True, kind="latency", n=num_pairs,
                   iterations=math.ceil(num_pairs / 32), units=num_pairs, unit="pairs/s", note="preference.training.epoch: bootstrap per member, shuffle, ceil(N/32) AdamW steps (a scan)")


# ---------------------------------------------------------------- sync
def weight_sync(size: str, n: int | None = None) -> HotPath:
    from _roofline import tree_bytes

    from jaxweight import sync

    mb = _pick(size, 4, 100, 1024, n)
    n_leaves = 16
    per = (mb << 20) // 4 // n_leaves
    learner = {f"w{i}": jnp.full((per,), float(i), jnp.float32) for i in range(n_leaves)}
    actor = jax.tree.map(jnp.zeros_like, learner)
    cfg = sync.config(1, copy_on_same_device=True)  # copy mode: the actor keeps buffers of its own

    def body(actor, state, learner):
        state, actor, fired = sync.step(state, learner, actor, cfg)
        return actor, state

    # the learner read once, the donated actor written once (its old values are not read)
    return HotPath("weight sync (jitted step, fires every call)", f"{mb} MiB in {n_leaves} leaves",
                   jax.jit(body, donate_argnums=0), (actor, sync.init(cfg), learner), threaded=True, n=mb,
                   min_bytes=2 * tree_bytes(learner), units=tree_bytes(learner), unit="bytes synced/s",
                   floor=("a plain jitted in-place copy of the same tree into a donated tree (no library code)",
                          jax.jit(lambda dst, src: jax.tree.map(lambda d, x: lax.dynamic_update_slice(d, x, (0,)), dst, src),
                                  donate_argnums=0),
                          (jax.tree.map(jnp.zeros_like, learner), learner), True), note="sync.step under jit with the actor donated: the actor's buffers take the learner's values")


# ---------------------------------------------------------------- the agent and the loop
def _demo_loop(size: str, n: int | None = None):
    """The ``preferences`` demo's loop on CartPole (one seed; ``n``: its PPO's number of envs)."""
    from jaxweight.demos import preferences as D
    from jaxweight.preference import loop

    s = D.settings("cartpole", quick=(size == "quick"), seeds=1, **({} if n is None else {"ppo_envs": int(n)}))
    pc = D.build(s)
    cfg = pc.config_for(s.total_timesteps, s.total_comparisons)
    # every leaf its own buffer, so the state can be donated (a fresh state shares some)
    return cfg, jax.tree.map(jnp.copy, loop.init(cfg, jax.random.key(0)))


def ppo_update(size: str, n: int | None = None) -> HotPath:
    from jaxweight.preference import loop

    cfg, state = _demo_loop(size, n)
    gen = cfg.generator
    steps = int(gen.config.num_envs * gen.config.num_steps)
    reward = loop.agent_reward(state, cfg)
    extra = {} if cfg.agent_hparams is None else {"hparams": cfg.agent_hparams}
    fn = jax.jit(lambda g, k: gen.train(g, k, jnp.asarray(steps, jnp.int32), reward, **extra), donate_argnums=0)
    return HotPath("PPO update (rollout + epochs)", f"CartPole, {gen.config.num_envs} envs x {gen.config.num_steps} steps",
                   fn, (state.gen, jax.random.key(1)), threaded=True, kind="latency", n=gen.config.num_envs,
                   iterations=gen.config.num_steps + gen.config.update_epochs * gen.config.num_minibatches,
                   units=steps, unit="env-steps/s", note="the preferences demo's PPO: one rollout on the learned reward, then its update epochs")


def loop_round(size: str, n: int | None = None) -> HotPath:
    from jaxweight.preference import loop

    cfg, state = _demo_loop(size, n)
    fn = jax.jit(lambda s, k: loop.step(s, k, cfg), donate_argnums=0)
    gen = cfg.generator
    return HotPath("preference-loop round", f"CartPole, {gen.config.num_envs} envs, 1 seed", fn,
                   (state, jax.random.key(2)), threaded=True, kind="latency", n=gen.config.num_envs,
                   unit="rounds/s",
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


# the main size of each path over at least two decades, for the cost-against-size sweep
SWEEPS: dict[str, dict[str, list[int]]] = {
    "quick": {"random_weight_schedule": [10, 100, 1000, 3000], "curriculum_step": [1000, 10_000, 100_000, 300_000],
              "maxent_step": [8, 64, 512, 2048], "maxent_policy_loss": [2, 16, 128, 256],
              "active_selection": [100, 300, 1000, 3000], "ensemble_epoch": [100, 300, 1000, 3000],
              "weight_sync": [1, 4, 16, 64], "ppo_update": [2, 4, 8, 16], "loop_round": [2, 4, 8, 16]},
    "cpu": {"random_weight_schedule": [100, 1000, 10_000, 100_000],
            "curriculum_step": [10_000, 100_000, 1_000_000, 10_000_000],
            "maxent_step": [64, 1024, 16_384, 131_072], "maxent_policy_loss": [4, 32, 256, 2048],
            "active_selection": [100, 1000, 10_000, 30_000], "ensemble_epoch": [100, 1000, 10_000, 30_000],
            "weight_sync": [1, 8, 64, 512], "ppo_update": [2, 8, 32, 256], "loop_round": [2, 8, 32, 256]},
}


def measure(hp: HotPath, n: int = 10, stream: Any = None) -> dict[str, Any]:
    """Compile (timed), warm up, then ``n`` timed calls, each after one call of ``stream`` (the
    in-process bandwidth reference, :class:`_roofline.Stream`) so both see the same load.

    Returns the program's median/min/max seconds, compile seconds, XLA's modelled traffic, the
    stream's bandwidth over the same window and the program's page faults per call.
    """
    from _roofline import _faults, xla_bytes

    floor_fields = {}
    # the floor first: a threaded program donates its state, which the floor may read
    if hp.floor is not None:
        what, ffn, fargs, *thr = hp.floor
        fargs = list(fargs)
        fc = ffn.lower(*fargs).compile()
        ft = []
        for i in range(max(3, n // 2) + 1):
            t = time.perf_counter()
            o = jax.block_until_ready(fc(*fargs))
            if i:
                ft.append(time.perf_counter() - t)
            if thr and thr[0]:
                fargs[0] = o
        floor_fields = {"floor": what, "floor_s": float(np.median(ft))}

    t0 = time.perf_counter()
    compiled = hp.fn.lower(*hp.args).compile()
    compile_s = time.perf_counter() - t0
    c = xla_bytes(compiled)
    args = list(hp.args)

    def call():
        out = compiled(*args)
        if hp.threaded:
            args[0] = out[0] if isinstance(out, tuple) else out
        return jax.block_until_ready(out)

    for _ in range(2):
        call()
    since = 0 if stream is None else len(stream.times)
    times, faults = [], 0
    for _ in range(n):
        if stream is not None:
            stream.once()
        f0 = _faults()
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
        faults += _faults() - f0
    times.sort()
    out = {"median_s": float(np.median(times)), "min_s": times[0], "max_s": times[-1], "n": n,
           "compile_s": compile_s, **c, "faults_per_call": faults / n, **floor_fields}
    if stream is not None:
        out.update(stream.summary(since))
    del args
    return out
