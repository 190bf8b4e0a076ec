"""The site and the package page hold together: absolute links on the package index, the
repository named, the built site's links checked, the formulas rendered by the vendored KaTeX.

The site itself is built by ``.ci/run``'s docs step (``mkdocs build --strict``, where
``docs/_ext/links.py`` fails the build on a dead link or anchor); these tests check the pieces
without mkdocs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
URLS = PYPROJECT["project"]["urls"]
SITE = URLS["Documentation"]
REPO_URL = URLS["Repository"]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


links = _load("docs_links_hook", DOCS / "_ext" / "links.py")


def _long_description() -> tuple[Path, str]:
    readme = PYPROJECT["project"]["readme"]
    path = REPO / (readme["file"] if isinstance(readme, dict) else readme)
    return path, path.read_text(encoding="utf-8")


def _docs_page(url: str) -> Path | None:
    """The docs source of a page of the site (``SITE + "guides/rl/"`` -> docs/guides/rl.md)."""
    rel = url[len(SITE):].split("#")[0].strip("/")
    for cand in (DOCS / f"{rel}.md", DOCS / rel / "index.md"):
        if cand.is_file():
            return cand
    return None


def test_long_description_links_are_absolute_and_lead_somewhere():
    path, text = _long_description()
    found = _LINK.findall(text) + re.findall(r"<(?:a|img)\b[^>]*(?:href|src)=\"([^\"]+)\"", text)
    assert len(found) >= 10, found
    relative = [u for u in found if not u.startswith("https://")]
    assert not relative, f"{path.name}: relative links break on the package index: {relative}"
    for url in found:
        if url.startswith(SITE):
            assert _docs_page(url) is not None, f"{path.name}: {url} is no page of docs/"
        elif url.startswith(REPO_URL + "/blob/main/"):
            assert (REPO / url[len(REPO_URL + "/blob/main/"):]).exists(), url


def test_long_description_example_prints_what_it_shows(monkeypatch, tmp_path):
    """The package page's example runs, and prints what its comment says."""
    monkeypatch.chdir(tmp_path)
    _, text = _long_description()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    shown = re.findall(r"^print\(.*#\s*(.+)$", code, flags=re.M)
    assert shown, "the example shows its output in a comment after print(...)"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "PYPI.md example", "exec"), {})  # noqa: S102 - the page's own code
    assert out.getvalue().splitlines() == [s.strip() for s in shown]


def test_install_lines_are_the_same_on_every_front_page():
    """README, the docs home, getting started and the package page give one install line per place."""
    wheel = 'pip install "jaxweight[all]"'
    clone = f"git clone {REPO_URL} && cd jaxweight"
    for name in ("README.md", "PYPI.md", "docs/index.md", "docs/getting-started.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        assert wheel in text and clone in text, name


def test_mkdocs_names_the_repository_and_the_site():
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(rf"^repo_url: {re.escape(REPO_URL)}$", text, flags=re.M)
    assert re.search(rf"^site_url: {re.escape(SITE)}$", text, flags=re.M)
    # links and anchors written in pages are warnings, so errors under --strict
    block = text.split("\nvalidation:\n", 1)[1].split("\n\n", 1)[0]
    for key in ("anchors", "not_found", "unrecognized_links"):
        assert re.search(rf"^  {key}: warn$", block, flags=re.M), key
    assert "docs/_ext/links.py" in text


# ----------------------------------------------------------------------------- the links hook

def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    for name, body in pages.items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"<html><body>{body}</body></html>", encoding="utf-8")
    return tmp_path


def test_dead_links_finds_missing_pages_and_anchors(tmp_path):
    site = _site(tmp_path, {
        "index.html": '<a href="guide/">g</a> <a href="guide/#idea">i</a> <a href="#top">t</a>'
                      '<h1 id="top">x</h1> <a href="https://example.org/#x">out</a>'
                      '<img src="img/a.png"> <a href="guide/#nope">n</a> <a href="gone/">d</a>',
        "guide/index.html": '<h2 id="idea">The idea</h2><a href="../#top">back</a>'
                            '<a href="../index.html#missing">m</a>',
        "img/a.png": "",
    })
    dead = links.dead_links(site)
    assert dead == [
        "guide/index.html: ../index.html#missing (no id 'missing' on index.html)",
        "index.html: guide/#nope (no id 'nope' on guide/index.html)",
        "index.html: gone/ (no file gone/index.html)",
    ]


