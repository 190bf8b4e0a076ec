"""Host helpers that prepare a batch: ragged groups -> dense masked arrays, truncation flags."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .._util import check_value

__all__ = ["pad_groups", "truncation_flags"]


def _pad(rows: Any, fill: Any, dtype: Any) -> np.ndarray:
    """Nested (possibly ragged) ``[P][G]`` sequence -> ``[P, Gmax]`` array."""
    if isinstance(rows, np.ndarray | jax.Array):
        return np.asarray(rows, dtype)
    rows = [list(r) if isinstance(r, Sequence | np.ndarray) and not isinstance(r, str) else [r]
            for r in rows]
    g = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), g), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def pad_groups(groups: Sequence[Sequence[float]], fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Host helper: ragged per-prompt lists -> ``(f32[P, Gmax], mask bool[P, Gmax])``.

    The mask says which entries are padding; the padded values are ``fill`` (0 by default:
    a finite placeholder, so the arrays pass ``jax_debug_nans``).

    Example::

        from jaxweight import maxent

        u, mask = maxent.pad_groups([[1.0, 0.0, 1.0], [0.5]])
        assert u.shape == (2, 3) and mask.sum() == 4
    """
    mask = _pad([[True] * len(g) for g in groups], False, bool)
    vals = _pad([list(g) for g in groups], fill, np.float32)
    return vals, mask


def _length(x: Any, name: str) -> int:
    try:
        return len(x)
    except TypeError:
        raise ValueError(f"{name} must be a sequence like finish_reasons, got {type(x).__name__}") from None


def _check_ragged(rows: Sequence[Any], other: Any, name: str, nested: bool) -> None:
    """Refuse ``other`` unless it has the shape of ``rows``: as many rows, each as long (flat: one row)."""
    if nested:
        n, m = len(rows), _length(other, name)
        if m != n:
            raise ValueError(f"{name} has {m} rows but finish_reasons has {n}")
    for i, (r, o) in enumerate(zip(rows, other)):
        sub = f"[{i}]" if nested else ""
        a, b = len(r), _length(o, name + sub)
        if a != b:
            raise ValueError(f"{name}{sub} has {b} entries but finish_reasons{sub} has {a}")


def truncation_flags(
    finish_reasons: Sequence[Any],
    token_counts: Any,
    max_completion_len: int,
    explicit: Any = None,
) -> np.ndarray:
    """Host helper: which completions were truncated (their reward is then zeroed).

    An entry is truncated if its ``explicit`` flag is truthy, else if
    ``finish_reason.strip().lower() == "length"``, else if
    ``max_completion_len > 0`` and ``token_count >= max_completion_len``.

    Args:
      finish_reasons: ``[P][G]`` (ragged ok) or flat sequence of strings / None.
      token_counts: matching numbers of completion tokens.
      max_completion_len: generation length limit (``<= 0``: not used).
      explicit: optional matching truthy flags (None entries fall through).

    Returns:
      bool array of the padded shape (padding False).

    Raises:
      ValueError: ``max_completion_len`` NaN / inf or a traced value (a host helper);
        ``token_counts`` or ``explicit`` whose length (or a row's length) differs from
        ``finish_reasons``'s (the message names the argument and both lengths).
    """
    check_value(max_completion_len, "max_completion_len", static=True)
    nested = len(finish_reasons) > 0 and not isinstance(finish_reasons[0], str | type(None))
    rows = finish_reasons if nested else [finish_reasons]
    toks = token_counts if nested else [token_counts]
    expl = explicit if explicit is None or nested else [explicit]
    _check_ragged(rows, toks, "token_counts", nested)
    if expl is not None:
        _check_ragged(rows, expl, "explicit", nested)
    out = []
    for i, reasons in enumerate(rows):
        row = []
        for j, reason in enumerate(reasons):
            flag = None if expl is None else expl[i][j]
            if flag is not None and bool(flag):
                row.append(True)
                continue
            if isinstance(reason, str) and reason.strip().lower() == "length":
                row.append(True)
                continue
            tok = toks[i][j]
            row.append(bool(max_completion_len > 0 and tok is not None and tok >= max_completion_len))
        out.append(row)
    arr = _pad(out, False, bool)
    return arr if nested else arr[0]
