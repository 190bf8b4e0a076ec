"""The pipeline of ``demo lm --task countdown``: arms, warm start, ONE jitted Dr.GRPO-family step, evaluation.

Every arm is Dr.GRPO (group-centred advantages ``A = r - mean(r)``, token-level clipped
surrogate, the constant ``T_max = COMPLETION_LEN`` normalisation, no KL term) with one change,
set by the arm's array leaves (:class:`ArmParams`), so arms and seeds share one program
(``jax.vmap`` over runs):

* ``xdr_tau*`` (xDr.GRPO): per-candidate aggregation weights
  :func:`jaxweight.maxent.candidate_weights` of the rollout-time utility ``U = A T / T_max``
  at the arm's ``tau`` (``lam = 0``, as in the paper's runs), passed to
  :func:`jaxweight.maxent.policy_loss` as ``weights=``; Dr.GRPO's weights are uniform, which
  gives its loss bit for bit;
* ``seed_drgrpo``: the advantages scaled by :func:`jaxweight.maxent.seed_grpo_scale` of the
  group's semantic entropy over canonical answer forms;
* ``entropy_bonus``: minus ``entropy_coef`` x the policy's mean token entropy added to the loss;
* ``xdr_classmean_tau0.05`` (the class-mean control): xDr.GRPO's weights at tau = 0.05 averaged
  within each group's reward class (:func:`class_mean_weights`): the same total weight on the
  group's correct and on its wrong completions as xDr.GRPO's, so the same update magnitude, but
  spread uniformly over each class instead of concentrated on some of its members (identical to
  xDr.GRPO in a group with one correct completion).
* ``positive_class``: :func:`jaxweight.maxent.positive_class_weights` of the rewards: each group's
  weight shared equally by its correct completions, none on the wrong ones; with Dr.GRPO's
  advantages each correct completion of a group with ``k`` of ``G`` correct trains with
  ``(G - k) / k`` and each wrong one with 0 (the class-level mechanism written directly);
* ``maxent_step``: the seed's MaxEnt-GRPO weights from :func:`jaxweight.maxent.step` (listwise
  ``q = softmax(r)``, ``w ~ q^(1/tau)`` over each informative group, no reference term: there is no
  reference model here) with its tau controller on (the LM demo's settings: tau0 0.5, target weight
  entropy 0.75 ln G, rate 0.5, tau in [0.02, 5]); the signal is ``G w - 1`` in place of the
  advantage (the LM demo's ``full`` arm), one controller state per run;
* ``drgrpo_lr2x`` / ``drgrpo_lr4x``: Dr.GRPO with Adam's step times 2 or 4 (the learning rate
  2x and 4x: Adam's update is linear in it);
* ``*_graded``: the graded reward (:func:`._countdown_task.device_graded_reward`: 1 correct, up to
  ``GRADED_CREDIT`` for a well-formed answer by its distance to the target) in place of
  correctness; a program runs graded arms only or binary arms only.

The reward is correctness (:func:`._countdown_task.device_verify`) unless the arms are graded; mode
ids, pass@G and the incorrect-mass diagnostics always use correctness; mode ids are never rewarded.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ... import maxent as M
from . import _countdown_task as C
from ._model import TinyLM, sample, sequence_logp_entropy
from .._args import COUNTDOWN_ARM_SETTINGS as ARM_SETTINGS
from .._args import COUNTDOWN_ARMS as ARMS
from .._args import COUNTDOWN_DEFAULT_ARMS as DEFAULT_ARMS
from .._args import COUNTDOWN_SWEEP_TAUS as SWEEP_TAUS
from ._pipeline import sft_program

__all__ = ["ARM_SETTINGS", "ARMS", "DEFAULT_ARMS", "CONTROL_ARMS", "SWEEP_TAUS", "class_mean_weights", "maxent_config", "METRICS", "CountdownConfig", "QUICK",
           "ArmParams", "arm_params", "CountdownTask", "make_task", "warm_start", "eval_metrics", "Pipeline",
           "make_pipeline"]

CONTROL_ARMS = {"xdr_tau0.05": "xdr_classmean_tau0.05"}
METRICS = ("pass_at_1", "pass_at_8", "mean_at_8", "distinct_at_8", "coverage_at_8")


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
    """Settings of the countdown run (static; the defaults are the documented run)."""

    # task (ModeBench Countdown: 384 train / 128 eval prompts with 2-8 modes from the pool
    # C.POOLS[pool]: "paper", its generator's filters, or "full", targets up to 99)
    pool: str = "paper"
    n_train: int = C.N_TRAIN
    n_eval: int = C.N_EVAL
    split_seed: int = 0
    # warm start: supervised on the single-mode problems (disjoint from both splits)
    sft_steps: int = 400
    sft_batch: int = 128
    sft_lr: float = 1e-3
    # model
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    # RL
    steps: int = 200
    prompts: int = 32             # B: prompts per update
    generations: int = 8          # G: completions per prompt (the rollout budget is steps x B x G)
    lr: float = 3e-4             # 1e-3 collapsed the train reward of 3 of 6 runs (train split)
    temperature: float = 1.0
    clip_eps: float = 0.2
    entropy_coef: float = 0.01    # the entropy_bonus arm's coefficient
    seed_alpha: float = 0.0417    # the seed_drgrpo arm's alpha
    arms: tuple = DEFAULT_ARMS
    train_seeds: int = 3
    # evaluation: final checkpoint, K samples at temperature 1 + one greedy per eval prompt
    eval_seeds: int = 3
    eval_samples: int = 8
    chunk: int = 50               # steps per jitted scan (one metrics transfer)

    def __post_init__(self):
        for f in ("n_train", "n_eval", "sft_batch", "steps", "prompts", "train_seeds", "eval_seeds", "chunk",
                  "d_model", "n_layers", "n_heads", "d_ff", "eval_samples"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.sft_steps < 0:
            raise ValueError(f"sft_steps must be >= 0, got {self.sft_steps}")
        if self.generations < 2:
            raise ValueError(f"generations must be >= 2, got {self.generations}")
        for f in ("lr", "sft_lr", "temperature", "clip_eps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f} must be > 0, got {getattr(self, f)}")
        for f in ("entropy_coef", "seed_alpha"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{f} must be >= 0, got {getattr(self, f)}")
        if self.pool not in C.POOLS:
            raise ValueError(f"pool must be one of {list(C.POOLS)}, got {self.pool!r}")
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms must be distinct names from {list(ARMS)}, got {list(self.arms)}")
        if len({ARM_SETTINGS[a].graded for a in self.arms}) > 1:
            raise ValueError(f"arms must be all graded-reward arms or none (one reward per program), got "
                             f"{list(self.arms)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got {self.d_model} and {self.n_heads}")

    @property
    def runs(self) -> int:
        return len(self.arms) * self.train_seeds

    @property
    def graded(self) -> bool:
        """Whether the arms train on the graded reward (all or none of them do)."""
        return ARM_SETTINGS[self.arms[0]].graded


QUICK = CountdownConfig(n_train=48, n_eval=16, sft_steps=20, sft_batch=32, d_model=32, n_layers=1, n_heads=2,
                        d_ff=64, steps=4, prompts=4, generations=4, arms=DEFAULT_ARMS,
                        train_seeds=2, eval_seeds=2, eval_samples=8, chunk=2)


@flax.struct.dataclass
class ArmParams:
    """An arm's settings as array leaves (leading [R] axis in the pipeline).

    Attributes:
      xdr: bool[] xDr.GRPO aggregation weights on; tau: f32[] their temperature.
      seed: bool[] SEED-GRPO advantage scale on; entropy_coef: f32[] token-entropy bonus (0: off).
      classmean: bool[] the xDr weights averaged within each reward class (the class-mean control).
      positive: bool[] :func:`jaxweight.maxent.positive_class_weights` of the rewards.
      maxent: bool[] the MaxEnt-GRPO signal ``G w - 1`` of :func:`jaxweight.maxent.step`.
      lr_scale: f32[] Adam's step times this.
    """

    xdr: jax.Array
    tau: jax.Array
    seed: jax.Array
    entropy_coef: jax.Array
    classmean: jax.Array
    positive: jax.Array
    maxent: jax.Array
    lr_scale: jax.Array


def arm_params(cfg: CountdownConfig) -> ArmParams:
    """The runs' settings, run ``r = arm_index * train_seeds + seed``: leaves of shape [R]."""
    s = [ARM_SETTINGS[a] for a in cfg.arms for _ in range(cfg.train_seeds)]
    col = lambda f, dt: jnp.asarray(np.array([getattr(x, f) for x in s]), dt)  # noqa: E731
    return ArmParams(xdr=col("xdr", bool), tau=col("tau", jnp.float32), seed=col("seed", bool),
                     entropy_coef=jnp.asarray(np.where([x.entropy for x in s], cfg.entropy_coef, 0.0), jnp.float32),
                     classmean=col("classmean", bool), positive=col("positive", bool), maxent=col("maxent", bool),
                     lr_scale=col("lr_scale", jnp.float32))


