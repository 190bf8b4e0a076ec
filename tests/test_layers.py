"""The import graph of the library: no cycles, and every import runs down a layer.

Layers, lowest first: the base (``_util``, ``_install``, ``checkpoint``, ``metrics``), the concepts that use
no environment (``random_weighting``, ``awr``, ``curriculum``, ``maxent``, ``sync``,
``distributed``), ``rl`` (environments and agents), ``preference`` (reward learning, whose loop
trains ``rl``'s agents), ``interop``, the demos floor (``demos`` and host apps such as the
labelling page, ``label``), the CLI. So ``rl`` never imports ``preference``.

The graph is one of files (modules): every import statement counts, those inside functions
and those under ``if TYPE_CHECKING:`` too (an annotation-only import still ties two files
together, and "0 import circles at file level" admits no exception). An import of a package
counts as an import of its ``__init__``; inside a package, ``from . import name`` of a name the
``__init__`` re-exports counts as an import of the file that defines it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "jaxweight"

BASE = {"_util", "_install", "checkpoint", "metrics"}
CONCEPTS = {"random_weighting", "awr", "curriculum", "maxent", "preference", "sync", "distributed"}
HOST_APPS = {"label"}  # packages of their own on the demos floor: they use concepts, concepts never use them
# rl stands between the concepts that use no environment and preference, which uses rl's agents
LAYER = {**{m: 0 for m in BASE}, **{m: 1 for m in CONCEPTS - {"preference"}}, "rl": 2, "preference": 3,
         "interop": 4, "demos": 5, **{m: 5 for m in HOST_APPS}, "cli": 6, "__main__": 6}


def _modname(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_modname(p): p for p in PKG.rglob("*.py")}


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom | ast.Import, known: set[str]) -> list[str]:
    """Absolute jaxweight module names an import statement loads."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == "jaxweight" or a.name.startswith("jaxweight."):
                out.append(a.name)
        return out
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "jaxweight" or target.startswith("jaxweight.")):
        return out
    out.append(target)
    for a in node.names:  # `from pkg import submodule`
        sub = f"{target}.{a.name}"
        if sub in known:
            out.append(sub)
    return out


def _imports(mod: str, path: Path, known: set[str]):
    """``(node, resolved targets)`` of every import statement of a file (all of them: in
    functions, under ``if TYPE_CHECKING:``, anywhere)."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, _resolve(mod, is_pkg, node, known)


def _reexports(mods: dict[str, Path]) -> dict[str, dict[str, set[str]]]:
    """For each package: the names its ``__init__`` imports from other files -> those files."""
    known = set(mods)
    out: dict[str, dict[str, set[str]]] = {}
    for mod, path in mods.items():
        if path.name != "__init__.py":
            continue
        names: dict[str, set[str]] = {}
        for node, targets in _imports(mod, path, known):
            if isinstance(node, ast.ImportFrom) and targets and targets[0] in known and targets[0] != mod:
                for a in node.names:
                    names.setdefault(a.asname or a.name, set()).add(targets[0])
        out[mod] = names
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    reexports = _reexports(mods)
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        deps: set[str] = set()
        for node, targets in _imports(mod, path, known):
            for t in targets:
                # importing a.b.c runs a/__init__, a/b/__init__ too
                parts = t.split(".")
                for k in range(2, len(parts) + 1):
                    name = ".".join(parts[:k])
                    # a package's own __init__ is already running when its submodule loads ...
                    if name in known and name != mod and not mod.startswith(name + "."):
                        deps.add(name)
                # ... so a name taken from it comes from the file that defines it
                if isinstance(node, ast.ImportFrom) and mod.startswith(t + ".") and t in reexports:
                    for a in node.names:
                        deps |= reexports[t].get(a.name, set()) - {mod}
        graph[mod] = deps
    return graph


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_graph_is_read():
    g = _graph()
    assert "jaxweight.maxent" in g and "jaxweight._util" in g["jaxweight.maxent.weights"] | set().union(
        *g.values())


def test_no_import_cycles():
    """No circle of files, also inside a package and through annotation-only imports."""
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles (each a set of files that import each other): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def _graph_of(files: dict[str, str], tmp_path: Path) -> dict[str, set[str]]:
    """The import graph of a throwaway package ``jaxweight`` made of ``files`` (path -> source)."""
    global PKG
    for rel, src in files.items():
        f = tmp_path / "jaxweight" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(src)
    old, PKG = PKG, tmp_path / "jaxweight"
    try:
        return _graph()
    finally:
        PKG = old


def test_cycles_are_found_at_file_level(tmp_path):
    """The detector itself: circles inside one package, through TYPE_CHECKING, in functions and
    through a name an ``__init__`` re-exports are all found; a plain chain is not a circle."""
    g = _graph_of({
        "__init__.py": "",
        "pkg/__init__.py": "from .a import fa\nfrom .b import fb\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import fb\ndef fa(): ...\n",
        "pkg/b.py": "from .c import fc\ndef fb():\n    from . import fa\n",
        "pkg/c.py": "def fc(): ...\n",
        "other/__init__.py": "",
        "other/x.py": "def g():\n    from ..other import y\n",
        "other/y.py": "from jaxweight.other import x\n",
        "chain/__init__.py": "",
        "chain/p.py": "from . import q\n",
        "chain/q.py": "from jaxweight.pkg import c\n",
    }, tmp_path)
    assert g["jaxweight.pkg.a"] == {"jaxweight.pkg.b"}              # under TYPE_CHECKING
    assert g["jaxweight.pkg.b"] == {"jaxweight.pkg.c", "jaxweight.pkg.a"}   # re-exported name -> its file
    assert sorted(_cycles(g)) == [["jaxweight.other.x", "jaxweight.other.y"], ["jaxweight.pkg.a", "jaxweight.pkg.b"]]


def test_host_apps_sit_on_the_demos_floor():
    """A host app (the labelling page) may import concepts; no concept may import it."""
    assert LAYER["label"] == LAYER["demos"] > max(LAYER[c] for c in CONCEPTS)


def test_imports_run_down_the_layers():
    bad = []
    for mod, deps in _graph().items():
        lm = LAYER.get(_top(mod))
        if lm is None:
            continue
        for d in deps:
            ld = LAYER.get(_top(d))
            if ld is None:
                continue
            if ld > lm:
                bad.append(f"{mod} -> {d}")
            elif ld == lm == 0 and _top(d) != _top(mod) and _top(d) not in ("_util", "_install"):
                bad.append(f"{mod} -> {d} (the base imports only _util and _install)")
    assert bad == []


def test_rl_stands_below_preference():
    """Environments and agents know no reward-learning type: nothing in rl imports preference, and
    preference's generators do import rl (the arrow runs one way)."""
    g = _graph()
    assert LAYER["rl"] < LAYER["preference"] and LAYER["rl"] > max(LAYER[c] for c in CONCEPTS - {"preference"})
    up = sorted(f"{m} -> {d}" for m, deps in g.items() if _top(m) == "rl" for d in deps if _top(d) == "preference")
    assert up == []
    assert any(_top(d) == "rl" for d in g["jaxweight.preference.generators"])


def test_distributed_knows_no_concept():
    deps = _graph()["jaxweight.distributed"]
    assert not {d for d in deps if _top(d) in CONCEPTS - {"distributed"}}
