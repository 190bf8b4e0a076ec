"""The page's address kept beside the label log, so that a restarted run keeps an open tab working.

A small JSON file (``labels.page.json`` next to ``labels.jsonl``)::

    {"token": "3q2...", "port": 8765}

written atomically (a temp file created with mode ``0600``, fsync-ed, renamed
over the old one, the folder fsync-ed), readable by its owner only: the token
is the page's only secret. :class:`~jaxweight.label.HumanTeacher` reads it when
it starts (a resume reuses the token, and the port when it is free) and writes
it once the server listens. A fresh run removes it first, so the old tab's
token is refused and the page says the server restarted.

Example::

    import os, tempfile, pathlib
    from jaxweight.label.address import address_path, load_address, save_address
    path = address_path(pathlib.Path(tempfile.mkdtemp()) / "labels.jsonl")
    save_address(path, "x" * 43, 8765)
    assert load_address(path) == {"token": "x" * 43, "port": 8765}
    assert os.stat(path).st_mode & 0o777 == 0o600
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .._util import atomic_write_bytes
from typing import Any

__all__ = ["address_path", "load_address", "save_address"]

logger = logging.getLogger("jaxweight.label")


def address_path(log_path: str | os.PathLike) -> Path:
    """Where the address of the page of label log ``log_path`` is kept: ``<stem>.page.json`` beside it."""
    p = Path(log_path)
    return p.with_name(f"{p.stem}.page.json")


def load_address(path: str | os.PathLike) -> dict[str, Any] | None:
    """``{"token": str, "port": int}`` from ``path``, or None when it is missing or unreadable (with a warning:
    a new token is made, and only an open tab is affected)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("page address %s cannot be read (%s): the page gets a new token", p, e)
        return None
    ok = (isinstance(d, dict) and isinstance(d.get("token"), str) and isinstance(d.get("port"), int)
          and not isinstance(d.get("port"), bool) and 0 <= d["port"] <= 65535)
    if not ok:
        logger.warning("page address %s is not {token, port}: the page gets a new token", p)
        return None
    return {"token": d["token"], "port": d["port"]}


def save_address(path: str | os.PathLike, token: str, port: int) -> Path:
    """Write ``{"token", "port"}`` to ``path`` atomically, mode ``0600`` (the folder is created)."""
    data = (json.dumps({"token": token, "port": int(port)}) + "\n").encode("utf-8")
    return atomic_write_bytes(path, data, mode=0o600)
