"""The preference loop's store of traced round programs (jaxweight.preference._programs): a second
loop with the same settings loads its phases instead of tracing them and gets the same results;
other settings or code miss; a broken artifact is traced again; the store is off without the
persistent cache."""
import logging

import jax
import numpy as np
import pytest

pytestmark = pytest.mark.slow  # traces and exports the loop's round programs (the loop tests are slow too)

from jaxweight.preference import _programs
from jaxweight.preference import driver as dr

from tests.contracts import assert_trees_close

from .test_loop import _random_policy_trajs, make_dataset_loop

pytest.importorskip("flatbuffers")

C = 60


@pytest.fixture(scope="module")
def trajs():
    return _random_policy_trajs(jax.random.key(0), 3_000)


@pytest.fixture
def store(tmp_path, monkeypatch):
    folder = tmp_path / "jaxweight-programs"
    monkeypatch.setattr(_programs, "store_dir", lambda: folder)
    return folder


def _run(pc):
    pc.train(0, 0, C, num_seeds=2)
    return pc.state, pc.history


def _exports(monkeypatch):
    calls = []
    real = _programs.export_phase

    def counting(fn, args):
        calls.append(fn)
        return real(fn, args)

    monkeypatch.setattr(_programs, "export_phase", counting)
    return calls


def test_second_loop_loads_the_phases_and_agrees(trajs, store, monkeypatch):
    calls = _exports(monkeypatch)
    state1, hist1 = _run(make_dataset_loop(trajs))
    assert len(calls) == 4  # collect, fit_reward, fit_agent, finish traced and stored
    assert len(list(store.glob("*.exported"))) == 4 and len(list(store.glob("*.json"))) == 4

    pc = make_dataset_loop(trajs)
    state2, hist2 = _run(pc)
    assert len(calls) == 4  # nothing traced again
    kinds = {n: type(pc._jit[k].result()).__name__ for k in pc._jit if k[0] == "aot" for n in [k[1]]}
    assert kinds == {"init": "Compiled", "collect": "FlatProgram", "fit_reward": "FlatProgram",
                     "fit_agent": "FlatProgram", "finish": "FlatProgram"}
    np.testing.assert_equal(hist2, hist1)  # bit for bit (NaN == NaN)
    assert_trees_close(state2, state1)  # bit for bit

    # the same as without the store (plain jit of the same phases)
    monkeypatch.setattr(_programs, "store_dir", lambda: None)
    _, hist3 = _run(make_dataset_loop(trajs))
    np.testing.assert_equal(hist3, hist1)


def test_other_settings_miss_the_store(trajs, store, monkeypatch):
    calls = _exports(monkeypatch)
    _run(make_dataset_loop(trajs))
    _run(make_dataset_loop(trajs, fragment_length=8))  # other shapes: other programs
    assert len(calls) == 8 and len(list(store.glob("*.exported"))) == 8
    _run(make_dataset_loop(trajs, temperature=0.5))  # an array leaf: same shapes, but fingerprinted
    assert len(calls) == 12


def test_a_broken_artifact_is_traced_again(trajs, store, monkeypatch, caplog):
    _, hist1 = _run(make_dataset_loop(trajs))
    for p in store.glob("*.exported"):
        p.write_bytes(b"not a program")
    calls = _exports(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="jaxweight.preference"):
        _, hist2 = _run(make_dataset_loop(trajs))
    assert len(calls) == 4 and "unreadable stored program" in caplog.text
    np.testing.assert_equal(hist2, hist1)  # bit for bit (NaN == NaN)
    _, hist3 = _run(make_dataset_loop(trajs))  # replaced by good ones
    assert len(calls) == 4
    np.testing.assert_equal(hist3, hist1)


def test_store_is_off_without_the_persistent_cache(monkeypatch, tmp_path):
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert _programs.store_dir() is None
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert _programs.store_dir() == tmp_path / "jaxweight-programs"
    finally:
        jax.config.update("jax_compilation_cache_dir", old)


def test_classes_without_source_are_not_stored(trajs):
    pc = make_dataset_loop(trajs)
    assert _programs.source_hash([pc.generator, pc.reward_module]) is not None
    Local = type("Local", (), {"__module__": "not_a_module"})  # noqa: N806 - a class with no source file
    assert _programs.source_hash([Local()]) is None
    assert isinstance(pc, dr.PreferenceComparisons)
