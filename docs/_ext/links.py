"""mkdocs hook: every link of the built site holds, anchors included.

mkdocs' own validation (``validation:`` in mkdocs.yml) checks the links written in markdown
pages. This hook checks what the reader gets: after the build, every ``href`` and ``src`` of
every HTML page that points inside the site must name a file that was built, and its
``#fragment`` an ``id`` on that page; the tables of contents (the notebooks' too, made by
mkdocs-jupyter) and the API reference's cross-references are covered alike. A dead link fails
the build, naming the page, the link and what is missing.

The notebooks' tables of contents (and their titles in the navigation) are made here from the
headings of the rendered page: mkdocs-jupyter makes them from a markdown conversion that drops
inline code from a heading ("Curricula on device:") and so links ids that do not exist.
"""

from __future__ import annotations

import html
import posixpath
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit



class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for name in ("id", "name") if tag == "a" else ("id",):
            if a.get(name):
                self.ids.add(a[name])
        for name in ("href", "src"):
            if a.get(name) and not (tag == "link" and a.get("rel") in ("canonical", "alternate")):
                self.links.append(a[name])


def _target(site: Path, page: str, link: str) -> tuple[str | None, str]:
    """The site-relative file ``link`` points at from ``page`` (None: outside the site), and its fragment."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:", "javascript:")):
        return None, ""
    path = unquote(parts.path)
    if not path:
        return page, unquote(parts.fragment)
    target = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
    if target.startswith(".."):
        return None, ""                      # above the site root: not ours to check
    if path.endswith("/") or (site / target).is_dir():
        target = posixpath.join(target, "index.html")
    return target, unquote(parts.fragment)


def dead_links(site: Path) -> list[str]:
    """``"page: link (why)"`` for every link of the built site that does not hold."""
    pages: dict[str, _Page] = {}
    for f in sorted(site.rglob("*.html")):
        p = _Page()
        p.feed(f.read_text(encoding="utf-8", errors="replace"))
        pages[f.relative_to(site).as_posix()] = p
    dead = []
    for name, p in pages.items():
        if name == "404.html":               # served at any depth: its relative links are the theme's
            continue
        for link in p.links:
            target, frag = _target(site, name, link)
            if target is None:
                continue
            if not (site / target).is_file():
                dead.append(f"{name}: {link} (no file {target})")
            elif frag and target in pages and frag not in pages[target].ids:
                dead.append(f"{name}: {link} (no id {frag!r} on {target})")
    return dead


def on_post_build(config, **kwargs):  # noqa: ARG001 - mkdocs' signature
    from mkdocs.exceptions import PluginError

    dead = dead_links(Path(config.site_dir))
    if dead:
        shown = "\n  ".join(dead[:40])
        more = f"\n  ... and {len(dead) - 40} more" if len(dead) > 40 else ""
        raise PluginError(f"{len(dead)} dead link(s) in the built site:\n  {shown}{more}")


_HEADING = re.compile(r"<h([1-6])\b[^>]*\bid=\"([^\"]+)\"[^>]*>(.*?)</h\1>", re.S)


def heading_tokens(content: str) -> list[dict]:
    """The table of contents of an HTML page from its headings (their ids, their text with code)."""
    root: list[dict] = []
    stack: list[dict] = []
    for level, hid, inner in _HEADING.findall(content):
        inner = re.sub(r"<a\b[^>]*class=\"anchor-link\"[^>]*>.*?</a>", "", inner, flags=re.S)
        name = " ".join(html.unescape(re.sub(r"<[^>]+>", "", inner)).split())
        tok = {"level": int(level), "id": hid, "name": name, "children": []}
        while stack and stack[-1]["level"] >= tok["level"]:
            stack.pop()
        (stack[-1]["children"] if stack else root).append(tok)
        stack.append(tok)
    return root


def on_page_content(content, page, config, files, **kwargs):  # noqa: ARG001 - mkdocs' signature
    from mkdocs.structure.toc import get_toc

    if page.file.src_uri.endswith(".ipynb"):
        tokens = heading_tokens(content)
        if tokens:
            page.toc = get_toc(tokens)
            if tokens[0]["level"] == 1:
                page.title = tokens[0]["name"]
    return content
