"""A store of the preference loop's traced round programs, so a second run skips tracing them.

JAX's persistent compilation cache turns a second run's XLA compilation into
a file read, but every program is still traced and lowered first (the cache
key is the lowered module): about 3 s for the loop's programs. This store
keeps each round program as a serialized :mod:`jax.export` artifact (its
StableHLO over the flat list of input leaves) in
``<JAX compilation cache>/jaxweight-programs/``; a later run with the same
key deserializes it (milliseconds) and compiles it, which the persistent
cache answers. It is used only where the persistent cache is on (the CLI
turns it on) and ``flatbuffers`` is importable (``jax.export`` serializes with it).

The key of a program holds everything its trace depends on: its name, the
loop's fingerprint (every setting, :meth:`PreferenceComparisons.fingerprint`),
the input tree (memory addresses left out) and leaf shapes, the XLA options,
the JAX / jaxlib versions and backend, and a hash of jaxweight's own source
and of the source files that define the generator, environment and reward
net classes. A loop whose classes have no source file is not stored.
Artifacts are written atomically; one that cannot be read is ignored (and
replaced) with a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax

from .._util import atomic_write_bytes, without_traced_checks

logger = logging.getLogger("jaxweight.preference")

FORMAT = 1
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def store_dir() -> Path | None:
    """``<jax_compilation_cache_dir>/jaxweight-programs``, or None where the store is off."""
    folder = jax.config.jax_compilation_cache_dir
    if not folder or not jax.config.jax_enable_compilation_cache:
        return None
    if importlib.util.find_spec("flatbuffers") is None:
        return None
    return Path(folder) / "jaxweight-programs"


def _hash_files(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(set(paths)):
        h.update(str(p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


@functools.cache
def _package_hash() -> str:
    """sha256 of every ``.py`` file of the installed jaxweight package."""
    root = Path(__file__).resolve().parents[1]
    return _hash_files(root.rglob("*.py"))


def _classes(objs: Iterable[Any]) -> set[type]:
    """The classes of ``objs`` and of the flax modules they hold (walked through dataclass fields)."""
    seen: set[type] = set()
    todo = [o for o in objs if o is not None]
    while todo:
        obj = todo.pop()
        cls = type(obj)
        if cls in seen:
            continue
        seen.add(cls)
        if isinstance(obj, nn.Module) and dataclasses.is_dataclass(obj):
            todo.extend(v for f in dataclasses.fields(obj) if isinstance(v := getattr(obj, f.name, None), nn.Module))
    return seen


def source_hash(objs: Iterable[Any]) -> str | None:
    """Hash of the source files that define the classes of ``objs`` (None: one has no source file)."""
    files = []
    for cls in _classes(objs):
        try:
            files.append(Path(inspect.getsourcefile(cls)).resolve())
        except (TypeError, OSError):
            return None
    return _hash_files(files)


def program_key(name: str, fingerprint: dict, sources: str, in_tree: Any, in_avals: list, options: Any) -> str:
    """The store key of program ``name`` (hex sha256)."""
    backend = jax.devices()[0]
    blob = json.dumps({
        "format": FORMAT, "program": name, "fingerprint": fingerprint, "sources": sources,
        "package": _package_hash(), "tree": _ADDRESS.sub("", repr(in_tree)),
        "avals": [[list(a.shape), str(a.dtype)] for a in in_avals], "options": options,
        "jax": jax.__version__, "jaxlib": jax.lib.__version__, "backend": [backend.platform, backend.device_kind],
    }, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


def load(folder: Path, key: str) -> tuple[Any, list[str]] | None:
    """``(exported, metric names)`` stored under ``key``, or None (absent or unreadable)."""
    path, meta = folder / f"{key}.exported", folder / f"{key}.json"
    if not path.exists() or not meta.exists():
        return None
    try:
        names = json.loads(meta.read_text())["metrics"]
        return jax.export.deserialize(bytearray(path.read_bytes())), list(names)
    except Exception as e:  # noqa: BLE001 - a broken artifact is traced again and replaced
        logger.warning("ignoring the unreadable stored program %s (%s); tracing it again", path, e)
        return None


def save(folder: Path, key: str, exported: Any, names: list[str]) -> None:
    """Store ``exported`` and its metric names under ``key`` (atomic; failures only logged)."""
    try:
        atomic_write_bytes(folder / f"{key}.exported", exported.serialize())
        atomic_write_bytes(folder / f"{key}.json", json.dumps({"format": FORMAT, "metrics": names}).encode())
    except Exception as e:  # noqa: BLE001 - the store is an optimisation
        logger.warning("could not store the traced program %s in %s: %s", key, folder, e)


def export_phase(fn: Callable, args: tuple) -> tuple[Any, list[str]] | None:
    """Export ``fn(*args) -> (state, metrics)`` over the flat leaves of ``args``.

    Returns ``(exported, sorted metric names)``, or None where the output's
    state is not shaped like the input's (then the program is not stored).
    """
    in_tree = jax.tree.structure(args)
    seen: dict[str, Any] = {}

    def flat(*leaves):
        state, metrics = fn(*jax.tree.unflatten(in_tree, leaves))
        seen["state"], seen["metrics"] = jax.tree.structure(state), metrics
        return jax.tree.leaves((state, metrics))

    leaves = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in jax.tree.leaves(args)]
    with without_traced_checks():  # debug checks are no-ops outside checkify, and cannot be serialized
        exported = jax.export.export(jax.jit(flat))(*leaves)
    if seen["state"] != jax.tree.structure(args[0]) or not isinstance(seen["metrics"], dict):
        return None
    return exported, sorted(seen["metrics"])


class FlatProgram:
    """A compiled flat program called like the phase it stands for: ``(state, run_keys, cfg, i[, parts])``.

    The inputs are flattened (their tree must be the one it was built for, else
    ``TypeError``) and the outputs rebuilt as ``(state, {name: value})``.
    """

    def __init__(self, compiled: Any, in_tree: Any, state_tree: Any, names: list[str]):
        self.compiled, self.in_tree, self.state_tree, self.names = compiled, in_tree, state_tree, names

    def __call__(self, *args: Any) -> tuple[Any, dict]:
        leaves, tree = jax.tree.flatten(args)
        if tree != self.in_tree:
            raise TypeError("arguments shaped unlike the stored program's")
        out = self.compiled(*leaves)
        n = self.state_tree.num_leaves
        return jax.tree.unflatten(self.state_tree, out[:n]), dict(zip(self.names, out[n:]))
