"""Every code block on every docs page runs, so the manual cannot go stale.

The rule, per page of ``docs/`` (``docs/_ext`` aside), one test per page:

- ```` ```python ```` blocks run in page order in one namespace per page, in a temporary
  working directory (a block that writes files writes them there). Warnings are errors here as
  everywhere. A block that raises fails the page's test, naming the page and the block's line.
- ```` ```bash ```` blocks (``sh``, ``shell`` and ``console`` read the same): every command ``python -m jaxweight ...`` (also inside ``a && b``
  chains) is parsed by the command line's own argument parsers, not run: a flag that is misspelt
  or refused fails the test. ``python -m jaxweight.<module>`` must name a module that exists.
  Other lines (``pip install ...``, ``python3 -m venv ...``, ``mkdocs ...``) are not run.
- ```` ```text ````, ```` ```json ````, ```` ```yaml ```` and ```` ```toml ```` blocks are
  output or file contents and are not run. A block without a language fails: every block says
  what it is.

Two markers, on the line before a ```` ```python ```` block, for code that cannot run in the
test process: ``<!-- docs:needs MODULE -->`` (an optional package the main test run does not
install, e.g. tunix: the block runs in :func:`test_docs_page_with_extra`, after the page's other
blocks, where ``MODULE`` imports, and is skipped where it does not) and
``<!-- docs:no-run REASON -->`` (code for a cluster of processes; ``REASON`` says which test
runs its equivalent). Both are rare on purpose.

Two markers make a page show what its code does:

- ``<!-- docs:output -->`` on the line before a ```` ```text ```` block: the block is what the
  page's preceding ```` ```python ```` block prints (its stdout, captured while it runs). The test
  fails, naming the page and line, unless the two are equal line by line (trailing whitespace
  stripped, leading and trailing blank lines ignored). Examples therefore print rounded,
  deterministic values (``f"{x:.3f}"``, fixed keys, CPU). Output of a ``docs:needs`` block is
  checked where that block runs; a ``docs:no-run`` block shows no output.
- ``<!-- docs:figure img/NAME.png -->`` on the line before a ```` ```python ```` block: the block
  writes ``NAME.png`` into its working directory (the test's temporary directory) and the test
  fails unless it did, unless the file is a PNG, unless the file of that name in ``docs/img`` is committed and
  unless the page shows it (an image link with an alt text to ``img/NAME.png`` as seen from the
  page: ``../img/NAME.png`` from ``guides/``). The committed figure is made by the same code:
  ``JAXWEIGHT_DOCS_WRITE_FIGURES=1 python -m pytest -q tests/test_docs.py -k PAGE`` copies each
  written file to ``docs/img`` under its name (then ``git add`` it). Figures use matplotlib (the Agg
  backend, which tests/conftest.py sets) and stay small (``figsize=(6, 3.2), dpi=100``: a PNG
  under ~80 KB).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

RUN_LANGS = {"python", "bash"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}   # all read as bash blocks
SHOWN_LANGS = {"text", "json", "yaml", "toml"}
_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)[^\n]*$")
_MARK = re.compile(r"^\s*<!--\s*docs:(needs|no-run|output|figure)\s*(.*?)\s*-->\s*$")
_FIGURE = re.compile(r"img/[\w.-]+\.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: set to 1 to copy the figures the pages' code draws to docs/img (how the committed ones are made)
WRITE_FIGURES = os.environ.get("JAXWEIGHT_DOCS_WRITE_FIGURES", "") == "1"


@dataclass
class Block:
    page: str           # docs-relative path, e.g. "guides/curriculum.md"
    line: int           # 1-based line of the opening fence
    lang: str
    code: str
    needs: str | None = None    # <!-- docs:needs MODULE -->
    no_run: str | None = None   # <!-- docs:no-run REASON -->
    output: bool = False        # <!-- docs:output --> (a text block: what the python block before prints)
    figure: str | None = None   # <!-- docs:figure img/NAME.png --> (a python block draws it)

    @property
    def where(self) -> str:
        return f"docs/{self.page}, block at line {self.line}"


def blocks(text: str, page: str) -> list[Block]:
    """The fenced code blocks of a markdown page, in order (indented fences, e.g. in lists, too)."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.match(prev)
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip("`") == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        b = Block(page, i + 1, lang, textwrap.dedent("\n".join(body)) + "\n")
        if mark:
            kind, arg = mark.group(1), mark.group(2)
            if kind == "output":
                b.output = True
            else:
                setattr(b, {"needs": "needs", "no-run": "no_run", "figure": "figure"}[kind], arg)
        out.append(b)
        i = j + 1
    return out


