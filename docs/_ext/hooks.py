"""mkdocs hooks: the index page's component table is README.md's, each module linked to its page.

A module in README's table without a page in docs/ fails the build.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

MARK = "<!-- components: README.md's module table, inserted by docs/_ext/hooks.py -->"


def on_page_markdown(markdown, page, config, files, **kwargs):  # noqa: ARG001 - mkdocs' signature
    if MARK not in markdown:
        return markdown
    readme = Path(config.config_file_path).parent / "README.md"
    lines = readme.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| module |")), None)
    if start is None:
        raise PluginError(f"{readme}: no component table (a line starting with '| module |')")
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    pages = {f.src_uri[:-3] for f in files if f.src_uri.endswith(".md")}

    def link(m: re.Match) -> str:
        name = m.group(1)
        if name not in pages:
            raise PluginError(f"README.md's component table lists jaxweight.{name}, which has no page "
                              f"docs/{name}.md (add it and its nav entry in mkdocs.yml)")
        return f"| [`jaxweight.{name}`]({name}.md) |"

    table = [re.sub(r"^\| `jaxweight\.(\w+)` \|", link, row) for row in table]
    return markdown.replace(MARK, "\n".join(table))
