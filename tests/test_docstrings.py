"""Every docstring example in the library runs as written.

An example is the indented block that follows a docstring line ending in ``Example::``
or ``Examples::``. Each runs as standalone Python in a fresh namespace (nothing is
pre-imported), in a temporary working directory. Test ids are ``<module>:<qualname>``,
so ``pytest tests/test_docstrings.py -k maxent`` runs one package's examples.
Demos are left out: they are programs, not API.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "jaxweight"
SKIP_PARTS = {"demos"}
# modules whose examples need an optional extra: they run where it is installed
OPTIONAL = {"jaxweight.interop.tunix": "tunix"}


def _examples_in(doc: str) -> list[str]:
    """The indented blocks after lines ending in ``Example::`` / ``Examples::``."""
    lines = doc.expandtabs().splitlines()
    out = []
    i = 0
    while i < len(lines):
        head = lines[i].rstrip()
        if head.endswith(("Example::", "Examples::")):
            indent = len(lines[i]) - len(lines[i].lstrip())
            block = []
            j = i + 1
            while j < len(lines):
                line = lines[j]
                if line.strip() and len(line) - len(line.lstrip()) <= indent:
                    break
                block.append(line)
                j += 1
            code = textwrap.dedent("\n".join(block)).strip("\n")
            if code.strip():
                out.append(code)
            i = j
        else:
            i += 1
    return out


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _collect() -> list[tuple[str, str, str]]:
    cases = []
    for path in sorted(PKG.rglob("*.py")):
        if SKIP_PARTS & set(path.relative_to(PKG).parts):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        mod = _module_name(path)

        def visit(node, prefix):
            doc = ast.get_docstring(node, clean=True) if isinstance(
                node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
            if doc:
                for k, code in enumerate(_examples_in(doc)):
                    name = prefix or "<module>"
                    cases.append((f"{mod}:{name}" + (f"[{k}]" if k else ""), mod, code))
            for child in getattr(node, "body", []):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(child, f"{prefix}.{child.name}" if prefix else child.name)

        visit(tree, "")
    return cases


CASES = _collect()


def test_examples_found():
    assert len(CASES) >= 10, [c[0] for c in CASES]


@pytest.mark.parametrize(("mod", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_docstring_example_runs(mod, code, tmp_path, monkeypatch):
    if mod in OPTIONAL:
        pytest.importorskip(OPTIONAL[mod])
    monkeypatch.chdir(tmp_path)
    # dont_inherit: the example runs without this file's `from __future__ import annotations`
    # (string annotations break a dataclass defined in an example: no module to resolve them in)
    program = compile(code, "<docstring example>", "exec", dont_inherit=True)
    exec(program, {"__name__": "__docstring_example__"})  # noqa: S102