def _pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_ext" not in p.parts)


def page_blocks(page: str) -> list[Block]:
    return blocks((DOCS / page).read_text(encoding="utf-8"), page)


# ----------------------------------------------------------------------------- python blocks

def run_python(bs: list[Block], ns: dict | None = None, printed: dict[int, str] | None = None) -> dict:
    """Runs the blocks in order in one namespace; a block that raises fails the test naming it.

    Each block's stdout is captured into ``printed`` (opening line -> text) and echoed after it; a
    block marked ``docs:figure`` must write its PNG into the working directory (:func:`check_drawn`).
    """
    if ns is None:
        # a real module in sys.modules: dataclasses (flax.struct too) look their class's module up there
        mod = types.ModuleType("__docs__")
        sys.modules["__docs__"] = mod
        ns = mod.__dict__
    for b in bs:
        drawn = Path.cwd() / Path(b.figure).name if b.figure else None
        if drawn is not None:
            drawn.unlink(missing_ok=True)   # an earlier block's file does not count
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(b.code, b.where, "exec"), ns)  # noqa: S102 - the docs' own code
        except Exception as e:  # the message says which page and block broke
            pytest.fail(f"{b.where} raised {type(e).__name__}: {e}\n{b.code}", pytrace=False)
        finally:
            sys.stdout.write(out.getvalue())
        if printed is not None:
            printed[b.line] = out.getvalue()
        if drawn is not None:
            check_drawn(b, drawn)
    return ns


# ----------------------------------------------------------------------------- shown output

def _shown(text: str) -> list[str]:
    """Lines as compared: trailing whitespace stripped, leading and trailing blank lines dropped."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def check_outputs(bs: list[Block], printed: dict[int, str]) -> int:
    """Every ``docs:output`` text block equals what the python block before it printed; returns how
    many were compared (an output of a block that ran elsewhere, ``docs:needs``, is left to that run)."""
    n = 0
    for i, b in enumerate(bs):
        if not b.output:
            continue
        src = next((p for p in reversed(bs[:i]) if p.lang == "python"), None)
        if src is None or src.no_run is not None:
            pytest.fail(f"{b.where}: docs:output shows what a python block before it prints, and "
                        f"{'none runs' if src is None else f'the block at line {src.line} is docs:no-run'}",
                        pytrace=False)
        if src.line not in printed:
            continue
        got, want = _shown(printed[src.line]), _shown(b.code)
        if got != want:
            diff = "\n".join(difflib.unified_diff(want, got, "shown", "printed", lineterm=""))
            pytest.fail(f"{b.where}: the output shown is not what the block at line {src.line} prints:\n"
                        f"{diff}", pytrace=False)
        n += 1
    return n


# ----------------------------------------------------------------------------- figures

def _committed(path: Path) -> bool:
    """Whether git tracks ``path`` (True where the tree is no git checkout: nothing to ask)."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        return True
    rel = path.relative_to(REPO).as_posix()
    return subprocess.run(["git", "ls-files", "--error-unmatch", rel], cwd=REPO,
                          capture_output=True).returncode == 0


def check_figure_marks(bs: list[Block], text: str, docs: Path | None = None) -> int:
    """Every ``docs:figure img/NAME.png`` names a committed file of ``docs/img`` that the page shows
    with an alt text; returns how many figures the page draws."""
    docs = DOCS if docs is None else docs
    n = 0
    for b in bs:
        if b.figure is None:
            continue
        n += 1
        if not _FIGURE.fullmatch(b.figure):
            pytest.fail(f"{b.where}: docs:figure names img/NAME.png (docs-relative), got {b.figure!r}",
                        pytrace=False)
        rel = os.path.relpath(docs / b.figure, (docs / b.page).parent).replace(os.sep, "/")
        if not re.search(r"!\[[^\]]*\S[^\]]*\]\(" + re.escape(rel) + r"(\s+\"[^\"]*\")?\)", text):
            pytest.fail(f"{b.where}: the page draws {b.figure} but does not show it: add "
                        f"![what it shows]({rel}) (with an alt text)", pytrace=False)
        if not WRITE_FIGURES:
            committed = docs / b.figure
            if not committed.is_file() or not _committed(committed):
                pytest.fail(f"{b.where}: docs/{b.figure} is not committed: make it with "
                            f"JAXWEIGHT_DOCS_WRITE_FIGURES=1 python -m pytest tests/test_docs.py -k "
                            f"{Path(b.page).stem} and git add it", pytrace=False)
    return n


