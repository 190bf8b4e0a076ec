"""Griffe extension: jaxweight's docstrings as the API reference shows them.

The docstrings are Google style with reST inline markup, read as written by ``help()`` and by
tests/test_docstrings.py. For mkdocstrings this rewrites them in memory (the sources are
untouched) once the package is loaded:

- ``:func:`name```, ``:class:``, ``:meth:``, ``:mod:``, ``:data:``, ``:attr:``, ``:obj:``
  -> a cross-reference ``[`name`][jaxweight.full.path]``, resolved from the docstring's scope
  (the object, its class, its module and that module's imports, then the enclosing packages),
  then as a ``jaxweight.`` path; ``.name`` is looked up from the module outwards; ``~`` shows the
  last part only. Every reference into jaxweight must land on an object the reference renders:
  autorefs warns otherwise, and ``mkdocs build --strict`` fails. A name that resolves outside
  jaxweight (jax, numpy, the standard library...) stays code: the build is offline.
- ``Example::`` / ``Examples::`` and an indented block -> an Examples section with a fenced
  Python block; any other paragraph ending in ``::`` -> ``:`` and a fenced block.
- ``a, b: description`` in an Args / Attributes section -> one entry per name (as Napoleon reads
  it), so that griffe still checks every name against the signature.

and decides what is shown, each object once: a package's re-exported names under the package
(not again in their submodule), a name exported by several modules at its shortest path, names
that ``__getattr__`` loads lazily from a submodule (``jaxweight.checked``); dunders (but
``__call__``) and undocumented rebindings such as ``Array = jax.Array`` are left out.
"""

from __future__ import annotations

import re
import sys

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|const):`([^`]+)`")
_EXTERNAL = {
    "jax", "jnp", "lax", "np", "numpy", "optax", "flax", "nn", "chex", "orbax", "tunix", "gymnax",
    "imitation", "torch", "tensorboardX", "matplotlib", "plt", "tqdm", "msgpack", "atropos",
    "maxent_grpo", "torchrl", "seals", "stable_baselines3", "gymnasium",
} | set(sys.stdlib_module_names)


def _lookup(collection, path: str):
    try:
        return collection.get_member(path)
    except Exception:  # noqa: BLE001 - griffe raises KeyError/AliasResolutionError/...
        return None


def _final_path(obj) -> str:
    if obj.is_alias:
        try:
            return obj.final_target.path
        except Exception:  # noqa: BLE001 - an alias to something griffe did not load
            return obj.target_path
    return obj.path


def _resolve(obj, target: str) -> str | None:
    """The full path ``target`` names from ``obj``'s docstring, or None."""
    collection = obj.modules_collection
    if target.startswith("."):
        name = target.lstrip(".")
        scope = obj if obj.is_module else obj.module
        while scope is not None:
            found = _lookup(collection, f"{scope.path}.{name}")
            if found is not None:
                return _final_path(found)
            scope = scope.parent
        return None
    first, _, rest = target.partition(".")
    scope = obj
    while scope is not None:
        if first in scope.members:
            base = _final_path(scope.members[first])
            return f"{base}.{rest}" if rest else base
        scope = scope.parent
    if first == "jaxweight" or _lookup(collection, f"jaxweight.{target}") is None:
        return target
    return f"jaxweight.{target}"


def _role_to_link(obj, match: re.Match) -> str:
    text = match.group(1).strip()
    short = text.startswith("~")
    target = text.lstrip("~")
    ident = target[:-2] if target.endswith("()") else target
    title = target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip(".")
    path = _resolve(obj, ident) or ident
    found = _lookup(obj.modules_collection, path)
    if found is not None:  # where it is defined: the reference registers that path too
        path = _final_path(found)
    root = path.split(".", 1)[0]
    if root != "jaxweight" and root in _EXTERNAL:
        return f"`{title}`"
    return f"[`{title}`][{path}]"


def _literal_blocks(text: str) -> str:
    """reST ``para::`` + indented block -> Markdown (an Examples section for ``Example::``)."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip()
        if not stripped.endswith("::") or stripped.endswith(":::"):
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        block: list[str] = []
        while j < len(lines):
            nxt = lines[j]
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            block.append(nxt)
            j += 1
        while block and not block[-1].strip():
            block.pop()
        body = [b for b in block]
        while body and not body[0].strip():
            body.pop(0)
        if not body:  # not a literal block after all
            out.append(line)
            i += 1
            continue
        inner = min(len(b) - len(b.lstrip()) for b in body if b.strip())
        head = stripped.strip()[:-2].rstrip()
        pad = " " * indent
        if head in ("Example", "Examples"):
            fence_pad = pad + "    "
            out.append(f"{pad}Examples:")
            lang = "python"
        else:
            fence_pad = pad
            if head:
                out.append(f"{pad}{head}:")
                out.append("")
            lang = "python" if any(re.match(r"\s*(import|from|def|class|@)\b|.*=", b) for b in body) else "text"
        out.append(f"{fence_pad}```{lang}")
        out.extend(fence_pad + b[inner:] if b.strip() else "" for b in body)
        out.append(f"{fence_pad}```")
        out.append("")
        i = j
    return "\n".join(out)


