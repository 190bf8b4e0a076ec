"""jaxweight: fast, pure and composable data weighting for RL pipelines in JAX.

Submodules (imported on first use, so ``import jaxweight`` stays cheap):

- ``jaxweight.random_weighting``  random log-normal loss-component weights (torchref)
- ``jaxweight.awr``               advantage-weighted regression of a weight policy
- ``jaxweight.curriculum``        on-device curriculum scheduler (atropos + PLR, sqrt competence)
- ``jaxweight.maxent``            MaxEnt-GRPO reward weighting and its tau / beta controllers (maxent_grpo)
- ``jaxweight.rl``                environments (fixed-horizon gymnax / brax) and agents (PPO, SAC)
- ``jaxweight.preference``        reward learning from preference comparisons (imitation)
- ``jaxweight.sync``              learner -> actor weight sync (torchrl UpdateWeights)
- ``jaxweight.distributed``       meshes, data-parallel gradients, multi-host helpers (no concept)
- ``jaxweight.checkpoint``        atomic msgpack checkpoints of any state pytree
- ``jaxweight.metrics``           flat metric dicts, JSON-lines and TensorBoard writers
- ``jaxweight.interop``           atropos / maxent_grpo / imitation formats, the tunix plug-in

``jaxweight.checked(fn)`` runs ``fn`` under checkify so that traced hyperparameter checks
raise ``ValueError`` like eager ones; ``jaxweight.StateFileError`` is the one error for a
malformed state or checkpoint file.
"""

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "random_weighting",
    "awr",
    "curriculum",
    "maxent",
    "rl",
    "preference",
    "sync",
    "distributed",
    "checkpoint",
    "metrics",
    "interop",
)
__all__ = ["__version__", "checked", "StateFileError", *_SUBMODULES]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in ("checked", "StateFileError"):  # the validation wrapper and the one file error
        return getattr(importlib.import_module("._util", __name__), name)
    raise AttributeError(f"module 'jaxweight' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
