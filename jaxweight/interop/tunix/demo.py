"""tunix's tiny model on a toy reward: ``"jaxweight_maxent"`` + the curriculum iterator vs tunix's ``"grpo"``.

``python -m jaxweight.interop.tunix.demo [--steps 40] [--seeds 5]`` (needs ``.[tunix]``; CPU).
The model is tunix's own test ``ToyTransformer`` with its ``MockVocab`` (22 words); a
prompt is two words, and the reward of a completion is the fraction of its words found in
the prompt (about 0.1 for the untrained model). Both arms get the same budget: steps,
prompts per step, generations, optimiser, KL coefficient, initial weights, prompt pool:

- ``grpo``: tunix's defaults, ``advantage_estimator="grpo"``, ``policy_loss_fn="grpo"``,
  prompts drawn uniformly;
- ``maxent``: ``"jaxweight_maxent"`` estimator and policy loss (tau controller toward a
  weight-entropy target), prompts drawn by :class:`CurriculumPromptIterator`
  (``prioritized``: Prioritized Level Replay on the group mean reward).

Each run ends with an evaluation of the mean reward over every prompt of the pool (8
samples each). It prints one line per run and a summary (mean +- std over seeds).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

POOL_SIZE = 16


def prompt_pool(seed: int = 0) -> np.ndarray:
    """``POOL_SIZE`` two-word prompts over the words of tunix's ``MockVocab``."""
    from tunix.tests.test_common import MockVocab

    words = [w for w, i in MockVocab.DEFAULT_MAPPING.items() if i >= 3]
    idx = np.random.default_rng(seed).integers(0, len(words), size=(POOL_SIZE, 2))
    return np.array([f"{words[a]} {words[b]}" for a, b in idx])


def reward(prompts, completions, **kwargs):
    """Fraction of a completion's words that appear in its prompt (0 for an empty completion)."""
    out = []
    for p, c in zip(prompts, completions):
        target, words = set(str(p).split()), str(c).split()
        out.append(sum(w in target for w in words) / max(len(words), 1))
    return out


def _cluster(seed: int, steps: int, lr: float):
    import jax
    import optax
    from flax import nnx
    from tunix.rl import rl_cluster as rlc
    from tunix.rl.rollout.base_rollout import RolloutConfig
    from tunix.tests.test_common import MockVocab, ModelConfig, ToyTransformer

    vocab = MockVocab()

    def model():
        return ToyTransformer(config=ModelConfig(vocab_size=vocab.GetPieceSize()), rngs=nnx.Rngs(seed))

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    cfg = rlc.ClusterConfig(
        role_to_mesh={r: mesh for r in rlc.Role}, rollout_engine="vanilla",
        training_config=rlc.RLTrainingConfig(actor_optimizer=optax.adam(lr), eval_every_n_steps=10**9,
                                             max_steps=steps),
        rollout_config=RolloutConfig(max_tokens_to_generate=6, max_prompt_length=4, kv_cache_size=16,
                                     temperature=1.0))
    return rlc.RLCluster(actor=model(), reference=model(), tokenizer=vocab, cluster_config=cfg)


def evaluate(cluster, pool: np.ndarray, samples: int = 8) -> float:
    """Mean reward of ``samples`` completions of every prompt of the pool."""
    from tunix.rl import rl_cluster as rlc

    prompts = list(np.repeat(pool, samples))
    out = cluster.generate(prompts=prompts, mode=rlc.Mode.EVAL)
    return float(np.mean(reward(prompts, out.text)))


def run(arm: str, seed: int, steps: int, *, batch: int = 4, generations: int = 4, lr: float = 3e-3,
        beta: float = 0.04, eval_samples: int = 8) -> dict:
    """One training run of ``arm`` (``"grpo"`` or ``"maxent"``); returns its numbers."""
    if arm not in ("grpo", "maxent"):
        raise ValueError(f"arm must be 'grpo' or 'maxent', got {arm!r}")
    from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner

    from ... import curriculum, maxent
    from . import CurriculumPromptIterator, MaxEntAdvantageEstimator, register

    pool = prompt_pool()
    cluster = _cluster(seed, steps, lr)
    before = evaluate(cluster, pool, eval_samples)
    train_rewards: list[float] = []

    def log(prompts, completions, rewards, advantages, **kwargs):
        train_rewards.append(float(np.mean(rewards)))
        return {}

    if arm == "grpo":
        rng = np.random.default_rng(seed)
        data = [{"prompts": pool[rng.integers(0, len(pool), size=batch)]} for _ in range(steps)]
        metric_fns = [log]
        algo = GRPOConfig(num_generations=generations, beta=beta)
    else:
        register(maxent_estimator=MaxEntAdvantageEstimator(maxent.config(
            tau=0.5, schedule=maxent.TauSchedule(target_entropy=0.8, learning_rate=0.05))))
        data = CurriculumPromptIterator({"prompts": pool}, curriculum.config("prioritized", capacity=len(pool)),
                                        batch_size=batch, num_generations=generations, seed=seed)
        metric_fns = [log, data.metric_fn]
        algo = GRPOConfig(num_generations=generations, beta=beta, advantage_estimator="jaxweight_maxent",
                          policy_loss_fn="jaxweight_maxent")
    t0 = time.perf_counter()
    GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=reward, metric_fns=metric_fns).train(data)
    seconds = time.perf_counter() - t0
    return {"arm": arm, "seed": seed, "steps": steps, "eval_before": before, "eval_after": evaluate(cluster, pool, eval_samples),
            "train_reward_first5": float(np.mean(train_rewards[:5])),
            "train_reward_last5": float(np.mean(train_rewards[-5:])), "train_seconds": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxweight.interop.tunix.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    runs = []
    for seed in range(args.seeds):
        for arm in ("grpo", "maxent"):
            r = run(arm, seed, args.steps)
            runs.append(r)
            print(f"{arm:6s} seed {seed}: eval {r['eval_before']:.3f} -> {r['eval_after']:.3f}, train reward "
                  f"{r['train_reward_first5']:.3f} -> {r['train_reward_last5']:.3f} ({r['train_seconds']:.0f} s)",
                  flush=True)
    for arm in ("grpo", "maxent"):
        after = np.array([r["eval_after"] for r in runs if r["arm"] == arm])
        print(f"{arm:6s} eval reward after {args.steps} steps: {after.mean():.3f} +- {after.std():.3f} "
              f"over {len(after)} seeds")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