_SECTION = re.compile(
    r"(Args|Arguments|Parameters|Params|Attributes|Keyword Args|Keyword Arguments|Other Parameters):")
_NAMES = re.compile(r"\*{0,2}\w+(\s*,\s*\*{0,2}\w+)+")


def _grouped_items(text: str) -> str:
    """``a, b: description`` in an Args/Attributes section -> one entry per name, same text.

    Griffe reads one name per entry; this keeps the grouped form the docstrings use (as
    Napoleon does) and still checks every name against the signature.
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not _SECTION.fullmatch(line.strip()):
            continue
        section_indent = len(line) - len(line.lstrip())
        item_indent = None
        while i < len(lines):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent <= section_indent:
                break
            if item_indent is None and line.strip():
                item_indent = indent
            if not line.strip() or indent != item_indent:
                out.append(line)
                i += 1
                continue
            j = i + 1  # the item's continuation lines
            while j < len(lines) and (not lines[j].strip() or
                                      len(lines[j]) - len(lines[j].lstrip()) > item_indent):
                j += 1
            item = lines[i:j]
            while item and not item[-1].strip():
                item.pop()
            joined = "\n".join(item)
            head, sep, rest = joined.partition(":")
            names = " ".join(head.split())
            if sep and _NAMES.fullmatch(names.rstrip(",")):
                pad = " " * item_indent
                desc = rest.lstrip(" ")
                for name in names.rstrip(",").split(","):
                    out.append(f"{pad}{name.strip()}: {desc}")
                out.extend(lines[i + len(item):j])
            else:
                out.extend(lines[i:j])
            i = j
    return "\n".join(out)


def _objects(pkg):
    """Every object defined in ``pkg`` (aliases left out), parents before children."""
    stack: list = [pkg]
    while stack:
        obj = stack.pop()
        yield obj
        stack.extend(m for m in obj.members.values() if not m.is_alias)


def _modules(pkg):
    return [o for o in _objects(pkg) if o.is_module]


def _add_lazy_exports(mod) -> None:
    """A name in ``__all__`` that ``__getattr__`` loads from a submodule becomes an alias to it."""
    for name in mod.exports or ():
        if not isinstance(name, str) or name in mod.members:
            continue
        for sub in mod.modules.values():
            member = sub.members.get(name)
            if member is not None and not member.is_alias:
                mod.set_member(name, griffe.Alias(name, member, parent=mod))
                break


def _document_once(mod) -> None:
    """Show a package's re-exported names under the package only, not again in their submodule.

    A submodule left with nothing public to show (and no such submodule) is left out too.
    """
    for name in mod.exports or ():
        member = mod.members.get(name) if isinstance(name, str) else None
        if member is None or not member.is_alias:
            continue
        try:
            target = member.final_target
        except Exception:  # noqa: BLE001 - an alias to something outside the package
            continue
        if not target.is_module and target.path.startswith(mod.path + ".") and target.parent is not mod:
            target.public = False


def _export_once(modules) -> None:
    """A name exported by several modules is shown once, at its shortest path (e.g. ``jaxweight.X``
    rather than ``jaxweight.checkpoint.X``), so that every reference has one place to land."""
    homes: dict[str, list] = {}
    for mod in modules:
        for member in mod.members.values():
            if not member.is_alias or not member.is_public:
                continue
            try:
                target = member.final_target
            except Exception:  # noqa: BLE001 - an alias to something outside the package
                continue
            if not target.is_module:
                homes.setdefault(target.path, []).append(member)
    for aliases in homes.values():
        for alias in sorted(aliases, key=lambda a: (a.path.count("."), a.path))[1:]:
            alias.public = False


def _has_public(mod) -> bool:
    for member in mod.members.values():
        if member.is_alias:
            continue
        if member.is_module:
            if member.is_public and _has_public(member):
                return True
        elif member.is_public:
            return True
    return False


def _noise(obj) -> bool:
    """Dunders other than ``__call__`` (``__init__`` is merged into its class), and undocumented
    module-level rebindings of another name (``Array = jax.Array``)."""
    if obj.is_module:
        return False
    if obj.name.startswith("__") and obj.name.endswith("__"):
        return obj.name not in ("__call__", "__init__")
    return (obj.is_attribute and obj.parent is not None and obj.parent.is_module and not obj.docstring
            and isinstance(obj.value, (griffe.ExprName, griffe.ExprAttribute)))


class RstMarkup(griffe.Extension):
    """Rewrites every docstring of the loaded package once it is fully loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:  # noqa: ARG002 - griffe's signature
        modules = _modules(pkg)
        for mod in modules:
            _add_lazy_exports(mod)
        for mod in modules:
            _document_once(mod)
        _export_once(modules)
        for obj in _objects(pkg):
            if _noise(obj):
                obj.public = False
        for mod in modules:
            if mod.parent is not None and not _has_public(mod):
                mod.public = False
        for obj in _objects(pkg):
            doc = obj.docstring
            if doc is not None and doc.value:
                value = _ROLE.sub(lambda m, o=obj: _role_to_link(o, m), doc.value)
                doc.value = _grouped_items(_literal_blocks(value))
