"""The pipeline of ``demo lm``: settings, task, warm start and ONE jitted GRPO training step.

The jaxweight calls of a step are the fields of :class:`Parts` (curriculum sampling and
update over task buckets, the MaxEnt step, the SEED-GRPO scale, dynamic sampling, the policy
loss, the weight sync); :func:`make_pipeline` takes a ``Parts`` so a caller can swap any of
them (an ablation, or stand-ins that time the library's share of the step) without touching
this module.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ... import curriculum as cur
from ... import maxent as M
from ... import sync as S
from .._args import LM_ARM_FLAGS as ARM_FLAGS
from .._args import LM_ARMS as ARMS
from ._model import TinyLM, completion_mask, sample, sequence_logp
from ._task import (COMPLETION_LEN, EOS, N_BUCKETS, N_LEVELS, PROMPT_LEN, Pool, bucket_of, make_pool,
                       make_split_set, stratified)

__all__ = ["LMConfig", "QUICK", "ARMS", "ARM_FLAGS", "Parts", "Task", "make_task", "warm_start", "Pipeline",
           "make_pipeline", "sft_program", "device_rewards", "device_cluster_ids", "EVAL_SETS", "HARD_LEVELS"]

EVAL_SETS = ("heldout", "validation", "inpool")
HARD_LEVELS = (1, 2, 3)      # 2- to 4-digit problems: the headline (level 0 has ~10 held-out problems)


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Settings of the demo (static; the defaults are the documented run)."""

    # task
    pool_size: int = 131_072      # train split only
    eval_per_level: int = 256     # greedy evaluation: problems per level of each eval set
    pass_k_per_level: int = 128   # sampled evaluation (pass@k) on the held-out hard levels
    pass_k_samples: int = 32
    sft_examples: int = 4_000
    sft_steps: int = 400
    sft_batch: int = 128
    sft_lr: float = 1e-3
    # model
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    # RL
    steps: int = 1_200
    prompts: int = 32             # B: groups in each update
    sample_prompts: int = 48      # P >= B: groups sampled (dynamic sampling keeps B of them)
    generations: int = 8          # G
    seeds: int = 1
    arms: tuple = ("full", "grpo_uniform")
    lr: float = 1e-4
    temperature: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float = 0.28
    kl_coef: float = 0.04         # the loss's KL coefficient, the same in every arm (but the KL-controller arm)
    normalization: str = "sequence_mean"
    sync_interval: int = 2
    replay: float = 0.5           # fraction of curriculum arms' prompts from curriculum-chosen buckets
    plr_temperature: float = 1.0
    bucket_ema: float = 0.1
    tau0: float = 0.5
    beta0: float = 0.04           # beta inside the MaxEnt weights (the controller steers it in its arm)
    target_entropy_frac: float = 0.75   # target weight entropy = frac * ln(G)
    tau_lr: float = 0.5
    kl_target: float = 0.05
    seed_alpha: float = 0.0417
    eval_every: int = 100
    chunk: int = 100              # steps per jitted scan (checkpoint / eval granularity)
    trace_every: int = 10         # per-step metrics are kept in results.json as means of this many steps

    def __post_init__(self):
        for f in ("pool_size", "eval_per_level", "pass_k_per_level", "sft_examples", "sft_batch", "steps",
                  "prompts", "seeds", "sync_interval", "eval_every", "chunk", "d_model", "n_layers", "n_heads",
                  "d_ff", "trace_every"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.generations < 2:
            raise ValueError(f"generations must be >= 2, got {self.generations}")
        if self.pass_k_samples < 2:
            raise ValueError(f"pass_k_samples must be >= 2, got {self.pass_k_samples}")
        if self.sample_prompts < self.prompts:
            raise ValueError(f"sample_prompts must be >= prompts, got {self.sample_prompts} < {self.prompts}")
        if self.sft_steps < 0:
            raise ValueError(f"sft_steps must be >= 0, got {self.sft_steps}")
        if not 0.0 <= self.replay <= 1.0:
            raise ValueError(f"replay must be in [0, 1], got {self.replay}")
        if not 0.0 < self.target_entropy_frac <= 1.0:
            raise ValueError(f"target_entropy_frac must be in (0, 1], got {self.target_entropy_frac}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.normalization not in M.NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {list(M.NORMALIZATIONS)}, got {self.normalization!r}")
        bad = [a for a in self.arms if a not in ARM_FLAGS]
        if bad or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {list(ARM_FLAGS)}, got {list(self.arms)}")
        if self.sft_examples > self.pool_size:
            raise ValueError(f"sft_examples must be <= pool_size, got {self.sft_examples} > {self.pool_size}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got {self.d_model} and {self.n_heads}")

    @property
    def runs(self) -> int:
        return len(self.arms) * self.seeds


QUICK = LMConfig(pool_size=8_192, eval_per_level=32, pass_k_per_level=16, pass_k_samples=8, sft_examples=512,
                 sft_steps=30, sft_batch=64, d_model=32, n_layers=1, n_heads=2, d_ff=64, steps=8, prompts=4,
                 sample_prompts=6, generations=4, seeds=1, arms=ARMS, eval_every=4, chunk=4, trace_every=2)


# ================================================================ library parts
def _curriculum_config(cfg: LMConfig):
    # the items are the N_BUCKETS task buckets (digits x operation x carries), not problems
    return cur.config("prioritized", n_bins=5, capacity=N_BUCKETS, temperature=cfg.plr_temperature,
                      ema_alpha=cfg.bucket_ema, competence_threshold=0.5, priority="frontier",
                      staleness_coeff=0.3)


def _maxent_config(cfg: LMConfig, maxent_on: bool, kl_on: bool):
    """The weighting and its tau / beta controllers (each switched off by a zero rate)."""
    target = cfg.target_entropy_frac * math.log(cfg.generations)
    return M.config(
        tau=cfg.tau0, beta=cfg.kl_coef if kl_on else cfg.beta0, q_temperature=1.0, normalize_by_tokens=False,
        schedule=M.TauSchedule(target_entropy=target, learning_rate=cfg.tau_lr if maxent_on else 0.0,
                               minimum_value=0.02, maximum_value=5.0, warmup_steps=0),
        kl=M.KLController(target=cfg.kl_target, horizon=10, step_size=0.2 if kl_on else 0.0),
    )


def _sync_config(interval, placement=None):
    # the actor keeps its own copy (copy_on_same_device): staleness is real even on one device
    return S.config(interval, placement, copy_on_same_device=True)


def curriculum_sample(state, key, ccfg, step, total, num, eligible):
    """i32[num] bucket ids drawn by the curriculum (-1 where none is tracked)."""
    return cur.sample(state, key, ccfg, num=num, step=step, total_steps=total, eligible=eligible)


def curriculum_update(state, bucket_ids, rewards, ccfg):
    """The curriculum state after each group's rewards ``f32[P, G]`` (items: the groups' buckets)."""
    return cur.update_groups(state, bucket_ids, rewards, ccfg)


def maxent_step(state, rewards, ref_logp, mask, mcfg, step, kl):
    """``(state, out)``: MaxEnt weights, advantages and entropy, then the tau / beta controllers."""
    return M.step(state, rewards, ref_logp, mcfg, mask=mask, global_step=step, measured_kl=kl)


def seed_scale(cluster, seq_logp, g, alpha):
    """f32[B] SEED-GRPO scale of each group from its answer clusters."""
    return M.seed_grpo_scale(M.semantic_entropy(cluster, seq_logp), alpha, g)


def select_groups(rewards, num, key):
    """i32[num] the groups to train on (non-zero reward variance first)."""
    return M.select_groups(rewards, num=num, key=key).index


def policy_loss(logp, behaviour_logp, signal, mask, ref_logp, kl_coef, cfg, token_entropy):
    """``(loss, metrics)`` of :func:`jaxweight.maxent.policy_loss` with the demo's settings."""
    return M.policy_loss(logp, behaviour_logp, signal, mask, ref_logp=ref_logp, kl_coef=kl_coef,
                         clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high,
                         normalization=cfg.normalization, token_entropy=token_entropy)


def sync_step(sync_state, learner, actor, interval, placement=None):
    """``(sync_state, actor, fired)``: count the step, copy learner -> actor on a fire."""
    return S.step(sync_state, learner, actor, _sync_config(interval, placement))


def staleness(sync_state):
    return S.staleness(sync_state)


@dataclasses.dataclass(frozen=True)
class Parts:
    """The jaxweight calls of one pipeline step (defaults: the library's public functions).

    Pass ``Parts(maxent_step=my_fn, ...)`` to :func:`make_pipeline` to replace any of them;
    each replacement takes and returns what the default does.
    """

    curriculum_sample: Callable = curriculum_sample
    curriculum_update: Callable = curriculum_update
    maxent_step: Callable = maxent_step
    seed_scale: Callable = seed_scale
    select_groups: Callable = select_groups
    policy_loss: Callable = policy_loss
    sync_step: Callable = sync_step
    staleness: Callable = staleness


# ======================================================================= task
@dataclasses.dataclass(frozen=True)
class Task:
    """The RL pool (train split), the warm-start subset, the evaluation sets and the pass@k set.

    ``evals`` maps each of :data:`EVAL_SETS` to a :class:`Pool`: ``heldout`` and ``validation``
    come from their own splits (disjoint from the pool and the warm start at every level),
    ``inpool`` from the RL pool. ``pass_k``: held-out problems of the hard levels.
    """

    pool: Pool
    sft: Pool
    evals: dict
    pass_k: Pool
    keys: Any  # the string key index of the pool


def _key_index(pool: Pool):
    return cur.KeyIndex(len(pool), pool.keys)


def make_task(cfg: LMConfig, seed: int = 0) -> Task:
    """Build the pool (train split), the warm-start subset and the disjoint evaluation sets."""
    pool = make_pool(cfg.pool_size, seed, split=0)
    sft = pool.take(stratified(pool, cfg.sft_examples, seed + 7))
    held = make_split_set(cfg.eval_per_level, 2, seed + 1)
    val = make_split_set(cfg.eval_per_level, 1, seed + 2)
    inpool = make_split_set(cfg.eval_per_level, 0, seed + 3, pool=pool)
    hard = np.flatnonzero(np.isin(held.level, HARD_LEVELS))
    hard = np.concatenate([hard[held.level[hard] == lv][:cfg.pass_k_per_level] for lv in HARD_LEVELS])
    return Task(pool, sft, {"heldout": held, "validation": val, "inpool": inpool}, held.take(hard),
                _key_index(pool))


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
    fn = sft_program(_model(cfg), cfg.sft_steps, cfg.sft_batch, cfg.sft_lr)
    return fn(keys, jnp.asarray(task.sft.prompts), jnp.asarray(task.sft.targets))


@functools.lru_cache(maxsize=8)
def sft_program(model: TinyLM, steps: int, batch: int, lr: float):
    """Jitted ``(keys [S], prompts i32[N, Lp], targets i32[N, L]) -> (params [S, ...], losses f32[S, steps])``:
    one model per key, initialised from it, then ``steps`` Adam steps on random batches of
    ``batch`` labelled completions (teacher forcing up to and including EOS)."""
    opt = optax.adam(lr)
    example = jnp.zeros((1, model.max_len), jnp.int32)

    def one(key, prompts, targets):
        k_init, k_data = jax.random.split(key)
        params = model.init(k_init, example)

        def step(carry, k):
            p, o = carry
            idx = jax.random.randint(k, (batch,), 0, prompts.shape[0])
            loss, g = jax.value_and_grad(lambda p: _nll(model, p, prompts[idx], targets[idx]))(p)
            u, o = opt.update(g, o, p)
            return (optax.apply_updates(p, u), o), loss

        (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), jax.random.split(k_data, steps))
        return params, losses

    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


