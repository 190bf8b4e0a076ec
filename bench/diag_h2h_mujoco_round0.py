"""Diagnostic for the MuJoCo head-to-head: round 0 of the reward training alone, the same comparisons into
imitation's trainer and into jaxweight's, then the learned reward's upright - fallen gap.

``export``: in imitation's environment, per seed, 20 random-policy episodes of the absorbing InvertedPendulum the
head-to-head uses (gymnasium's MuJoCo ``InvertedPendulum-v4``, seals' ``AbsorbAfterDoneWrapper``, 1000 steps),
200 pairs of 50-step fragments by imitation's ``RandomFragmenter`` and the labels of its ``SyntheticGatherer``
(``sample=False``): round 0 of the loop, whose agent has not trained yet. Also the probe: the states of 64
random-policy episodes before the fall (upright) and after it (fallen). Written to ``DIR/round0-seedN.npz``.

``imitation`` / ``jaxweight``: each seed's comparisons into that library's ensemble trainer with the
head-to-head's settings (3 members of (32, 32) ReLU MLPs on the state, AdamW lr 1e-3, batch 32, one bootstrap
sample per member, 200 epochs: round 0's epoch multiplier), the reward nets' input raw or through ``tanh`` (what
jaxweight's reward net does on brax, whose observations are unbounded); the gap (ensemble mean on the upright
probe states minus on the fallen ones) before and after training. Rows are written to ``--json`` as they come.

``$JAXWEIGHT_IMITATION_PYTHON bench/diag_h2h_mujoco_round0.py export DIR --seeds 4``, then
``... imitation DIR --seeds 2 --input tanh --json P`` and ``python bench/diag_h2h_mujoco_round0.py jaxweight DIR
--seeds 4 --input tanh,none --json P``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PAIRS, FRAGMENT, EPISODES, MEMBERS, EPOCHS = 200, 50, 20, 3, 200.0


# provenance and the atomic write kept here: the export and imitation modes run in imitation's environment, which
# has no jax, so neither bench/_common nor jaxweight._util can be imported there
def _provenance() -> dict:
    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip()
    return dict(command=" ".join(["python", *sys.argv]), commit=commit + (" + uncommitted changes" if dirty else ""),
                machine=f"{platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def _write(path: str | None, rows: list, meta: dict) -> None:
    if path:
        tmp = f"{path}.tmp"
        Path(tmp).write_text(json.dumps(dict(meta, rows=rows), indent=1))
        os.replace(tmp, path)


def export(folder: Path, seeds: int) -> None:
    import gymnasium as gym  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from imitation.algorithms import preference_comparisons as pcmp  # noqa: PLC0415
    from imitation.data import rollout  # noqa: PLC0415
    from seals.util import AbsorbAfterDoneWrapper  # noqa: PLC0415
    from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: PLC0415

    from bench_preference_h2h_mujoco import HORIZON, _probe_states  # noqa: PLC0415

    def bare():
        return gym.make("InvertedPendulum-v4", disable_env_checker=True).unwrapped

    def make():
        return gym.wrappers.TimeLimit(AbsorbAfterDoneWrapper(bare()), HORIZON)

    up, down = _probe_states(bare, 0)
    folder.mkdir(parents=True, exist_ok=True)
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        venv = DummyVecEnv([make] * 16)
        venv.seed(seed)
        trajs = rollout.generate_trajectories(None, venv, rollout.make_sample_until(min_episodes=EPISODES), rng=rng)
        pairs = pcmp.RandomFragmenter(warning_threshold=0, rng=rng)(trajs, FRAGMENT, PAIRS)
        prefs = pcmp.SyntheticGatherer(sample=False, rng=rng)(pairs)
        stack = lambda field: np.stack([np.stack([getattr(f, field) for f in p]) for p in pairs]).astype(np.float32)  # noqa: E731
        np.savez(folder / f"round0-seed{seed}.npz", obs=stack("obs"), acts=stack("acts"), rews=stack("rews"),
                 prefs=np.asarray(prefs, np.float32), up=up, down=down)
        print(f"seed {seed}: {int(np.sum(np.abs(prefs - 0.5) > 1e-6))} of {PAIRS} pairs decided", flush=True)


def train_imitation(d, seed: int, squash: bool) -> tuple[float, float]:
    import gymnasium as gym  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import torch as th  # noqa: PLC0415
    from imitation.algorithms import preference_comparisons as pcmp  # noqa: PLC0415
    from imitation.data.types import TrajectoryWithRew  # noqa: PLC0415
    from imitation.rewards.reward_nets import BasicRewardNet, RewardEnsemble  # noqa: PLC0415

    from bench_preference_h2h_mujoco import _tanh_layer  # noqa: PLC0415

    th.set_num_threads(1)
    th.manual_seed(seed)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (d["obs"].shape[-1],), np.float32)
    act_space = gym.spaces.Box(-3.0, 3.0, (d["acts"].shape[-1],), np.float32)
    layer = dict(normalize_input_layer=_tanh_layer()) if squash else {}
    ens = RewardEnsemble(obs_space, act_space, [BasicRewardNet(obs_space, act_space, use_action=False,
                                                               hid_sizes=(32, 32), **layer) for _ in range(MEMBERS)])
    frag = lambda i, j: TrajectoryWithRew(obs=d["obs"][i, j], acts=d["acts"][i, j], infos=None, terminal=False,  # noqa: E731
                                          rews=d["rews"][i, j])
    ds = pcmp.PreferenceDataset()
    ds.push([(frag(i, 0), frag(i, 1)) for i in range(len(d["prefs"]))], d["prefs"])

    def gap():
        r = [float(np.mean(ens.predict(o, np.zeros((len(o), 1), np.float32), o, np.zeros(len(o), bool))))
             for o in (d["up"], d["down"])]
        return r[0] - r[1]

    before = gap()
    trainer = pcmp.EnsembleTrainer(pcmp.PreferenceModel(ens), pcmp.CrossEntropyRewardLoss(),
                                   rng=np.random.default_rng(seed), batch_size=32, epochs=1, lr=1e-3)
    trainer.train(ds, epoch_multiplier=EPOCHS)
    return before, gap()


def train_jaxweight(d, seed: int, squash: bool) -> tuple[float, float]:
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxweight.preference import buffer as pbuf  # noqa: PLC0415
    from jaxweight.preference.data import fragment_pairs_from_arrays  # noqa: PLC0415
    from jaxweight.preference.env_rewards import reward_net  # noqa: PLC0415
    from jaxweight.preference.trainer import RewardTrainer  # noqa: PLC0415
    from jaxweight.rl.envs import make_env  # noqa: PLC0415

    env, params = make_env("brax:inverted_pendulum")
    net = reward_net(env, params, use_next_state=False, use_action=False)  # the demo's: tanh(obs / 1) inside
    if not squash:
        net = net.net  # the RewardMLP alone: raw observations
    pairs = fragment_pairs_from_arrays(d["obs"], d["acts"], d["rews"])
    cfg = pbuf.config(len(d["prefs"]))
    buf = pbuf.step(pbuf.init(cfg, example_pairs=pairs), pairs, jnp.asarray(d["prefs"]), cfg)
    trainer = RewardTrainer(net, num_members=MEMBERS, learning_rate=1e-3)
    state = trainer.init(jax.random.key(seed), pairs)

    def gap(p):
        r = []
        for o in (d["up"], d["down"]):
            o = jnp.asarray(o)
            r.append(float(jnp.mean(jax.vmap(lambda q: net.apply(q, o, jnp.zeros((len(o), 1)), o,
                                                                  jnp.zeros(len(o), bool)))(p))))
        return r[0] - r[1]

    before = gap(state.params)
    state, _ = trainer.train(state, jax.random.key(100 + seed), buf, epoch_multiplier=EPOCHS)
    return before, gap(state.params)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("export", "imitation", "jaxweight"))
    p.add_argument("folder", type=Path)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--input", default="tanh,none", help="comma-separated: tanh, none")
    p.add_argument("--json")
    a = p.parse_args()
    if a.mode == "export":
        export(a.folder, a.seeds)
        return
    import numpy as np  # noqa: PLC0415

    train = train_imitation if a.mode == "imitation" else train_jaxweight
    meta = dict(_provenance(), trainer=a.mode, settings=dict(pairs=PAIRS, fragment_length=FRAGMENT,
                members=MEMBERS, epochs=EPOCHS, lr=1e-3, batch=32))
    rows = []
    for inputs in a.input.split(","):
        if inputs not in ("tanh", "none"):
            raise SystemExit(f"--input: tanh or none, not {inputs!r}")
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            d = dict(np.load(a.folder / f"round0-seed{seed}.npz"))
            t = time.perf_counter()
            before, after = train(d, seed, inputs == "tanh")
            rows.append(dict(trainer=a.mode, input=inputs, seed=seed,
                             decided_pairs=int(np.sum(np.abs(d["prefs"] - 0.5) > 1e-6)),
                             gap_before=before, gap_after=after, train_s=time.perf_counter() - t))
            print(rows[-1], flush=True)
            _write(a.json, rows, meta)


if __name__ == "__main__":
    main()
