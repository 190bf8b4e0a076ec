"""Where this jaxweight came from, for the lines that say how to install an extra.

Kept apart from ``_util`` (which imports jax) so that the command line's help and refusals,
which name extras, are printed without loading jax.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """The pip line that installs ``extra`` where this jaxweight came from.

    From a checkout (an editable install: ``pyproject.toml`` next to the package) the line is
    ``pip install -e ".[extra]"`` (the checkout's path instead of ``.`` when the working directory
    is elsewhere); from an installed wheel it is ``pip install "jaxweight[extra]"``.
    """
    root = Path(__file__).resolve().parents[1]
    project = root / "pyproject.toml"
    try:
        is_checkout = 'name = "jaxweight"' in project.read_text(encoding="utf-8")
    except OSError:
        is_checkout = False
    if not is_checkout:
        return f'pip install "jaxweight[{extra}]"'
    here = "." if Path.cwd().resolve() == root else str(root)
    return f'pip install -e "{here}[{extra}]"'