# ============================================================ on-device reward
def device_rewards(tokens: jax.Array, targets: jax.Array) -> jax.Array:
    """f32[P, G]: exact match of each completion ``tokens i32[P, G, L]`` with ``targets i32[P, L]``.

    Equal to ``_task.host_rewards`` (``maxent.extract_answer`` of the rendered text).
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


def distinct_answers(tokens: jax.Array) -> jax.Array:
    """f32[P]: distinct answers (non-empty completions ended by EOS) in each group ``i32[P, G, L]``."""
    has = jnp.any(tokens == EOS, axis=-1) & (tokens[..., 0] != EOS)
    eq = jnp.all(tokens[:, :, None, :] == tokens[:, None, :, :], axis=-1) & has[:, :, None] & has[:, None, :]
    first = jnp.argmax(eq, axis=-1)
    return jnp.sum(has & (first == jnp.arange(tokens.shape[1])), axis=-1).astype(jnp.float32)


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
    parts: Parts = Parts()

    def init(self, ref_params_per_seed, key) -> State:
        """The start state: learner = actor = reference = the warm-start model of each run's seed."""
        return self.fns.init(ref_params_per_seed, key)

    def random_params(self, key) -> Any:
        """Untrained params, one copy per seed (leading [S] axis): a stand-in for :func:`warm_start`."""
        ex = jnp.zeros((1, PROMPT_LEN + COMPLETION_LEN), jnp.int32)
        p = self.model.init(key, ex)
        return jax.tree.map(lambda x: jnp.stack([x] * self.cfg.seeds), p)

    def step(self, state: State) -> tuple[State, dict]:
        """ONE jitted pipeline step (sample -> reward -> select -> weight -> update -> sync -> curriculum)."""
        return self.fns.step_jit(state, self.data)

    @property
    def step_function(self):
        """The jitted ``(state, data) -> (state, metrics)`` behind :meth:`step` (``data``: :attr:`data`)."""
        return self.fns.step_jit

    def chunk(self, state: State, n: int) -> tuple[State, dict]:
        """``n`` steps in one jitted ``lax.scan`` (state donated): metrics ``[n, R, ...]``."""
        key = ("chunk", n)
        if key not in self.fns.compiled:
            self.fns.compiled[key] = self.fns.chunk_jit.lower(state, self.data, n).compile()
        return self.fns.compiled[key](state, self.data)

    def evaluate(self, params) -> jax.Array:
        """Greedy accuracy f32[R, len(EVAL_SETS), N_LEVELS] of params [R, ...] on each eval set and level."""
        return self.fns.evaluate(params, self.data)

    def evaluate_sampled(self, params, key) -> dict:
        """Sampled evaluation on the held-out hard levels: per run ``correct i32[R, H]`` (of
        ``pass_k_samples``), ``distinct f32[R, H]`` answers per problem, ``entropy f32[R]``."""
        return self.fns.evaluate_sampled(params, self.data, key)

    @property
    def phases(self):
        """``(choose, act, learn)`` with the data bound, for the multi-device path."""
        f, d = self.fns, self.data
        return (lambda state: f.choose(state, d), f.act, lambda runs, ref, x, y, step: f.learn(runs, ref, x, y, step, d))


