"""Head-to-head on a MuJoCo-class task: imitation's preference-comparisons loop (imitation + stable-baselines3 on
MuJoCo) against jaxweight's (brax), one after the other, on InvertedPendulum at a fixed horizon of 1000.

The cheapest MuJoCo-class task both can run, from the original paper's eight (Christiano et al. 2017). seals has
no InvertedPendulum, so imitation's side gets the seals treatment by hand: gymnasium's ``InvertedPendulum-v4``
(MuJoCo) inside seals' ``AbsorbAfterDoneWrapper`` (after the pole falls the episode absorbs: the terminal
observation repeats, reward 0) and a 1000-step ``TimeLimit``. jaxweight's side is ``brax:inverted_pendulum`` (the
same model in brax, the same fixed horizon and absorbing end: :mod:`jaxweight.rl.brax_envs`).

Budget, both sides: the demo's settings of ``brax:inverted_pendulum``: 2e6 agent steps, 2,000 comparisons, 11
rounds (``num_iterations=10``), 50-step fragments, a 3-member bagged ensemble of (32, 32) MLPs on (state, next
state) trained with AdamW (lr 1e-3, batch 32, one epoch, 200x on round 0), a teacher answering with the
Bradley-Terry probability (``sample=False``), PPO with 512 environments x 80 steps, 8 minibatches, 4 epochs,
(64, 64) tanh actor and critic, lr 3e-4 annealed linearly over the run, gamma 0.97, GAE 0.95, entropy 0.01, ratio
clip 0.3, no gradient clipping. What stays different: jaxweight's agent keeps the rest of its brax settings
(observation normalisation, reward scaling 10, the tanh-squashed Gaussian with a std per state, the absorbing
bootstrap: the demo's); SB3's PPO keeps its own (raw observations and rewards, a state-independent std, actions
clipped to the box). Each side is judged by its own agent's final true return, so those differences count in the
quality column, not in the time.

Rows (time = the loop's wall time, compilation included):

1. ``loop, 1 seed, cold``: imitation's one seed against jaxweight's one seed.
2. ``loop, 4 vmapped seeds, cold (per seed)``: imitation's one seed against jaxweight's four vmapped seeds / 4.
3. ``loop, 4 vmapped seeds, warm cache (per seed)``: the same in a second fresh process with the persistent
   compilation cache the first one filled.

Each row reports both final true returns (the last round's evaluation: 8 episodes of the stochastic policy per
seed; 1000 is the maximum) and a uniformly random policy's. The issue's goal for this row is "state the ratio as
measured on this CPU" (>= 10x per seed on a GPU, where imitation does not run).

The rows run only when ``imitation``, ``stable_baselines3``, ``seals``, ``torch``, ``mujoco`` and ``brax`` are
importable (imitation's side: ``pip install imitation==1.0.1 torch==2.13.0 'mujoco<3.2' imageio`` in an
environment of its own; jaxweight's: the ``brax`` extra). ``--quick``: 2e4 steps, 100 comparisons, 3 rounds, 16
environments; no ratio judged.

``python bench/bench_preference_h2h_mujoco.py [--quick] [--json P]`` or
``python -m jaxweight bench --only preference_h2h_mujoco``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common and bench_preference_h2h (_common imports
# jax: imported where used, so that imitation's worker runs in an environment without jax)

MODULE = "preference_h2h_mujoco"
ENV = "brax:inverted_pendulum"
HORIZON = 1000
FULL = dict(quick=False)  # the demo's settings of ENV (the docstring's budget)
QUICK = dict(quick=True, total_timesteps=20_000, total_comparisons=100, num_iterations=2, ppo_envs=16, ppo_steps=40,
             ppo_minibatches=4, heldout_steps=2_000)
PEERS = ("imitation", "stable_baselines3", "seals", "torch", "mujoco", "imageio")


def peers_missing() -> list[str]:
    """What is not importable: brax here, imitation's side's packages in its interpreter
    (``$JAXWEIGHT_IMITATION_PYTHON`` or this one)."""
    from bench_preference_h2h import peers_missing as imitation_missing  # noqa: PLC0415

    return ([] if importlib.util.find_spec("brax") else ["brax"]) + imitation_missing(PEERS)


def _settings(sizes: dict, seeds: int = 1):
    from jaxweight.demos import preferences as D  # noqa: PLC0415

    sizes = dict(sizes)
    # PPO on both sides (the demo's default agent for ENV is SAC since: BRAX_DEFAULTS)
    return D.settings(ENV, quick=sizes.pop("quick"), seeds=max(seeds, 1), agent="ppo", **sizes)


# ------------------------------------------------------------ the two loops (fresh processes)
def _worker_imitation(sizes: dict, seed: int) -> dict:
    import gymnasium as gym  # noqa: PLC0415
    import torch as th  # noqa: PLC0415
    from bench_preference_h2h import imitation_run  # noqa: PLC0415
    from seals.util import AbsorbAfterDoneWrapper  # noqa: PLC0415

    s = SimpleNamespace(**sizes)  # the demo's settings, from the parent: the same numbers as jaxweight's side
    th.set_num_threads(1)

    def make():
        inner = gym.make("InvertedPendulum-v4", disable_env_checker=True).unwrapped
        return gym.wrappers.TimeLimit(AbsorbAfterDoneWrapper(inner), HORIZON)

    ppo = dict(n_envs=s.ppo_envs, n_steps=s.ppo_steps, minibatches=s.ppo_minibatches, epochs=s.ppo_epochs,
               lr=s.learning_rate, gamma=s.gamma, gae_lambda=0.95, ent_coef=s.ent_coef, clip=s.clip_eps, vf_coef=0.5,
               max_grad_norm=float("inf") if s.max_grad_norm is None else s.max_grad_norm, hidden=(64, 64))
    out = imitation_run(make, seed, total_timesteps=s.total_timesteps, total_comparisons=s.total_comparisons,
                        num_iterations=s.num_iterations, fragment_length=s.fragment_length, members=s.num_members,
                        hidden=(32, 32), use_action=s.use_action, use_next_state=s.use_next_state,
                        reward_lr=s.reward_learning_rate, ppo=ppo, random_baseline=True)
    return dict(out, env="InvertedPendulum-v4 (MuJoCo), seals.util.AbsorbAfterDoneWrapper, TimeLimit 1000")


def _worker_jaxweight(sizes: dict, seeds: int) -> dict:
    from bench_preference_h2h import jaxweight_run  # noqa: PLC0415

    return dict(jaxweight_run(ENV, sizes, seeds, random_baseline=True), settings=dataclasses.asdict(
        _settings(sizes, seeds)), env=ENV)



# ----------------------------------------------------------------------- run
def run(quick: bool = False) -> list[dict]:
    from _common import record  # noqa: PLC0415
    from bench_preference_h2h import EVAL_EPISODES, PYTHON_VAR, imitation_python, spawn  # noqa: PLC0415

    sizes = QUICK if quick else FULL
    missing = peers_missing()
    s = None if "brax" in missing else _settings(sizes)
    size = ("InvertedPendulum, horizon 1000" if s is None else
            f"InvertedPendulum, horizon 1000, {s.total_timesteps:.0e} steps, {s.total_comparisons} comparisons, "
            f"{s.num_iterations + 1} rounds, L={s.fragment_length}, M={s.num_members}")
    if missing:
        return [record(MODULE, "loop vs imitation + stable-baselines3 (MuJoCo)", size, None, "skipped", None,
                       note=f"skipped: {', '.join(missing)} not importable (jaxweight[brax] here; pip install "
                            f"imitation==1.0.1 torch==2.13.0 'mujoco<3.2' imageio in ${PYTHON_VAR} or here)")]
    me = Path(__file__).resolve()
    base = spawn("imitation", dataclasses.asdict(s), 0, None, script=me, python=imitation_python())
    one = spawn("jaxweight", sizes, 1, None, script=me)
    with tempfile.TemporaryDirectory() as tmp:
        four = spawn("jaxweight", sizes, 4, tmp, script=me)
        warm = spawn("jaxweight", sizes, 4, tmp, script=me)
    b = base["train_s"]
    ret = (f"final true return: imitation {base['final_return']:.1f} (random {base['random_return']:.1f}), "
           f"jaxweight {{}} (of 1000; {EVAL_EPISODES} episodes per seed)")
    recs = [record(MODULE, "loop, 1 seed, cold", size, one["train_s"], "imitation + SB3, 1 seed", b,
                   imitation=base, jaxweight=one, note=ret.format(f"{one['final_return']:.1f}"))]
    for label, r in (("cold", four), ("warm cache", warm)):
        recs.append(record(MODULE, f"loop, 4 vmapped seeds, {label} (per seed)", size, r["train_s"] / 4,
                           "imitation + SB3, 1 seed", b, jaxweight=r,
                           note=f"4 seeds in {r['train_s']:.1f} s; " + ret.format(
                               " / ".join(f"{x:.1f}" for x in r["final_returns"]))))
    return recs


if __name__ == "__main__":
    from bench_preference_h2h import entry

    entry({"imitation": _worker_imitation, "jaxweight": _worker_jaxweight}, run)
