"""Diagnostic: how often a brax task's simulation diverges under random actions, and what the fixed-horizon
environment makes of it.

Per seed, ``--envs`` episodes of ``--horizon`` steps with uniformly random actions in [-1, 1], stepped twice from
the same resets and actions:

- ``raw``: brax's own ``env.step`` (the task built as ``rl.make_env`` builds it: seals' observations, no early
  termination), nothing contained: the episodes whose return is not finite or whose observation leaves
  ``DIVERGED``, and the first step where that happens;
- ``contained``: ``rl.make_env("brax:<name>")``, whose :class:`~jaxweight.rl.brax_envs.BraxEnv` ends a diverged
  step in the absorbing state: the steps it marks ``diverged``, the episodes with any, and whether every return
  and observation stays finite.

``python bench/diag_brax_divergence.py --env ant --seeds 4 --json PATH``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(name: str, seeds: int, envs: int, horizon: int) -> list[dict]:
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from _common import record  # noqa: PLC0415
    from jaxweight.rl.brax_envs import DIVERGED  # noqa: PLC0415
    from jaxweight.rl.envs import make_env  # noqa: PLC0415

    env, params = make_env(f"brax:{name}", horizon=horizon)
    brax_env = env.inner.brax_env
    a_size = env.inner.action_size

    def episode(key):
        k_reset, k_act = jax.random.split(key)
        actions = jax.random.uniform(k_act, (horizon, a_size), minval=-1.0, maxval=1.0)
        _, s0 = env.reset_env(k_reset, params)

        def raw(s, a):
            s = brax_env.step(s, a)
            bad = ~jnp.all(jnp.isfinite(s.obs)) | ~jnp.isfinite(s.reward) | (jnp.max(jnp.abs(s.obs)) >= DIVERGED)
            return s, (s.reward, bad)

        def contained(s, a):
            o, s, r, _, info = env.step_env(None, s, a, params)
            return s, (r, info["diverged"], jnp.all(jnp.isfinite(o)))

        _, (r_raw, bad) = jax.lax.scan(raw, s0.env_state, actions)
        _, (r_c, div, finite) = jax.lax.scan(contained, s0, actions)
        first = jnp.where(bad.any(), jnp.argmax(bad), -1)
        return dict(raw_return=r_raw.sum(), raw_bad=bad.any(), raw_first=first, contained_return=r_c.sum(),
                    diverged_steps=div.sum(), contained_finite=finite.all() & jnp.isfinite(r_c).all())

    go = jax.jit(jax.vmap(episode))
    recs = []
    for seed in range(seeds):
        t0 = time.perf_counter()
        out = {k: np.asarray(v) for k, v in jax.device_get(go(jax.random.split(jax.random.key(seed), envs))).items()}
        wall = time.perf_counter() - t0
        raw_ok = np.isfinite(out["raw_return"]) & ~out["raw_bad"]
        firsts = out["raw_first"][out["raw_first"] >= 0]
        note = (f"seed {seed}, {envs} random-action episodes of {horizon} steps: raw brax, {int((~raw_ok).sum())} "
                f"diverged (first at steps {sorted(firsts.tolist())[:8]}); contained, "
                f"{int((out['diverged_steps'] > 0).sum())} episodes ended in the absorbing state by a diverged step, "
                f"all returns and observations finite: {bool(out['contained_finite'].all())}")
        recs.append(record("brax_divergence", f"brax:{name} random actions, seed {seed}",
                           f"{envs} episodes x {horizon} steps", wall, "none", None, note=note,
                           raw_diverged_episodes=int((~raw_ok).sum()), raw_first_steps=sorted(firsts.tolist()),
                           raw_returns=[float(x) for x in out["raw_return"]],
                           contained_returns=[float(x) for x in out["contained_return"]],
                           contained_diverged_episodes=int((out["diverged_steps"] > 0).sum()),
                           contained_all_finite=bool(out["contained_finite"].all()),
                           diverged_at=DIVERGED))
        print(note, flush=True)
    return recs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="ant", help="brax task name (default ant)")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--envs", type=int, default=32, help="episodes per seed")
    p.add_argument("--horizon", type=int, default=1000)
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args()
    recs = run(a.env, a.seeds, a.envs, a.horizon)
    if a.json:
        from jaxweight.checkpoint import save_json  # noqa: PLC0415

        save_json(a.json, recs)


if __name__ == "__main__":
    main()
