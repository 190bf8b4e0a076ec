"""Head-to-head: imitation's own preference-comparisons loop (imitation + stable-baselines3) against jaxweight's.

Settings (both sides): seals' fixed-horizon CartPole (``seals:seals/CartPole-v0``;
jaxweight's ``FixedHorizonCartPole`` is the same task), 1e6 agent steps,
2,000 comparisons, 11 rounds (``num_iterations=10``), 20-step fragments, a
3-member bagged reward ensemble of state-only (32, 32) MLPs trained with AdamW
(lr 1e-3, batch 32, one epoch, 200x on round 0), a teacher answering with the
Bradley-Terry probability (``sample=False``), and PPO with 8 environments x 64
steps, 4 minibatches, 4 epochs, (64, 64) tanh actor and critic, lr 1e-3
annealed linearly over the run, gamma 0.99, entropy 0.01. The demo's settings.

Rows:

1. ``loop, 1 seed``: imitation's wall time for one seed against jaxweight's
   ``PreferenceComparisons.train`` for one seed, cold (compilation included,
   JAX's persistent cache off).
2. ``loop, 4 vmapped seeds, cold``: imitation's one-seed time against
   jaxweight's four vmapped seeds / 4, cold. Goal >= 35x per seed.
3. ``loop, 4 vmapped seeds, warm cache``: the same in a second fresh process
   with the persistent cache the first one filled. Goal >= 50x per seed.

Every row also reports each side's final true return (mean over the last
round's evaluation episodes; 8 episodes of the stochastic policy), which
should agree ("same final true return": both solve the task, 500 is the
maximum). imitation runs seeds one after another, so its per-seed time is its
one-seed time; it runs once per bench run (about 6 minutes on 2 CPU cores).

The rows run only when ``imitation``, ``stable_baselines3``, ``seals`` and
``torch`` are importable (``pip install imitation==1.0.1 torch==2.13.0``; they
are not dependencies of jaxweight); otherwise one row says they were skipped.
``--quick``: 2e4 agent steps, 100 comparisons, 3 rounds; no goals judged.

``python bench/bench_preference_h2h.py [--quick] [--json P]`` or
``python -m jaxweight bench --only preference_h2h``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common (imports jax: imported where used, so that
# imitation's workers, here and in bench_preference_h2h_mujoco, run in environments without jax)

MODULE = "preference_h2h"
FULL = dict(total_timesteps=1_000_000, total_comparisons=2_000, num_iterations=10)
QUICK = dict(total_timesteps=20_000, total_comparisons=100, num_iterations=2)
PEERS = ("imitation", "stable_baselines3", "seals", "torch")
# the demo's settings (jaxweight.demos.preferences.settings("cartpole"))
FRAGMENT_LENGTH, MEMBERS, HIDDEN = 20, 3, (32, 32)
PPO = dict(n_envs=8, n_steps=64, minibatches=4, epochs=4, lr=1e-3, gamma=0.99, gae_lambda=0.95, ent_coef=0.01,
           clip=0.2, vf_coef=0.5, max_grad_norm=0.5, hidden=(64, 64))
EVAL_EPISODES = 8


#: the interpreter of imitation's side, if not this one (imitation 1.0.1 pins gymnasium 0.29, which an environment
#: with brax may not have)
PYTHON_VAR = "JAXWEIGHT_IMITATION_PYTHON"


#: the CPU core a worker pins itself to (:func:`start`'s ``core``)
CORE_VAR = "JAXWEIGHT_BENCH_CORE"


def imitation_python() -> str:
    """The interpreter that runs imitation's side: ``$JAXWEIGHT_IMITATION_PYTHON`` or this one."""
    return os.environ.get(PYTHON_VAR) or sys.executable


