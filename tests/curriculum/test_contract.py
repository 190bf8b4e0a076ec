"""jaxweight.curriculum: the component contract (tests/contracts.py), donation, KeyIndex, the demo."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import curriculum as cur
from tests.contracts import assert_trees_close, assert_vmap_matches_loop, check_state_contract

F32 = np.float32
N = 10


def test_update_contracts(tmp_path):
    cfg = cur.config("competence_based", 5, capacity=N, rebin_interval=3)
    cfg2 = cur.config("competence_based", 5, capacity=N, rebin_interval=7, ema_alpha=0.9,
                      temperature=0.3, competence_c0=0.5, staleness_coeff=0.9)
    # distinct ids: a run of duplicates is one affine composition whose rounding XLA's fused
    # multiply-adds may change by an ulp between eager and jitted calls (see update's docstring)
    ids = jnp.array([3, 1, 7, 9, 0, 5], jnp.int32)
    scores = jnp.array([0.2, 1.0, 0.7, -0.5, 0.3, 0.9], jnp.float32)
    bids = jnp.stack([ids, ids[::-1], (ids + 4) % N])
    bscores = jnp.stack([scores, scores * 2, scores[::-1]])
    check_state_contract(
        init=lambda: cur.init(cfg),
        update=cur.update,
        update_args=(ids, scores, cfg),
        update_args_alt=(ids[::-1], scores + 1, cfg2),
        batched_init=lambda: jax.vmap(lambda _: cur.init(cfg))(jnp.arange(3)),
        batched_update_in_axes=(0, 0, None),
        batched_update_args=(bids, bscores, cfg),
        tmp_path=tmp_path,
    )


@pytest.mark.slow  # over the fast tier's budget (tests/conftest.py)
def test_update_groups_contracts(tmp_path):
    cfg = cur.config("uniform", 5, capacity=N, rebin_interval=2)
    cfg2 = cur.config("uniform", 5, capacity=N, rebin_interval=5, ema_alpha=0.1)
    ids = jnp.array([4, 4, 2], jnp.int32)
    scores = jnp.array([[1.0, 0.0, jnp.nan], [0.5, 0.5, 1.0], [0.0, 0.0, 0.0]], jnp.float32)
    check_state_contract(
        init=lambda: cur.init(cfg),
        update=cur.update_groups,
        update_args=(ids, scores, cfg),
        update_args_alt=(ids + 1, scores * 0.5, cfg2),
        batched_init=lambda: jax.vmap(lambda _: cur.init(cfg))(jnp.arange(2)),
        tmp_path=tmp_path,
    )


@pytest.mark.slow  # over the fast tier's budget (tests/conftest.py)
def test_donated_update_and_step():
    """The README recipe: ``jax.jit(cur.step, donate_argnums=0)`` updates the pool in place."""
    cfg = cur.config("easy_first", 5, capacity=N)
    s = cur.init(cfg)
    ref = cur.update(s, np.array([1, 2]), np.array([0.3, 0.6], F32), cfg)
    s_in = jax.tree.map(jnp.copy, s)
    out = jax.jit(cur.update, donate_argnums=0)(s_in, jnp.array([1, 2]), jnp.array([0.3, 0.6], jnp.float32), cfg)
    assert s_in.ema.is_deleted() and s_in.count.is_deleted()  # the pool was donated
    assert_trees_close(out, ref)
    step = jax.jit(cur.step, donate_argnums=0, static_argnames="num")
    out2, step_out = step(out, jax.random.key(0), jnp.array([3, 99]), jnp.array([0.1, 0.2], jnp.float32), cfg,
                          num=5, step=0, total_steps=10)
    items = step_out.item_ids
    assert out.ema.is_deleted() and items.shape == (5,) and int(out2.count[3]) == 1
    # the out-of-range id 99 is skipped and counted
    assert step_out.to_dict() == {"curriculum/n_applied": 1.0, "curriculum/n_invalid": 1.0,
                                  "curriculum/n_nonfinite": 0.0, "curriculum/n_out_of_range": 1.0}
    want_state, want_out = cur.step(ref, jax.random.key(0), jnp.array([3]),
                                    jnp.array([0.1], jnp.float32), cfg, step=0, total_steps=10, num=5)
    assert_trees_close(out2, want_state)
    np.testing.assert_array_equal(items, want_out.item_ids)
    sampled = cur.sample(want_state, jax.random.key(0), cfg, step=0, total_steps=10, num=5)
    np.testing.assert_array_equal(sampled, items)


@pytest.mark.slow  # over the fast tier's budget; the tier keeps the update contracts and the demo's run
def test_step_contract(tmp_path):
    """The component contract of ``cur.step``: jit == eager, no recompilation for new values
    (hyperparameters included), stable layout, vmap over seeds and over a hyperparameter,
    checkpoint round trip, donation."""
    cfg = cur.config("competence_sqrt", 5, capacity=N, rebin_interval=3)
    cfg2 = cur.config("competence_sqrt", 5, capacity=N, rebin_interval=7, ema_alpha=0.9, temperature=0.3,
                      competence_c0=0.5)
    ids = jnp.array([3, 1, 7, 9, 0, 5], jnp.int32)  # distinct: see test_update_contracts
    scores = jnp.array([0.2, 1.0, 0.7, -0.5, 0.3, 0.9], jnp.float32)

    def step(s, key, i, x, c, t):
        return cur.step(s, key, i, x, c, num=8, step=t, total_steps=jnp.float32(20))

    key = jax.random.key(0)
    args = (key, ids, scores, cfg, jnp.float32(3))
    check_state_contract(
        init=lambda: cur.init(cfg), update=step, update_args=args,
        update_args_alt=(jax.random.key(1), ids[::-1], scores + 1, cfg2, jnp.float32(9)),
        batched_init=lambda: jax.vmap(lambda _: cur.init(cfg))(jnp.arange(3)),
        batched_update_in_axes=(0, None, None, None, None),
        batched_update_args=(jax.random.split(key, 3), ids, scores, cfg, jnp.float32(3)),
        tmp_path=tmp_path,
    )
    # vmap over a hyperparameter: stacked configs (ema_alpha, temperature are array leaves)
    cfgs = jax.tree.map(lambda *x: jnp.stack(x), *[cur.config("competence_sqrt", 5, capacity=N, ema_alpha=a,
                                                              temperature=t, rebin_interval=3)
                                                   for a, t in ((0.1, 0.5), (0.5, 1.0), (0.9, 2.0))])
    assert_vmap_matches_loop(lambda s, c: step(s, key, ids, scores, c, jnp.float32(3)), (0, 0),
                             jax.vmap(cur.init)(cfgs), cfgs)
    # donation: the jitted step consumes the state and gives the same result
    s0 = cur.init(cfg)
    want = step(s0, *args)
    s_in = jax.tree.map(jnp.copy, s0)
    got = jax.jit(step, donate_argnums=0)(s_in, *args)
    assert all(x.is_deleted() for x in jax.tree.leaves(s_in))
    assert_trees_close(got, want)


@pytest.mark.smoke
def test_demo_quick(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from jaxweight.demos import curriculum as demo

    # two strategies keep it short; the notebook runs all five at small size
    assert demo.main(["--quick", "--out", str(tmp_path), "--no-progress",
                      "--strategies", "uniform,prioritized", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "uniform" in out and "prioritized" in out
    assert (tmp_path / "curriculum_learning_curves.png").stat().st_size > 0
    res = json.loads((tmp_path / "curriculum_results.json").read_text())
    assert set(res["strategies"]) == {"uniform", "prioritized"}
    assert res["time"]["time/compile_s"] > 0 and res["time"]["time/run_s"] > 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == res["steps"]
    assert "curriculum/prioritized/mastered" in json.loads(lines[-1])


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--strategies", "hardest"], ["--seed", "-1"]])
def test_demo_bad_flags_exit_2(argv, capsys):
    from jaxweight.demos import curriculum as demo

    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    assert e.value.code == 2 and "error: argument" in capsys.readouterr().err



# ==================================================================== KeyIndex
def test_key_index():
    k = cur.KeyIndex(3)
    np.testing.assert_array_equal(k.ids(["b", "a", "b"]), [0, 1, 0])
    assert k.ids(["a", "zz"], add=False).tolist() == [1, -1] and len(k) == 2
    assert k.ids("c").shape == () and k.ids("c") == 2
    assert k.ids([["a"], ["c"]]).shape == (2, 1)
    assert k.key(1) == "a" and k.keys() == ["b", "a", "c"] and "c" in k
    with pytest.raises(ValueError) as e:
        k.ids(["d"])
    assert str(e.value) == "KeyIndex is full (capacity 3)"
    assert len(k) == 3  # nothing added by the failed call
    with pytest.raises(ValueError, match="str"):
        k.ids([1])
    with pytest.raises(IndexError):
        k.key(3)
    assert k.ids(np.array(["a", "b"])).dtype == np.int32



def test_init_accepts_and_ignores_a_key():
    cfg = cur.config("uniform", 5, capacity=N)
    assert_trees_close(cur.init(cfg, jax.random.key(0)), cur.init(cfg))
    with pytest.raises(ValueError, match="cfg must be a CurriculumConfig"):
        cur.init(jax.random.key(0), cfg)


def test_public_surface():
    assert set(cur.__all__) <= set(dir(cur))
    assert not any(n.startswith("_") for n in cur.__all__)
    for name in ("update_jit", "step_jit", "update_groups_jit", "sample_items", "state_dict", "load_json"):
        assert not hasattr(cur, name)  # no pre-jitted copies, no forwards
    assert "donate_argnums=0" in cur.update.__doc__ and "donate_argnums=0" in cur.__doc__
