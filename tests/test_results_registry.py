"""The results registry: every file under bench/results/ is indexed, and every cited path exists.

``bench/results/README.md`` indexes each results file in one table row (path, claim, command,
commit, machine, date, status, the docs pages that cite it). These tests fail when

- a file under ``bench/results/`` has no row, or a row names a file that does not exist;
- a row's status is not one of the four words, or does not match the folder the file is in
  (``diag/``: diagnostic, ``archive/``: superseded);
- a row names a docs page that does not cite the file by its full path;
- ``README.md``, a docs page, a notebook or a Python file under ``jaxweight/``, ``bench/`` or
  ``tests/`` cites a ``bench/results/...`` or ``docs/img/...`` path that does not exist (a ``*``
  is a glob and must match a file), or a docs page links an image that does not exist;
- ``README.md`` or a docs page cites a results file in an abbreviated form such as
  ``...-seed1-cpu-2core.json`` instead of its full path.

It also checks that the demos' and benches' JSON writers record where a result came from.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REGISTRY = RESULTS / "README.md"
STATUSES = {"headline", "diagnostic", "superseded", "negative"}
COLUMNS = ["file", "claim", "command", "commit", "machine", "date", "status", "cited by"]
PROVENANCE = {"command", "commit", "machine", "date", "jax_version", "device"}

# a cited path: bench/results/... or docs/img/..., up to a quote, space, bracket or backtick
CITED = re.compile(r"(?:bench/results|docs/img)/[A-Za-z0-9_.*/+-]*[A-Za-z0-9_*/]")
# an abbreviated results file: "...-seed1-cpu-2core.json", "...-seed2-...", "`...-brax-x.json`"
ABBREVIATED = re.compile(r"\.\.\.-[A-Za-z0-9_.-]*(?:\.json|-\.\.\.)|-\.\.\.`")
IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _results_files() -> set[str]:
    return {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file() and p != REGISTRY}


def _rows() -> list[dict[str, str]]:
    """The registry's table rows whose first cell is a backticked path, as {column: cell}."""
    rows, header = [], None
    for line in REGISTRY.read_text().splitlines():
        if not line.startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if [c.lower() for c in cells] == COLUMNS:
            header = COLUMNS
            continue
        if header and not set(line) <= set("|-: ") and cells[0].startswith("`"):
            assert len(cells) == len(header), f"registry row with {len(cells)} cells, want {len(header)}: {line}"
            rows.append(dict(zip(header, cells)))
    return rows


def _citing_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    for folder in ("jaxweight", "bench", "tests"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in files if f.exists() and f.resolve() != Path(__file__).resolve()]


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_registry_exists_and_has_rows():
    assert REGISTRY.exists(), "bench/results/README.md (the results registry) is missing"
    rows = _rows()
    assert rows, "no table rows in bench/results/README.md (header: | " + " | ".join(COLUMNS) + " |)"


def test_every_results_file_is_indexed_and_every_row_exists():
    indexed = [r["file"].strip("`") for r in _rows()]
    dupes = sorted({p for p in indexed if indexed.count(p) > 1})
    assert not dupes, f"indexed more than once in bench/results/README.md: {dupes}"
    files = _results_files()
    missing = sorted(files - set(indexed))
    assert not missing, f"results files not indexed in bench/results/README.md: {missing}"
    ghosts = sorted(set(indexed) - files)
    assert not ghosts, f"bench/results/README.md indexes files that do not exist: {ghosts}"


def test_rows_are_complete_and_statuses_match_folders():
    for r in _rows():
        path = r["file"].strip("`")
        empty = [c for c in COLUMNS if not r[c]]
        assert not empty, f"{path}: empty registry cells {empty}"
        words = {w.strip(" *").lower() for w in r["status"].split(",")}
        assert words <= STATUSES, f"{path}: status {r['status']!r}, want words of {sorted(STATUSES)}"
        if path.startswith("diag/"):
            assert "diagnostic" in words, f"{path} is under diag/ but its status is {r['status']!r}"
        elif path.startswith("archive/"):
            assert "superseded" in words, f"{path} is under archive/ but its status is {r['status']!r}"
        else:
            assert not words & {"diagnostic", "superseded"}, (
                f"{path}: status {r['status']!r} belongs under diag/ or archive/")


def test_rows_name_pages_that_cite_the_file():
    for r in _rows():
        path = "bench/results/" + r["file"].strip("`")
        pages = re.findall(r"docs/[A-Za-z0-9_./-]+\.md", r["cited by"])
        assert pages, f"{path}: 'cited by' names no docs page ({r['cited by']!r})"
        for page in pages:
            assert (ROOT / page).exists(), f"{path}: 'cited by' names {page}, which does not exist"
            assert path in (ROOT / page).read_text(), f"{path}: {page} does not cite it by its full path"


@pytest.mark.parametrize("source", _citing_files(), ids=_rel)
def test_cited_paths_exist(source):
    text = source.read_text()
    bad = []
    for m in sorted(set(CITED.findall(text))):
        target = m.rstrip(".")
        hits = list(ROOT.glob(target)) if "*" in target else [ROOT / target] if (ROOT / target).exists() else []
        if not hits:
            bad.append(target)
    assert not bad, f"{_rel(source)} cites paths that do not exist: {bad}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))], ids=_rel)
def test_results_are_cited_by_full_path(page):
    if not page.exists():
        pytest.skip("no README.md")
    abbreviated = sorted(set(ABBREVIATED.findall(page.read_text())))
    assert not abbreviated, f"{_rel(page)} cites results files in an abbreviated form (cite the full path): {abbreviated}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=_rel)
def test_docs_images_exist(page):
    bad = [link for link in IMAGE_LINK.findall(page.read_text())
           if "://" not in link and not (page.parent / link).resolve().exists()]
    assert not bad, f"{_rel(page)} links images that do not exist: {bad}"


# --------------------------------------------------------------------------- provenance of new results

def test_demo_results_record_provenance(tmp_path):
    from jaxweight.demos import _common as C

    p = C.provenance()
    assert set(p) >= PROVENANCE and p["command"] and p["machine"] and p["date"].endswith("Z")
    ours = {"x": 1, "date": "kept"}
    path = C.write_results(tmp_path, ours)
    import json

    saved = json.loads(path.read_text())
    assert set(saved) >= PROVENANCE | {"x"} and saved["date"] == "kept" and saved["x"] == 1
    assert ours == {"x": 1, "date": "kept"}  # the caller's dict is not changed
    assert C.write_results(tmp_path, [1, 2], "list.json").read_text().split() == ["[", "1,", "2", "]"]


def test_bench_records_record_provenance():
    spec = importlib.util.spec_from_file_location("_bench_common_for_test", ROOT / "bench" / "_common.py")
    b = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = b
    try:
        spec.loader.exec_module(b)
        rec = b.record("m", "n", "s", 1.0, "baseline", 2.0, note="x")
    finally:
        del sys.modules[spec.name]
    assert set(rec) >= PROVENANCE and rec["ratio"] == 2.0
    assert rec["device"] == b.device_name()  # the record's own device string is kept
