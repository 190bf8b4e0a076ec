import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxweight import cli

REPO = Path(__file__).resolve().parents[1]


def test_usage_and_unknown_command(capsys):
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    assert "python -m jaxweight demo" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2


def test_unknown_demo(capsys):
    assert cli.demo(["nope"]) == 2
    assert "unknown demo 'nope'" in capsys.readouterr().err


def test_default_demo_is_the_preference_loop(monkeypatch):
    """`python -m jaxweight demo` with no name runs the preference-comparisons demo (the main job)."""
    assert cli.DEFAULT_DEMO == "preferences" and cli.DEFAULT_DEMO in cli.DEMOS
    seen = []

    class Fake:
        @staticmethod
        def main(argv):
            seen.append(argv)
            return 0

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: Fake if name == cli.DEMOS["preferences"] else None)
    assert cli.demo(["--quick"]) == 0 and seen == [["--quick"]]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    assert "python -m jaxweight demo" in readme
    out = subprocess.run(
        ["awk", '/<!-- ci:test-command -->/{f=1; next} f && /^```/{if (n++) exit; next} f{print}',
         str(REPO / "README.md")], capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("python3 -m venv") and "pytest" in out
    assert "ci:test-command" in (REPO / ".ci" / "run").read_text()


@pytest.mark.smoke
def test_bench_runner_quick_json(tmp_path):
    """Smoke: the bench runner runs one module's quick benchmark and writes the JSON records."""
    if not (REPO / "bench" / "bench_random_weighting.py").exists():
        pytest.skip("no random_weighting benchmark yet")
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "jaxweight", "bench", "--only", "random_weighting", "--quick",
                        "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "XLA_FLAGS": ""})
    assert r.returncode == 0, r.stderr
    recs = json.loads(out.read_text())
    assert recs and {"module", "name", "size", "jaxweight_s", "baseline", "baseline_s", "ratio", "device",
                     "jax_version"} <= set(recs[0])
    assert all(rec["module"] == "random_weighting" for rec in recs)
