"""Benchmark of ``demo lm``: one jitted GRPO pipeline step and jaxweight's share of it.

Rows:

1. ``pipeline_step``: one jitted step of the demo's default setting (its arms
   x seeds vmapped: level-balanced draws and the curriculum over 24 task buckets,
   KV-cache sampling of P x G completions, reward, SEED clustering, dynamic
   sampling down to B groups, reference log-probs, ``maxent.step`` with the tau
   controller, ``maxent.policy_loss``, the optax update, ``sync.step``, the
   curriculum update). Baseline: the same step with every jaxweight call
   replaced by a trivial stand-in (uniform bucket draw, no curriculum update,
   uniform weights / plain advantages, no controllers, SEED scale 1, the first
   B groups, the clipped loss written inline, a plain ``where`` for the sync),
   passed as the demo's ``lm.Parts``. Goal: jaxweight's share
   ``(t_step - t_standins) / t_step`` under 5%.
2. ``tokens_per_second``: completion tokens sampled per second of step time.

Timings are medians of jitted calls after compilation (``time_jax``); the
machine's load is not controlled, so the share is noisy at the few-% level:
``share`` is clipped at 0 in the goal check (a negative share means the
stand-in version was not measurably faster).
"""

from __future__ import annotations

import os
import sys
import types

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import main, record, time_jax  # noqa: E402

from jaxweight.demos import lm  # noqa: E402

MODULE = "lm"


def _cur_sample(state, key, ccfg, step, total, num, eligible):
    return jax.random.randint(key, (num,), 0, ccfg.capacity)


def _cur_update(state, ids, rewards, ccfg):
    return state


def _maxent_step(ctl_state, rewards, ref_logp, mask, mcfg, step, kl):
    adv = rewards - jnp.mean(rewards, -1, keepdims=True)
    w = jnp.full(rewards.shape, 1.0 / rewards.shape[-1])
    return ctl_state, types.SimpleNamespace(weights=w, advantages=adv,
                                            entropy=types.SimpleNamespace(mean=jnp.float32(0.0)))


def _seed_scale(cluster, seq_logp, g, alpha):
    return jnp.ones(cluster.shape[:1], jnp.float32)


def _select_groups(rewards, num, key):
    return jnp.arange(num)


def _policy_loss(logp, behaviour_logp, signal, mask, ref_logp, kl_coef, cfg, token_entropy):
    ratio = jnp.exp(logp - behaviour_logp)
    a = signal[:, None]
    pg = -jnp.minimum(ratio * a, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps_high) * a)
    d = ref_logp - logp
    m = mask.astype(jnp.float32)
    tok = (pg + kl_coef * (jnp.exp(d) - d - 1.0)) * m
    zero = jnp.float32(0.0)
    return jnp.mean(jnp.sum(tok, -1) / jnp.maximum(jnp.sum(m, -1), 1.0)), {
        k: zero for k in ("policy/kl", "policy/clip_fraction", "policy/ratio_mean", "policy/ratio_max",
                          "policy/entropy")}


def _sync_step(sync_state, learner, actor, interval, placement=None):
    return sync_state, learner, jnp.bool_(True)


def _staleness(sync_state):
    return jnp.int32(0)


# trivial stand-ins for every jaxweight call of the step (the demo's public ``Parts``)
STANDINS = lm.Parts(curriculum_sample=_cur_sample, curriculum_update=_cur_update, maxent_step=_maxent_step,
                    seed_scale=_seed_scale, select_groups=_select_groups, policy_loss=_policy_loss,
                    sync_step=_sync_step, staleness=_staleness)


def _time_step(cfg, task, n, parts):
    pipe = lm.make_pipeline(cfg, task, parts)
    state = pipe.init(pipe.random_params(jax.random.key(0)), jax.random.key(1))
    t = time_jax(pipe.step_function, state, pipe.data, n=n, warmup=2)
    _, m = pipe.step(state)
    return t, float(jnp.sum(m["tokens"]))


def run(quick: bool = False) -> list[dict]:
    cfg = lm.QUICK if quick else lm.LMConfig()
    n = 5 if quick else 10
    task = lm.make_task(cfg)
    full, tokens = _time_step(cfg, task, n, lm.Parts())
    stub, _ = _time_step(cfg, task, n, STANDINS)
    share = (full.median - stub.median) / full.median
    size = f"{cfg.runs} runs x {cfg.prompts} of {cfg.sample_prompts}x{cfg.generations} (pool {cfg.pool_size})"
    return [
        record(MODULE, "pipeline_step", size, full.median, "step with stand-ins", stub.median,
               goal="jaxweight share < 5%", met=max(share, 0.0) < 0.05, share=share,
               compile_s=full["compile_s"], timing=full, baseline_timing=stub,
               note=f"jaxweight share of the step: {100 * share:.1f}% "
                    f"(step {full.median * 1e3:.0f} ms, stand-ins {stub.median * 1e3:.0f} ms)"),
        record(MODULE, "tokens_per_second", size, full.median, "floor", None,
               tokens_per_second=tokens / full.median,
               note=f"{tokens / full.median:,.0f} completion tokens/s sampled and trained on"),
    ]


if __name__ == "__main__":
    main(run)