def make_pipeline(cfg: LMConfig, task: Task, parts: Parts = Parts()) -> Pipeline:
    """Build init / the jitted training step and chunk / evaluation for ``cfg.arms`` x ``cfg.seeds`` runs.

    ``parts`` are the library calls of the step (see :class:`Parts`).
    """
    pool = task.pool
    pb = bucket_of(pool.level, pool.op, pool.carries)
    ev = [task.evals[n] for n in EVAL_SETS]
    data = {"pool_prompts": jnp.asarray(pool.prompts), "pool_targets": jnp.asarray(pool.targets),
            "pool_level": jnp.asarray(pool.level), "pool_bucket": jnp.asarray(pb),
            "level_table": cur.bucket_table(pool.level, num_buckets=N_LEVELS),
            "bucket_table": cur.bucket_table(pb, num_buckets=N_BUCKETS),
            "eval_prompts": jnp.asarray(np.concatenate([e.prompts for e in ev])),
            "eval_targets": jnp.asarray(np.concatenate([e.targets for e in ev])),
            "eval_group": jnp.asarray(np.concatenate([i * N_LEVELS + e.level for i, e in enumerate(ev)])),
            "pk_prompts": jnp.asarray(task.pass_k.prompts), "pk_targets": jnp.asarray(task.pass_k.targets)}
    fns = _functions(cfg, parts)
    return Pipeline(cfg=cfg, model=fns.model, flags=fns.flags, data=data, fns=fns, parts=parts)


