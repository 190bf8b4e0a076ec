"""mkdocs hooks: README.md's component table on the pages that ask for it, and the notebooks.

- A page holding ``MARK`` gets README.md's component table (the lines from ``| module |`` on),
  each ``jaxweight.X`` linked to its API page: ``api/X.md``, or ``api/X/index.md`` for a package
  whose reference is split into sub-pages (``preference``). A module without a page fails the build.
- The notebooks of the repository's ``notebooks/`` folder join the site as ``notebooks/*.ipynb``
  (mkdocs-jupyter renders them with their stored outputs), so they are kept in one place.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

MARK = "<!-- components: README.md's module table, inserted by docs/_ext/hooks.py -->"


def api_page(name: str, pages: set[str]) -> str:
    """The API page of ``jaxweight.<name>`` (a ``docs/``-relative path), or a PluginError."""
    for cand in (f"api/{name}.md", f"api/{name}/index.md"):
        if cand in pages:
            return cand
    raise PluginError(f"README.md's component table lists jaxweight.{name}, which has no API page "
                      f"docs/api/{name}.md or docs/api/{name}/index.md (add it and its nav entry in mkdocs.yml)")


def component_table(readme: Path) -> list[str]:
    """README.md's component table, as its lines."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| module |")), None)
    if start is None:
        raise PluginError(f"{readme}: no component table (a line starting with '| module |')")
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table


def on_page_markdown(markdown, page, config, files, **kwargs):  # noqa: ARG001 - mkdocs' signature
    if MARK not in markdown:
        return markdown
    table = component_table(Path(config.config_file_path).parent / "README.md")
    pages = {f.src_uri for f in files if f.src_uri.endswith(".md")}
    here = posixpath.dirname(page.file.src_uri)

    def link(m: re.Match) -> str:
        target = posixpath.relpath(api_page(m.group(1), pages), here or ".")
        return f"| [`jaxweight.{m.group(1)}`]({target}) |"

    table = [re.sub(r"^\| `jaxweight\.(\w+)` \|", link, row) for row in table]
    return markdown.replace(MARK, "\n".join(table))


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files, config, **kwargs):  # noqa: ARG001 - mkdocs' signature
    root = Path(config.config_file_path).parent
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        files.append(File(f"notebooks/{nb.name}", str(root), config.site_dir, config.use_directory_urls))
    return files
