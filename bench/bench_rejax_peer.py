"""Our PPO against rejax's PPO (a maintained pure-JAX PPO) on CartPole, side by side in one run.

Both sides run the same training work: gymnax's CartPole physics (ours through the fixed-horizon
wrapper ``rl.make_env("cartpole")``, rejax on ``CartPole-v1``), ``num_envs`` parallel environments,
64-step rollouts, 8 epochs of 16 minibatches, 64x64 swish MLPs for actor and critic, GAE 0.95,
clip 0.2, entropy 0.01, gradient clipping at 0.5. Per side and size, one jitted program runs
``ITERS`` PPO iterations (rollout plus update) in a ``fori_loop``: rejax's own
``train_iteration`` (its ``train`` adds evaluations, which are left out here) and our
``PPOAgent.train``. Compile is timed on its own (``lower().compile()``); the training time is the
median of ``--repeats`` runs of the compiled program. Env-steps/s = ``ITERS * num_envs * 64 / time``.

rejax 0.1.3 cannot live beside the project: it unpacks gymnax's step as 5 values, and gymnax 1.0
(the project's) returns 6. So each side runs in a child process of its own interpreter (ours:
this one; rejax: ``--rejax-python``, a venv with ``rejax==0.1.3 gymnax==0.0.9`` and the project's
jax), the same jax version on both, one size at a time, the sides' order alternating between sizes.
Run ``python bench/bench_rejax_peer.py --rejax-python V/bin/python [--envs 4,16,64,256]
[--repeats 3] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import provenance, write_json  # noqa: E402

STEPS = 64          # rollout length per environment per iteration
EPOCHS = 8
MINIBATCHES = 16
ITERS = 8           # PPO iterations per timed program


def _ours(num_envs: int):
    from jaxweight import rl

    env, params = rl.make_env("cartpole")
    agent = rl.PPOAgent(env, params, config=rl.PPOConfig(
        num_envs=num_envs, num_steps=STEPS, num_minibatches=MINIBATCHES, update_epochs=EPOCHS,
        hidden_sizes=(64, 64), activation="swish"),
        hparams=rl.PPOHParams.create(learning_rate=3e-4, gamma=0.99, ent_coef=0.01, clip_eps=0.2))
    steps = ITERS * num_envs * STEPS
    fn = jax.jit(lambda s, k: agent.train(s, k, steps))
    return fn, (agent.init(0), jax.random.key(1))


def _rejax(num_envs: int):
    from rejax import PPO

    algo = PPO.create(env="CartPole-v1", num_envs=num_envs, num_steps=STEPS, num_epochs=EPOCHS,
                      num_minibatches=MINIBATCHES, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95,
                      clip_eps=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                      agent_kwargs={"hidden_layer_sizes": (64, 64), "activation": "swish"})
    ts = algo.init_state(jax.random.key(0))
    fn = jax.jit(lambda t: jax.lax.fori_loop(0, ITERS, lambda _, x: algo.train_iteration(x), t))
    return fn, (ts,)


SIDES = {"jaxweight": _ours, "rejax": _rejax}


def measure(side: str, num_envs: int) -> dict:
    fn, args = SIDES[side](num_envs)
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))            # one warm run
    return {"side": side, "num_envs": num_envs, "compile_s": compile_s, "compiled": compiled, "args": args}


def time_once(m: dict) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(m["compiled"](*m["args"]))
    return time.perf_counter() - t0


def child(side: str, num_envs: int, repeats: int) -> dict:
    """One side at one size, in this process: compile, one warm run, ``repeats`` timed runs."""
    m = measure(side, num_envs)
    times = [time_once(m) for _ in range(repeats)]
    steps = ITERS * num_envs * STEPS
    t = float(np.median(times))
    return {"side": side, "num_envs": num_envs, "env_steps": steps, "compile_s": m["compile_s"], "train_s": t,
            "train_s_all": times, "env_steps_per_s": steps / t, "jax_version": jax.__version__}


def run(envs: list[int], repeats: int, pythons: dict[str, str], log=print) -> list[dict]:
    import json
    import subprocess

    rows = []
    for i, n in enumerate(envs):
        order = list(SIDES) if i % 2 == 0 else list(SIDES)[::-1]     # alternate who goes first
        got = {}
        for side in order:
            r = subprocess.run([pythons[side], __file__, "--child", side, "--envs", str(n), "--repeats", str(repeats)],
                               capture_output=True, text=True, cwd=ROOT, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(f"{side} at num_envs {n} failed:\n{r.stderr[-2000:]}")
            got[side] = json.loads(r.stdout.strip().splitlines()[-1])
        ours, peer = got["jaxweight"], got["rejax"]
        ours["ratio_vs_rejax"] = peer["train_s"] / ours["train_s"]
        rows += [ours, peer]
        log(f"num_envs {n:5d}: jaxweight {ours['env_steps_per_s']:10,.0f} env-steps/s (compile {ours['compile_s']:.1f} s)"
            f" | rejax {peer['env_steps_per_s']:10,.0f} (compile {peer['compile_s']:.1f} s) | "
            f"ours {ours['ratio_vs_rejax']:.2f}x rejax's rate")
    return rows


def main(argv: list[str] | None = None) -> int:
    import json

    ap = argparse.ArgumentParser(prog="python bench/bench_rejax_peer.py", description=__doc__.split("\n")[0])
    ap.add_argument("--envs", default="4,16,64,256", help="comma-separated num_envs sizes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rejax-python", default=None, help="the interpreter of a venv with rejax 0.1.3 and gymnax 0.0.9")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=list(SIDES), default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    envs = [int(x) for x in a.envs.split(",")]
    if a.child:
        print(json.dumps(child(a.child, envs[0], a.repeats)))
        return 0
    if a.rejax_python is None:
        ap.error("--rejax-python is needed: rejax runs in a venv of its own (see the module docstring)")
    rows = run(envs, a.repeats, {"jaxweight": sys.executable, "rejax": a.rejax_python})
    out = {"what": "PPO on CartPole, ours against rejax 0.1.3's, training iterations only (compile apart), each side "
                   "in its own process", "iterations_per_program": ITERS, "num_steps": STEPS, "epochs": EPOCHS,
           "minibatches": MINIBATCHES, "rows": rows, **provenance()}
    if a.json:
        write_json(a.json, out)
        print(f"written {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