def maxent_config(g: int) -> M.MaxEntConfig:
    """The ``maxent_step`` arm's weighting and tau controller (the LM demo's settings, no reference term)."""
    return M.config(tau=0.5, beta=0.0, q_temperature=1.0, normalize_by_tokens=False, include_reference_term=False,
                    schedule=M.TauSchedule(target_entropy=0.75 * float(np.log(g)), learning_rate=0.5,
                                           minimum_value=0.02, maximum_value=5.0, warmup_steps=0))


def class_mean_weights(weights: jax.Array, reward: jax.Array) -> jax.Array:
    """Each weight replaced by the mean weight of its group's completions with the same reward.

    Keeps every reward class's total weight (the update's magnitude on correct and on wrong
    completions) and removes the concentration inside a class. ``weights, reward: f32[B, G]``.
    (A G x G comparison per group: optax and jax offer no segment mean over a row's classes.)
    """
    same = (reward[:, :, None] == reward[:, None, :]).astype(weights.dtype)        # [B, G, G]
    return jnp.einsum("bij,bj->bi", same, weights) / jnp.sum(same, -1)


# ======================================================================= task
@dataclasses.dataclass(frozen=True)
class CountdownTask:
    """``train`` / ``eval`` :class:`._countdown_task.Problems` (2-8 modes, disjoint by numbers and
    target) and ``sft``: the single-mode problems of the warm start (disjoint from both)."""

    train: C.Problems
    eval: C.Problems
    sft: C.Problems