def test_notebook_toc_keeps_code_and_points_at_real_ids():
    html = ('<h1 id="curricula-on-device-jaxweightcurriculum">Curricula on device: <code>jaxweight.curriculum</code>'
            '<a class="anchor-link" href="#curricula-on-device-jaxweightcurriculum">¶</a></h1>'
            '<h2 id="2-from-q-to-weights">2. From <code>q</code> to weights<a class="anchor-link" href="#x">¶</a></h2>'
            '<h3 id="deep">deep &amp; deeper</h3><h2 id="next">Next</h2>')
    (top,) = links.heading_tokens(html)
    assert (top["id"], top["name"]) == ("curricula-on-device-jaxweightcurriculum", "Curricula on device: jaxweight.curriculum")
    assert [(c["id"], c["name"]) for c in top["children"]] == [("2-from-q-to-weights", "2. From q to weights"),
                                                               ("next", "Next")]
    assert top["children"][0]["children"][0]["name"] == "deep & deeper"


# ----------------------------------------------------------------------------- the math

KATEX = DOCS / "assets" / "katex"


def formulas() -> list[tuple[str, str, bool]]:
    """``(page, tex, display)`` for every formula of the docs pages (arithmatex's ``$...$``/``$$...$$``)."""
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        if "_ext" in page.parts:
            continue
        text = re.sub(r"^(\s*)(`{3,}).*?^\1\2\s*$", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        text = re.sub(r"`[^`\n]+`", "", text)
        name = page.relative_to(DOCS).as_posix()
        for m in re.finditer(r"\$\$(.+?)\$\$", text, flags=re.S):
            out.append((name, m.group(1).strip(), True))
        text = re.sub(r"\$\$(.+?)\$\$", "", text, flags=re.S)
        for m in re.finditer(r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?![\w$])", text):
            out.append((name, m.group(1), False))
    return out


def test_katex_is_vendored_and_served():
    for f in ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js", "render.js", "COPYRIGHT"):
        assert (KATEX / f).is_file(), f
    css = (KATEX / "katex.min.css").read_text(encoding="utf-8")
    fonts = set(re.findall(r"url\((fonts/[^)]+)\)", css))
    assert fonts and all((KATEX / f).is_file() for f in fonts), sorted(f for f in fonts if not (KATEX / f).is_file())
    size = sum(f.stat().st_size for f in KATEX.rglob("*") if f.is_file())
    assert size < 1_000_000, size                          # modest: the JS, the CSS and the woff2 fonts
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for asset in ("assets/katex/katex.min.js", "assets/katex/contrib/auto-render.min.js",
                  "assets/katex/render.js", "assets/katex/katex.min.css"):
        assert f"  - {asset}" in text, asset
    assert "pymdownx.arithmatex" in text and "http" not in text.split("extra_javascript:", 1)[1].split("markdown_extensions", 1)[0]


@pytest.mark.skipif(shutil.which("node") is None, reason="node runs the vendored KaTeX")
def test_every_formula_renders_with_the_vendored_katex():
    # every formula of the pages, and two checks of the renderer itself: one formula it must draw,
    # one it must refuse
    found = formulas() + [("test", r"w_i \propto q_i^{1/\tau}\,\pi_{\mathrm{ref}}(y_i)^{\beta/\tau}", True),
                          ("test-bad", r"\frac{1}{", False)]
    script = ("const katex = require(process.argv[1]); const fs = require('fs');"
              "const items = JSON.parse(fs.readFileSync(0, 'utf8')); const bad = [];"
              "for (const [page, tex, display] of items) { try { katex.renderToString(tex, "
              "{displayMode: display, throwOnError: true}); } catch (e) { bad.push(page + ': ' + tex + ': ' + e.message); } }"
              "console.log(JSON.stringify(bad));")
    res = subprocess.run(["node", "-e", script, str(KATEX / "katex.min.js")], input=json.dumps(found),
                         capture_output=True, text=True, timeout=120, check=True)
    bad = json.loads(res.stdout)
    assert [b for b in bad if not b.startswith("test-bad: ")] == [] and len(bad) == 1, bad
