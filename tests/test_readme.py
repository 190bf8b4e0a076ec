"""README.md is the front door: short, its commands where a newcomer looks, its example run.

The code block marked ``<!-- readme:run -->`` runs as written, and the assertions check what it
computes: if the API it shows changes, this test fails instead of the README going stale.
Warnings are errors here as everywhere, so a deprecated spelling fails too. Every other page's
code is run by tests/test_docs.py.
"""

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARK = "<!-- readme:run -->"
DEMO_COMMAND = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[all]" && python -m jaxweight demo'
TEST_COMMAND = ('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[all,test]" '
                "&& python -m pytest -n 2")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _blocks() -> list[str]:
    return re.findall(re.escape(MARK) + r"\s*```python\n(.*?)```", _text(), flags=re.S)


def _after(marker: str) -> str:
    """The first line of the code block right after ``marker`` (what .ci/run's awk reads)."""
    m = re.search(re.escape(marker) + r"\s*```[\w]*\n(.*?)\n```", _text(), flags=re.S)
    assert m, f"no code block after {marker}"
    return m.group(1).strip()


def test_readme_is_a_front_door():
    text = _text()
    lines = text.splitlines()
    assert len(lines) <= 200, len(lines)
    # the two set-up commands in the first screen, exactly, with the markers CI and the docs read
    assert _after("<!-- ci:demo-command -->") == DEMO_COMMAND
    assert _after("<!-- ci:test-command -->") == TEST_COMMAND
    first_screen = "\n".join(lines[:60])
    assert "<!-- ci:demo-command -->" in first_screen and "<!-- ci:test-command -->" in first_screen
    assert 'python -m pytest -n 2 -m "not slow"' in text             # the fast tier
    assert len(_blocks()) == 1                                        # one short example
    for word in ("the issue", "15%", "Q section", "goal met", "goal not met"):
        assert word.lower() not in text.lower(), word


def test_component_table_lists_every_package():
    text = _text()
    start = text.index("| module |")
    rows = re.findall(r"^\| `jaxweight\.(\w+)` \|", text[start:], flags=re.M)
    assert {"random_weighting", "awr", "curriculum", "maxent", "rl", "preference", "label", "sync",
            "checkpoint", "metrics", "interop"} <= set(rows)
    assert len(rows) == len(set(rows))


def test_readme_links_are_relative_docs_pages():
    """Links work on GitHub: relative paths under docs/ (pages of the site), no site URLs."""
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text())
    docs = [link for link in links if link.startswith("docs/")]
    assert len(docs) >= 15
    assert all(link.endswith(".md") or link.endswith("/") for link in docs), docs
    own = [link for link in docs if not link.startswith(("docs/results/", "docs/benchmarks.md",
                                                         "docs/guides/rl.md", "docs/guides/preference.md"))]
    missing = [link for link in own if not (REPO / link).exists()]
    assert not missing, missing                                       # the pages this branch writes


def test_readme_example_runs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)   # a block that writes files writes them here
    ns: dict = {}
    (code,) = _blocks()
    try:
        exec(compile(code, "README.md example", "exec"), ns)  # noqa: S102 - the README's own code
    except Exception as e:  # pragma: no cover - the message says what broke
        pytest.fail(f"README example failed: {type(e).__name__}: {e}\n{code}")
    # the example computed what its comments say
    scores = np.asarray(ns["scores"])
    assert ns["next_ids"].shape == (256,) and ns["next_ids"].dtype == jnp.int32
    assert ns["logs"]["curriculum/items_tracked"] == 1024.0 and ns["logs"]["curriculum/n_invalid"] == 0.0
    # an item's first score sets its EMA; the rest of the pool is untracked
    np.testing.assert_allclose(np.asarray(ns["state"].ema)[:1024], scores, rtol=1e-6)
    count = np.asarray(ns["state"].count)
    assert (count[:1024] == 1).all() and (count[1024:] == 0).all()
    # prioritized (frontier) replays tracked items, nearer 0.5 than a uniform draw (mean distance 0.25)
    drawn = np.asarray(ns["next_ids"])
    assert drawn.min() >= 0 and drawn.max() < 1024
    assert np.abs(scores[drawn] - 0.5).mean() < 0.2
    # the sweep: four pools in one program, each EMA = the first score whatever its rate
    assert ns["states"].ema.shape == (4, 100_000)
    np.testing.assert_allclose(np.asarray(ns["states"].ema)[:, :1024], np.broadcast_to(scores, (4, 1024)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ns["sweep"].ema_alpha), [0.1, 0.2, 0.3, 0.5], rtol=1e-6)