def make_task(cfg: CountdownConfig) -> CountdownTask:
    """The splits from ``C.POOLS[cfg.pool]`` and the warm start's single-mode problems of the same pool."""
    pool = C.POOLS[cfg.pool]
    train, ev = C.make_splits(cfg.split_seed, cfg.n_train, cfg.n_eval, **pool)
    return CountdownTask(train, ev, C.candidates(min_modes=1, max_modes=1, **pool))


def _model(cfg: CountdownConfig) -> TinyLM:
    return TinyLM(vocab_size=C.VOCAB_SIZE, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                  d_ff=cfg.d_ff, max_len=C.PROMPT_LEN + C.COMPLETION_LEN)


def warm_start(cfg: CountdownConfig, task: CountdownTask, keys: jax.Array):
    """Supervised warm start on the single-mode problems' solutions, one model per key.

    Returns:
      ``(params, losses)``: params with a leading [S] axis, losses f32[S, sft_steps].
    """
    fn = sft_program(_model(cfg), cfg.sft_steps, cfg.sft_batch, cfg.sft_lr)
    return fn(keys, jnp.asarray(task.sft.prompts), jnp.asarray(task.sft.solutions[:, 0]))


def _data(p: C.Problems) -> dict:
    return {"prompts": jnp.asarray(p.prompts), "numbers": jnp.asarray(p.numbers), "target": jnp.asarray(p.target),
            "mode_codes": jnp.asarray(p.mode_codes), "n_modes": jnp.asarray(p.n_modes)}


