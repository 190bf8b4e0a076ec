"""The outside world's formats, apart from the math.

- ``jaxweight.interop.atropos``      atropos ``CurriculumScheduler`` JSON state <-> curriculum state
- ``jaxweight.interop.maxent_grpo``  maxent_grpo controller JSON <-> controller state
- ``jaxweight.interop.imitation``    imitation trajectories / reward nets <-> jaxweight (optional torch)
- ``jaxweight.interop.tunix``        tunix (``google-tunix``) estimators, policy loss, prompt curriculum, learner

Submodules are imported on first use; none of them imports an optional package at import time.
"""

import importlib

_SUBMODULES = ("atropos", "maxent_grpo", "imitation", "tunix")
__all__ = list(_SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'jaxweight.interop' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
