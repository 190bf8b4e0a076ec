"""``MaxEntGRPOLearner``: tunix's ``GRPOLearner`` with the full MaxEnt weighting (imports tunix)."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from ... import maxent
from ._compat import tunix_modules, tunix_step
from .estimators import MaxEntAdvantageEstimator, centred_from_weights
from .loss import masked_token_mean

_, _, grpo_learner, rlc = tunix_modules()

__all__ = ["MaxEntTrainExample", "MaxEntGRPOLearner"]


@flax.struct.dataclass(frozen=True)
class MaxEntTrainExample(grpo_learner.TrainExample):
    """tunix's ``TrainExample`` plus the per-step values of the weighting, as f32[B] arrays.

    Attributes:
      maxent_beta: f32[B] the controller's beta (the same value on every row).
      maxent_scale: f32[B] SEED-GRPO scale of each row's group (1 without SEED).
    """

    maxent_beta: jax.Array | None = None
    maxent_scale: jax.Array | None = None


class MaxEntGRPOLearner(grpo_learner.GRPOLearner):
    """``GRPOLearner`` with the full MaxEnt weighting of :mod:`jaxweight.maxent`.

    Besides what the registry estimator sees (rewards), each batch gives the weighting:
    the reference log-probs (tunix computes them when ``algo_config.beta != 0``; then the
    weights use ``pi_ref^(beta/tau)`` and the token counts), the KL of the policy to the
    reference measured on the batch (fed to the beta controller), SEED-GRPO from the
    completions' answers (``seed_alpha``), and the train/eval mode (eval batches never
    advance the controllers). Advantages are the centred weights ``n*w - 1``; the
    controller's beta and the SEED scale travel in the example (:class:`MaxEntTrainExample`)
    to the ``"jaxweight_maxent"`` policy loss, never through the frozen ``algo_config``.

    Sequence packing is refused (it drops the extra fields and splits groups).

    Args:
      rl_cluster, algo_config, reward_fns, metric_fns, data_shuffle_seed: as ``GRPOLearner``
        (``algo_config.policy_loss_fn`` is typically ``"jaxweight_maxent"``; register() first).
      estimator: a :class:`MaxEntAdvantageEstimator` whose state the learner advances
        (default: a new one on ``maxent.config`` with ``beta=algo_config.beta``; the loss uses
        the controller's beta, so set it in the estimator's config).
      maxent_cfg: the config of the weighting (default ``estimator.cfg`` with the reference
        term on when tunix computes reference log-probs).
      seed_alpha: SEED-GRPO strength (None: off); answers by ``answer_fn``
        (default :func:`~jaxweight.maxent.extract_answer`).
      truncate_unfinished: zero the rewards of completions that hit ``max_tokens_to_generate``.
      save_dir, save_every: after ``k`` weighted train batches, ``k`` a multiple of
        ``save_every`` (tunix's checkpoint interval), write ``save_dir/maxent_{k}.ckpt``; a
        learner built on a resumed tunix run (step ``k > 0``) restores it. With one
        micro-batch per step, ``k`` is tunix's step counter.

    Raises:
      ValueError: sequence packing on, or a resumed run without its snapshot.
    """

    def __init__(self, rl_cluster, algo_config, reward_fns, metric_fns=None, data_shuffle_seed=None, *,
                 estimator: MaxEntAdvantageEstimator | None = None,
                 maxent_cfg: maxent.MaxEntConfig | None = None, seed_alpha: float | None = None,
                 answer_fn: Callable[[str], str] = maxent.extract_answer, truncate_unfinished: bool = False,
                 save_dir: str | os.PathLike | None = None, save_every: int = 0):
        if rl_cluster.cluster_config.training_config.max_seq_token_per_tpu is not None:
            raise ValueError("MaxEntGRPOLearner needs whole groups and its extra example fields: turn off "
                             "sequence packing (RLTrainingConfig.max_seq_token_per_tpu=None)")
        super().__init__(rl_cluster=rl_cluster, algo_config=algo_config, reward_fns=reward_fns,
                         metric_fns=metric_fns, data_shuffle_seed=data_shuffle_seed)
        if estimator is None:  # the controller starts from tunix's beta
            estimator = MaxEntAdvantageEstimator(maxent.config(beta=float(self.algo_config.beta or 0.0)))
        self.estimator = estimator
        base = self.estimator.cfg if maxent_cfg is None else maxent_cfg
        self.maxent_cfg = base.replace(include_reference_term=bool(self.algo_config.beta))
        self.seed_alpha, self.answer_fn = seed_alpha, answer_fn
        self.truncate_unfinished = truncate_unfinished
        self.save_dir = None if save_dir is None else Path(save_dir)
        self.save_every = int(save_every)
        self._seen = threading.local()
        step = tunix_step(self)
        if self.save_dir is not None and step > 0:
            path = self.save_dir / f"maxent_{step}.ckpt"
            if not path.exists():
                raise ValueError(f"tunix resumes at step {step} but {path} does not exist: "
                                 f"save_every must divide tunix's checkpoint interval")
            self.estimator.restore(path)

    def _compute_rewards(self, prompts, completions, mode, step=None, **kwargs):
        rewards = super()._compute_rewards(prompts, completions, mode, step, **kwargs)
        self._seen.value = (list(completions), np.asarray(rewards, np.float32))
        return rewards

    def _generate_and_compute_advantage(self, training_input, mode=rlc.Mode.TRAIN):
        ex = super()._generate_and_compute_advantage(training_input, mode)
        completions, rewards = self._seen.value
        g = int(self.algo_config.num_generations)
        train = mode == rlc.Mode.TRAIN
        est = self.estimator
        mask = ex.completion_mask
        tokens = jnp.sum(jnp.asarray(mask, jnp.float32), axis=-1)
        ref = kl = policy = None
        kl_valid = True
        if ex.ref_per_token_logps is not None or self.seed_alpha is not None:
            per_tok = ex.old_per_token_logps
            if per_tok is None:
                per_tok = self.rl_cluster.get_old_per_token_logps(
                    prompt_tokens=ex.prompt_ids, completion_tokens=ex.completion_ids)
            policy = masked_token_mean(per_tok, mask)
        if ex.ref_per_token_logps is not None:
            ref = masked_token_mean(ex.ref_per_token_logps, mask)
            m = jnp.asarray(mask, jnp.float32)
            kl = jnp.sum((jnp.asarray(per_tok, jnp.float32) - ex.ref_per_token_logps) * m) / jnp.maximum(
                jnp.sum(m), 1.0)
            kl_valid = jnp.sum(m) > 0  # a KL over no token measured nothing: the beta controller skips it
        truncated = None
        if self.truncate_unfinished:
            limit = self.rl_cluster.get_rollout_config(mode).max_tokens_to_generate
            truncated = tokens >= limit
        out = est.weights(rewards, g, update=train, ref_logp=ref, token_counts=tokens, truncated=truncated,
                          measured_kl=kl, kl_valid=kl_valid, cfg=self.maxent_cfg)
        done = int(est.calls)
        if train and self.save_dir is not None and self.save_every and done % self.save_every == 0:
            est.save(self.save_dir / f"maxent_{done}.ckpt", step=done)  # what tunix step `done` resumes from
        adv = centred_from_weights(out.weights, out.valid)
        scale = jnp.ones((adv.shape[0],), jnp.float32)
        if self.seed_alpha is not None:
            answers = [[self.answer_fn(c) for c in completions[i:i + g]] for i in range(0, len(completions), g)]
            h = maxent.semantic_entropy(maxent.cluster_ids(answers), policy.reshape(-1, g))
            scale = maxent.seed_grpo_scale(h, self.seed_alpha, g)
            adv = adv * scale[:, None]
        logs = maxent.metrics_dict(out)
        if self.seed_alpha is not None:
            logs["maxent/seed_scale_mean"] = float(jnp.mean(scale))
        self.rl_cluster.buffer_metrics({k: (v, np.mean) for k, v in logs.items()}, mode=mode)
        b = adv.size
        fields = {f.name: getattr(ex, f.name) for f in dataclasses.fields(ex)}
        fields.update(advantages=jax.device_put(adv.reshape(-1)),
                      maxent_beta=jnp.full((b,), out.beta, jnp.float32),
                      maxent_scale=jnp.repeat(scale, g))
        return MaxEntTrainExample(**fields)



MaxEntGRPOLearner.TrainExample = MaxEntTrainExample