def eval_metrics(samples: jax.Array, greedy: jax.Array, data: dict) -> dict:
    """The paper's per-prompt outcomes of K sampled and one greedy completion per problem.

    Args:
      samples: i32[E, P, K, L] K completions per problem for each of E evaluation seeds.
      greedy: i32[P, L] the greedy completion of each problem.
      data: the problems' arrays: ``numbers i32[P, 3]``, ``target i32[P]``, ``mode_codes
        i32[P, MAX_MODES]``, ``n_modes i32[P]``.

    Returns:
      ``f32[E, P]`` each: ``pass_at_1`` (the greedy completion is correct; the same for every
      seed), ``pass_at_8`` (any of the K is correct), ``mean_at_8`` (share correct),
      ``distinct_at_8`` (distinct correct canonical modes among the K) and ``coverage_at_8``
      (distinct_at_8 / the problem's mode count). Mode identity is read from the canonical
      form (:func:`._countdown_task.device_mode_ids`), never from the text.
    """
    def one(tok):
        r, code = C.device_verify(tok, data["numbers"], data["target"])
        distinct, cov = C.mode_metrics(C.device_mode_ids(r, code, data["mode_codes"]), data["n_modes"])
        return {"pass_at_8": jnp.max(r, -1), "mean_at_8": jnp.mean(r, -1), "distinct_at_8": distinct,
                "coverage_at_8": cov}

    out = jax.vmap(one)(samples)
    r1, _ = C.device_verify(greedy[:, None, :], data["numbers"], data["target"])
    out["pass_at_1"] = jnp.broadcast_to(r1[:, 0], out["pass_at_8"].shape)
    return out


# =================================================================== pipeline
@flax.struct.dataclass
class RunState:
    """Per-run (arm x training seed) state: leaves carry a leading [R] axis."""

    params: Any
    opt: Any
    key: jax.Array
    ctl: Any          # the maxent_step arm's controller state (carried, unused, by every other arm)


@dataclasses.dataclass
class Pipeline:
    """The pieces of one configuration (see :func:`make_pipeline`)."""

    cfg: CountdownConfig
    model: TinyLM
    arms: ArmParams
    train: dict
    eval: dict
    fns: Any

    def init(self, params_per_seed, key) -> RunState:
        """Every run starts from its training seed's warm-start model (params [S, ...]) and key:
        the arms of one training seed share the warm start and the sampling keys (paired runs)."""
        return self.fns.init(self.per_run(params_per_seed), key)

    def chunk(self, state: RunState, n: int, arms: ArmParams | None = None, data: dict | None = None
              ) -> tuple[RunState, dict]:
        """``n`` steps of every run in one jitted ``lax.scan`` (state donated): metrics ``f32[n, R]``.

        ``arms`` (default :attr:`arms`) and ``data`` (default the train split) are arguments of the
        compiled program: other settings or problems of the same shapes reuse it.
        """
        arms = self.arms if arms is None else arms
        data = self.train if data is None else data
        if n not in self.fns.compiled:
            self.fns.compiled[n] = self.fns.chunk_jit.lower(state, arms, data, n).compile()
        return self.fns.compiled[n](state, arms, data)

    def evaluate(self, params, key, split: str = "eval") -> dict:
        """The paper's evaluation of params ``[R, ...]`` (one per run) on ``split``.

        Returns (host NumPy) per run, evaluation seed and prompt ``f32[R, E, P]``: ``pass_at_1``
        (greedy), ``pass_at_8``, ``mean_at_8``, ``distinct_at_8``, ``coverage_at_8`` (K =
        ``eval_samples`` draws at temperature 1; the E evaluation keys are the same for every
        run), and the sampled token entropy ``f32[R, E]``. ``split="train"`` evaluates the train
        problems in blocks of ``n_eval`` (the same compiled program; a last partial block is
        left out); any leading size works (e.g. the [S] warm-start models; one compilation per size).
        """
        if split == "eval":
            return jax.device_get(self.fns.evaluate(params, key, self.eval))
        n = self.eval["prompts"].shape[0]
        blocks = [jax.device_get(self.fns.evaluate(params, key, jax.tree.map(lambda x: x[i:i + n], self.train)))
                  for i in range(0, self.train["prompts"].shape[0] - n + 1, n)]
        return {k: np.concatenate([b[k] for b in blocks], axis=-1) if k != "entropy" else
                np.mean([b[k] for b in blocks], axis=0) for k in blocks[0]}

    def per_run(self, params_per_seed):
        """Params ``[S, ...]`` (one per training seed) -> ``[R, ...]`` (each run's seed)."""
        return jax.tree.map(lambda x: x[self.fns.seed_of], params_per_seed)


