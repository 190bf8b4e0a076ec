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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, record  # noqa: E402

MODULE = "preference_h2h"
FULL = dict(total_timesteps=1_000_000, total_comparisons=2_000, num_iterations=10)
QUICK = dict(total_timesteps=20_000, total_comparisons=100, num_iterations=2)
PEERS = ("imitation", "stable_baselines3", "seals", "torch")
# the demo's settings (jaxweight.demos.preferences.settings("cartpole"))
FRAGMENT_LENGTH, MEMBERS, HIDDEN = 20, 3, (32, 32)
PPO = dict(n_envs=8, n_steps=64, minibatches=4, epochs=4, lr=1e-3, gamma=0.99, gae_lambda=0.95, ent_coef=0.01,
           clip=0.2, vf_coef=0.5, max_grad_norm=0.5, hidden=(64, 64))
EVAL_EPISODES = 8


def peers_missing() -> list[str]:
    """The peer packages that are not importable here."""
    return [m for m in PEERS if importlib.util.find_spec(m) is None]


# ------------------------------------------------------------ imitation's loop (fresh process)
def _worker_imitation(sizes: dict, seed: int) -> dict:
    import gymnasium as gym  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import seals  # noqa: PLC0415, F401 - registers seals/CartPole-v0
    import torch as th  # noqa: PLC0415
    from imitation.algorithms import preference_comparisons as pcmp  # noqa: PLC0415
    from imitation.rewards.reward_nets import AddSTDRewardWrapper, BasicRewardNet, RewardEnsemble  # noqa: PLC0415
    from stable_baselines3 import PPO as SB3PPO  # noqa: PLC0415
    from stable_baselines3.common.evaluation import evaluate_policy  # noqa: PLC0415
    from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: PLC0415

    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    th.manual_seed(seed)

    def make():
        return gym.make("seals:seals/CartPole-v0", disable_env_checker=True)

    venv = DummyVecEnv([make] * PPO["n_envs"])
    venv.seed(seed)
    members = [BasicRewardNet(venv.observation_space, venv.action_space, use_state=True, use_action=False,
                              use_next_state=False, use_done=False, hid_sizes=HIDDEN) for _ in range(MEMBERS)]
    ensemble = RewardEnsemble(venv.observation_space, venv.action_space, members)
    agent_reward = AddSTDRewardWrapper(ensemble, default_alpha=0.0)
    k = sizes["num_iterations"]
    total = sizes["total_timesteps"]
    agent_total = (k + 1) * (total // k) + total % k  # imitation trains the agent in K + 1 rounds
    holder = {}

    def lr(_progress):  # annealed over the whole run, as jaxweight's PPOHParams(anneal_steps=...)
        done = holder["agent"].num_timesteps if "agent" in holder else 0
        return PPO["lr"] * max(1.0 - done / agent_total, 0.0)

    agent = SB3PPO(
        "MlpPolicy", venv, n_steps=PPO["n_steps"], batch_size=PPO["n_envs"] * PPO["n_steps"] // PPO["minibatches"],
        n_epochs=PPO["epochs"], learning_rate=lr, gamma=PPO["gamma"], gae_lambda=PPO["gae_lambda"],
        ent_coef=PPO["ent_coef"], clip_range=PPO["clip"], vf_coef=PPO["vf_coef"],
        max_grad_norm=PPO["max_grad_norm"],
        policy_kwargs=dict(net_arch=dict(pi=list(PPO["hidden"]), vf=list(PPO["hidden"])), activation_fn=th.nn.Tanh),
        seed=seed, device="cpu", verbose=0,
    )
    holder["agent"] = agent
    generator = pcmp.AgentTrainer(agent, agent_reward, venv, rng=rng, exploration_frac=0.0)
    model = pcmp.PreferenceModel(ensemble)
    trainer = pcmp.EnsembleTrainer(model, pcmp.CrossEntropyRewardLoss(), rng=rng, batch_size=32, epochs=1, lr=1e-3)
    loop = pcmp.PreferenceComparisons(
        generator, ensemble, num_iterations=k, fragmenter=pcmp.RandomFragmenter(warning_threshold=0, rng=rng),
        preference_gatherer=pcmp.SyntheticGatherer(sample=False, rng=rng), reward_trainer=trainer,
        fragment_length=FRAGMENT_LENGTH, transition_oversampling=1, initial_comparison_frac=0.1,
        initial_epoch_multiplier=200.0, allow_variable_horizon=False, query_schedule="hyperbolic",
    )
    marks = []
    t0 = time.perf_counter()
    loop.train(total, sizes["total_comparisons"], callback=lambda i: marks.append(time.perf_counter() - t0))
    train_s = time.perf_counter() - t0
    eval_env = DummyVecEnv([make])
    eval_env.seed(seed + 1000)
    returns, _ = evaluate_policy(agent, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=False,
                                 return_episode_rewards=True)
    return dict(train_s=train_s, setup_s=t0 - t_start, first_round_s=marks[0] if marks else None,
                round_s=marks, final_return=float(np.mean(returns)), agent_steps=int(agent.num_timesteps),
                torch=th.__version__)


# ------------------------------------------------------------ jaxweight's loop (fresh process)
def _worker_jaxweight(sizes: dict, seeds: int) -> dict:
    import numpy as np  # noqa: PLC0415

    from jaxweight.demos import preferences as D  # noqa: PLC0415

    s = D.settings("cartpole", seeds=seeds, **sizes)
    t0 = time.perf_counter()
    pc = D.build(s)
    marks = []
    pc.train(0, s.total_timesteps, s.total_comparisons, lambda i: marks.append(time.perf_counter() - t0),
             num_seeds=seeds)
    train_s = time.perf_counter() - t0
    gt = np.asarray(pc.history[-1]["gt_return"], np.float64)  # [seeds]: the last round's evaluation
    return dict(train_s=train_s, first_round_s=marks[0], round_s=marks, final_return=float(np.nanmean(gt)),
                final_returns=gt.tolist())


def _worker(name: str, sizes: dict, n: int) -> None:
    fn = {"imitation": _worker_imitation, "jaxweight": _worker_jaxweight}[name]
    print(json.dumps(fn(sizes, n)))


def _spawn(name: str, sizes: dict, n: int, cache: str | None, timeout: int = 7200) -> dict:
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if cache is None:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    else:
        env.update(JAX_ENABLE_COMPILATION_CACHE="true", JAX_COMPILATION_CACHE_DIR=cache,
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    r = subprocess.run([sys.executable, __file__, "--worker", name, json.dumps(sizes), str(n)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{name} worker failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------- run
def run(quick: bool = False) -> list[dict]:
    sizes = QUICK if quick else FULL
    size = (f"cartpole, {sizes['total_timesteps']:.0e} steps, {sizes['total_comparisons']} comparisons, "
            f"{sizes['num_iterations'] + 1} rounds, L={FRAGMENT_LENGTH}, M={MEMBERS}")
    missing = peers_missing()
    if missing:
        return [record(MODULE, "loop vs imitation + stable-baselines3", size, None, "skipped", None,
                       note=f"skipped: {', '.join(missing)} not importable (pip install imitation==1.0.1 "
                            f"torch==2.13.0 to run this row)")]
    judged = not quick
    base = _spawn("imitation", sizes, 0, None)
    one = _spawn("jaxweight", sizes, 1, None)
    with tempfile.TemporaryDirectory() as tmp:
        cold = _spawn("jaxweight", sizes, 4, tmp)
        warm = _spawn("jaxweight", sizes, 4, tmp)
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
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
    else:
        main(run)
