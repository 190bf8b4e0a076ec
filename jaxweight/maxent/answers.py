"""Host text helpers of SEED-GRPO: the final answer of a completion and answer clusters.

:func:`extract_answer` follows maxent_grpo's rules:

- the payload of the **last** top-level ``\\boxed{...}`` / ``\\fbox{...}`` whose
  braces balance, stripped; a box nested inside another box's payload is part
  of that payload (``\\boxed{a \\boxed{b}}`` gives ``a \\boxed{b}``);
- the brace-less forms ``\\boxed 12`` / ``\\fbox 3`` (payload: the next token,
  up to white space, ``$`` or one of ``,;.!?``: ``\\boxed 12, done`` gives ``12``);
- an empty payload (``\\boxed{}``, ``\\boxed{ }``) is no answer: the last
  non-empty box wins;
- else the first non-empty ``<answer>...</answer>`` (case-insensitive, across
  lines), else :data:`NO_ANSWER` (``"NO_ANSWER_FOUND"``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from .batch import _pad

__all__ = ["NO_ANSWER", "extract_answer", "cluster_ids"]

NO_ANSWER = "NO_ANSWER_FOUND"

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE = re.compile(r"\s+([^\s${},;.!?]+)")
_ANSWER = re.compile(r"(?si)<answer>\s*(.*?)\s*</answer>")


def _balanced(text: str, start: int) -> int | None:
    """Index of the ``}`` closing the ``{`` just before ``start``, or None."""
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _boxed_payloads(text: str) -> list[str]:
    """Payloads of the top-level boxes, left to right (empty ones included)."""
    out: list[str] = []
    pos = 0
    while True:
        m = _BOX.search(text, pos)
        if m is None:
            return out
        j = m.end()
        k = j
        while k < len(text) and text[k].isspace():
            k += 1
        if k < len(text) and text[k] == "{":
            close = _balanced(text, k + 1)
            if close is None:  # unbalanced: not a box; look further on
                pos = j
                continue
            out.append(text[k + 1:close].strip())
            pos = close + 1
            continue
        bare = _BARE.match(text, j)
        if bare is not None:
            out.append(bare.group(1).strip())
            pos = bare.end()
            continue
        pos = j


def extract_answer(text: str | None) -> str:
    """Host helper: the final answer of a completion (SEED-GRPO clustering key).

    See the module docstring for the rules (maxent_grpo's).

    Args:
      text: the completion (None or empty: no answer).

    Returns:
      The answer string, or :data:`NO_ANSWER`.

    Example::

        from jaxweight import maxent

        assert maxent.extract_answer(r"so \\boxed{\\frac{1}{2}}") == r"\\frac{1}{2}"
        assert maxent.extract_answer(r"\\boxed 12, done") == "12"
        assert maxent.extract_answer(r"\\boxed{}") == "NO_ANSWER_FOUND"
    """
    if not text:
        return NO_ANSWER
    for body in reversed(_boxed_payloads(text)):
        if body:
            return body
    for m in _ANSWER.finditer(text):
        if m.group(1).strip():
            return m.group(1).strip()
    return NO_ANSWER


def cluster_ids(answers: Sequence[Sequence[str]]) -> np.ndarray:
    """Host helper: cluster id of each answer within its group.

    Exact string match, ids in first-seen order; every :data:`NO_ANSWER` gets
    its own fresh id after the largest real id (a group without answers gets
    ``0..n-1``). Ragged groups are padded with -1.

    Args:
      answers: ``[P][G]`` strings (e.g. ``extract_answer`` of each completion).

    Returns:
      i32[P, Gmax].

    Example::

        from jaxweight import maxent

        assert maxent.cluster_ids([["4", "5", "4", "NO_ANSWER_FOUND"]]).tolist() == [[0, 1, 0, 2]]
    """
    rows = []
    for group in answers:
        seen: dict[str, int] = {}
        ids = []
        for a in group:
            if a == NO_ANSWER:
                ids.append(None)
            else:
                ids.append(seen.setdefault(a, len(seen)))
        nxt = len(seen)
        out = []
        for i in ids:
            if i is None:
                out.append(nxt)
                nxt += 1
            else:
                out.append(i)
        rows.append(out)
    return _pad(rows, -1, np.int32)
