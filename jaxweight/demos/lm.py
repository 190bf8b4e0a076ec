"""A small language model learns integer arithmetic with GRPO: the whole jaxweight stack at once.

``python -m jaxweight demo lm [--quick] [--out DIR] [--steps N] [--seeds S] [--arms a,b] ...``

A 2-layer causal transformer (flax, d_model 128, 0.4M parameters, character
vocabulary) answers ``a+b`` / ``a-b`` with 1 to 4 digit operands, writing the
digits of the result least significant first and then ``<eos>``. After a short
supervised warm start on 4,000 labelled problems (the frozen warm-start model
is also the reference policy), every arm runs GRPO-style RL where **one jitted
function** does a whole training step:

1. the curriculum (:mod:`jaxweight.curriculum`, Prioritized Level Replay with
   ``priority="frontier"`` over a pool of 131,072 string-keyed problems)
   picks ``B`` prompts by their EMA success: a ``replay`` fraction from the
   tracked items nearest 50% success, the rest fresh items of the pool;
2. the actor (its own parameter copy) samples ``G`` completions per prompt
   (KV cache, ``lax.scan``, explicit keys, temperature) with their log-probs;
3. reward = exact match of the answer (on device; equal to the host path
   ``maxent.extract_answer`` of the rendered text, checked in the tests);
   SEED-GRPO clusters equal answers (an on-device twin of
   ``maxent.cluster_ids``) and scales each group by its semantic entropy;
4. :func:`jaxweight.maxent.maxent_step` turns rewards and reference log-probs
   into MaxEnt weights, its tau controller steering the weight entropy to a
   target and its beta controller steering the KL to the reference;
5. the learner takes an optax step on the clipped, token-level policy
   gradient plus ``beta`` times the KL to the reference; the per-completion
   signal is the GRPO group advantage (GRPO arms, fixed ``beta``) or the MaxEnt
   weight centred on its group, ``G * w_g - 1`` (MaxEnt arms, ``beta`` from the
   controller), both scaled by SEED-GRPO;
6. :func:`jaxweight.sync.tick` copies learner -> actor every ``k`` steps (the
   actor samples with weights up to ``k - 1`` steps stale; measured);
7. the curriculum is updated with each prompt's group success.

Arms (same sample budget, vmapped together with the seeds in one program):
``full`` (curriculum + MaxEnt), ``grpo_uniform`` (plain GRPO advantages, uniform
sampling), ``grpo_curriculum`` and ``maxent_uniform`` (the two single changes).

Outputs under ``--out`` (default ``jaxweight-out/lm/``): ``results.json``,
``metrics.jsonl`` (one line per step and run, plus held-out evaluations),
``lm_grpo.png`` (skipped with a note without matplotlib), ``checkpoint.jwc``
(the whole state; ``--resume`` continues from it) and a table on stdout.

Several devices
---------------
``run(..., devices=(learner_devices, actor_devices))`` runs the same pipeline
with the learner (curriculum, optimiser, controllers, reference model) on one
group of devices and the actor (sampling) on another; the runs (arms x seeds)
are sharded over each group, the step is split into three jitted phases
(choose prompts on the learner, sample on the actor, update on the learner)
and ``sync.tick`` moves the weights across with ``placement=`` the actor's
sharding. The result equals the single-device run (tested on 8 fake CPU
devices).

Several hosts: start every process with ``jax.distributed.initialize()``
(coordinator address, process count and id from the environment or
arguments), then build the two device groups from ``jax.devices()`` (which
lists every host's devices), e.g. the learner on the devices of processes
``0..k-1`` and the actor on the rest, and call the same
``run(..., devices=(learner, actor))`` in every process (SPMD: every process
runs the same program; each holds the shards of its own devices). Host-side
outputs (results, plots) should be written by ``jax.process_index() == 0``
only; the checkpoint needs ``jax.experimental.multihost_utils.process_allgather``
of the state first. This path is documented, not tested here (no multi-host
machine in CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
import types
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import checkpoint as ckpt
from .. import controllers as C
from .. import curriculum as cur
from .. import maxent as M
from .. import sync as S
from . import _common
from ._lm_model import TinyLM, completion_mask, sample, sequence_logp
from ._lm_task import COMPLETION_LEN, EOS, N_LEVELS, PROMPT_LEN, Pool, make_heldout, make_pool, stratified

__all__ = ["LMConfig", "QUICK", "ARMS", "Task", "make_task", "warm_start", "Pipeline", "make_pipeline",
           "run", "main", "device_rewards", "device_cluster_ids"]

ARMS = ("full", "grpo_uniform", "grpo_curriculum", "maxent_uniform")
_ARM_FLAGS = {  # (curriculum, maxent)
    "full": (True, True), "grpo_uniform": (False, False),
    "grpo_curriculum": (True, False), "maxent_uniform": (False, True),
}


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Settings of the demo (static; the defaults are the documented run)."""

    # task
    pool_size: int = 131_072
    heldout_per_level: int = 256
    sft_examples: int = 4_000     # 2,000 are memorised (loss -> 0; 2-digit problems stay near 20%)
    sft_steps: int = 400
    sft_batch: int = 128
    sft_lr: float = 1e-3          # 2e-3 diverged for one seed in three
    # model
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    # RL
    steps: int = 300
    prompts: int = 32            # B
    generations: int = 8         # G
    seeds: int = 2
    arms: tuple = ARMS
    lr: float = 1e-4
    temperature: float = 1.0
    clip_eps: float = 0.2
    sync_interval: int = 2
    replay: float = 0.5          # fraction of curriculum prompts replayed from tracked items
    plr_temperature: float = 2.0
    tau0: float = 0.5
    beta0: float = 0.04
    target_entropy_frac: float = 0.75   # target weight entropy = frac * ln(G)
    tau_lr: float = 0.5
    kl_target: float = 0.05
    seed_alpha: float = 0.0417
    eval_every: int = 25
    chunk: int = 25              # steps per jitted scan (checkpoint / eval granularity)

    def __post_init__(self):
        for f in ("pool_size", "heldout_per_level", "sft_examples", "sft_batch", "steps", "prompts",
                  "seeds", "sync_interval", "eval_every", "chunk", "d_model", "n_layers", "n_heads", "d_ff"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.generations < 2:
            raise ValueError(f"generations must be >= 2, got {self.generations}")
        if self.sft_steps < 0:
            raise ValueError(f"sft_steps must be >= 0, got {self.sft_steps}")
        if not 0.0 <= self.replay <= 1.0:
            raise ValueError(f"replay must be in [0, 1], got {self.replay}")
        if not 0.0 < self.target_entropy_frac <= 1.0:
            raise ValueError(f"target_entropy_frac must be in (0, 1], got {self.target_entropy_frac}")
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {list(ARMS)}, got {list(self.arms)}")
        if self.sft_examples > self.pool_size:
            raise ValueError(f"sft_examples must be <= pool_size, got {self.sft_examples} > {self.pool_size}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got {self.d_model} and {self.n_heads}")

    @property
    def runs(self) -> int:
        return len(self.arms) * self.seeds


QUICK = LMConfig(pool_size=8_192, heldout_per_level=32, sft_examples=512, sft_steps=30, sft_batch=64,
                 d_model=32, n_layers=1, n_heads=2, d_ff=64, steps=8, prompts=4, generations=4, seeds=1,
                 eval_every=4, chunk=4)


# ============================================================ library adapter
# Every call into jaxweight's RL components goes through this small section.
def _curriculum_config(cfg: LMConfig):
    return cur.config("prioritized", n_bins=5, capacity=cfg.pool_size, temperature=cfg.plr_temperature,
                      ema_alpha=0.5, competence_threshold=0.5, priority="frontier", staleness_coeff=0.3)


def _curriculum_sample(state, key, ccfg, step, total, num):
    return cur.sample(state, key, ccfg, step, total, num=num)


def _curriculum_update(state, ids, rewards, ccfg):
    return cur.update_groups(state, ids, rewards, ccfg)


def _controller_config(cfg: LMConfig, on: bool):
    """The tau / beta controllers (switched off for the GRPO arms: zero rates)."""
    target = cfg.target_entropy_frac * math.log(cfg.generations)
    return C.config(
        tau=cfg.tau0, beta=cfg.beta0,
        schedule=C.TauSchedule(target_entropy=target, learning_rate=cfg.tau_lr if on else 0.0,
                               minimum_value=0.02, maximum_value=5.0, warmup_steps=0),
        kl=C.KLController(target=cfg.kl_target, horizon=10, step_size=0.2 if on else 0.0),
    )


def _controller_init(ctl_cfg):
    return C.init(ctl_cfg)


def _maxent_step(ctl_state, rewards, ref_logp, mask, ctl_cfg, step, kl):
    return M.maxent_step(ctl_state, rewards, ref_logp, None, mask, ctl_cfg, global_step=step,
                         measured_kl=kl, q_temperature=1.0, normalize_by_tokens=False)


def _seed_scale(cluster, seq_logp, g, alpha):
    h = M.semantic_entropy(cluster, seq_logp)
    return M.seed_grpo_scale(h, alpha, g)


def _sync_config(interval, placement=None):
    # the actor keeps its own copy (copy_on_same_device): staleness is real even on one device
    return S.config(interval, placement, copy_on_same_device=True)


def _sync_tick(sync_state, learner, actor, interval, placement=None):
    return S.tick(sync_state, learner, actor, _sync_config(interval, placement))


def _staleness(sync_state):
    return S.staleness(sync_state)


# ======================================================================= task
@dataclasses.dataclass(frozen=True)
class Task:
    """The pool (curriculum items), the warm-start subset and the held-out sets."""

    pool: Pool
    sft: Pool
    heldout: Pool
    keys: Any  # the curriculum's string key index (or the list of keys)


def _key_index(pool: Pool):
    from ..interop import atropos

    return atropos.KeyIndex(len(pool), pool.keys)


def make_task(cfg: LMConfig, seed: int = 0) -> Task:
    """Build the pool (distinct problems with string keys), the SFT subset and the held-out sets."""
    pool = make_pool(cfg.pool_size, seed)
    sft = pool.take(stratified(pool, cfg.sft_examples, seed + 7))
    held = make_heldout(cfg.heldout_per_level, pool, seed + 1)
    return Task(pool, sft, held, _key_index(pool))


# ================================================================= warm start
def _model(cfg: LMConfig) -> TinyLM:
    return TinyLM(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_ff=cfg.d_ff,
                  max_len=PROMPT_LEN + COMPLETION_LEN)


def _nll(model, params, prompts, targets):
    lp = sequence_logp(model, params, prompts, targets)
    m = completion_mask(targets)
    return -jnp.sum(lp * m) / jnp.maximum(jnp.sum(m), 1)


def warm_start(cfg: LMConfig, task: Task, keys: jax.Array):
    """Supervised warm start, one model per key (vmapped).

    Returns:
      ``(params, losses)``: params with a leading [S] axis, losses f32[S, sft_steps].
    """
    return _warm_start_fn(cfg)(keys, jnp.asarray(task.sft.prompts), jnp.asarray(task.sft.targets))


@functools.lru_cache(maxsize=8)
def _warm_start_fn(cfg: LMConfig):
    model = _model(cfg)
    opt = optax.adam(cfg.sft_lr)
    example = jnp.zeros((1, PROMPT_LEN + COMPLETION_LEN), jnp.int32)

    def one(key, prompts, targets):
        k_init, k_data = jax.random.split(key)
        params = model.init(k_init, example)

        def step(carry, k):
            p, o = carry
            idx = jax.random.randint(k, (cfg.sft_batch,), 0, prompts.shape[0])
            loss, g = jax.value_and_grad(lambda p: _nll(model, p, prompts[idx], targets[idx]))(p)
            u, o = opt.update(g, o, p)
            return (optax.apply_updates(p, u), o), loss

        (params, _), losses = jax.lax.scan(step, (params, opt.init(params)),
                                           jax.random.split(k_data, cfg.sft_steps))
        return params, losses

    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


# ============================================================ on-device reward
def device_rewards(tokens: jax.Array, targets: jax.Array) -> jax.Array:
    """f32[P, G]: exact match of each completion ``tokens i32[P, G, L]`` with ``targets i32[P, L]``.

    Equal to ``_lm_task.host_rewards`` (``maxent.extract_answer`` of the rendered text).
    """
    return jnp.all(tokens == targets[:, None, :], axis=-1).astype(jnp.float32)


def device_cluster_ids(tokens: jax.Array) -> jax.Array:
    """i32[P, G] cluster ids of the answers, as ``maxent.cluster_ids`` of the extracted answers.

    Non-empty completions ended by EOS with equal tokens share an id (first-seen
    order); a completion without an answer (no EOS, or EOS first) gets its own
    fresh id after the real ones.
    """
    # an answer = a non-empty completion ended by EOS (extract_answer reads "<answer></answer>" as none)
    has = jnp.any(tokens == EOS, axis=-1) & (tokens[..., 0] != EOS)       # [P, G]
    eq = jnp.all(tokens[:, :, None, :] == tokens[:, None, :, :], axis=-1)  # [P, G, G]
    eq = eq & has[:, :, None] & has[:, None, :]
    first = jnp.argmax(eq, axis=-1)                                        # first equal index
    g = tokens.shape[1]
    is_first = has & (first == jnp.arange(g))
    rank = jnp.cumsum(is_first, axis=-1) - 1
    real = jnp.take_along_axis(rank, first, axis=-1)
    n_real = jnp.sum(is_first, axis=-1, keepdims=True)
    fresh = n_real + jnp.cumsum(~has, axis=-1) - 1
    return jnp.where(has, real, fresh).astype(jnp.int32)


# =================================================================== pipeline
@flax.struct.dataclass
class RunState:
    """Per-run (arm x seed) state: leaves carry a leading [R] axis in the pipeline."""

    learner: Any
    opt: Any
    ctl: Any
    cur: Any
    key: jax.Array


@flax.struct.dataclass
class State:
    """Everything a resumed run needs (checkpointed as one tree)."""

    runs: RunState
    actor: Any            # actor params [R, ...] (its own copy; synced every k steps)
    ref: Any              # frozen reference params [R, ...]
    sync: Any             # SyncState (one for all runs)
    step: jax.Array       # i32[]


@dataclasses.dataclass
class Pipeline:
    """The pieces of one configuration (see :func:`make_pipeline`).

    The functions take the task's arrays (``data``) as an argument, so one
    compiled program serves every run with the same settings.
    """

    cfg: LMConfig
    model: TinyLM
    flags: dict
    data: dict
    fns: Any

    def init(self, ref_params_per_seed, key) -> State:
        """The start state: learner = actor = reference = the warm-start model of each run's seed."""
        return self.fns.init(ref_params_per_seed, key)

    def step(self, state: State) -> tuple[State, dict]:
        """ONE jitted pipeline step (sample -> reward -> weight -> update -> sync -> curriculum)."""
        return self.fns.step_jit(state, self.data)

    def chunk(self, state: State, n: int) -> tuple[State, dict]:
        """``n`` steps in one jitted ``lax.scan`` (state donated): metrics ``[n, R]``."""
        key = ("chunk", n)
        if key not in self.fns.compiled:
            self.fns.compiled[key] = self.fns.chunk_jit.lower(state, self.data, n).compile()
        return self.fns.compiled[key](state, self.data)

    def evaluate(self, params) -> jax.Array:
        """Greedy held-out accuracy f32[R, N_LEVELS] of params [R, ...]."""
        return self.fns.evaluate(params, self.data)

    @property
    def phases(self):
        """``(choose, act, learn)`` with the data bound, for the multi-device path."""
        f, d = self.fns, self.data
        return (lambda state: f.choose(state, d), f.act, lambda runs, ref, x, y, step: f.learn(runs, ref, x, y, step, d))


def make_pipeline(cfg: LMConfig, task: Task) -> Pipeline:
    """Build init / the jitted training step and chunk / evaluation for ``cfg.arms`` x ``cfg.seeds`` runs."""
    data = {"pool_prompts": jnp.asarray(task.pool.prompts), "pool_targets": jnp.asarray(task.pool.targets),
            "pool_level": jnp.asarray(task.pool.level), "held_prompts": jnp.asarray(task.heldout.prompts),
            "held_targets": jnp.asarray(task.heldout.targets), "held_level": jnp.asarray(task.heldout.level)}
    fns = _functions(cfg)
    return Pipeline(cfg=cfg, model=fns.model, flags=fns.flags, data=data, fns=fns)


@functools.lru_cache(maxsize=8)
def _functions(cfg: LMConfig):
    model = _model(cfg)
    b, g, L = cfg.prompts, cfg.generations, COMPLETION_LEN
    R = cfg.runs
    ccfg = _curriculum_config(cfg)
    use_cur = np.repeat([_ARM_FLAGS[a][0] for a in cfg.arms], cfg.seeds)
    use_max = np.repeat([_ARM_FLAGS[a][1] for a in cfg.arms], cfg.seeds)
    seed_of = np.tile(np.arange(cfg.seeds), len(cfg.arms))
    flags = {"curriculum": jnp.asarray(use_cur), "maxent": jnp.asarray(use_max)}
    ctl_cfgs = jax.tree.map(lambda *x: jnp.stack(x),
                            *[_controller_config(cfg, bool(m)) for m in use_max])
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    total = jnp.float32(cfg.steps)
    target_entropy = cfg.target_entropy_frac * math.log(g)

    def init(ref_params_per_seed, key) -> State:
        ref = jax.tree.map(lambda x: x[seed_of], ref_params_per_seed)
        keys = jax.random.split(key, R)

        def one(params, ctl_cfg, k):
            return RunState(learner=params, opt=opt.init(params), ctl=_controller_init(ctl_cfg),
                            cur=cur.init(ccfg), key=k)

        runs = jax.vmap(one)(ref, ctl_cfgs, keys)
        # three separate buffers (learner, actor, reference): the training chunk donates the state
        fresh = lambda t: jax.tree.map(lambda x: jnp.array(x, copy=True), t)  # noqa: E731
        return State(runs=runs.replace(learner=fresh(runs.learner)), actor=fresh(ref), ref=ref,
                     sync=S.init(_sync_config(cfg.sync_interval)), step=jnp.int32(0))

    # ---- phase 1 (learner side): pick the prompts
    def choose_one(rs: RunState, step, use_c, data):
        k_cur, k_new, k_mix, k_act, k_next = jax.random.split(rs.key, 5)
        ids_c = _curriculum_sample(rs.cur, k_cur, ccfg, step, total, b)
        ids_n = jax.random.randint(k_new, (b,), 0, cfg.pool_size)
        replay = use_c & (jax.random.uniform(k_mix, (b,)) < cfg.replay) & (ids_c >= 0) & (
            jnp.sum(rs.cur.count > 0) > 0)
        ids = jnp.where(replay, ids_c, ids_n)
        return {"ids": ids, "replay": replay, "prompts": data["pool_prompts"][ids],
                "targets": data["pool_targets"][ids], "level": data["pool_level"][ids],
                "k_act": k_act}, rs.replace(key=k_next)

    # ---- phase 2 (actor side): sample G completions, reward, clusters
    def act_one(actor, x):
        prompts = jnp.repeat(x["prompts"], g, axis=0)
        s = sample(model, actor, prompts, x["k_act"], L, cfg.temperature)
        tokens = s.tokens.reshape(b, g, L)
        return {"tokens": tokens, "logp": s.logp.reshape(b, g, L), "mask": s.mask.reshape(b, g, L),
                "reward": device_rewards(tokens, x["targets"]), "cluster": device_cluster_ids(tokens)}

    # ---- phase 3 (learner side): weights, update, curriculum
    def learn_one(rs: RunState, ref, ctl_cfg, x, y, step, use_m):
        prompts = jnp.repeat(x["prompts"], g, axis=0)
        tokens = y["tokens"].reshape(b * g, L)
        mask = y["mask"].reshape(b * g, L).astype(jnp.float32)
        ntok = jnp.maximum(jnp.sum(mask, -1), 1.0)
        act_lp = y["logp"].reshape(b * g, L)
        ref_lp = jnp.where(mask > 0, jax.lax.stop_gradient(sequence_logp(model, ref, prompts, tokens)), 0.0)
        d = (ref_lp - act_lp) * mask
        kl_tok = (jnp.exp(d) - d - 1.0) * mask                       # k3 estimator, >= 0
        kl = jnp.sum(kl_tok) / jnp.sum(mask)
        reward = y["reward"]
        seq_act = jnp.sum(act_lp * mask, -1).reshape(b, g)
        scale = _seed_scale(y["cluster"], seq_act, g, cfg.seed_alpha)    # [B]
        # groups whose rewards are all equal carry no preference (their GRPO advantages are 0):
        # they are masked out of the MaxEnt weights, the entropy the tau controller sees and the loss
        informative = jnp.max(reward, -1) > jnp.min(reward, -1)                  # [B]
        gmask = jnp.broadcast_to(informative[:, None], (b, g))
        out = _maxent_step(rs.ctl, reward, (jnp.sum(ref_lp * mask, -1) / ntok).reshape(b, g), gmask,
                           ctl_cfg, step, kl)
        # the per-completion signal: GRPO's group advantages, or for the MaxEnt arms the MaxEnt
        # weights centred on the group (G * w - 1: mean 0 over an informative group, 0 elsewhere);
        # SEED-GRPO scales both by the group's semantic entropy
        centred = jnp.where(gmask, g * out.weights - 1.0, 0.0)
        signal = jnp.where(use_m, centred, out.advantages)
        adv = jax.lax.stop_gradient(signal * scale[:, None]).reshape(b * g)
        beta = rs.ctl.beta     # fixed for the GRPO arms (controller off), steered for the MaxEnt arms

        def loss_fn(p):
            lp = jnp.where(mask > 0, sequence_logp(model, p, prompts, tokens), 0.0)
            # clipped policy gradient (token level, per-sequence mean) + beta * KL to the reference (k3)
            ratio = jnp.exp(lp - act_lp)
            pg = -jnp.minimum(ratio * adv[:, None],
                              jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv[:, None])
            dd = ref_lp - lp
            pen = jnp.exp(dd) - dd - 1.0
            return jnp.mean(jnp.sum((pg + beta * pen) * mask, -1) / ntok)

        loss, grads = jax.value_and_grad(loss_fn)(rs.learner)
        upd, opt_state = opt.update(grads, rs.opt, rs.learner)
        learner = optax.apply_updates(rs.learner, upd)
        cstate = _curriculum_update(rs.cur, x["ids"], reward, ccfg)
        m = {"reward": jnp.mean(reward), "loss": loss, "kl": kl, "tau": rs.ctl.tau, "beta": rs.ctl.beta,
             "weight_entropy": out.entropy.mean, "target_entropy": jnp.float32(target_entropy),
             "frac_zero_std": 1.0 - jnp.mean(informative.astype(jnp.float32)), "seed_scale": jnp.mean(scale),
             "replay": jnp.mean(x["replay"].astype(jnp.float32)),
             "level": jnp.mean(x["level"].astype(jnp.float32)),
             "tokens": jnp.sum(mask)}
        return rs.replace(learner=learner, opt=opt_state, ctl=out.state, cur=cstate), m

    def choose(state: State, data):
        return jax.vmap(choose_one, in_axes=(0, None, 0, None))(state.runs, state.step, flags["curriculum"], data)

    def act(actor, x):
        return jax.vmap(act_one)(actor, x)

    def learn(runs, ref, x, y, step, data=None):
        return jax.vmap(learn_one, in_axes=(0, 0, 0, 0, 0, None, 0))(
            runs, ref, ctl_cfgs, x, y, step, flags["maxent"])

    def one_step(state: State, data):
        x, runs = choose(state, data)
        y = act(state.actor, x)
        runs, m = learn(runs, state.ref, x, y, state.step)
        sync, actor, _ = _sync_tick(state.sync, runs.learner, state.actor, cfg.sync_interval)
        m["staleness"] = jnp.broadcast_to(_staleness(sync).astype(jnp.float32), (R,))
        return State(runs=runs, actor=actor, ref=state.ref, sync=sync, step=state.step + 1), m

    def chunk(state, data, n):
        return jax.lax.scan(lambda s, _: one_step(s, data), state, None, length=n)

    def evaluate(params, data):
        def one(p):
            s = sample(model, p, data["held_prompts"], jax.random.key(0), L, 1.0, greedy=True)
            ok = jnp.all(s.tokens == data["held_targets"], axis=-1).astype(jnp.float32)
            lv = data["held_level"]
            return jax.ops.segment_sum(ok, lv, N_LEVELS) / jnp.maximum(
                jax.ops.segment_sum(jnp.ones_like(ok), lv, N_LEVELS), 1.0)
        return jax.lax.map(one, params)

    return types.SimpleNamespace(
        model=model, flags={"curriculum": use_cur, "maxent": use_max, "seed": seed_of},
        init=jax.jit(init), step_jit=jax.jit(one_step),
        chunk_jit=jax.jit(chunk, static_argnums=2, donate_argnums=0),
        choose=choose, act=act, learn=learn, evaluate=jax.jit(evaluate), compiled={})


# ======================================================================== run
def _accuracy_block(acc: np.ndarray, arms, seeds) -> dict:
    """acc f32[R, N_LEVELS] -> per arm {overall, per_level, per_seed, per_seed_per_level}."""
    out = {}
    for i, a in enumerate(arms):
        a_acc = np.asarray(acc[i * seeds:(i + 1) * seeds], np.float64)      # [S, L]
        out[a] = {"overall": float(a_acc.mean()), "per_level": a_acc.mean(0).tolist(),
                  "per_seed": a_acc.mean(1).tolist(), "per_seed_per_level": a_acc.tolist()}
    return out


def _placements(devices):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    ldev, adev = devices
    lm = Mesh(np.asarray(ldev), ("r",))
    am = Mesh(np.asarray(adev), ("r",))
    return (NamedSharding(lm, P("r")), NamedSharding(lm, P()), NamedSharding(am, P("r")))


def _place_state(state: State, shardings) -> State:
    l_r, l_rep, a_r = shardings
    return State(runs=jax.device_put(state.runs, l_r), actor=jax.device_put(state.actor, a_r),
                 ref=jax.device_put(state.ref, l_r), sync=jax.device_put(state.sync, l_rep),
                 step=jax.device_put(state.step, l_rep))


def _multi_device_chunk(pipe: Pipeline, shardings, n: int):
    """The same steps as ``pipe.chunk`` with learner and actor on different devices."""
    choose, act, learn = pipe.phases
    l_r, _, a_r = shardings
    j_choose, j_act, j_learn = jax.jit(choose), jax.jit(act), jax.jit(learn)
    R = pipe.cfg.runs

    def run_chunk(state: State):
        ms = []
        for _ in range(n):
            x, runs = j_choose(state)
            y = j_act(state.actor, jax.device_put(x, a_r))             # learner -> actor devices
            y = jax.device_put(y, l_r)                                 # actor -> learner devices
            runs, m = j_learn(runs, state.ref, x, y, state.step)
            sync, actor, _ = _sync_tick(state.sync, runs.learner, state.actor, pipe.cfg.sync_interval,
                                        placement=a_r)
            m["staleness"] = jnp.broadcast_to(_staleness(sync).astype(jnp.float32), (R,))
            state = State(runs=runs, actor=actor, ref=state.ref, sync=sync, step=state.step + 1)
            ms.append(m)
        return state, jax.tree.map(lambda *x: jnp.stack(x), *ms)

    return run_chunk


def _checkpoint_target(pipe: Pipeline) -> State:
    cfg = pipe.cfg
    ex = jnp.zeros((1, PROMPT_LEN + COMPLETION_LEN), jnp.int32)
    p = pipe.model.init(jax.random.key(0), ex)
    ps = jax.tree.map(lambda x: jnp.stack([x] * cfg.seeds), p)
    return pipe.init(ps, jax.random.key(0))


def run(cfg: LMConfig | None = None, *, quick: bool = False, seed: int = 0, out: str | Path | None = None,
        checkpoint: str | Path | None = None, resume: bool = False, stop_after_chunks: int | None = None,
        devices: tuple | None = None, writer: Any = None, progress: Any = None) -> dict:
    """Warm start, then train every arm x seed; returns the results dict (see ``results.json``).

    Args:
      cfg: settings (default :class:`LMConfig`, or :data:`QUICK` with ``quick=True``).
      seed: the task, warm start and RL keys derive from it.
      out: if given, ``results.json`` is written there (the CLI also writes the plot).
      checkpoint: file for the whole state, saved after every chunk.
      resume: continue from ``checkpoint`` if it exists (same numbers as an uninterrupted run).
      stop_after_chunks: stop (as if killed) after this many chunks of this call.
      devices: ``(learner_devices, actor_devices)`` to split the pipeline (runs sharded over each).
      writer: a metrics writer (``write(step, flat_dict)``), e.g. ``_common.metrics_writer(args)``.
      progress: callable ``progress(str)`` for one line per chunk.
    """
    cfg = cfg or (QUICK if quick else LMConfig())
    t_wall = time.perf_counter()
    timer = _common.Timer()
    task = make_task(cfg, seed)
    pipe = make_pipeline(cfg, task)
    names = [f"{a}/s{s}" for a in cfg.arms for s in range(cfg.seeds)]
    k_sft, k_rl = jax.random.split(jax.random.key(seed))
    meta: dict[str, Any] = {}
    state = None
    if resume and checkpoint is not None and Path(checkpoint).exists():
        state, meta = ckpt.load_with_metadata(checkpoint, _checkpoint_target(pipe))
        if meta.get("config") != _config_dict(cfg):
            raise ValueError(f"checkpoint {str(checkpoint)!r} was written with other settings; "
                             "remove it or use the same flags")
        if progress:
            progress(f"resumed from {checkpoint} at step {int(state.step)}")
    if state is None:
        with timer.section("warm_start"):
            ref, sft_losses = warm_start(cfg, task, jax.random.split(k_sft, cfg.seeds))
            jax.block_until_ready(ref)
        state = pipe.init(ref, k_rl)
        acc0 = np.asarray(pipe.evaluate(state.runs.learner))
        meta = {"config": _config_dict(cfg), "evals": [{"step": 0, "acc": acc0.tolist()}],
                "train_seconds": 0.0, "compile_seconds": 0.0, "tokens": 0.0, "history": [],
                "warm_start_seconds": timer["warm_start"],
                "sft_loss_final": np.asarray(sft_losses[:, -1]).tolist()}
        if writer is not None:
            writer.write(0, _eval_dict(acc0, names))
    shardings = None
    if devices is not None:
        shardings = _placements(devices)
        state = _place_state(state, shardings)
    compiled: dict[int, Any] = {}
    chunks_done = 0
    while int(state.step) < cfg.steps:
        if stop_after_chunks is not None and chunks_done >= stop_after_chunks:
            break
        s0 = int(state.step)
        n = min(cfg.chunk, cfg.steps - s0)
        if n not in compiled:
            if devices is None:
                with timer.section("compile"):
                    compiled[n] = functools.partial(pipe.chunk, n=n)
                    if ("chunk", n) not in pipe.fns.compiled:
                        pipe.fns.compiled[("chunk", n)] = pipe.fns.chunk_jit.lower(state, pipe.data, n).compile()
            else:
                compiled[n] = _multi_device_chunk(pipe, shardings, n)
        t0 = time.perf_counter()
        state, m = compiled[n](state)
        m = jax.device_get(m)
        dt = time.perf_counter() - t0
        meta["train_seconds"] += dt
        meta["tokens"] += float(np.sum(m["tokens"]))
        step = int(state.step)
        means = {k: np.asarray(v).mean(0).tolist() for k, v in m.items()}       # per run
        meta["history"].append({"step": step, **means})
        if writer is not None:
            for i in range(n):
                writer.write(s0 + i + 1, {f"{nm}/{k}": float(v[i, r]) for k, v in m.items()
                                          for r, nm in enumerate(names)})
        if step % cfg.eval_every == 0 or step == cfg.steps:
            acc = np.asarray(pipe.evaluate(state.runs.learner))
            meta["evals"].append({"step": step, "acc": acc.tolist()})
            if writer is not None:
                writer.write(step, _eval_dict(acc, names))
        if checkpoint is not None:
            ckpt.save(checkpoint, jax.device_get(state), metadata=meta)
        chunks_done += 1
        if progress:
            ov = np.asarray(meta["evals"][-1]["acc"]).mean(1)
            progress(f"step {step}/{cfg.steps}: {dt / n:.3f} s/step; held-out " + ", ".join(
                f"{nm} {a:.2f}" for nm, a in zip(names, ov)))
    meta["compile_seconds"] = meta.get("compile_seconds", 0.0) + timer["compile"]
    res = _results(cfg, meta, state, time.perf_counter() - t_wall)
    res["finished"] = int(state.step) >= cfg.steps
    if out is not None:
        _common.write_results(out, res)
    res["_state"] = state
    return res


def _config_dict(cfg: LMConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["arms"] = list(cfg.arms)
    return d


def _eval_dict(acc: np.ndarray, names) -> dict:
    d = {}
    for r, nm in enumerate(names):
        d[f"{nm}/heldout/overall"] = float(np.mean(acc[r]))
        for lv in range(N_LEVELS):
            d[f"{nm}/heldout/level{lv + 1}"] = float(acc[r, lv])
    return d


def _results(cfg: LMConfig, meta: dict, state: State, wall: float) -> dict:
    evals = meta["evals"]
    acc0 = np.asarray(evals[0]["acc"])
    acc1 = np.asarray(evals[-1]["acc"])
    start = _accuracy_block(acc0, cfg.arms, cfg.seeds)
    final = _accuracy_block(acc1, cfg.arms, cfg.seeds)
    steps_done = int(state.step)
    arms = {}
    for i, a in enumerate(cfg.arms):
        sl = slice(i * cfg.seeds, (i + 1) * cfg.seeds)
        curve = {"steps": [e["step"] for e in evals],
                 "overall": [float(np.mean(np.asarray(e["acc"])[sl])) for e in evals],
                 "per_level": [np.asarray(e["acc"])[sl].mean(0).tolist() for e in evals]}
        hist = meta["history"]
        trace = {k: [float(np.mean(h[k][sl])) for h in hist] for k in (hist[0] if hist else {}) if k != "step"}
        trace["steps"] = [h["step"] for h in hist]
        arms[a] = {"heldout_accuracy_start": start[a], "heldout_accuracy_final": final[a],
                   "gain": final[a]["overall"] - start[a]["overall"],
                   "curriculum": bool(_ARM_FLAGS[a][0]), "maxent": bool(_ARM_FLAGS[a][1]),
                   "heldout_curve": curve, "trace": trace}
    train = meta["train_seconds"]
    return {
        "wall_seconds": wall, "train_seconds": train, "compile_seconds": meta.get("compile_seconds", 0.0),
        "warm_start_seconds": meta.get("warm_start_seconds", 0.0),
        "seconds_per_step": train / max(steps_done, 1),
        "tokens_per_second": meta["tokens"] / max(train, 1e-9),
        "steps": steps_done, "runs": cfg.runs, "config": meta["config"],
        "sample_budget_per_arm_and_seed": steps_done * cfg.prompts * cfg.generations,
        "target_entropy": cfg.target_entropy_frac * math.log(cfg.generations),
        "sft_loss_final": meta.get("sft_loss_final"), "arms": arms,
    }


# ===================================================================== report
def summary_table(res: dict) -> str:
    """Held-out accuracy per arm: start -> final (mean over seeds), per level and per seed."""
    head = ["arm", "start", "final", "gain", "L1", "L2", "L3", "L4", "per seed final"]
    rows = [head]
    for a, r in res["arms"].items():
        s, f = r["heldout_accuracy_start"], r["heldout_accuracy_final"]
        rows.append([a, f"{s['overall']:.3f}", f"{f['overall']:.3f}", f"{r['gain']:+.3f}"]
                    + [f"{x:.2f}" for x in f["per_level"]] + [" ".join(f"{x:.3f}" for x in f["per_seed"])])
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i in (0, len(head) - 1) else c.rjust(w[i])  # noqa: E731
                              for i, c in enumerate(r))
    return "\n".join([fmt(rows[0]), fmt(["-" * x for x in w])] + [fmt(r) for r in rows[1:]])


def plot(plt, res: dict):
    """The figure: held-out accuracy, hardest level, weight entropy vs target, tau, beta / KL, staleness."""
    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    colors = dict(zip(ARMS, ("tab:red", "tab:blue", "tab:green", "tab:orange")))
    for a, r in res["arms"].items():
        c = r["heldout_curve"]
        t = r["trace"]
        ax[0, 0].plot(c["steps"], c["overall"], "-o", ms=3, color=colors[a], label=a)
        ax[0, 1].plot(c["steps"], [x[-1] for x in c["per_level"]], "-o", ms=3, color=colors[a], label=a)
        if r["maxent"]:
            ax[0, 2].plot(t["steps"], t["weight_entropy"], color=colors[a], label=f"{a} weight entropy")
            ax[1, 0].plot(t["steps"], t["tau"], color=colors[a], label=f"{a} tau")
            ax[1, 1].plot(t["steps"], t["beta"], color=colors[a], label=f"{a} beta")
        ax[1, 1].plot(t["steps"], t["kl"], ":", color=colors[a], label=f"{a} KL")
        ax[1, 2].plot(t["steps"], t["reward"], color=colors[a], label=f"{a} train reward")
    ax[0, 2].axhline(res["target_entropy"], color="k", ls=":", label="target")
    ax[1, 2].plot(res["arms"][next(iter(res["arms"]))]["trace"]["steps"],
                  res["arms"][next(iter(res["arms"]))]["trace"]["staleness"], "k--", label="actor staleness")
    titles = ["held-out accuracy (mean of levels)", "held-out accuracy, 4-digit level",
              "MaxEnt weight entropy (nats)", "tau", "beta (solid) and KL to reference (dotted)",
              "train reward; actor staleness (steps)"]
    for a_, tt in zip(ax.flat, titles):
        a_.set(title=tt, xlabel="step")
        a_.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxweight demo lm", description=__doc__.split("\n\n")[0])
    _common.add_common_args(p, "lm", quick_help="tiny model and task, a few steps (a smoke run, < 1 min)")
    g = p.add_argument_group("lm demo options")
    g.add_argument("--steps", type=_common.positive_int, default=None, help="RL steps (default 300)")
    g.add_argument("--seeds", type=_common.positive_int, default=None, help="seeds per arm (default 2)")
    g.add_argument("--arms", type=_common.comma_list(ARMS), default=None,
                   help=f"comma-separated arms (default all: {','.join(ARMS)})")
    g.add_argument("--prompts", type=_common.positive_int, default=None, help="prompts per step B (default 32)")
    g.add_argument("--generations", type=_common.int_range(2, None), default=None,
                   help="completions per prompt G (default 8)")
    g.add_argument("--lr", type=_common.positive_float, default=None, help="learner Adam learning rate")
    g.add_argument("--temperature", type=_common.positive_float, default=None, help="sampling temperature")
    g.add_argument("--sync-interval", type=_common.positive_int, default=None,
                   help="learner -> actor sync every k steps (default 2)")
    g.add_argument("--replay", type=_common.prob, default=None,
                   help="fraction of curriculum prompts replayed from the tracked pool (default 0.5)")
    g.add_argument("--eval-every", type=_common.positive_int, default=None, help="held-out evaluation period")
    g.add_argument("--sft-steps", type=_common.nonneg_int, default=None, help="warm-start steps (default 400)")
    g.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.jwc if present")
    g.add_argument("--no-checkpoint", action="store_true", help="do not write checkpoint.jwc")
    a = p.parse_args(argv)
    cfg = QUICK if a.quick else LMConfig()
    over = {"steps": a.steps, "seeds": a.seeds, "prompts": a.prompts, "generations": a.generations,
            "lr": a.lr, "temperature": a.temperature, "sync_interval": a.sync_interval, "replay": a.replay,
            "sft_steps": a.sft_steps}
    over = {k: v for k, v in over.items() if v is not None}
    if a.arms is not None:
        over["arms"] = tuple(a.arms)
    if a.eval_every is not None:
        over["eval_every"] = over["chunk"] = a.eval_every
    try:
        cfg = dataclasses.replace(cfg, **over)
    except ValueError as e:
        p.error(str(e))
    out = _common.out_dir(a)
    log = None if a.no_progress else (lambda s: print(s, flush=True))
    with _common.metrics_writer(a, append=a.resume) as w:
        res = run(cfg, seed=a.seed, out=out, checkpoint=None if a.no_checkpoint else out / "checkpoint.jwc",
                  resume=a.resume, writer=w, progress=log)
    res.pop("_state", None)
    png = _common.save_plot(lambda plt: plot(plt, res), out / "lm_grpo.png")
    print(f"demo lm: {cfg.runs} runs ({len(cfg.arms)} arms x {cfg.seeds} seeds), {res['steps']} steps of "
          f"{cfg.prompts} prompts x {cfg.generations} completions; wall {res['wall_seconds']:.1f} s "
          f"(warm start {res['warm_start_seconds']:.1f} s, compile {res['compile_seconds']:.1f} s, "
          f"{res['seconds_per_step']:.3f} s/step, {res['tokens_per_second']:.0f} tokens/s)")
    print(summary_table(res))
    print(f"wrote {out / 'results.json'}, {out / 'metrics.jsonl'}" + (f", {png}" if png is not None else ""))
    goals = []
    arms = res["arms"]
    if not a.quick:
        goals.append(("default run finishes within 10 minutes", res["wall_seconds"] <= 600))
        if "full" in arms:
            goals.append(("full pipeline: held-out gain >= 0.30 over the warm start", arms["full"]["gain"] >= 0.30))
            if "grpo_uniform" in arms:
                goals.append(("full pipeline gains more than plain GRPO with uniform sampling",
                              arms["full"]["gain"] > arms["grpo_uniform"]["gain"]))
            goals.append(("full pipeline: hardest level above 20%",
                          arms["full"]["heldout_accuracy_final"]["per_level"][-1] > 0.20))
    return _common.finish(goals, a.strict)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