def check_drawn(b: Block, drawn: Path) -> None:
    """The block wrote its figure, a PNG; with ``JAXWEIGHT_DOCS_WRITE_FIGURES=1`` it is copied to docs/."""
    if not drawn.is_file():
        pytest.fail(f"{b.where}: docs:figure {b.figure}: the block wrote no {drawn.name} in its working "
                    f"directory", pytrace=False)
    with drawn.open("rb") as f:
        if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
            pytest.fail(f"{b.where}: docs:figure {b.figure}: {drawn.name} is not a PNG", pytrace=False)
    if WRITE_FIGURES:
        dest = DOCS / b.figure
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(drawn, dest)


# ----------------------------------------------------------------------------- bash blocks

class _Parsed(Exception):
    """Raised by the patched ``parse_args`` once the command line parsed: nothing runs."""


def _commands(code: str) -> list[list[str]]:
    """The shell commands of a bash block as argument lists (continuations joined, ``&&``/``;``/``|`` split)."""
    cmds = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        cur: list[str] = []
        for tok in lex:
            if tok in ("&&", "||", ";", "|", "&"):
                cmds.append(cur)
                cur = []
            else:
                cur.append(tok)
        cmds.append(cur)
    return [c for c in cmds if c]


def jaxweight_argv(cmd: list[str]) -> tuple[str, list[str]] | None:
    """``("jaxweight", argv)`` for ``python -m jaxweight ARGV``, ``(module, [])`` for ``python -m
    jaxweight.module``, None for any other command. Leading ``VAR=value`` settings are skipped."""
    while cmd and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd[0]):
        cmd = cmd[1:]
    if len(cmd) >= 3 and re.fullmatch(r"python[0-9.]*", cmd[0]) and cmd[1] == "-m":
        if cmd[2] == "jaxweight":
            return "jaxweight", cmd[3:]
        if cmd[2].startswith("jaxweight."):
            return cmd[2], []
    return None


def parse_cli(argv: list[str], where: str, monkeypatch) -> None:
    """Parses ``python -m jaxweight ARGV`` with the CLI's and the demo's own parsers, running nothing."""
    from jaxweight import cli

    argv = [a for a in argv if a != "--no-compile-cache"]
    if not argv or argv[0] in ("-h", "--help", "help"):
        return
    if argv[0] not in ("demo", "bench"):
        pytest.fail(f"{where}: `python -m jaxweight {shlex.join(argv)}`: unknown command {argv[0]!r}",
                    pytrace=False)
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    err = io.StringIO()
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", parse_args)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = (cli.demo if argv[0] == "demo" else cli.bench)(argv[1:])
        except _Parsed:
            return
        except SystemExit as e:  # argparse: --help exits 0, a refused flag exits 2
            rc = e.code or 0
    if rc != 0:
        pytest.fail(f"{where}: `python -m jaxweight {shlex.join(argv)}` is refused by the command line "
                    f"(exit {rc}): {err.getvalue().strip()}", pytrace=False)


def check_bash(b: Block, monkeypatch) -> int:
    """Parses the block's jaxweight commands; returns how many there were."""
    n = 0
    for cmd in _commands(b.code):
        got = jaxweight_argv(cmd)
        if got is None:
            continue
        n += 1
        module, argv = got
        if module == "jaxweight":
            parse_cli(argv, b.where, monkeypatch)
        elif importlib.util.find_spec(module) is None:
            pytest.fail(f"{b.where}: `python -m {module}`: no such module", pytrace=False)
    return n


