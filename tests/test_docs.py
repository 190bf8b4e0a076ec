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
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
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
_MARK = re.compile(r"^\s*<!--\s*docs:(needs|no-run)\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: str           # docs-relative path, e.g. "guides/curriculum.md"
    line: int           # 1-based line of the opening fence
    lang: str
    code: str
    needs: str | None = None    # <!-- docs:needs MODULE -->
    no_run: str | None = None   # <!-- docs:no-run REASON -->

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
            setattr(b, "needs" if mark.group(1) == "needs" else "no_run", mark.group(2))
        out.append(b)
        i = j + 1
    return out


def _pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_ext" not in p.parts)


def page_blocks(page: str) -> list[Block]:
    return blocks((DOCS / page).read_text(encoding="utf-8"), page)


# ----------------------------------------------------------------------------- python blocks

def run_python(bs: list[Block], ns: dict | None = None) -> dict:
    """Runs the blocks in order in one namespace; a block that raises fails the test naming it."""
    if ns is None:
        # a real module in sys.modules: dataclasses (flax.struct too) look their class's module up there
        mod = types.ModuleType("__docs__")
        sys.modules["__docs__"] = mod
        ns = mod.__dict__
    for b in bs:
        try:
            exec(compile(b.code, b.where, "exec"), ns)  # noqa: S102 - the docs' own code
        except Exception as e:  # the message says which page and block broke
            pytest.fail(f"{b.where} raised {type(e).__name__}: {e}\n{b.code}", pytrace=False)
    return ns


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
        if (b.needs is not None or b.no_run is not None) and b.lang != "python":
            pytest.fail(f"{b.where}: docs:needs / docs:no-run mark python blocks only", pytrace=False)
        if b.needs == "" or b.no_run == "":
            pytest.fail(f"{b.where}: docs:needs names a module, docs:no-run a reason", pytrace=False)
    for b in bs:
        if b.lang in SHELL_LANGS:
            check_bash(b, monkeypatch)
    run_python([b for b in bs if b.lang == "python" and b.needs is None and b.no_run is None])


_WITH_EXTRA = [p for p in _pages() if any(b.needs for b in page_blocks(p))]


@pytest.mark.parametrize("page", _WITH_EXTRA or [pytest.param(None, marks=pytest.mark.skip("no page needs an extra"))])
def test_docs_page_with_extra(page, monkeypatch, tmp_path):
    """A page's blocks marked ``docs:needs MODULE`` run (after its other blocks) where MODULE imports."""
    bs = [b for b in page_blocks(page) if b.lang == "python" and b.no_run is None]
    for mod in sorted({b.needs for b in bs if b.needs}):
        pytest.importorskip(mod)
    monkeypatch.chdir(tmp_path)
    run_python(bs)


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