@functools.lru_cache(maxsize=8)
def _functions(cfg: LMConfig, parts: Parts):
    model = _model(cfg)
    b, p_all, g, L = cfg.prompts, cfg.sample_prompts, cfg.generations, COMPLETION_LEN
    R = cfg.runs
    ccfg = _curriculum_config(cfg)
    fl = {name: np.repeat([ARM_FLAGS[a][i] for a in cfg.arms], cfg.seeds)
          for i, name in enumerate(("curriculum", "maxent", "dynamic", "seed", "kl_controller"))}
    seed_of = np.tile(np.arange(cfg.seeds), len(cfg.arms))
    flags = {k: jnp.asarray(v) for k, v in fl.items()}
    ctl_cfgs = jax.tree.map(lambda *x: jnp.stack(x), *[
        _maxent_config(cfg, bool(m), bool(k)) for m, k in zip(fl["maxent"], fl["kl_controller"])])
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    total = jnp.float32(cfg.steps)
    temp = jnp.float32(cfg.temperature)
    target_entropy = cfg.target_entropy_frac * math.log(g)

    def init(ref_params_per_seed, key) -> State:
        ref = jax.tree.map(lambda x: x[seed_of], ref_params_per_seed)
        keys = jax.random.split(key, R)

        def one(params, ctl_cfg, k):
            return RunState(learner=params, opt=opt.init(params), ctl=M.init(ctl_cfg),
                            cur=cur.init(ccfg), key=k)

        runs = jax.vmap(one)(ref, ctl_cfgs, keys)
        # three separate buffers (learner, actor, reference): the training chunk donates the state
        fresh = lambda t: jax.tree.map(lambda x: jnp.array(x, copy=True), t)  # noqa: E731
        return State(runs=runs.replace(learner=fresh(runs.learner)), actor=fresh(ref), ref=ref,
                     sync=S.init(_sync_config(cfg.sync_interval)), step=jnp.int32(0))

    # ---- phase 1 (learner side): pick the prompts: level-balanced fresh draws, or a fresh
    # problem inside a bucket the curriculum picks
    def choose_one(rs: RunState, step, use_c, data):
        k_cur, k_lvl, k_fresh, k_mix, k_bkt, k_act, k_sel, k_next = jax.random.split(rs.key, 8)
        lev = jax.random.randint(k_lvl, (p_all,), 0, N_LEVELS)
        ids_fresh = cur.draw_in_buckets(k_fresh, data["level_table"], lev)
        eligible = data["bucket_table"].size > 0
        b_cur = parts.curriculum_sample(rs.cur, k_cur, ccfg, step, total, p_all, eligible)
        ids_cur = cur.draw_in_buckets(k_bkt, data["bucket_table"], b_cur)
        replay = use_c & (jax.random.uniform(k_mix, (p_all,)) < cfg.replay) & (ids_cur >= 0) & (
            jnp.sum(rs.cur.count > 0) > 0)
        ids = jnp.maximum(jnp.where(replay, ids_cur, ids_fresh), 0)
        return {"ids": ids, "replay": replay, "prompts": data["pool_prompts"][ids],
                "targets": data["pool_targets"][ids], "level": data["pool_level"][ids],
                "bucket": data["pool_bucket"][ids], "k_act": k_act, "k_sel": k_sel}, rs.replace(key=k_next)

    # ---- phase 2 (actor side): sample G completions per prompt, reward, clusters
    def act_one(actor, x):
        prompts = jnp.repeat(x["prompts"], g, axis=0)
        s = sample(model, actor, prompts, x["k_act"], L, temp)
        tokens = s.tokens.reshape(p_all, g, L)
        return {"tokens": tokens, "logp": s.logp.reshape(p_all, g, L), "entropy": s.entropy.reshape(p_all, g, L),
                "mask": s.mask.reshape(p_all, g, L), "reward": device_rewards(tokens, x["targets"]),
                "cluster": device_cluster_ids(tokens)}

    # ---- phase 3 (learner side): select groups, weights, update, curriculum
    def learn_one(rs: RunState, ref, ctl_cfg, x, y, step, f):
        reward_all = y["reward"]                                                   # [P, G]
        idx = jnp.where(f["dynamic"], parts.select_groups(reward_all, b, x["k_sel"]), jnp.arange(b))
        prompts = jnp.repeat(x["prompts"][idx], g, axis=0)
        flat = lambda a: a[idx].reshape((b * g,) + a.shape[2:])  # noqa: E731
        tokens, mask_b, act_lp, ent = flat(y["tokens"]), flat(y["mask"]), flat(y["logp"]), flat(y["entropy"])
        mask = mask_b.astype(jnp.float32)
        reward = reward_all[idx]
        ntok = jnp.maximum(jnp.sum(mask, -1), 1.0)
        ref_lp = jnp.where(mask_b, jax.lax.stop_gradient(sequence_logp(model, ref, prompts, tokens, temp)), 0.0)
        kl_actor = jnp.sum(M.k3_kl(act_lp, ref_lp) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        seq_act = jnp.sum(act_lp * mask, -1).reshape(b, g)
        scale = jnp.where(f["seed"], parts.seed_scale(y["cluster"][idx], seq_act, g, cfg.seed_alpha), 1.0)
        # groups whose rewards are all equal carry no preference (their GRPO advantages are 0):
        # they are masked out of the MaxEnt weights and the entropy the tau controller sees
        informative = jnp.max(reward, -1) > jnp.min(reward, -1)                  # [B]
        gmask = jnp.broadcast_to(informative[:, None], (b, g))
        ctl, out = parts.maxent_step(rs.ctl, reward, (jnp.sum(ref_lp * mask, -1) / ntok).reshape(b, g), gmask,
                                     ctl_cfg, step, kl_actor)
        # the per-completion signal: GRPO's group advantages, or the MaxEnt weights centred on the
        # group (G * w - 1: mean 0 over an informative group, 0 elsewhere); SEED scales either
        centred = jnp.where(gmask, g * out.weights - 1.0, 0.0)
        signal = (jnp.where(f["maxent"], centred, out.advantages) * scale[:, None]).reshape(b * g)
        kl_coef = jnp.where(f["kl_controller"], rs.ctl.beta, jnp.float32(cfg.kl_coef))

        def loss_fn(p):
            lp = jnp.where(mask_b, sequence_logp(model, p, prompts, tokens, temp), 0.0)
            return parts.policy_loss(lp, act_lp, signal, mask_b, ref_lp, kl_coef, cfg, ent)

        (loss, lm), grads = jax.value_and_grad(loss_fn, has_aux=True)(rs.learner)
        upd, opt_state = opt.update(grads, rs.opt, rs.learner)
        learner = optax.apply_updates(rs.learner, upd)
        cstate = parts.curriculum_update(rs.cur, x["bucket"], reward_all, ccfg)   # from all P groups
        inf_all = jnp.max(reward_all, -1) > jnp.min(reward_all, -1)
        m = {"reward": jnp.mean(reward_all), "reward_trained": jnp.mean(reward), "loss": loss,
             "kl": lm["policy/kl"], "kl_actor": kl_actor, "clip_fraction": lm["policy/clip_fraction"],
             "ratio_mean": lm["policy/ratio_mean"], "ratio_max": lm["policy/ratio_max"],
             "entropy": lm["policy/entropy"], "distinct_answers": jnp.mean(distinct_answers(y["tokens"])),
             "frac_zero_std": 1.0 - jnp.mean(inf_all.astype(jnp.float32)),
             "frac_zero_std_trained": 1.0 - jnp.mean(informative.astype(jnp.float32)),
             "tau": rs.ctl.tau, "beta": rs.ctl.beta, "kl_coef": kl_coef,
             "weight_entropy": out.entropy.mean, "target_entropy": jnp.float32(target_entropy),
             "seed_scale": jnp.mean(scale), "replay": jnp.mean(x["replay"].astype(jnp.float32)),
             "tokens": jnp.sum(y["mask"]).astype(jnp.float32),
             "prompt_tokens": g * jnp.sum(x["prompts"] != 0).astype(jnp.float32),
             "bucket_counts": jnp.bincount(x["bucket"], length=N_BUCKETS).astype(jnp.float32)}
        for lv in range(N_LEVELS):
            m[f"level_share_{lv + 1}"] = jnp.mean((x["level"] == lv).astype(jnp.float32))
        return rs.replace(learner=learner, opt=opt_state, ctl=ctl, cur=cstate), m

    def choose(state: State, data):
        return jax.vmap(choose_one, in_axes=(0, None, 0, None))(state.runs, state.step, flags["curriculum"], data)

    def act(actor, x):
        return jax.vmap(act_one)(actor, x)

    def learn(runs, ref, x, y, step, data=None):
        return jax.vmap(learn_one, in_axes=(0, 0, 0, 0, 0, None, 0))(runs, ref, ctl_cfgs, x, y, step, flags)

    def one_step(state: State, data):
        x, runs = choose(state, data)
        y = act(state.actor, x)
        runs, m = learn(runs, state.ref, x, y, state.step)
        sync, actor, _ = parts.sync_step(state.sync, runs.learner, state.actor, cfg.sync_interval)
        m["staleness"] = jnp.broadcast_to(parts.staleness(sync).astype(jnp.float32), (R,))
        return State(runs=runs, actor=actor, ref=state.ref, sync=sync, step=state.step + 1), m

    def chunk(state, data, n):
        return jax.lax.scan(lambda s, _: one_step(s, data), state, None, length=n)

    n_groups = len(EVAL_SETS) * N_LEVELS

    def evaluate(params, data):
        def one(p):
            s = sample(model, p, data["eval_prompts"], jax.random.key(0), L, 1.0, greedy=True)
            ok = jnp.all(s.tokens == data["eval_targets"], axis=-1).astype(jnp.float32)
            grp = data["eval_group"]
            acc = jax.ops.segment_sum(ok, grp, n_groups) / jnp.maximum(
                jax.ops.segment_sum(jnp.ones_like(ok), grp, n_groups), 1.0)
            return acc.reshape(len(EVAL_SETS), N_LEVELS)
        return jax.lax.map(one, params)

    n_k = cfg.pass_k_samples
    per = math.gcd(n_k, 8)                         # samples per pass (bounds the KV cache)

    def evaluate_sampled(params, data, key):
        h = data["pk_prompts"].shape[0]
        prompts = jnp.repeat(data["pk_prompts"], per, axis=0)

        def one(args):
            p, k = args

            def part(kk):
                s = sample(model, p, prompts, kk, L, temp)
                tok = s.tokens.reshape(h, per, L)
                m = s.mask.astype(jnp.float32)
                return tok, jnp.sum(s.entropy * m), jnp.sum(m)

            tok, e, n = jax.lax.map(part, jax.random.split(k, n_k // per))
            tok = jnp.moveaxis(tok, 0, 1).reshape(h, n_k, L)
            ok = jnp.all(tok == data["pk_targets"][:, None, :], axis=-1)
            return {"correct": jnp.sum(ok, -1).astype(jnp.int32), "distinct": distinct_answers(tok),
                    "entropy": jnp.sum(e) / jnp.maximum(jnp.sum(n), 1.0)}

        keys = jax.random.split(key, jax.tree.leaves(params)[0].shape[0])
        return jax.lax.map(one, (params, keys))

    return types.SimpleNamespace(
        model=model, flags={**fl, "seed_index": seed_of},
        init=jax.jit(init), step_jit=jax.jit(one_step),
        chunk_jit=jax.jit(chunk, static_argnums=2, donate_argnums=0),
        choose=choose, act=act, learn=learn, evaluate=jax.jit(evaluate),
        evaluate_sampled=jax.jit(evaluate_sampled), compiled={})