# ----------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("page", _pages())
def test_docs_page(page, monkeypatch, tmp_path):
    """The page's python blocks run in order; its ``python -m jaxweight`` lines parse."""
    monkeypatch.chdir(tmp_path)
    bs = page_blocks(page)
    for b in bs:
        if b.lang not in RUN_LANGS | SHELL_LANGS | SHOWN_LANGS:
            pytest.fail(f"{b.where}: a code block needs a language (python, bash, text, json, yaml or "
                        f"toml), got {b.lang or 'none'!r}", pytrace=False)
        if (b.needs is not None or b.no_run is not None or b.figure is not None) and b.lang != "python":
            pytest.fail(f"{b.where}: docs:needs / docs:no-run / docs:figure mark python blocks only",
                        pytrace=False)
        if b.output and b.lang != "text":
            pytest.fail(f"{b.where}: docs:output marks text blocks only", pytrace=False)
        if b.needs == "" or b.no_run == "" or b.figure == "":
            pytest.fail(f"{b.where}: docs:needs names a module, docs:no-run a reason, docs:figure a file",
                        pytrace=False)
        if b.figure is not None and b.no_run is not None:
            pytest.fail(f"{b.where}: a docs:figure block must run", pytrace=False)
    check_figure_marks(bs, (DOCS / page).read_text(encoding="utf-8"))
    for b in bs:
        if b.lang in SHELL_LANGS:
            check_bash(b, monkeypatch)
    printed: dict[int, str] = {}
    run_python([b for b in bs if b.lang == "python" and b.needs is None and b.no_run is None], printed=printed)
    check_outputs(bs, printed)


_WITH_EXTRA = [p for p in _pages() if any(b.needs for b in page_blocks(p))]


@pytest.mark.parametrize("page", _WITH_EXTRA or [pytest.param(None, marks=pytest.mark.skip("no page needs an extra"))])
def test_docs_page_with_extra(page, monkeypatch, tmp_path):
    """A page's blocks marked ``docs:needs MODULE`` run (after its other blocks) where MODULE imports."""
    bs = [b for b in page_blocks(page) if b.lang == "python" and b.no_run is None]
    for mod in sorted({b.needs for b in bs if b.needs}):
        pytest.importorskip(mod)
    monkeypatch.chdir(tmp_path)
    printed: dict[int, str] = {}
    run_python(bs, printed=printed)
    check_outputs(page_blocks(page), printed)


def test_docs_pages_found():
    """The manual's own pages are there and hold code (a broken glob would test nothing)."""
    pages = set(_pages())
    assert {"index.md", "getting-started.md", "guides/curriculum.md", "design.md"} <= pages
    n_python = sum(b.lang == "python" for p in pages for b in page_blocks(p))
    assert n_python >= 20, n_python
    assert len([b for p in pages for b in page_blocks(p) if b.no_run is not None]) <= 3


# ----------------------------------------------------------------------------- the harness itself

def test_a_raising_block_fails_naming_its_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = "```python\nx = 1\n```\n\ntext\n\n```python\nraise ValueError('boom')\n```\n"
    bs = blocks(page, "guides/broken.md")
    assert [b.line for b in bs] == [1, 7]
    with pytest.raises(pytest.fail.Exception, match=r"docs/guides/broken\.md, block at line 7 raised ValueError: boom"):
        run_python(bs)


def test_blocks_share_a_namespace_in_order():
    bs = blocks("```python\na = 2\n```\n1. a list\n\n    ```python\n    b = a * 3\n    ```\n", "p.md")
    assert run_python(bs)["b"] == 6


def test_markers_and_languages():
    text = ("<!-- docs:needs tunix -->\n```python\nimport tunix\n```\n"
            "<!-- docs:no-run needs 2 processes: tests/test_multihost.py -->\n\n```python\nx\n```\n"
            "```bash\npip install -e .\n```\n")
    a, b, c = blocks(text, "p.md")
    assert (a.needs, a.no_run, b.needs, b.no_run, c.lang) == ("tunix", None, None,
                                                             "needs 2 processes: tests/test_multihost.py", "bash")


