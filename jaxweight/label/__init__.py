"""Preference labels from a person: fragment clips, a labelling page on 127.0.0.1 and its durable log.

A host app on the demos floor (it uses :mod:`jaxweight.preference`'s concepts;
they never import it). Its parts, one concern per file:

- ``render``: fragments as animated GIFs (NumPy and Pillow only, no JAX),
  with a registry of renderers by environment id (``"cartpole"``, ``"pendulum"``);
  the view follows the subject and a fallen stretch is frozen and dimmed.
- ``log``: the labels as JSON lines, each appended and ``fsync``-ed before
  the page hears OK; read back on restart (a torn last line is dropped with a warning).
- ``board``: the open round (pairs, answers and undos, clips, the model's
  agreement, the run's phase and progress; pairs with nothing to judge answered
  by rule), shared by ``server``, a Starlette app served by uvicorn on a
  background thread behind a random token (Host and Origin checked), and
  ``teacher``'s :class:`HumanTeacher`, whose ``ask(round, obs, predicted)``
  blocks until a person has answered every pair.
- ``address``: the page's token and port kept beside the log (mode 0600), so
  a restarted run serves the same URL.

The server and the teacher need the ``label`` extra (starlette, uvicorn, pillow);
rendering and the board need only Pillow, the log only NumPy. Names load on
first use, so ``import jaxweight.label`` works without the web stack.

Example::

    from jaxweight.label import CHOICES, choice_preference
    assert [choice_preference(c) for c in CHOICES] == [(1.0, True), (0.0, True), (0.5, True), (0.5, False)]
"""

from __future__ import annotations

import importlib

from .choices import CHOICES, choice_preference

_LAZY = {
    "render": ("Renderer", "register_renderer", "get_renderer", "renderer_ids", "env_id", "render_clip"),
    "log": ("LabelLog", "LabelRecord", "pair_digest"),
    "board": ("LabelBoard", "LabelError"),
    "server": ("LabelServer", "make_app"),
    "teacher": ("HumanTeacher", "tqdm_progress"),
}

# written out (not built from _LAZY) so that static readers (the API reference) see it
__all__ = [
    "CHOICES", "choice_preference",
    "Renderer", "register_renderer", "get_renderer", "renderer_ids", "env_id", "render_clip",
    "LabelLog", "LabelRecord", "pair_digest",
    "LabelBoard", "LabelError",
    "LabelServer", "make_app",
    "HumanTeacher", "tqdm_progress",
]
assert set(__all__) == {"CHOICES", "choice_preference", *(n for names in _LAZY.values() for n in names)}


def __getattr__(name):
    for module, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(f".{module}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
