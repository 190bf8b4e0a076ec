"""mkdocs hooks: the results registry (``bench/results/README.md``) as a page, and links to its rows.

- A page holding ``MARK`` (``docs/results/registry.md``) gets the registry's text, its 8-column
  tables shown in 3 columns so that they fit the page: file | claim | status, date, with the
  command, commit, machine and citing pages on a compact line under the claim. The file cell, a
  results file's path under ``bench/results/``, gets an id (:func:`anchor`), and each docs page
  named in it (``docs/results/mujoco.md``) becomes a link.
- On every other page, a results file cited as inline code by its full path
  (`` `bench/results/archive/x.json` ``) that has a registry row is shown by its path under
  ``bench/results/``, linked to its row; the full path stays the link's title (shown on hover),
  so the page's source keeps citing the full path. Code blocks are left as they are.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

MARK = "<!-- registry: bench/results/README.md, inserted by docs/_ext/registry.py -->"
PAGE = "results/registry.md"
REGISTRY = Path("bench") / "results" / "README.md"

_ROW = re.compile(r"^\| `([^`|]+)` \|", re.M)
COLUMNS = ("file", "claim", "command", "commit", "machine", "date", "status", "cited by")
_CITED_PAGE = re.compile(r"`docs/([A-Za-z0-9_./-]+\.md)`")
_CITED_FILE = re.compile(r"`bench/results/([A-Za-z0-9_./+-]+)`")
_FENCE = re.compile(r"^(\s*)(```|~~~)")


def anchor(path: str) -> str:
    """The id of a results file's row: its path under ``bench/results/`` with every run of other
    characters than letters, digits, ``_`` and ``-`` made one ``-`` (``archive/x.json`` -> ``archive-x-json``)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", path)


def registry_files(text: str) -> set[str]:
    """The paths (under ``bench/results/``) that the registry's rows name."""
    return set(_ROW.findall(text))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _compact_tables(text: str) -> str:
    """The registry's 8-column tables as file | claim | status, date; the command, commit, machine
    and citing pages of a row go on a small line under its claim. Every other line is kept."""
    out, in_table = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("|") and [c.lower() for c in _cells(line)] == list(COLUMNS):
            in_table = True
            out.append("| file | claim | status, date |\n|---|---|---|\n")
        elif in_table and line.startswith("|"):
            cells = _cells(line)
            if set(line.strip()) <= set("|-: "):
                continue
            if len(cells) != len(COLUMNS):
                raise PluginError(f"{REGISTRY}: a row with {len(cells)} cells, want {len(COLUMNS)}: {line}")
            r = dict(zip(COLUMNS, cells))
            run = " · ".join(f"*{c}:* {r[c]}" for c in ("command", "commit", "machine", "cited by"))
            out.append(f"| {r['file']} | {r['claim']}<br><small>{run}</small> | {r['status']}<br>{r['date']} |\n")
        else:
            in_table = False
            out.append(line)
    return "".join(out)


def registry_page(text: str, pages: set[str]) -> str:
    """The registry's markdown, its tables in 3 columns (:func:`_compact_tables`), with an id on
    each row's file cell and each cited page linked."""
    text = _ROW.sub(lambda m: f"| `{m[1]}`{{#{anchor(m[1])}}} |", _compact_tables(text))

    def link(m: re.Match) -> str:
        if m[1] not in pages:
            raise PluginError(f"{REGISTRY} names docs/{m[1]}, which is not a page of the site")
        return f"[`docs/{m[1]}`]({posixpath.relpath(m[1], posixpath.dirname(PAGE))})"

    return _CITED_PAGE.sub(link, text)


def _outside_code_blocks(markdown: str, fn) -> str:
    """``fn`` applied to the text between fenced code blocks, the blocks kept as they are."""
    out, chunk, fence = [], [], None
    for line in markdown.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence is None and m:
            out.append(fn("".join(chunk)))
            chunk, fence = [line], m[2]
        elif fence is not None:
            chunk.append(line)
            if m and m[2] == fence:
                out.append("".join(chunk))
                chunk, fence = [], None
        else:
            chunk.append(line)
    out.append(fn("".join(chunk)) if fence is None else "".join(chunk))
    return "".join(out)


def link_results(markdown: str, here: str, files: set[str]) -> str:
    """``markdown`` of the page ``here`` (a ``docs/``-relative path) with each registered results file
    cited as `` `bench/results/X` `` shown as ``X``, linked to its registry row."""
    target = posixpath.relpath(PAGE, posixpath.dirname(here) or ".")

    def link(m: re.Match) -> str:
        if m[1] not in files:
            return m[0]
        return f'[`{m[1]}`]({target}#{anchor(m[1])} "bench/results/{m[1]}")'

    return _outside_code_blocks(markdown, lambda text: _CITED_FILE.sub(link, text))


def on_page_markdown(markdown, page, config, files, **kwargs):  # noqa: ARG001 - mkdocs' signature
    text = (Path(config.config_file_path).parent / REGISTRY).read_text(encoding="utf-8")
    if MARK in markdown:
        pages = {f.src_uri for f in files if f.src_uri.endswith(".md")}
        return markdown.replace(MARK, registry_page(text, pages))
    return link_results(markdown, page.file.src_uri, registry_files(text))
