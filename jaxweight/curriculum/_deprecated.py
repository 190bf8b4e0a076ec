"""Old spellings (API.md) that keep working: each warns once per call and forwards.

- ``sample_items(key, state, ...)``      -> :func:`jaxweight.curriculum.sample` ``(state, key, ...)``
- ``KeyIndex``, ``state_dict``, ``load_state_dict``, ``save_json``, ``load_json``
                                         -> :mod:`jaxweight.interop.atropos`
"""

from __future__ import annotations

from typing import Any

from .._util import warn_deprecated
from .sampling import sample


def sample_items(key: Any, state: Any, cfg: Any, current_step: Any, total_steps: Any, num: int,
                 eligible: Any = None):
    """Deprecated: use ``sample(state, key, cfg, current_step, total_steps, num, eligible)``."""
    warn_deprecated("jaxweight.curriculum.sample_items(key, state, ...)",
                    "jaxweight.curriculum.sample(state, key, ...)")
    return sample(state, key, cfg, current_step, total_steps, num, eligible)


def _atropos():
    from ..interop import atropos

    return atropos


def state_dict(state: Any, cfg: Any, keys: Any = None) -> dict:
    """Deprecated: use :func:`jaxweight.interop.atropos.state_dict`."""
    warn_deprecated("jaxweight.curriculum.state_dict", "jaxweight.interop.atropos.state_dict")
    return _atropos().state_dict(state, cfg, keys)


def load_state_dict(d: Any, capacity: int, keys: Any = None):
    """Deprecated: use :func:`jaxweight.interop.atropos.load_state_dict`."""
    warn_deprecated("jaxweight.curriculum.load_state_dict", "jaxweight.interop.atropos.load_state_dict")
    return _atropos().load_state_dict(d, capacity, keys)


def save_json(path: Any, state: Any, cfg: Any, keys: Any = None):
    """Deprecated: use :func:`jaxweight.interop.atropos.save_json`."""
    warn_deprecated("jaxweight.curriculum.save_json", "jaxweight.interop.atropos.save_json")
    return _atropos().save_json(path, state, cfg, keys)


def load_json(path: Any, capacity: int, keys: Any = None):
    """Deprecated: use :func:`jaxweight.interop.atropos.load_json`."""
    warn_deprecated("jaxweight.curriculum.load_json", "jaxweight.interop.atropos.load_json")
    return _atropos().load_json(path, capacity, keys)


def KeyIndex(capacity: int, keys: Any = ()):  # noqa: N802 - the old class name
    """Deprecated: use :class:`jaxweight.interop.atropos.KeyIndex`."""
    warn_deprecated("jaxweight.curriculum.KeyIndex", "jaxweight.interop.atropos.KeyIndex")
    return _atropos().KeyIndex(capacity, keys)