def peers_missing(peers: tuple = PEERS) -> list[str]:
    """The ``peers`` that :func:`imitation_python` cannot import."""
    if imitation_python() == sys.executable:
        return [m for m in peers if importlib.util.find_spec(m) is None]
    probe = "import importlib.util as u, json; print(json.dumps([m for m in %r if u.find_spec(m) is None]))" % (peers,)
    try:
        r = subprocess.run([imitation_python(), "-c", probe], capture_output=True, text=True, timeout=120)
        return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else list(peers)
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return list(peers)


# ------------------------------------------------------------ imitation's loop (fresh process)
def imitation_run(make, seed: int, *, total_timesteps: int, total_comparisons: int, num_iterations: int,
                  fragment_length: int, members: int, hidden: tuple, use_action: bool, use_next_state: bool,
                  reward_lr: float, ppo: dict, random_baseline: bool = False) -> dict:
    """imitation's preference-comparisons loop with a stable-baselines3 PPO agent on ``make()`` environments, as
    jaxweight's demo runs it (a bagged ensemble, the Bradley-Terry teacher with ``sample=False``, the hyperbolic
    query schedule, PPO's learning rate annealed over the whole run); then its final true return over
    ``EVAL_EPISODES`` episodes of the stochastic policy and, with ``random_baseline``, a uniformly random policy's.
    Imports torch and imitation only (it runs in imitation's environment, which may have no jax)."""
    import numpy as np  # noqa: PLC0415
    import torch as th  # noqa: PLC0415
    from imitation.algorithms import preference_comparisons as pcmp  # noqa: PLC0415
    from imitation.rewards.reward_nets import AddSTDRewardWrapper, BasicRewardNet, RewardEnsemble  # noqa: PLC0415
    from stable_baselines3 import PPO as SB3PPO  # noqa: PLC0415
    from stable_baselines3.common.evaluation import evaluate_policy  # noqa: PLC0415
    from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: PLC0415

    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    th.manual_seed(seed)
    venv = DummyVecEnv([make] * ppo["n_envs"])
    venv.seed(seed)
    nets = [BasicRewardNet(venv.observation_space, venv.action_space, use_state=True, use_action=use_action,
                           use_next_state=use_next_state, use_done=False, hid_sizes=hidden) for _ in range(members)]
    ensemble = RewardEnsemble(venv.observation_space, venv.action_space, nets)
    agent_reward = AddSTDRewardWrapper(ensemble, default_alpha=0.0)
    k = num_iterations
    agent_total = (k + 1) * (total_timesteps // k) + total_timesteps % k  # imitation trains the agent in K + 1 rounds
    holder = {}

    def lr(_progress):  # annealed over the whole run, as jaxweight's PPOHParams(anneal_steps=...)
        done = holder["agent"].num_timesteps if "agent" in holder else 0
        return ppo["lr"] * max(1.0 - done / agent_total, 0.0)

    agent = SB3PPO(
        "MlpPolicy", venv, n_steps=ppo["n_steps"], batch_size=ppo["n_envs"] * ppo["n_steps"] // ppo["minibatches"],
        n_epochs=ppo["epochs"], learning_rate=lr, gamma=ppo["gamma"], gae_lambda=ppo["gae_lambda"],
        ent_coef=ppo["ent_coef"], clip_range=ppo["clip"], vf_coef=ppo["vf_coef"],
        max_grad_norm=ppo["max_grad_norm"],
        policy_kwargs=dict(net_arch=dict(pi=list(ppo["hidden"]), vf=list(ppo["hidden"])), activation_fn=th.nn.Tanh),
        seed=seed, device="cpu", verbose=0,
    )
    holder["agent"] = agent
    generator = pcmp.AgentTrainer(agent, agent_reward, venv, rng=rng, exploration_frac=0.0)
    model = pcmp.PreferenceModel(ensemble)
    trainer = pcmp.EnsembleTrainer(model, pcmp.CrossEntropyRewardLoss(), rng=rng, batch_size=32, epochs=1,
                                   lr=reward_lr)
    loop = pcmp.PreferenceComparisons(
        generator, ensemble, num_iterations=k, fragmenter=pcmp.RandomFragmenter(warning_threshold=0, rng=rng),
        preference_gatherer=pcmp.SyntheticGatherer(sample=False, rng=rng), reward_trainer=trainer,
        fragment_length=fragment_length, transition_oversampling=1, initial_comparison_frac=0.1,
        initial_epoch_multiplier=200.0, allow_variable_horizon=False, query_schedule="hyperbolic",
    )
    marks = []
    t0 = time.perf_counter()
    loop.train(total_timesteps, total_comparisons, callback=lambda i: marks.append(time.perf_counter() - t0))
    train_s = time.perf_counter() - t0
    eval_env = DummyVecEnv([make])
    eval_env.seed(seed + 1000)
    returns, _ = evaluate_policy(agent, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=False,
                                 return_episode_rewards=True)
    out = dict(train_s=train_s, setup_s=t0 - t_start, first_round_s=marks[0] if marks else None, round_s=marks,
               final_return=float(np.mean(returns)), agent_steps=int(agent.num_timesteps), torch=th.__version__)
    if random_baseline:
        out["random_return"] = random_policy_return(make, seed, EVAL_EPISODES)
    return out


def random_policy_return(make, seed: int, episodes: int, seed_actions: bool = False) -> float:
    """Mean true return of a uniformly random policy over ``episodes`` episodes of ``make()`` (a gymnasium env;
    resets seeded ``seed + 2000 + i``, the action space seeded with ``seed`` if ``seed_actions``)."""
    env, rand = make(), []
    if seed_actions:
        env.action_space.seed(seed)
    for ep in range(episodes):
        env.reset(seed=seed + 2000 + ep)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total, done = total + float(r), term or trunc
        rand.append(total)
    return sum(rand) / len(rand)


def _worker_imitation(sizes: dict, seed: int) -> dict:
    import gymnasium as gym  # noqa: PLC0415
    import seals  # noqa: PLC0415, F401 - registers seals/CartPole-v0

    def make():
        return gym.make("seals:seals/CartPole-v0", disable_env_checker=True)

    return imitation_run(make, seed, **sizes, fragment_length=FRAGMENT_LENGTH, members=MEMBERS, hidden=HIDDEN,
                         use_action=False, use_next_state=False, reward_lr=1e-3, ppo=PPO)


# ------------------------------------------------------------ jaxweight's loop (fresh process)
def jaxweight_run(env: str, sizes: dict, seeds: int, random_baseline: bool = False) -> dict:
    """jaxweight's loop, ``demo preferences`` settings of ``env`` with ``sizes`` (and ``quick``) for ``seeds``
    vmapped seeds: wall time, per-round marks, the last round's true returns (and a random policy's)."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from jaxweight.demos import preferences as D  # noqa: PLC0415

    s = D.settings(env, seeds=seeds, **sizes)
    t0 = time.perf_counter()
    pc = D.build(s)
    marks = []
    pc.train(0, s.total_timesteps, s.total_comparisons, lambda i: marks.append(time.perf_counter() - t0),
             num_seeds=seeds)
    train_s = time.perf_counter() - t0
    gt = np.asarray(pc.history[-1]["gt_return"], np.float64)  # [seeds]: the last round's evaluation
    out = dict(train_s=train_s, first_round_s=marks[0], round_s=marks, final_return=float(np.nanmean(gt)),
               final_returns=gt.tolist())
    if random_baseline:
        out["random_return"] = float(np.mean(D.random_return(pc, s, jax.random.key(9))))
    return out


def _worker_jaxweight(sizes: dict, seeds: int) -> dict:
    return jaxweight_run("cartpole", sizes, seeds)


def entry(workers: dict, run, add_arguments=None) -> None:
    """The command line of a head-to-head script: ``--worker NAME SIZES N`` runs ``workers[NAME](SIZES, N)`` and
    prints its JSON result (what :func:`spawn` reads); otherwise the bench (``--quick``, ``--json P`` and the
    options of ``add_arguments``, as in ``_common.main``)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        if os.environ.get(CORE_VAR):
            os.sched_setaffinity(0, {int(os.environ[CORE_VAR])})
        print(json.dumps(workers[sys.argv[2]](json.loads(sys.argv[3]), int(sys.argv[4]))))
    else:
        from _common import main  # noqa: PLC0415

        main(run, add_arguments)


def start(name: str, sizes: dict, n: int, cache: str | None, *, script: str | Path = __file__,
          python: str = sys.executable, core: int | None = None, show: bool = False) -> subprocess.Popen:
    """Start ``script --worker name sizes n`` with ``python`` in a fresh process (JAX's persistent compilation
    cache off, or in ``cache``; pinned to CPU ``core`` if given; its stderr shown as it comes with ``show``, else
    kept for the error); :func:`finish` reads its result."""
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if cache is None:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    else:
        env.update(JAX_ENABLE_COMPILATION_CACHE="true", JAX_COMPILATION_CACHE_DIR=cache,
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if core is not None:
        env[CORE_VAR] = str(core)  # the worker pins itself first thing (no preexec_fn: JAX is multithreaded)
    return subprocess.Popen([python, str(script), "--worker", name, json.dumps(sizes), str(n)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=None if show else subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: int = 7200) -> dict:
    """The JSON result of a worker :func:`start` started (its last stdout line)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"worker {proc.args[3]} failed:\n" + ("(its stderr is above)" if err is None else err[-3000:]))
    return json.loads(out.strip().splitlines()[-1])


def spawn(name: str, sizes: dict, n: int, cache: str | None, timeout: int = 7200, *, script: str | Path = __file__,
          python: str = sys.executable) -> dict:
    """Run ``script --worker name sizes n`` with ``python`` in a fresh process (:func:`start`) and wait for its
    JSON result."""
    return finish(start(name, sizes, n, cache, script=script, python=python), timeout)


# ----------------------------------------------------------------------- run
def run(quick: bool = False) -> list[dict]:
    from _common import record  # noqa: PLC0415

    sizes = QUICK if quick else FULL
    size = (f"cartpole, {sizes['total_timesteps']:.0e} steps, {sizes['total_comparisons']} comparisons, "
            f"{sizes['num_iterations'] + 1} rounds, L={FRAGMENT_LENGTH}, M={MEMBERS}")
    missing = peers_missing()
    if missing:
        return [record(MODULE, "loop vs imitation + stable-baselines3", size, None, "skipped", None,
                       note=f"skipped: {', '.join(missing)} not importable (pip install imitation==1.0.1 "
                            f"torch==2.13.0 here or in ${PYTHON_VAR} to run this row)")]
    judged = not quick
    base = spawn("imitation", sizes, 0, None, python=imitation_python())
    one = spawn("jaxweight", sizes, 1, None)
    with tempfile.TemporaryDirectory() as tmp:
        cold = spawn("jaxweight", sizes, 4, tmp)
        warm = spawn("jaxweight", sizes, 4, tmp)
    b = base["train_s"]
    ret = (f"final true return: imitation {base['final_return']:.1f}, jaxweight {{:.1f}} "
           f"(of 500; {EVAL_EPISODES} episodes per seed)")
    recs = [record(MODULE, "loop, 1 seed, cold", size, one["train_s"], "imitation + SB3, 1 seed", b,
                   imitation=base, jaxweight=one, note=ret.format(one["final_return"]))]
    for label, r, goal in (("cold", cold, 35.0), ("warm cache", warm, 50.0)):
        per_seed = r["train_s"] / 4
        g = {"goal": f">= {goal:.0f}x per seed", "met": b / per_seed >= goal} if judged else {}
        recs.append(record(MODULE, f"loop, 4 vmapped seeds, {label} (per seed)", size, per_seed,
                           "imitation + SB3, 1 seed", b, **g, jaxweight=r,
                           note=f"4 seeds in {r['train_s']:.1f} s; " + ret.format(r["final_return"])))
    return recs


if __name__ == "__main__":
    entry({"imitation": _worker_imitation, "jaxweight": _worker_jaxweight}, run)
