"""The advantage estimators ``"jaxweight_grpo"`` and ``"jaxweight_maxent"`` on tunix's flat ``[P*G]`` rewards."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import checkpoint, maxent

__all__ = ["ESTIMATOR_GRPO", "ESTIMATOR_MAXENT", "grouped", "centred_from_weights", "GroupAdvantageEstimator",
           "MaxEntAdvantageEstimator"]

ESTIMATOR_GRPO = "jaxweight_grpo"
ESTIMATOR_MAXENT = "jaxweight_maxent"


def grouped(x: Any, num_generations: int, name: str = "rewards") -> jax.Array:
    """tunix's flat ``[P*G]`` layout (prompt-major, G consecutive completions) as f32[P, G].

    Args:
      x: f32[P*G] numpy or jax array (a sharded ``jax.Array`` stays on its devices).
      num_generations: G >= 1.
      name: argument name for errors.

    Returns:
      f32[P, G].

    Raises:
      ValueError: ``x`` not of rank 1, or its length not a multiple of G.
    """
    if isinstance(num_generations, bool) or not isinstance(num_generations, int | np.integer) or num_generations < 1:
        raise ValueError(f"num_generations must be an int >= 1, got {num_generations!r}")
    shape = np.shape(x)
    if len(shape) != 1:
        raise ValueError(f"{name} must have shape [P*G] (rank 1), got shape {shape}")
    if shape[0] % int(num_generations):
        raise ValueError(f"{name} has {shape[0]} entries, not a multiple of num_generations={num_generations}")
    return jnp.asarray(x, jnp.float32).reshape(-1, int(num_generations))


def _like_input(out: jax.Array, ref: Any) -> Any:
    """numpy in -> numpy out; jax in -> jax out (f32[P*G])."""
    flat = out.reshape(-1)
    return np.asarray(flat) if isinstance(ref, np.ndarray) else flat


def centred_from_weights(w: jax.Array, valid: jax.Array) -> jax.Array:
    """``n*w - 1`` on valid entries (n valid in the row), 0 elsewhere: f32[P, G], zero row sums.

    A full row gives ``G*w - 1``, so tunix's own policy losses read it as an advantage:
    above-uniform weights are pushed up, below-uniform ones down.
    """
    n = jnp.sum(valid, axis=-1, keepdims=True, dtype=jnp.float32)
    return jnp.where(valid, n * w - 1.0, 0.0)


def _grpo_flat(rewards, *, scale, eps, ddof, baseline):
    return maxent.group_advantages(rewards, scale=scale, eps=eps, ddof=ddof, baseline=baseline)


_grpo_jit = jax.jit(_grpo_flat, static_argnames=("scale", "ddof", "baseline"))


@dataclasses.dataclass(frozen=True)
class GroupAdvantageEstimator:
    """tunix advantage estimator ``"jaxweight_grpo"``: :func:`jaxweight.maxent.group_advantages`.

    Called by tunix as ``est(rewards=r, num_generations=G)`` on ``r: f32[P*G]``. The defaults
    (``eps=1e-6``, ``ddof=1``, ``scale="group"``) are tunix's ``"grpo"``: on finite rewards the two
    agree to float32 rounding. Where they differ, by design:

    - a NaN / inf reward is masked out: its advantage is 0 and its group is normalised over the
      remaining completions (tunix's ``"grpo"`` turns the whole group into NaN);
    - a group with fewer than two valid rewards gets 0 (tunix: NaN for one);
    - rewards up to the float32 range give finite advantages (tunix's float32 std overflows);
    - the result is float32 (tunix keeps the reward dtype, usually float64).

    Attributes:
      scale, eps, ddof, baseline: see :func:`jaxweight.maxent.group_advantages`
        (``scale="none"`` is Dr.GRPO, ``baseline="leave_one_out"`` RLOO).
    """

    scale: str = "group"
    eps: float = 1e-6
    ddof: int = 1
    baseline: str = "mean"

    def __post_init__(self):
        # every check once, here (same messages as maxent)
        maxent.group_advantages(np.zeros((1, 2), np.float32), scale=self.scale, eps=self.eps, ddof=self.ddof,
                                baseline=self.baseline)

    def __call__(self, rewards: Any, num_generations: int) -> Any:
        """Advantages f32[P*G] (numpy for numpy input, jax otherwise); 0 where the reward is not finite."""
        u = grouped(rewards, num_generations)
        a = _grpo_jit(u, scale=self.scale, eps=jnp.float32(self.eps), ddof=self.ddof, baseline=self.baseline)
        return _like_input(a, rewards)


class MaxEntAdvantageEstimator:
    """tunix advantage estimator ``"jaxweight_maxent"``: reference-free MaxEnt weights, stateful.

    Each call runs :func:`jaxweight.maxent.step` on the ``[P, G]`` rewards (no reference term:
    the registry passes no reference log-probs) with the controller state it holds, advances
    the tau controller, and returns the weights as the centred signal ``n*w - 1`` (``G*w - 1``
    on a full group; 0 on invalid entries), so tunix's own ``"grpo"`` loss works with it and
    :func:`maxent_policy_loss` recovers ``w`` exactly. NaN / inf rewards are masked out and
    counted (``metrics()["maxent/n_invalid"]``); an all-invalid batch leaves the state unchanged.

    tunix calls an estimator for eval batches too and does not say which it is: through the
    registry every call advances the controller. :class:`MaxEntGRPOLearner` calls it with
    ``update=False`` on eval batches. tunix's checkpoints do not hold this state: use
    :meth:`save` / :meth:`restore` beside them.

    Args:
      cfg: a :func:`jaxweight.maxent.config` (default ``maxent.config()``); its reference term
        is switched off here (``include_reference_term=False``).

    Attributes:
      cfg: the config in use. state: the :class:`~jaxweight.maxent.ControllerState`.
      calls: i32[] number of updating calls (the ``global_step`` given to the controllers).
      last: the last :class:`~jaxweight.maxent.MaxEntStepOutput` (None before the first call).
    """

    def __init__(self, cfg: maxent.MaxEntConfig | None = None):
        cfg = maxent.config() if cfg is None else cfg
        if not isinstance(cfg, maxent.MaxEntConfig):
            raise ValueError(f"cfg must be a maxent.MaxEntConfig (maxent.config(...)), got {type(cfg).__name__}")
        self.cfg = cfg.replace(include_reference_term=False)
        self.state = maxent.init(self.cfg)
        self.calls = jnp.asarray(0, jnp.int32)
        self.last: maxent.MaxEntStepOutput | None = None
        self._step = jax.jit(maxent.step)
        self._lock = threading.Lock()

    def weights(self, rewards: Any, num_generations: int, *, update: bool = True, ref_logp: Any = None,
                token_counts: Any = None, truncated: Any = None, measured_kl: Any = None,
                kl_valid: Any = True, cfg: maxent.MaxEntConfig | None = None) -> maxent.MaxEntStepOutput:
        """One :func:`jaxweight.maxent.step` on flat tunix inputs; the state advances iff ``update``.

        Args:
          rewards: f32[P*G].
          num_generations: G.
          update: keep the new controller state (False: eval batches).
          ref_logp, token_counts: f32[P*G] or None (length-normalised reference log-probs and
            completion lengths; :class:`MaxEntGRPOLearner` fills them in).
          truncated: bool[P*G] or None (zero-truncation of unfinished completions).
          measured_kl: f32[] or None (the beta controller's input).
          kl_valid: bool[] whether ``measured_kl`` measured anything (False: the beta controller skips it).
          cfg: overrides ``self.cfg`` for this call (the learner's reference-term config).

        Returns:
          the :class:`~jaxweight.maxent.MaxEntStepOutput` (``[P, G]`` arrays).
        """
        cfg = self.cfg if cfg is None else cfg
        u = grouped(rewards, num_generations)
        ref = jnp.zeros_like(u) if ref_logp is None else grouped(ref_logp, num_generations, "ref_logp")
        tok = None if token_counts is None else grouped(token_counts, num_generations, "token_counts")
        trunc = None if truncated is None else grouped(truncated, num_generations, "truncated") > 0
        kl = None if measured_kl is None else jnp.asarray(measured_kl, jnp.float32)
        with self._lock:
            state, out = self._step(self.state, u, ref, cfg, token_counts=tok, truncated=trunc,
                                    global_step=self.calls, measured_kl=kl,
                                    kl_valid=jnp.asarray(kl_valid, bool))
            if update:
                self.state = state
                self.calls = self.calls + 1
            self.last = out
        return out

    def __call__(self, rewards: Any, num_generations: int, *, update: bool = True) -> Any:
        """tunix's estimator call: f32[P*G] centred weights ``n*w - 1`` (numpy for numpy input)."""
        out = self.weights(rewards, num_generations, update=update)
        return _like_input(centred_from_weights(out.weights, out.valid), rewards)

    def metrics(self) -> dict[str, float]:
        """``{"maxent/...": float}`` of the last call (the state's fields before any call)."""
        if self.last is None:
            return maxent.metrics_dict(self.state)
        return maxent.metrics_dict(self.last)

    def save(self, path: str | os.PathLike, step: int | None = None) -> Path:
        """Write the controller state and call count (a jaxweight checkpoint; ``step`` in its metadata)."""
        with self._lock:
            tree = {"state": self.state, "calls": self.calls}
            return checkpoint.save(path, tree, metadata={"step": step, "kind": "tunix.MaxEntAdvantageEstimator"})

    def restore(self, path: str | os.PathLike) -> int | None:
        """Load what :meth:`save` wrote (shapes and dtypes checked); returns the saved ``step``."""
        with self._lock:
            tree, meta = checkpoint.load_with_metadata(path, {"state": self.state, "calls": self.calls})
            self.state, self.calls = tree["state"], tree["calls"]
        return meta.get("step")