def test_output_marker_compares_what_the_block_before_prints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = ("```python\nprint(f'{2 / 3:.3f}')   \nprint('b')\n```\n\n<!-- docs:output -->\n"
            "```text\n\n0.667\nb   \n\n```\n```python\nprint('c')\n```\n<!-- docs:output -->\n```text\nd\n```\n")
    bs = blocks(page, "guides/shown.md")
    assert [(b.lang, b.output) for b in bs] == [("python", False), ("text", True), ("python", False),
                                                 ("text", True)]
    printed: dict[int, str] = {}
    run_python(bs[:1], printed=printed)
    assert check_outputs(bs[:2], printed) == 1   # trailing spaces and the blank lines around do not count
    run_python(bs[2:3], printed=printed)
    with pytest.raises(pytest.fail.Exception,
                       match=r"docs/guides/shown\.md, block at line 17: the output shown is not what the "
                             r"block at line 13 prints(?s:.*)-d\n\+c"):
        check_outputs(bs, printed)
    lone = blocks("<!-- docs:output -->\n```text\n1\n```\n", "p.md")
    with pytest.raises(pytest.fail.Exception, match="none runs"):
        check_outputs(lone, {})


def test_figure_marker_needs_the_png_written_committed_and_shown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = tmp_path / "docs"
    draw = ("```python\nfrom pathlib import Path\nPath('g.png').write_bytes(b'\\x89PNG\\r\\n\\x1a\\n' + bytes(8))\n"
            "```\n")
    text = f"<!-- docs:figure img/g.png -->\n{draw}\n![three weight traces over 50 steps](../img/g.png)\n"
    (b,) = blocks(text, "guides/fig.md")
    assert b.figure == "img/g.png"
    (docs / "img").mkdir(parents=True)
    (docs / "img" / "g.png").write_bytes(PNG_SIGNATURE)
    monkeypatch.setattr(sys.modules[__name__], "_committed", lambda path: True)
    assert check_figure_marks([b], text, docs) == 1
    run_python([b])                                   # it wrote g.png: check_drawn passes
    for unshown in (text.replace("![three weight traces over 50 steps]", "[a link]"),   # a link, not an image
                    text.replace("three weight traces over 50 steps", ""),              # no alt text
                    text.replace("../img/g.png)", "img/g.png)")):                       # the wrong depth
        with pytest.raises(pytest.fail.Exception, match=r"docs/guides/fig\.md.*does not show it"):
            check_figure_marks([b], unshown, docs)
    monkeypatch.setattr(sys.modules[__name__], "_committed", lambda path: False)
    with pytest.raises(pytest.fail.Exception, match="is not committed"):
        check_figure_marks([b], text, docs)
    silent = blocks("<!-- docs:figure img/g.png -->\n```python\nx = 1\n```\n", "guides/fig.md")
    with pytest.raises(pytest.fail.Exception, match=r"block at line 2: docs:figure img/g\.png: the block wrote no g\.png"):
        run_python(silent)
    not_png = blocks("<!-- docs:figure img/g.png -->\n```python\nPath('g.png').write_text('hi')\n```\n", "p.md")
    with pytest.raises(pytest.fail.Exception, match="is not a PNG"):
        run_python(not_png, {"Path": Path})
    monkeypatch.setattr(sys.modules[__name__], "WRITE_FIGURES", True)
    monkeypatch.setattr(sys.modules[__name__], "DOCS", docs)
    (docs / "img" / "g.png").unlink()
    run_python([b])                                   # the written figure is copied to docs/img
    assert (docs / "img" / "g.png").read_bytes() == PNG_SIGNATURE + bytes(8)


def test_bash_lines_are_parsed_not_run(monkeypatch):
    ok = Block("p.md", 1, "bash", "pip install -e '.[all]' && python -m jaxweight demo preferences --quick "
                                  "--seeds 2   # a comment\npython -m jaxweight bench --only sync --quick\n"
                                  "python3 -m venv .venv\npython -m jaxweight demo lm --task countdown --sweep\n")
    assert check_bash(ok, monkeypatch) == 3
    bad = Block("guides/x.md", 4, "bash", "python -m jaxweight demo preferences --seeds 0\n")
    with pytest.raises(pytest.fail.Exception, match=r"docs/guides/x\.md, block at line 4.*--seeds"):
        check_bash(bad, monkeypatch)
    typo = Block("guides/x.md", 9, "bash", "python -m jaxweight demo curriculum --no-such-flag\n")
    with pytest.raises(pytest.fail.Exception, match=r"docs/guides/x\.md.*--no-such-flag"):
        check_bash(typo, monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="unknown demo"):
        check_bash(Block("p.md", 1, "bash", "python -m jaxweight demo nosuchdemo\n"), monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="no such module"):
        check_bash(Block("p.md", 1, "bash", "python -m jaxweight.nosuchmodule\n"), monkeypatch)
