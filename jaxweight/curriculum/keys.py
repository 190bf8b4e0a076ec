"""String item keys <-> pool ids on the host (atropos keys its items by strings)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .._util import check_static_int

__all__ = ["KeyIndex"]


class KeyIndex:
    """Host map between string item keys and pool ids, in first-seen order.

    Args:
      capacity: the pool size N; at most N keys (ids ``0..N-1``).
      keys: keys to add at once, in order.

    Example::

        from jaxweight.curriculum import KeyIndex

        keys = KeyIndex(capacity=1000)
        assert keys.ids(["q17", "q3", "q17"]).tolist() == [0, 1, 0]
        assert keys.ids(["new"], add=False).tolist() == [-1]
        assert keys.key(1) == "q3"
    """

    def __init__(self, capacity: int, keys: Iterable[str] = ()):
        self.capacity = check_static_int(capacity, "capacity", minimum=1)
        self._ids: dict[str, int] = {}
        self._keys: list[str] = []
        keys = list(keys)
        if keys:
            self.ids(keys, add=True)

    def ids(self, keys: str | Sequence[Any], add: bool = True) -> np.ndarray:
        """Ids of ``keys`` (a str or a nested sequence of str): np.int32 of the same shape.

        Unknown keys are added (``add=True``) or give -1.

        Raises:
          ValueError: a key is not a str, or adding would exceed the capacity
            (``"KeyIndex is full (capacity N)"``; nothing is added then).
        """
        arr = np.asarray(keys, dtype=object)
        flat = arr.reshape(-1).tolist()
        for k in flat:
            if not isinstance(k, str):
                raise ValueError(f"keys must be str, got {type(k).__name__} {k!r}")
        if add:
            new = list(dict.fromkeys(k for k in flat if k not in self._ids))
            if len(self._keys) + len(new) > self.capacity:
                raise ValueError(f"KeyIndex is full (capacity {self.capacity})")
            self._ids.update(zip(new, range(len(self._keys), len(self._keys) + len(new))))
            self._keys.extend(new)
        out = np.fromiter((self._ids.get(k, -1) for k in flat), dtype=np.int32, count=len(flat))
        return out.reshape(arr.shape)

    def key(self, item_id: int) -> str:
        """The key of an id (``IndexError`` if unknown)."""
        i = int(item_id)
        if not 0 <= i < len(self._keys):
            raise IndexError(f"id {i} has no key (index holds {len(self._keys)} keys)")
        return self._keys[i]

    def keys(self) -> list[str]:
        """All keys in id order."""
        return list(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, k: object) -> bool:
        return k in self._ids

    def __repr__(self) -> str:
        return f"KeyIndex(capacity={self.capacity}, size={len(self)})"
