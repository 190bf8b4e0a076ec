"""random_weighting runs under ``jax.debug_nans`` and ``jax.debug_infs`` (CONVENTIONS: no NaN or
inf as a sentinel in a state or an output).

"Not set yet" is a flag: an X-ray scale state without its first loss holds ``initial_loss = 0``
and ``initialized = False``; a non-finite loss is skipped without a NaN reaching any op. Each
test runs eager (every op checked) and jitted (outputs checked) and must equal the unchecked run.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxweight import random_weighting as rw
from tests.contracts import assert_trees_close, checked_and_plain, debug_checks

NAN, INF = float("nan"), float("inf")





def test_law_config_init_step_and_metrics(jit_or_eager):
    """config / init / step / resample_trajectory / weights / stats: finite, in the bounds, and
    equal to the unchecked run; metrics_dict is finite floats."""
    with debug_checks():
        cfg = rw.config(trajectory_sigmas={"xray": 1.0}, step_sigmas=0.3, log_weight_bounds=(-2.0, 2.0))

    def f(k0, k1, k2):
        s = rw.init(cfg, k0)
        s1 = rw.step(s, k1, cfg)
        return s, s1, rw.resample_trajectory(s1, k2, cfg), rw.weights(s1), rw.stats(s1, cfg)

    keys = jax.random.split(jax.random.key(0), 3)
    out, plain = checked_and_plain(f, jit_or_eager, *keys)
    assert_trees_close(out, plain)
    s, s1, s2, w, st = out
    assert int(s.sample_count) == 0 and int(s1.sample_count) == 1 and int(s2.sample_count) == 0
    for lw in (s.base_log_weights, s1.log_weights, s2.log_weights):
        assert np.all((np.asarray(lw) >= -2.0) & (np.asarray(lw) <= 2.0))
    np.testing.assert_array_equal(s1.base_log_weights, s.base_log_weights)   # a step keeps the base
    np.testing.assert_allclose(w, np.exp(np.asarray(s1.log_weights)), rtol=1e-6)
    assert float(st["weight_xray"]) == float(w[0])
    with debug_checks():
        m = rw.metrics_dict(s1, cfg)
    assert len(m) == 1 + 3 * 10 and all(np.isfinite(v) for v in m.values())
    assert m["random_weighting/sample_count"] == 1.0


@pytest.mark.parametrize("trajectories, steps", [(5, 3), (80, 60)])   # fused kernel / per-component scan
def test_sample_schedule(trajectories, steps, jit_or_eager):
    """A whole schedule under the checks equals the unchecked one and stays in the bounds."""
    cfg = rw.config(step_sigmas=0.5)
    f = lambda k: rw.sample_schedule_with_base(k, cfg, trajectories, steps)  # noqa: E731
    got, plain = checked_and_plain(f, jit_or_eager, jax.random.key(1))
    assert_trees_close(got, plain)
    lw, base = got
    assert lw.shape == (trajectories, steps, 10) and base.shape == (trajectories, 10)
    assert np.all(np.abs(np.asarray(lw)) <= 3.0)


def test_xray_scale_unset_and_nonfinite_losses(jit_or_eager):
    """The unset scale is a flag (initial_loss 0, initialized False), not NaN; NaN and inf losses
    are skipped (state unchanged, the current weight returned); then the first finite loss sets it."""
    with debug_checks():
        cfg = rw.xray_scale_config()
        s0 = rw.xray_scale_init(cfg)
    assert (float(s0.weight), float(s0.initial_loss), bool(s0.initialized)) == (1.0, 0.0, False)

    def f(s, a, b, c):
        s, wa = rw.xray_scale_step(s, a, cfg)
        s, wb = rw.xray_scale_step(s, b, cfg)
        s2, wc = rw.xray_scale_step(s, c, cfg)
        return s, wa, wb, s2, wc

    losses = (np.float32(NAN), np.float32(INF), np.float32(100.0))
    (s, wa, wb, s2, wc), plain = checked_and_plain(f, jit_or_eager, s0, *losses)
    assert_trees_close((s, wa, wb, s2, wc), plain)
    assert_trees_close(s, s0)
    assert float(wa) == float(wb) == 1.0
    assert bool(s2.initialized) and float(s2.initial_loss) == 100.0
    np.testing.assert_allclose(wc, 0.75, rtol=1e-6)   # 0.5 * 1 + 0.5 * 50 / 100


def test_xray_scale_zero_denominator_lands_on_max_weight(jit_or_eager):
    """``initial_loss + 1e-6 == 0``: target / 0 is taken as max_weight directly, no inf on the way."""
    with debug_checks():
        cfg = rw.xray_scale_config()
        s0 = rw.xray_scale_init(cfg, np.float32(-1e-6))
    (s, w), plain = checked_and_plain(lambda s, x: rw.xray_scale_step(s, x, cfg), jit_or_eager, s0,
                                       np.float32(5.0))
    assert_trees_close((s, w), plain)
    np.testing.assert_allclose(w, 0.5 * 1.0 + 0.5 * 10.0, rtol=1e-6)


def test_component_weighting_with_a_nan_loss(jit_or_eager):
    """torchref's component weighting: a NaN X-ray loss leaves the scale at 1, the weights are
    the random ones, all finite."""
    with debug_checks():
        cfg = rw.component_config()
        s0 = rw.component_init(cfg, 0)

    def f(s, k, x):
        return rw.component_step(s, k, x, cfg)

    (s, w), plain = checked_and_plain(f, jit_or_eager, s0, jax.random.key(2), np.float32(NAN))
    assert_trees_close((s, w), plain)
    assert set(w) == set(cfg.random.components) and not bool(s.xray.initialized)
    np.testing.assert_allclose(np.stack([w[c] for c in cfg.random.components]), rw.weights(s.random), rtol=1e-6)
    with debug_checks():
        out = rw.combine({"xray": np.float32(0.75)}, w)
    np.testing.assert_allclose(out["xray"], 0.75 * w["xray"], rtol=1e-6)
