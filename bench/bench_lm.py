"""Benchmark of ``demo lm``: one jitted GRPO pipeline step and jaxweight's share of it.

Rows:

1. ``pipeline_step``: one jitted step of the demo's default setting (all arms
   x seeds vmapped: curriculum sampling over the 131k pool, KV-cache sampling of
   B x G completions, reward, SEED clustering, reference log-probs,
   ``maxent_step`` with the tau / beta controllers, the optax update,
   ``sync.tick``, the curriculum update). Baseline: the same step with every
   jaxweight call replaced by a trivial stand-in (uniform prompt draw, no
   curriculum update, uniform weights / plain advantages, no controllers, SEED
   scale 1, a plain ``where`` for the sync). Goal: jaxweight's share
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
from jaxweight.demos._lm_task import COMPLETION_LEN, PROMPT_LEN  # noqa: E402

MODULE = "lm"


def _standins():
    """Trivial replacements of the adapter functions of ``jaxweight.demos.lm``."""

    def cur_sample(state, key, ccfg, step, total, num):
        return jax.random.randint(key, (num,), 0, ccfg.capacity)

    def cur_update(state, ids, rewards, ccfg):
        return state

    def maxent_step(ctl_state, rewards, ref_logp, mask, ctl_cfg, step, kl):
        adv = rewards - jnp.mean(rewards, -1, keepdims=True)
        w = jnp.full(rewards.shape, 1.0 / rewards.shape[-1])
        return types.SimpleNamespace(weights=w, advantages=adv, state=ctl_state,
                                     entropy=types.SimpleNamespace(mean=jnp.float32(0.0)))

    def seed_scale(cluster, seq_logp, g, alpha):
        return jnp.ones(cluster.shape[:1], jnp.float32)

    def sync_tick(sync_state, learner, actor, interval, placement=None):
        return sync_state, learner, jnp.bool_(True)

    def staleness(sync_state):
        return jnp.int32(0)

    return {"_curriculum_sample": cur_sample, "_curriculum_update": cur_update, "_maxent_step": maxent_step,
            "_seed_scale": seed_scale, "_sync_tick": sync_tick, "_staleness": staleness}


def _time_step(cfg, task, n):
    lm._functions.cache_clear()
    pipe = lm.make_pipeline(cfg, task)
    params = pipe.model.init(jax.random.key(0), jnp.zeros((1, PROMPT_LEN + COMPLETION_LEN), jnp.int32))
    ref = jax.tree.map(lambda x: jnp.stack([x] * cfg.seeds), params)
    state = pipe.init(ref, jax.random.key(1))
    t = time_jax(pipe.fns.step_jit, state, pipe.data, n=n, warmup=2)
    _, m = pipe.fns.step_jit(state, pipe.data)
    return t, float(jnp.sum(m["tokens"]))


def run(quick: bool = False) -> list[dict]:
    cfg = lm.QUICK if quick else lm.LMConfig()
    n = 5 if quick else 10
    task = lm.make_task(cfg)
    full, tokens = _time_step(cfg, task, n)
    saved = {k: getattr(lm, k) for k in _standins()}
    try:
        for k, f in _standins().items():
            setattr(lm, k, f)
        stub, _ = _time_step(cfg, task, n)
    finally:
        for k, f in saved.items():
            setattr(lm, k, f)
        lm._functions.cache_clear()
    share = (full.median - stub.median) / full.median
    size = f"{cfg.runs} runs x {cfg.prompts}x{cfg.generations} (pool {cfg.pool_size})"
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
