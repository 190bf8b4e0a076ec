"""Head-to-head on a MuJoCo-class task where both sides learn: imitation's preference-comparisons loop (imitation
1.0.1 + stable-baselines3 SAC on MuJoCo) against jaxweight's (SAC on brax), on InvertedPendulum at a fixed horizon
of 1000, both with the demo's defaults for ``brax:inverted_pendulum``.

The measure, per seed: the wall time until the learned-reward agent first reaches 0.8 of its own true-reward
baseline, and the final normalised score. A round's evaluation (8 episodes of the stochastic policy on the true
reward, after the round's agent training) reaches it when ``(return - random) / (baseline - random) >= 0.8``; the
time is the loop's wall clock at the end of that round, compilation and the per-round evaluations included (the
granularity is a round: 1e4 agent steps). Each side's baseline is its own agent trained on the true reward for the
same number of steps in the same process after the loop, its final return over 32 episodes; ``random`` is a
uniformly random policy's. The final score uses the learned-reward agent's final return over 32 episodes.

Environments (the physics differ): seals has no InvertedPendulum, so imitation's side gets the seals treatment by
hand: gymnasium's ``InvertedPendulum-v4`` (MuJoCo 3.1, the C engine: 2 substeps of 0.02 s per action, reset noise
0.01) inside seals' ``AbsorbAfterDoneWrapper`` (after the pole falls past 0.2 rad the episode absorbs: the terminal
observation repeats) and a 1000-step ``TimeLimit``. jaxweight's side is ``brax:inverted_pendulum``: the same MJCF
model stepped by brax's generalised pipeline in JAX (its own integrator and contact solver, 2 substeps per action,
the same reset noise and fall test), in :mod:`jaxweight.rl.brax_envs`' fixed horizon with the same absorbing end.
The task, horizon, reward (1 per step upright) and random baseline agree; the trajectories of one action sequence
do not agree bit for bit.

Budget, both sides (``demo preferences --env brax:inverted_pendulum`` with no other flag): 1e5 agent steps in 11
rounds (``num_iterations=10``; imitation trains the agent in K + 1 rounds, 1.1e5 steps in all), 2,000 comparisons
on the hyperbolic schedule, 50-step fragments, a 3-member bagged ensemble of (32, 32) MLPs on the state trained with
AdamW (lr 1e-3, batch 32, one epoch, 200x on round 0), a teacher answering with the Bradley-Terry probability
(``sample=False``); SAC with 16 environments, one gradient step per environment step (16 after each vectorised
step), batch 256, a 1e6 replay buffer, 10,000 uniformly random transitions first, (256, 256) ReLU actor and twin
critics, Adam lr 3e-4, gamma 0.99, tau 0.005, the temperature learned from 1.0 towards entropy -|A|. What stays
different: jaxweight's SAC bootstraps through the absorbing end as the demo does, SB3's at the time limit. Both
relabel each replayed minibatch with the current reward model (PEBBLE's relabelling: jaxweight's SAC always,
imitation's through ``imitation.policies.replay_buffer_wrapper.ReplayBufferRewardWrapper`` with
``reward_net.predict_processed``, as imitation's own ``train_preference_comparisons`` script sets up an off-policy
agent). ``run(relabel=False)`` leaves imitation's replay with the reward each transition had when it was collected
(``AgentTrainer``'s ``RewardVecEnvWrapper`` alone). Each side is judged against its own agent's true-reward
baseline, so these differences count in the quality column, not in the time.

Every side's seed runs in a fresh process pinned to one of the machine's cores, cold (JAX's persistent compilation
cache off); a seed's two sides start next to each other, each next process on the first core to fall free (with
one core, one after the other). One row per seed compares the time to 0.8 (``ratio`` = imitation's /
jaxweight's); a last row the whole loop's wall per seed.

The rows run only when ``imitation``, ``stable_baselines3``, ``seals``, ``torch``, ``mujoco`` and ``brax`` are
importable (imitation's side: ``pip install imitation==1.0.1 torch==2.13.0 'mujoco<3.2' imageio`` in an
environment of its own, named by ``$JAXWEIGHT_IMITATION_PYTHON``; jaxweight's: the ``brax`` extra). ``--quick``: the
demo's quick SAC settings (1e4 steps, 2,000 random transitions first), 100 comparisons, 3 rounds; no goal judged.

A diagnostic in both workers: after every round, the learned reward's ensemble mean on upright states minus on
fallen (absorbing) ones, over the states of untrained-policy episodes (``round_reward_gap``; kept out of the
timed loop).

``python bench/bench_preference_h2h_mujoco.py [--quick] [--json P] [--seeds N] [--input-norm none|running|tanh]
[--reward-norm] [--baselines-from JSON | --baseline-ceiling] [--parts DIR]`` (``run(relabel=False)`` as above; see
:func:`run` for each option: ``--input-norm`` and ``--reward-norm`` set imitation's reward nets' input layer and
output normalisation, ``--baselines-from`` and ``--baseline-ceiling`` replace the trained true-reward baselines,
``--parts`` keeps every finished seed so that an interrupted run resumes) or
``python -m jaxweight bench --only preference_h2h_mujoco``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common and bench_preference_h2h (_common imports
# jax: imported where used, so that imitation's worker runs in an environment without jax)

MODULE = "preference_h2h_mujoco"
ENV = "brax:inverted_pendulum"
HORIZON = 1000
TARGET = 0.8  # the fraction of its own true-reward baseline a side must reach
FULL = dict(quick=False)  # the demo's defaults for ENV (the docstring's budget)
QUICK = dict(quick=True, total_comparisons=100, num_iterations=2, heldout_steps=2_000)
PEERS = ("imitation", "stable_baselines3", "seals", "torch", "mujoco", "imageio")


def peers_missing() -> list[str]:
    """What is not importable: brax here, imitation's side's packages in its interpreter
    (``$JAXWEIGHT_IMITATION_PYTHON`` or this one)."""
    from bench_preference_h2h import peers_missing as imitation_missing  # noqa: PLC0415

    return ([] if importlib.util.find_spec("brax") else ["brax"]) + imitation_missing(PEERS)


def _settings(sizes: dict, seeds: int = 1):
    from jaxweight.demos import preferences as D  # noqa: PLC0415

    sizes = dict(sizes)
    return D.settings(ENV, quick=sizes.pop("quick"), seeds=max(seeds, 1), **sizes)  # the demo's agent: SAC


def time_to_target(round_s: list, returns: list, baseline: float, random: float, target: float = TARGET):
    """The wall clock at the end of the first round whose true return reaches ``target`` of the baseline in the
    normalised score ``(return - random) / (baseline - random)``; None if no round does."""
    span = baseline - random
    for t, r in zip(round_s, returns):
        if span > 0 and (r - random) / span >= target:
            return t
    return None


# ------------------------------------------------------------ the two loops (fresh processes)
def _probe_states(make, seed: int, episodes: int = 64):
    """Observations of ``episodes`` uniformly random episodes of ``make()`` (an env that terminates at the fall):
    those before the fall, and the fallen ones the episodes end in (the absorbing observation), for the learned
    reward's per-round diagnostic."""
    import numpy as np  # noqa: PLC0415

    env, up, down = make(), [], []
    env.action_space.seed(seed + 5000)
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + 5000 + ep)
        done = False
        while not done:
            up.append(obs)
            obs, _, term, trunc, _ = env.step(env.action_space.sample())
            done = term or trunc
        down.append(obs)
    return np.asarray(up, np.float32), np.asarray(down, np.float32)


