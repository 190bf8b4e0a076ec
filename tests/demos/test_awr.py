"""The ``awr`` demo: the policy beats default and random weights; the demo uses the library's pieces."""

import jax.numpy as jnp
import numpy as np
import pytest


@pytest.mark.slow
def test_demo_quick_policy_beats_defaults(tmp_path):
    from jaxweight.demos import awr as demo

    res = demo.run(quick=True, out=tmp_path, progress=False, log=lambda *a: None)
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["policy"]["r_free_mean"] < rows["default"]["r_free_mean"] - 2 * rows["default"]["r_free_se"]
    assert rows["policy"]["r_free_mean"] < rows["random"]["r_free_mean"]
    assert rows["policy"]["error_mean"] < rows["default"]["error_mean"]      # also closer to the truth
    assert rows["policy"]["win_rate_vs_default"] > 0.6
    assert demo.policy_wins(res["rows"])
    for k in ("plot", "table", "json"):
        assert (tmp_path / {"plot": "awr_demo.png", "table": "awr_demo.txt", "json": "awr_demo.json"}[k]).exists()


def test_demo_group_advantages_is_the_library_one():
    from jaxweight import maxent
    from jaxweight.demos import awr as demo

    r = jnp.asarray(np.random.RandomState(1).rand(3, 8) + 0.1, jnp.float32)
    x = -jnp.log(r)
    want = (x - x.mean(1, keepdims=True)) / (x.std(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(demo.group_advantages(r), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(demo.group_advantages(r), maxent.group_advantages(x, eps=1e-6, ddof=0))


@pytest.mark.fast
@pytest.mark.smoke
def test_demo_smoke_tiny(tmp_path, monkeypatch):
    """Smoke (the fast tier's end-to-end run of the demo): tiny sizes, every output written and finite."""
    from jaxweight.demos import awr as demo

    monkeypatch.setitem(demo.SIZES, "quick", dict(train=8, group=4, test=16, test_group=4, epochs=1, seeds=1))
    res = demo.run(quick=True, out=tmp_path, progress=False, log=lambda *a: None)
    assert {r["method"] for r in res["rows"]} >= {"policy", "default", "random"}
    assert all(np.isfinite(r["r_free_mean"]) for r in res["rows"])
    for name in ("awr_demo.json", "awr_demo.txt", "metrics.jsonl"):
        assert (tmp_path / name).stat().st_size > 0
    import json

    saved = json.loads((tmp_path / "awr_demo.json").read_text())
    assert saved["total_s"] > 0 and {"command", "commit", "machine", "date"} <= set(saved)
    assert saved["rows"] == json.loads(json.dumps(res["rows"]))
