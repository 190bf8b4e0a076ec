"""Packaging metadata: one source for the version, the extras' split, the project URLs, and
the release step of .ci/run (build, twine check, the wheel outside the checkout)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import jaxweight

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
EXTRAS = PROJECT["optional-dependencies"]


def _names(reqs):
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_the_version_is_written_once():
    assert "version" not in PROJECT and PROJECT["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "jaxweight.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc)?\d*", jaxweight.__version__)


def test_metadata_for_an_index():
    assert PROJECT["authors"] == [{"name": "jaxweight developers"}]
    assert PROJECT["keywords"] and any(c.startswith("Programming Language :: Python :: 3.") for c in
                                       PROJECT["classifiers"])
    urls = PROJECT["urls"]
    assert {"Repository", "Documentation", "Changelog"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    assert (REPO / "CHANGELOG.md").is_file() and (REPO / "CONTRIBUTING.md").is_file()


def test_extras_split_runtime_from_test_tools():
    tools = {"pytest", "pytest-xdist", "hypothesis", "chex", "selenium"}
    assert EXTRAS["all"] == ["jaxweight[rl,plots,tensorboard]"]
    assert tools <= _names(EXTRAS["test"])
    assert not tools & _names(EXTRAS["label"]) and _names(EXTRAS["label"]) == {"starlette", "uvicorn", "pillow"}
    assert {"build", "twine", "jaxweight"} <= _names(EXTRAS["dev"]) and "test" in EXTRAS["dev"][0]


def test_ci_builds_checks_and_runs_the_wheel_outside_the_checkout():
    ci = (REPO / ".ci" / "run").read_text()
    step = ci[ci.index('echo ".ci/run: step wheel'):ci.index("# the notebooks")]
    for needed in ("python -m build", "twine check", "python3 -m venv", ".whl", "[all]", 'cd "$work"',
                   "-m jaxweight --help", "-m jaxweight demo --quick"):
        assert needed in step, needed
    assert "pip install -e" not in step.split('python3 -m venv "$work/venv"')[1]  # the wheel, not editable