def _tanh_layer():
    import torch as th  # noqa: PLC0415

    class Tanh(th.nn.Module):  # jaxweight's reward-net input, tanh(obs / 1) (brax's observation space is unbounded)
        def __init__(self, size: int):
            super().__init__()
            del size

        def forward(self, x):
            return th.tanh(x)

    return Tanh


def _worker_imitation(sizes: dict, seed: int) -> dict:
    os.environ.setdefault("TQDM_DISABLE", "1")  # imitation's per-epoch progress bars
    import gymnasium as gym  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import torch as th  # noqa: PLC0415
    from imitation.algorithms import preference_comparisons as pcmp  # noqa: PLC0415
    from imitation.rewards.reward_nets import (  # noqa: PLC0415
        AddSTDRewardWrapper, BasicRewardNet, NormalizedRewardNet, RewardEnsemble)
    from imitation.util.networks import RunningNorm  # noqa: PLC0415
    from seals.util import AbsorbAfterDoneWrapper  # noqa: PLC0415
    from imitation.policies.replay_buffer_wrapper import ReplayBufferRewardWrapper  # noqa: PLC0415
    from stable_baselines3 import SAC  # noqa: PLC0415
    from stable_baselines3.common.buffers import ReplayBuffer  # noqa: PLC0415
    from stable_baselines3.common.evaluation import evaluate_policy  # noqa: PLC0415
    from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: PLC0415

    from bench_preference_h2h import EVAL_EPISODES, random_policy_return  # noqa: PLC0415

    _Tanh = _tanh_layer()

    s = SimpleNamespace(**sizes)  # the demo's settings, from the parent
    th.set_num_threads(1)

    def bare():
        return gym.make("InvertedPendulum-v4", disable_env_checker=True).unwrapped

    def make():
        return gym.wrappers.TimeLimit(AbsorbAfterDoneWrapper(bare()), HORIZON)

    def agent(env, seed_, relabel=None):
        buffer = {} if relabel is None else dict(  # imitation's train_preference_comparisons for off-policy agents
            replay_buffer_class=ReplayBufferRewardWrapper,
            replay_buffer_kwargs=dict(replay_buffer_class=ReplayBuffer, reward_fn=relabel))
        return SAC("MlpPolicy", env, **buffer, learning_rate=s.learning_rate, buffer_size=s.sac_buffer,
                   learning_starts=s.sac_learning_starts, batch_size=s.sac_batch, tau=0.005, gamma=s.gamma,
                   train_freq=1, gradient_steps=s.sac_updates_per_step, ent_coef="auto_1.0",
                   policy_kwargs=dict(net_arch=list(s.sac_hidden)), seed=seed_, device="cpu", verbose=0)

    def true_return(model, episodes, eval_seed):
        env = DummyVecEnv([make])
        env.seed(eval_seed)
        r, _ = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=False, return_episode_rewards=True)
        return float(np.mean(r))

    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    th.manual_seed(seed)
    venv = DummyVecEnv([make] * s.sac_envs)
    venv.seed(seed)
    inputs = getattr(s, "input_norm", "none")  # the reward nets' input layer (see run's ``input_norm``)
    layer = dict(running=dict(normalize_input_layer=RunningNorm), tanh=dict(normalize_input_layer=_Tanh),
                 none={})[inputs]
    nets = [BasicRewardNet(venv.observation_space, venv.action_space, use_state=True, use_action=s.use_action,
                           use_next_state=s.use_next_state, use_done=False, hid_sizes=(32, 32), **layer)
            for _ in range(s.num_members)]
    if getattr(s, "reward_norm", False):  # imitation's reward_ensemble config: each member's output RunningNorm
        nets = [NormalizedRewardNet(n, RunningNorm) for n in nets]
    ensemble = RewardEnsemble(venv.observation_space, venv.action_space, nets)
    agent_reward = AddSTDRewardWrapper(ensemble, default_alpha=0.0)
    learner = agent(venv, seed, functools.partial(agent_reward.predict_processed, update_stats=False)
                    if s.relabel else None)
    k = s.num_iterations
    agent_total = (k + 1) * (s.total_timesteps // k) + s.total_timesteps % k  # K + 1 rounds of agent training
    generator = pcmp.AgentTrainer(learner, agent_reward, venv, rng=rng,
                                  exploration_frac=0.0)
    trainer = pcmp.EnsembleTrainer(pcmp.PreferenceModel(ensemble), pcmp.CrossEntropyRewardLoss(), rng=rng,
                                   batch_size=32, epochs=1, lr=s.reward_learning_rate)
    loop = pcmp.PreferenceComparisons(
        generator, ensemble, num_iterations=k, fragmenter=pcmp.RandomFragmenter(warning_threshold=0, rng=rng),
        preference_gatherer=pcmp.SyntheticGatherer(sample=False, rng=rng), reward_trainer=trainer,
        fragment_length=s.fragment_length, transition_oversampling=1, initial_comparison_frac=0.1,
        initial_epoch_multiplier=200.0, allow_variable_horizon=False, query_schedule="hyperbolic",
    )
    marks, gt, gaps = [], [], []
    upright, fallen = _probe_states(bare, seed)
    t0 = time.perf_counter()

    def gap():  # the ensemble's mean learned reward on upright states minus on fallen (absorbing) ones
        r = [float(np.mean(ensemble.predict(o, np.zeros((len(o), 1), np.float32), o, np.zeros(len(o), bool),
                                            update_stats=False)))  # the probe leaves the normalisers alone
             for o in (upright, fallen)]
        return r[0] - r[1]

    def each_round(i):  # a round's evaluation on the true reward, inside the timed loop (as jaxweight's)
        gt.append(true_return(learner, EVAL_EPISODES, seed + 100 + i))
        marks.append(time.perf_counter() - t0)
        gaps.append(gap())  # after the mark: a diagnostic, outside the timed loop's measure
        print(f"[imitation] round {i}: true return {gt[-1]:.1f} at {marks[-1]:.0f} s; learned reward upright - "
              f"fallen {gaps[-1]:+.3f}", file=sys.stderr, flush=True)

    loop.train(s.total_timesteps, s.total_comparisons, callback=each_round)
    train_s = time.perf_counter() - t0
    final = true_return(learner, s.final_episodes, seed + 1000)
    t1 = time.perf_counter()
    baseline = None
    if getattr(s, "baseline", True):
        base_env = DummyVecEnv([make] * s.sac_envs)
        base_env.seed(seed + 3000)
        base = agent(base_env, seed + 3000).learn(agent_total)
        baseline = true_return(base, s.final_episodes, seed + 4000)
    baseline_s = time.perf_counter() - t1
    rand = random_policy_return(make, seed, s.final_episodes, seed_actions=True)  # on the same environment
    return dict(relabel=bool(s.relabel), reward_norm=bool(getattr(s, "reward_norm", False)), input_norm=inputs,
                train_s=train_s, setup_s=t0 - t_start, round_s=marks, round_return=gt, round_reward_gap=gaps,
                final_returns=[final],
                baseline_returns=[baseline], random_returns=[rand], baseline_s=baseline_s,
                agent_steps=int(learner.num_timesteps), torch=th.__version__,
                versions={m: __import__(m).__version__ for m in ("imitation", "stable_baselines3", "mujoco",
                                                                 "gymnasium", "seals")},
                env="InvertedPendulum-v4 (MuJoCo), seals.util.AbsorbAfterDoneWrapper, TimeLimit 1000")


def _jaxweight_gaps(pc, params: list) -> list:
    """Per seed and round (``[seeds][rounds]``), the learned reward's member mean on the upright transitions
    minus on the fallen (absorbing) ones, over 64,000 steps of an untrained agent (imitation's worker prints the
    same measure on random-policy episodes)."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from jaxweight.preference.evaluation import predicted_rewards  # noqa: PLC0415

    gen = pc.generator
    probe = gen.sample(gen.init(jax.random.key(7)), jax.random.key(8), 64_000)
    true, mask = np.asarray(probe.rews), np.asarray(probe.step_mask())
    up, down = (true == 1) & mask, (true == 0) & mask
    score = jax.jit(jax.vmap(lambda p: predicted_rewards(pc.reward_module, p, probe, ensemble=pc.ensemble)))
    rows = []
    for p in params:  # one row per round: the rounds' parameters were kept on the host
        pred = np.asarray(score(p))  # [seeds, N, T]
        rows.append((pred * up).sum((1, 2)) / up.sum() - (pred * down).sum((1, 2)) / down.sum())
    return np.asarray(rows).T.tolist()


def _worker_jaxweight(sizes: dict, seeds: int) -> dict:
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from jaxweight.demos import preferences as D  # noqa: PLC0415

    sizes = dict(sizes)
    with_baseline = sizes.pop("baseline", True)
    seed = int(sizes.pop("seed", 0))  # the run's seed (``seeds`` vmapped seeds split from it)
    s = _settings(sizes, seeds)
    t0 = time.perf_counter()
    pc = D.build(s)
    marks, params = [], []

    def each_round(i, n, host):
        marks.append(time.perf_counter() - t0)
        params.append(jax.device_get(pc.state.reward.params))  # for the learned-reward diagnostic after the loop
        print(f"[jaxweight] round {i}: true return {np.asarray(host['gt_return']).round(1).tolist()} at "
              f"{marks[-1]:.0f} s", file=sys.stderr, flush=True)

    pc.train(seed, s.total_timesteps, s.total_comparisons, num_seeds=seeds, progress=each_round)
    train_s = time.perf_counter() - t0
    gaps = _jaxweight_gaps(pc, params)
    key = jax.random.key(seed)
    final = D.evaluate(pc, s, jax.random.fold_in(key, 1))
    agent_total = sum(pc.plan(s.total_timesteps, s.total_comparisons).agent_steps)
    t1 = time.perf_counter()
    base = (D.true_reward_baseline(pc, s, jax.random.fold_in(key, 2), agent_total) if with_baseline
            else np.full(seeds, np.nan))
    baseline_s = time.perf_counter() - t1
    rnd = D.random_return(pc, s, jax.random.fold_in(key, 3))
    gt = np.asarray([h["gt_return"] for h in pc.history], np.float64)  # [rounds, seeds]
    return dict(train_s=train_s, round_s=marks, round_return=gt.T.tolist(), round_reward_gap=gaps,
                final_returns=final["return"].tolist(),
                baseline_returns=base.tolist(), random_returns=rnd.tolist(), baseline_s=baseline_s,
                agent_steps=int(agent_total), settings=dataclasses.asdict(s), env=ENV, jax=jax.__version__)


# ----------------------------------------------------------------------- run
def _side(r: dict, i: int, baseline: float | None = None) -> dict:
    """Seed ``i`` of a side's result: time to the target, final normalised score (against ``baseline`` if given,
    else the side's own baseline run)."""
    rounds = r["round_return"] if isinstance(r["round_return"][0], list) else [r["round_return"]]
    b = r["baseline_returns"][i] if baseline is None else baseline
    z, f = r["random_returns"][i], r["final_returns"][i]
    span = b - z
    gaps = r.get("round_reward_gap")
    gaps = None if gaps is None else (gaps[i] if gaps and isinstance(gaps[0], list) else gaps)
    return dict(time_to_target_s=time_to_target(r["round_s"], rounds[i], b, z), baseline=b, random=z, final=f,
                final_normalised=(f - z) / span if span > 0 else None, round_return=rounds[i],
                round_reward_gap=gaps)


def recorded_baselines(path: str | Path, seeds: int) -> dict:
    """Each side's true-reward baseline return per seed, from the per-seed rows of an earlier results file of
    this bench (same settings and seeds)."""
    import json  # noqa: PLC0415

    rows = {r["name"]: r for r in json.loads(Path(path).read_text())}
    out = {"imitation": [], "jaxweight": []}
    for seed in range(seeds):
        row = rows.get(f"time to {TARGET} of the true-reward baseline, seed {seed}")
        if row is None:
            raise ValueError(f"baselines_from: {path} has no row for seed {seed}")
        for side in out:
            out[side].append(float(row[side]["baseline"]))
    return out


def _jobs(seeds: int) -> list[tuple[str, int]]:
    """The workers of a paired run, in the order they start: each seed's two sides next to each other, so that
    the seeds finish in pairs (each side's seed ``k`` is a process of its own)."""
    return [(side, seed) for seed in range(seeds) for side in ("imitation", "jaxweight")]


def _schedule(jobs: list, cores: list, launch, done) -> None:
    """Run ``launch(job, core)`` (a started worker) for every job, at most one per core at a time, each next job
    on the first core to fall free; ``done(job, result)`` as each finishes (in this thread, in finishing order)."""
    import queue  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from bench_preference_h2h import finish  # noqa: PLC0415

    free, out = queue.Queue(), queue.Queue()
    for c in cores:
        free.put(c)

    def one(job, core):
        try:
            out.put((job, core, finish(launch(job, core), timeout=4 * 3600), None))
        except BaseException as e:  # noqa: BLE001  (reported in the calling thread)
            out.put((job, core, None, e))

    pending, running = list(jobs), 0
    while pending or running:
        while pending and not free.empty():
            threading.Thread(target=one, args=(pending.pop(0), free.get()), daemon=True).start()
            running += 1
        job, core, result, err = out.get()
        running -= 1
        free.put(core)
        if err is not None:
            raise RuntimeError(f"head-to-head worker {job[0]} seed {job[1]} failed") from err
        done(job, result)


def run(quick: bool = False, seeds: int = 1, relabel: bool = True, input_norm: str = "none",
        reward_norm: bool = False, baselines_from: str | None = None, baseline_ceiling: bool = False,
        parts: str | None = None) -> list[dict]:
    """The head-to-head rows.

    Args:
      quick: the quick settings (no goal judged).
      seeds: seeds a side; every side's seed is a fresh process pinned to a core of its own, the next one
        starting on the first core to fall free (a seed's two sides start next to each other).
      relabel: imitation's SAC relabels its replay with the current reward model.
      input_norm: imitation's reward nets' input layer: ``"none"`` (raw observations), ``"running"``
        (``imitation.util.networks.RunningNorm``, what imitation's ``train_preference_comparisons`` script puts
        in front of a ``BasicRewardNet`` by default) or ``"tanh"`` (``tanh(obs)``: jaxweight's reward-net input
        on brax, whose observation space is unbounded).
      reward_norm: each of imitation's reward nets inside ``NormalizedRewardNet(net, RunningNorm)`` (the output
        normalisation imitation's script adds by default; jaxweight's loop standardises its agent's reward
        over the buffer's transitions).
      baselines_from: a results file of this bench whose per-seed rows give both sides' true-reward baselines
        (same settings and seeds); neither side then trains its baseline again.
      baseline_ceiling: both sides' baseline is the task's maximum return (``HORIZON``: 1 per upright step)
        instead of a trained agent's; no baseline is trained. No true-reward agent can beat the maximum, so
        the normalised scores and the times to the target are then the strictest ones (a lower bound on the
        score, an upper bound on the time, against any true-reward baseline).
      parts: a folder where every side's seed is written as it finishes (``<side>-seed<k>.json``, atomically,
        with the settings it ran with); a later run with the same folder and settings reuses them.
    """
    if input_norm not in ("none", "running", "tanh"):
        raise ValueError(f"input_norm must be 'none', 'running' or 'tanh', not {input_norm!r}")
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, not {seeds}")
    if baseline_ceiling and baselines_from is not None:
        raise ValueError("baseline_ceiling and baselines_from both name the baselines: give one")
    from _common import record  # noqa: PLC0415
    from bench_preference_h2h import PYTHON_VAR, imitation_python, start  # noqa: PLC0415

    sizes = QUICK if quick else FULL
    missing = peers_missing()
    s = None if "brax" in missing else _settings(sizes)
    size = ("InvertedPendulum, horizon 1000, SAC" if s is None else
            f"InvertedPendulum, horizon 1000, SAC, {s.total_timesteps:.0e} steps, {s.total_comparisons} comparisons, "
            f"{s.num_iterations + 1} rounds, L={s.fragment_length}, M={s.num_members}")
    if missing:
        return [record(MODULE, "time to 0.8 of the true-reward baseline vs imitation + stable-baselines3 (MuJoCo)",
                       size, None, "skipped", None,
                       note=f"skipped: {', '.join(missing)} not importable (jaxweight[brax] here; pip install "
                            f"imitation==1.0.1 torch==2.13.0 'mujoco<3.2' imageio in ${PYTHON_VAR} or here)")]
    given = (recorded_baselines(baselines_from, seeds) if baselines_from is not None
             else {side: [float(HORIZON)] * seeds for side in ("imitation", "jaxweight")} if baseline_ceiling
             else None)
    me = Path(__file__).resolve()
    affinity = sorted(os.sched_getaffinity(0))
    two = len(affinity) >= 2
    cores = affinity[: 2 * seeds] if two else [None]
    worker_sizes = {"imitation": dict(dataclasses.asdict(s), relabel=relabel, input_norm=input_norm,
                                      reward_norm=reward_norm, baseline=given is None),
                    "jaxweight": dict(sizes, baseline=given is None)}
    results = {"imitation": [None] * seeds, "jaxweight": [None] * seeds}
    folder = None if parts is None else Path(parts)

    def part(side, seed):
        return folder / f"{side}-seed{seed}.json"

    def launch(job, core):
        side, seed = job
        if side == "imitation":
            return start(side, dict(worker_sizes[side]), seed, None, script=me, python=imitation_python(),
                         core=core, show=True)
        return start(side, dict(worker_sizes[side], seed=seed), 1, None, script=me, core=core, show=True)

    def done(job, result):
        results[job[0]][job[1]] = result
        if folder is not None:
            from jaxweight.checkpoint import save_json  # noqa: PLC0415

            save_json(part(*job), dict(settings=worker_sizes[job[0]], cores=len(cores), result=result))

    jobs = _jobs(seeds)
    if folder is not None:  # finished parts of an earlier run with the same settings
        import json  # noqa: PLC0415

        folder.mkdir(parents=True, exist_ok=True)
        for job in list(jobs):
            if part(*job).exists():
                kept = json.loads(part(*job).read_text())
                if kept["settings"] != json.loads(json.dumps(worker_sizes[job[0]])):  # tuples read back as lists
                    raise ValueError(f"parts: {part(*job)} ran with other settings; give another folder")
                results[job[0]][job[1]] = kept["result"]
                jobs.remove(job)
    _schedule(jobs, cores, launch, done)
    how = ((f"every side's seed a fresh process pinned to one core, {len(cores)} cores" if two
            else "one after the other on one core") + ", cold"
           + ("" if relabel else "; imitation's replay not relabelled")
           + ("" if input_norm == "none" else f"; imitation's reward nets' input layer {input_norm}")
           + ("" if not reward_norm else "; imitation's reward nets' output normalised (RunningNorm)")
           + ("" if baselines_from is None else f"; true-reward baselines from {baselines_from}")
           + ("" if not baseline_ceiling else f"; both baselines the task's maximum return {HORIZON}, no "
              "baseline trained (the strictest normalisation)"))
    recs = []
    for seed in range(seeds):
        a = _side(results["imitation"][seed], 0, None if given is None else given["imitation"][seed])
        b = _side(results["jaxweight"][seed], 0, None if given is None else given["jaxweight"][seed])
        when = {k: "never" if v["time_to_target_s"] is None else f"{v['time_to_target_s']:.0f} s"
                for k, v in (("imitation", a), ("jaxweight", b))}
        note = (f"seed {seed}: time to {TARGET} of the own true-reward baseline: imitation {when['imitation']}, "
                f"jaxweight {when['jaxweight']}; final "
                f"normalised imitation {a['final_normalised']:.2f} ({a['final']:.1f}; baseline {a['baseline']:.1f}, "
                f"random {a['random']:.1f}), jaxweight {b['final_normalised']:.2f} ({b['final']:.1f}; baseline "
                f"{b['baseline']:.1f}, random {b['random']:.1f}); {how}")
        recs.append(record(MODULE, f"time to {TARGET} of the true-reward baseline, seed {seed}", size,
                           b["time_to_target_s"], "imitation + SB3 SAC, same seed", a["time_to_target_s"],
                           goal=None if quick else "both sides reach 0.8 of their own true-reward baseline",
                           met=None if quick else (a["time_to_target_s"] is not None
                                                   and b["time_to_target_s"] is not None),
                           note=note, imitation=a, jaxweight=b))
    ib, jb = results["imitation"], results["jaxweight"]
    recs.append(record(MODULE, f"whole loop ({s.num_iterations + 1} rounds), per seed", size,
                       sum(r["train_s"] for r in jb) / seeds, f"imitation + SB3 SAC, {seeds} seed(s)",
                       sum(r["train_s"] for r in ib) / seeds,
                       note=f"loop wall, compilation and per-round evaluations included; {how}" + (
                           "" if given is not None else f"; true-reward baselines: jaxweight "
                           f"{sum(r['baseline_s'] for r in jb):.0f} s, imitation "
                           f"{sum(r['baseline_s'] for r in ib):.0f} s for {seeds} seed(s)"),
                       imitation=ib, jaxweight=jb))
    return recs


def _arguments(p) -> None:
    p.add_argument("--seeds", type=int, default=1, help="seeds a side (run's seeds)")
    p.add_argument("--input-norm", dest="input_norm", default="none", choices=("none", "running", "tanh"),
                   help="imitation's reward nets' input layer (run's input_norm)")
    p.add_argument("--reward-norm", dest="reward_norm", action="store_true",
                   help="imitation's reward nets' output through RunningNorm (run's reward_norm)")
    p.add_argument("--baselines-from", dest="baselines_from", metavar="JSON",
                   help="both sides' true-reward baselines from this earlier results file of the bench")
    p.add_argument("--baseline-ceiling", dest="baseline_ceiling", action="store_true",
                   help=f"both sides' baseline the task's maximum return ({HORIZON}); no baseline trained")
    p.add_argument("--parts", metavar="DIR",
                   help="write every side's seed here as it finishes; reuse the ones a run with the same "
                        "settings left")


if __name__ == "__main__":
    from bench_preference_h2h import entry

    entry({"imitation": _worker_imitation, "jaxweight": _worker_jaxweight}, run, _arguments)
