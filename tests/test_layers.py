"""The import graph of the library: no cycles, and every import runs down a layer.

Layers, lowest first: the base (``_util``, ``checkpoint``, ``metrics``), the concepts
(``random_weighting``, ``awr``, ``curriculum``, ``maxent``, ``preference``, ``sync``,
``distributed``), ``interop``, ``demos``, the CLI. Imports inside functions count too, and
an import of a package counts as an import of its ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "jaxweight"

BASE = {"_util", "checkpoint", "metrics"}
CONCEPTS = {"random_weighting", "awr", "curriculum", "maxent", "preference", "sync", "distributed"}
LAYER = {**{m: 0 for m in BASE}, **{m: 1 for m in CONCEPTS}, "interop": 2, "demos": 3, "cli": 4,
         "__main__": 4}


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


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node except the bodies of ``if TYPE_CHECKING:`` (imports for annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _resolve(mod, is_pkg, node, known):
                    # importing a.b.c runs a/__init__, a/b/__init__ too
                    parts = t.split(".")
                    for k in range(2, len(parts) + 1):
                        name = ".".join(parts[:k])
                        # a package's own __init__ is already running when its submodule loads
                        if name in known and name != mod and not mod.startswith(name + "."):
                            deps.add(name)
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
    assert _cycles(_graph()) == []


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
            elif ld == lm == 0 and _top(d) != _top(mod) and _top(d) != "_util":
                bad.append(f"{mod} -> {d} (the base imports only _util)")
    assert bad == []


def test_distributed_knows_no_concept():
    deps = _graph()["jaxweight.distributed"]
    assert not {d for d in deps if _top(d) in CONCEPTS - {"distributed"}}
