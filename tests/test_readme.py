"""The README's code blocks marked ``<!-- readme:run -->`` run as written (in order, one namespace).

They are the tour and the Design section's worked example: if an API they show changes,
this test fails instead of the README silently going stale. Warnings are errors here as
everywhere, so a snippet that uses a deprecated spelling fails too.
"""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MARK = "<!-- readme:run -->"


def _blocks() -> list[str]:
    text = README.read_text()
    return re.findall(re.escape(MARK) + r"\s*```python\n(.*?)```", text, flags=re.S)


def test_readme_has_runnable_blocks():
    blocks = _blocks()
    assert len(blocks) >= 6, len(blocks)
    assert "python -m jaxweight demo" in README.read_text()


def test_readme_blocks_run(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)   # a block that writes files writes them here
    ns: dict = {}
    for i, code in enumerate(_blocks()):
        try:
            exec(compile(code, f"README.md block {i}", "exec"), ns)  # noqa: S102 - the README's own code
        except Exception as e:  # pragma: no cover - the message says which block broke
            pytest.fail(f"README block {i} failed: {type(e).__name__}: {e}\n{code}")
    # the blocks computed what their comments say
    assert ns["rw_logs"]["random_weighting/sample_count"] == 1.0      # the five-line example
    assert "maxent/weight_entropy" in ns["mx_logs"] and ns["cur_logs"]["curriculum/items_tracked"] == 8.0
    assert ns["lw"].shape == (10_000, 100, 10)
    assert ns["next_ids"].shape == (4096,) and ns["clogs"]["curriculum/items_tracked"] > 4000
    assert ns["mlogs"]["maxent/tau"] != 0.5 and ns["mlogs"]["maxent/n_invalid"] == 0.0
    assert ns["out"].item_ids.shape == (256,)                         # the Design example's step
    assert ns["states"].ema.shape == (4, 10_000)
    assert ns["sstate"].version == 2 and int(ns["sstate"].counter) == 7
