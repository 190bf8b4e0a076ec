"""Every notebook in notebooks/ is executed at small size (JAXWEIGHT_SMALL=1), so none rots.

A notebook reads ``SMALL = os.environ.get("JAXWEIGHT_SMALL") == "1"`` and shrinks its sizes.
The Jupyter kernel stack is the ``notebooks`` extra, not part of ``.[all]``: without it these
tests skip, and CI runs them in a step of their own that fails on a skip (.ci/run).
"""

import importlib.util
import os
from pathlib import Path

import pytest

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
MISSING = [m for m in ("nbformat", "nbclient", "ipykernel", "matplotlib") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks yet")
@pytest.mark.skipif(bool(MISSING), reason=f"the notebook kernel stack is not installed ({', '.join(MISSING)}): "
                    "pip install -e '.[notebooks]' (CI runs the notebooks in a step of their own)")
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    import nbclient
    import nbformat

    monkeypatch.setenv("JAXWEIGHT_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("JAXWEIGHT_NB_OUT", str(tmp_path))
    # notebooks run on one device; the 8 fake devices are for the multi-device tests
    monkeypatch.setenv("XLA_FLAGS", "")
    repo = str(NB_DIR.parent)
    monkeypatch.setenv("PYTHONPATH", repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