def make_pipeline(cfg: CountdownConfig, task: CountdownTask) -> Pipeline:
    """Build init / the jitted chunk of training steps / evaluation for ``cfg.arms`` x ``cfg.train_seeds`` runs."""
    fns = _functions(cfg)
    return Pipeline(cfg=cfg, model=fns.model, arms=arm_params(cfg), train=_data(task.train), eval=_data(task.eval),
                    fns=fns)


@functools.lru_cache(maxsize=8)
def _functions(cfg: CountdownConfig):
    model = _model(cfg)
    b, g, L = cfg.prompts, cfg.generations, C.COMPLETION_LEN
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    temp = jnp.float32(cfg.temperature)
    seed_of = np.tile(np.arange(cfg.train_seeds), len(cfg.arms))
    mcfg = maxent_config(g)

    def init(params, key) -> RunState:
        return jax.vmap(lambda p, k: RunState(params=p, opt=opt.init(p), key=k, ctl=M.init(mcfg)))(
            params, jax.random.split(key, cfg.train_seeds)[seed_of])

    def step_one(rs: RunState, arm: ArmParams, data):
        k_p, k_s, k_next = jax.random.split(rs.key, 3)
        ids = jax.random.randint(k_p, (b,), 0, data["prompts"].shape[0])
        prompts = jnp.repeat(data["prompts"][ids], g, axis=0)                      # [B*G, Lp]
        s = sample(model, rs.params, prompts, k_s, L, temp)
        tokens = s.tokens.reshape(b, g, L)
        correct, code = C.device_verify(tokens, data["numbers"][ids], data["target"][ids])   # [B, G]
        reward = (C.device_graded_reward(tokens, data["numbers"][ids], data["target"][ids]) if cfg.graded
                  else correct)
        ntok = jnp.sum(s.mask, -1).reshape(b, g).astype(jnp.float32)
        adv = reward - jnp.mean(reward, -1, keepdims=True)                          # Dr.GRPO: no std
        utility = adv * ntok / L                                                    # U = A T / T_max
        w_x = M.candidate_weights(utility, tau=arm.tau)
        w_x = jnp.where(arm.classmean, class_mean_weights(w_x, reward), w_x)
        w = jnp.where(arm.positive, M.positive_class_weights(reward), jnp.where(arm.xdr, w_x, 1.0))  # 1: Dr.GRPO
        seq_lp = jnp.sum(s.logp, -1).reshape(b, g)
        cluster = C.device_cluster_ids(code)
        scale = jnp.where(arm.seed, M.seed_grpo_scale(M.semantic_entropy(cluster, seq_lp), cfg.seed_alpha, g), 1.0)
        informative = jnp.max(reward, -1) > jnp.min(reward, -1)
        gmask = jnp.broadcast_to(informative[:, None], (b, g))
        # MaxEnt-GRPO (maxent_step): the weights over informative groups, centred (G w - 1), in place of A
        ctl, mx = M.step(rs.ctl, reward, jnp.zeros_like(reward), mcfg, mask=gmask)
        ctl = jax.tree.map(lambda new, old: jnp.where(arm.maxent, new, old), ctl, rs.ctl)
        centred = jnp.where(gmask, g * mx.weights - 1.0, 0.0)
        signal = (jnp.where(arm.maxent, centred, adv) * scale[:, None]).reshape(b * g)

        def loss_fn(p):
            lp, ent = sequence_logp_entropy(model, p, prompts, s.tokens, temp)
            lp = jnp.where(s.mask, lp, 0.0)
            loss, m = M.policy_loss(lp, s.logp, signal, s.mask, clip_eps=cfg.clip_eps, normalization="constant",
                                    max_tokens=L, token_entropy=jax.lax.stop_gradient(ent), weights=w)
            mf = s.mask.astype(jnp.float32)
            mean_ent = jnp.sum(ent * mf) / jnp.maximum(jnp.sum(mf), 1.0)
            return loss - arm.entropy_coef * mean_ent, m

        (loss, lm), grads = jax.value_and_grad(loss_fn, has_aux=True)(rs.params)
        upd, opt_state = opt.update(grads, rs.opt, rs.params)
        upd = jax.tree.map(lambda u: u * arm.lr_scale, upd)                         # x1.0 is exact
        params = optax.apply_updates(rs.params, upd)
        diag = M.aggregation_diagnostics(jnp.broadcast_to(w, (b, g)), correct, mask=gmask)
        modes = C.device_mode_ids(correct, code, data["mode_codes"][ids])
        distinct, coverage = C.mode_metrics(modes, data["n_modes"][ids])
        m = {"reward": jnp.mean(reward), "correct": jnp.mean(correct), "pass_at_G": jnp.mean(jnp.max(correct, -1)),
             "distinct_at_G": jnp.mean(distinct), "coverage_at_G": jnp.mean(coverage),
             "effective_candidates": diag.mean_effective_candidates, "incorrect_mass": diag.mean_incorrect_mass,
             "informative_groups": jnp.mean(informative.astype(jnp.float32)), "token_entropy": lm["policy/entropy"],
             "completion_tokens": jnp.mean(ntok), "loss": loss, "pg_loss": lm["policy/pg_loss"],
             "seed_scale": jnp.mean(scale), "maxent_tau": rs.ctl.tau, "maxent_weight_entropy": mx.entropy.mean,
             "grad_norm": jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(grads)))}
        return RunState(params=params, opt=opt_state, key=k_next, ctl=ctl), m

    def chunk(state, arms, data, n):
        step = jax.vmap(step_one, in_axes=(0, 0, None))
        return jax.lax.scan(lambda s, _: step(s, arms, data), state, None, length=n)

    k, n_e = cfg.eval_samples, cfg.eval_seeds

    def evaluate(params, key, data):
        prompts = data["prompts"]
        rep = jnp.repeat(prompts, k, axis=0)

        def one_run(p):
            def one_seed(kk):
                s = sample(model, p, rep, kk, L, 1.0)
                mf = s.mask.astype(jnp.float32)
                return s.tokens.reshape(prompts.shape[0], k, L), jnp.sum(s.entropy * mf) / jnp.maximum(jnp.sum(mf), 1.0)

            tok, ent = jax.lax.map(one_seed, jax.random.split(key, n_e))       # the same keys for every run
            greedy = sample(model, p, prompts, key, L, 1.0, greedy=True).tokens
            return {**eval_metrics(tok, greedy, data), "entropy": ent}

        return jax.lax.map(one_run, params)

    return types.SimpleNamespace(model=model, init=jax.jit(init),
                                 chunk_jit=jax.jit(chunk, static_argnums=3, donate_argnums=0),
                                 evaluate=jax.jit(evaluate), compiled={}, seed_of=seed_of)
