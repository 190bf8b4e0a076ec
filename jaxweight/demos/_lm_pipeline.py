"""The pipeline of ``demo lm``: settings, task, warm start and ONE jitted GRPO training step.

The jaxweight calls of a step are the fields of :class:`Parts` (curriculum sampling and
update, the MaxEnt step, the SEED-GRPO scale, the weight sync); :func:`make_pipeline`
takes a ``Parts`` so a caller can swap any of them (an ablation, or stand-ins that time
the library's share of the step) without touching this module.
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

from .. import curriculum as cur
from .. import maxent as M
from .. import sync as S
from ._lm_model import TinyLM, completion_mask, sample, sequence_logp
from ._lm_task import COMPLETION_LEN, EOS, N_LEVELS, PROMPT_LEN, Pool, make_heldout, make_pool, stratified

__all__ = ["LMConfig", "QUICK", "ARMS", "Parts", "Task", "make_task", "warm_start", "Pipeline", "make_pipeline",
           "device_rewards", "device_cluster_ids"]

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


# ================================================================ library parts
def _curriculum_config(cfg: LMConfig):
    return cur.config("prioritized", n_bins=5, capacity=cfg.pool_size, temperature=cfg.plr_temperature,
                      ema_alpha=0.5, competence_threshold=0.5, priority="frontier", staleness_coeff=0.3)


def _maxent_config(cfg: LMConfig, on: bool):
    """The weighting and its tau / beta controllers (switched off for the GRPO arms: zero rates)."""
    target = cfg.target_entropy_frac * math.log(cfg.generations)
    return M.config(
        tau=cfg.tau0, beta=cfg.beta0, q_temperature=1.0, normalize_by_tokens=False,
        schedule=M.TauSchedule(target_entropy=target, learning_rate=cfg.tau_lr if on else 0.0,
                               minimum_value=0.02, maximum_value=5.0, warmup_steps=0),
        kl=M.KLController(target=cfg.kl_target, horizon=10, step_size=0.2 if on else 0.0),
    )


def _sync_config(interval, placement=None):
    # the actor keeps its own copy (copy_on_same_device): staleness is real even on one device
    return S.config(interval, placement, copy_on_same_device=True)


def curriculum_sample(state, key, ccfg, step, total, num):
    """i32[num] prompt ids drawn by the curriculum."""
    return cur.sample(state, key, ccfg, num=num, step=step, total_steps=total)


def curriculum_update(state, ids, rewards, ccfg):
    """The curriculum state after each prompt's group of rewards ``f32[B, G]``."""
    return cur.update_groups(state, ids, rewards, ccfg)


def maxent_step(state, rewards, ref_logp, mask, mcfg, step, kl):
    """``(state, out)``: MaxEnt weights, advantages and entropy, then the tau / beta controllers."""
    return M.step(state, rewards, ref_logp, mcfg, mask=mask, global_step=step, measured_kl=kl)


def seed_scale(cluster, seq_logp, g, alpha):
    """f32[B] SEED-GRPO scale of each group from its answer clusters."""
    return M.seed_grpo_scale(M.semantic_entropy(cluster, seq_logp), alpha, g)


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
    sync_step: Callable = sync_step
    staleness: Callable = staleness


# ======================================================================= task
@dataclasses.dataclass(frozen=True)
class Task:
    """The pool (curriculum items), the warm-start subset and the held-out sets."""

    pool: Pool
    sft: Pool
    heldout: Pool
    keys: Any  # the curriculum's string key index (or the list of keys)


def _key_index(pool: Pool):
    return cur.KeyIndex(len(pool), pool.keys)


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
        """ONE jitted pipeline step (sample -> reward -> weight -> update -> sync -> curriculum)."""
        return self.fns.step_jit(state, self.data)

    @property
    def step_function(self):
        """The jitted ``(state, data) -> (state, metrics)`` behind :meth:`step` (``data``: :attr:`data`)."""
        return self.fns.step_jit

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


def make_pipeline(cfg: LMConfig, task: Task, parts: Parts = Parts()) -> Pipeline:
    """Build init / the jitted training step and chunk / evaluation for ``cfg.arms`` x ``cfg.seeds`` runs.

    ``parts`` are the library calls of the step (see :class:`Parts`).
    """
    data = {"pool_prompts": jnp.asarray(task.pool.prompts), "pool_targets": jnp.asarray(task.pool.targets),
            "pool_level": jnp.asarray(task.pool.level), "held_prompts": jnp.asarray(task.heldout.prompts),
            "held_targets": jnp.asarray(task.heldout.targets), "held_level": jnp.asarray(task.heldout.level)}
    fns = _functions(cfg, parts)
    return Pipeline(cfg=cfg, model=fns.model, flags=fns.flags, data=data, fns=fns, parts=parts)


@functools.lru_cache(maxsize=8)
def _functions(cfg: LMConfig, parts: Parts):
    model = _model(cfg)
    b, g, L = cfg.prompts, cfg.generations, COMPLETION_LEN
    R = cfg.runs
    ccfg = _curriculum_config(cfg)
    use_cur = np.repeat([_ARM_FLAGS[a][0] for a in cfg.arms], cfg.seeds)
    use_max = np.repeat([_ARM_FLAGS[a][1] for a in cfg.arms], cfg.seeds)
    seed_of = np.tile(np.arange(cfg.seeds), len(cfg.arms))
    flags = {"curriculum": jnp.asarray(use_cur), "maxent": jnp.asarray(use_max)}
    ctl_cfgs = jax.tree.map(lambda *x: jnp.stack(x), *[_maxent_config(cfg, bool(m)) for m in use_max])
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    total = jnp.float32(cfg.steps)
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

    # ---- phase 1 (learner side): pick the prompts
    def choose_one(rs: RunState, step, use_c, data):
        k_cur, k_new, k_mix, k_act, k_next = jax.random.split(rs.key, 5)
        ids_c = parts.curriculum_sample(rs.cur, k_cur, ccfg, step, total, b)
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
        scale = parts.seed_scale(y["cluster"], seq_act, g, cfg.seed_alpha)    # [B]
        # groups whose rewards are all equal carry no preference (their GRPO advantages are 0):
        # they are masked out of the MaxEnt weights, the entropy the tau controller sees and the loss
        informative = jnp.max(reward, -1) > jnp.min(reward, -1)                  # [B]
        gmask = jnp.broadcast_to(informative[:, None], (b, g))
        ctl, out = parts.maxent_step(rs.ctl, reward, (jnp.sum(ref_lp * mask, -1) / ntok).reshape(b, g), gmask,
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
        cstate = parts.curriculum_update(rs.cur, x["ids"], reward, ccfg)
        m = {"reward": jnp.mean(reward), "loss": loss, "kl": kl, "tau": rs.ctl.tau, "beta": rs.ctl.beta,
             "weight_entropy": out.entropy.mean, "target_entropy": jnp.float32(target_entropy),
             "frac_zero_std": 1.0 - jnp.mean(informative.astype(jnp.float32)), "seed_scale": jnp.mean(scale),
             "replay": jnp.mean(x["replay"].astype(jnp.float32)),
             "level": jnp.mean(x["level"].astype(jnp.float32)),
             "tokens": jnp.sum(mask)}
        return rs.replace(learner=learner, opt=opt_state, ctl=ctl, cur=cstate), m

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
        sync, actor, _ = parts.sync_step(state.sync, runs.learner, state.actor, cfg.sync_interval)
        m["staleness"] = jnp.broadcast_to(parts.staleness(sync).astype(jnp.float32), (R,))
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


