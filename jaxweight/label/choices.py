"""A person's four answers and the preference each one means.

The preference convention is that of :class:`~jaxweight.preference.FragmentPairs`
and :func:`~jaxweight.preference.synthetic_preferences`: ``prefs[p]`` is the
probability that the *first* fragment of pair ``p`` (``obs[p, 0]``, imitation's
"fragment 1") is preferred. The page shows ``obs[p, 0]`` on the left, so:

========  ======  =======  ==============================================
choice    pref    valid    same as the noiseless synthetic teacher when
========  ======  =======  ==============================================
left      1.0     True     the first fragment's return is higher
right     0.0     True     the second fragment's return is higher
equal     0.5     True     the returns tie
skip      0.5     False    (the pair is not answered; kept out of training)
========  ======  =======  ==============================================

Example::

    from jaxweight.label.choices import choice_preference
    assert choice_preference("left") == (1.0, True)
"""

from __future__ import annotations

__all__ = ["CHOICES", "choice_preference"]

#: the answers the page offers, in the order of its buttons
CHOICES: tuple[str, ...] = ("left", "right", "equal", "skip")

_PREFS = {"left": (1.0, True), "right": (0.0, True), "equal": (0.5, True), "skip": (0.5, False)}


def choice_preference(choice: str) -> tuple[float, bool]:
    """``(pref, valid)`` of an answer: the probability the left (first) fragment is preferred.

    Args:
      choice: one of :data:`CHOICES`.

    Raises:
      ValueError: any other value.
    """
    try:
        return _PREFS[choice]
    except (KeyError, TypeError):
        raise ValueError(f"choice must be one of {list(CHOICES)}, got {choice!r}") from None
