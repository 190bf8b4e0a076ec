"""The reward trainer on the host (imitation ``BasicRewardTrainer`` / ``EnsembleTrainer``).

:class:`RewardTrainer` holds a :func:`~jaxweight.preference.training.config`
and runs :func:`~jaxweight.preference.training.epoch` (the one epoch driver)
one epoch at a time, compiled once, with imitation's metric names
(``reward/epoch-{k}/train/loss``, ``reward/final/...``, ``_std`` over members),
an optional progress bar and a per-epoch callback.

Example::

    import numpy as np
    from jaxweight.preference import Box, Discrete, RewardMLP, RewardTrainer, buffer, fragment_pairs_from_arrays
    pairs = fragment_pairs_from_arrays(np.random.rand(8, 2, 4, 3), np.random.randint(0, 2, (8, 2, 3)))
    bcfg = buffer.config(16)
    buf = buffer.step(buffer.init(bcfg, None, pairs), pairs, np.ones(8, np.float32), bcfg)
    trainer = RewardTrainer(RewardMLP(observation_space=Box((3,)), action_space=Discrete(2)), num_members=2,
                            batch_size=4)
    state, metrics = trainer.train(trainer.init(0, pairs), 1, buf, epoch_multiplier=2.0)
    assert "reward/final/train/loss_std" in metrics
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from .._util import as_key, progress_bar
from . import splits, training
from .buffer import PreferenceBuffer
from .regularization import Regularizer
from .reward_nets import check_inputs
from .training import TrainerState

Array = jax.Array

__all__ = ["RewardTrainer", "epoch_metrics_dict"]


def epoch_metrics_dict(metrics: Sequence[dict[str, Any]], ensemble: bool) -> dict[str, float]:
    """imitation-style flat metric dict from per-epoch metrics (host side).

    ``reward/epoch-{k}/{name}`` for every epoch, the last epoch again as
    ``reward/final/{name}``; for ensembles every per-member value is the member
    mean and ``{key}_std`` the member std (ddof 0).
    """
    out: dict[str, float] = {}
    host = jax.device_get(list(metrics))
    last = len(host) - 1
    for k, m in enumerate(host):
        for name, v in m.items():
            v = np.asarray(v, np.float64)
            for prefix in (f"reward/epoch-{k}",) + (("reward/final",) if k == last else ()):
                key = f"{prefix}/{name}"
                if ensemble and v.ndim > 0:
                    out[key] = float(v.mean())
                    out[f"{key}_std"] = float(v.std())
                else:
                    out[key] = float(v)
    return out


class RewardTrainer:
    """Host wrapper over :func:`~jaxweight.preference.training.epoch` (imitation's reward trainers).

    Args:
      module: reward module (e.g. :class:`~jaxweight.preference.RewardMLP`).
      num_members, batch_size, minibatch_size, epochs, learning_rate, weight_decay,
        b1, b2, eps, noise_prob, discount, threshold, regularizer, bagging: the
        settings of :func:`~jaxweight.preference.training.config` (``self.config``).
      progress: show a progress bar for multi-epoch ``train`` calls (off by default).
      callback: optional ``callback(epoch, num_epochs, out)`` called on the host
        after every epoch of :meth:`train` (``out``: that epoch's arrays).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        num_members: int | None = None,
        batch_size: int = 32,
        minibatch_size: int | None = None,
        epochs: int = 1,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.01,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        noise_prob: float = 0.0,
        discount: float = 1.0,
        threshold: float = 50.0,
        regularizer: Regularizer | None = None,
        bagging: bool = True,
        progress: bool = False,
        callback: Callable[[int, int, dict[str, Array]], Any] | None = None,
    ):
        self.config = training.config(
            module, batch_size=batch_size, minibatch_size=minibatch_size, epochs=epochs,
            num_members=num_members, bagging=bagging, regularizer=regularizer, learning_rate=learning_rate,
            weight_decay=weight_decay, b1=b1, b2=b2, eps=eps, noise_prob=noise_prob, discount=discount,
            threshold=threshold,
        )
        self.regularizer = regularizer
        self.progress = bool(progress)
        self.callback = callback
        self._epoch = jax.jit(training.epoch)

    @property
    def module(self) -> nn.Module:
        return self.config.module

    @property
    def ensemble(self) -> bool:
        return self.config.ensemble

    def init(self, key: Any, example: Any) -> TrainerState:
        """:func:`~jaxweight.preference.training.init` with this trainer's config."""
        return training.init(self.config, key, example)

    def num_epochs(self, epoch_multiplier: float = 1.0) -> int:
        return training.num_epochs(self.config.epochs, epoch_multiplier)

    def check_data(self, buffer: PreferenceBuffer) -> None:
        """Host checks of a concrete buffer: data the net accepts, something to train on, and the
        validation split (imitation's error).

        Raises:
          ValueError: a stored discrete observation / action outside the reward net's
            space (naming ``buffer.pairs.acts`` / ``buffer.pairs.obs``, the index, the
            value and the space); no stored pair is usable (an empty buffer, or every
            pair left out for NaN / inf data or preferences outside ``[0, 1]``); the
            validation split leaves a side empty.
        """
        cfg = self.config
        check_inputs(cfg.module, buffer.pairs.obs, buffer.pairs.acts,
                     names=("buffer.pairs.obs", "buffer.pairs.acts"), where=splits._filled(buffer))
        usable, n_bad = jax.device_get(splits._usable(cfg, buffer))
        n = int(np.sum(usable))
        if n == 0:
            size = int(np.max(np.asarray(jax.device_get(buffer.size))))
            why = ("the buffer is empty" if size == 0 else
                   f"all {size} stored pairs are invalid ({int(np.max(n_bad))} with NaN / inf data or "
                   "preferences outside [0, 1], the rest flagged invalid)")
            raise ValueError(f"cannot train the reward model: {why}; push comparisons with valid data "
                             "first (buffer.step)")
        if not cfg.has_updater:
            return
        val = int(n * cfg.val_split)
        if val < 1 or n - val < 1:
            raise ValueError(
                "Not enough data samples to split into training and validation, or the validation split "
                "is too large/small. Make sure you've generated enough initial preference data. You can "
                "adjust this through initial_comparison_frac in PreferenceComparisons."
            )

    def train(
        self, state: TrainerState, key: Any, buffer: PreferenceBuffer, epoch_multiplier: float = 1.0,
        *, progress: bool | None = None,
    ) -> tuple[TrainerState, dict[str, float]]:
        """Train for ``round(epochs * epoch_multiplier)`` epochs on the buffer, one compiled epoch at a time.

        Gives the state of ``training.epoch(state, key, buffer, cfg, epochs=n)``.

        Returns:
          ``(state, metrics)`` with imitation's metric names (see :func:`epoch_metrics_dict`).

        Raises:
          ValueError: "Must train for at least one epoch."; a stored action / observation
            outside the net's space; a buffer without a usable pair (empty, or every pair
            invalid: nothing is trained); the validation-split error.
        """
        n = self.num_epochs(epoch_multiplier)
        self.check_data(buffer)
        key = as_key(key)
        show = (self.progress if progress is None else progress) and n > 1
        bar = progress_bar(n, "Training reward model", leave=False) if show else None
        history = []
        for e in range(n):
            state, m = self._epoch(state, key, buffer, self.config, epochs=1, start=e)
            history.append(m)
            if bar is not None:
                bar.update(1)
            if self.callback is not None:
                self.callback(e, n, m)
        if bar is not None:
            bar.close()
        return state, epoch_metrics_dict(history, self.config.ensemble)
