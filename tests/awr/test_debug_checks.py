"""awr runs under ``jax.debug_nans`` and ``jax.debug_infs`` (CONVENTIONS: no NaN or inf as a
sentinel in a state or an output).

Rows with NaN / inf entries or a False mask are excluded before any op sees them; a batch
without a valid row reports 0 (loss, effective sample size) and counts, never NaN. Each test
runs eager (every op checked) and jitted (outputs checked) and must equal the unchecked run.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxweight import awr
from tests.contracts import assert_trees_close, checked_and_plain, debug_checks

NAN, INF = float("nan"), float("inf")
B, F, K = 16, 4, 3
_rng = np.random.default_rng(0)
X = _rng.normal(size=(B, F)).astype(np.float32)
A = _rng.normal(size=(B, K)).astype(np.float32)
ADV = _rng.normal(size=B).astype(np.float32)
X_BAD = X.copy()
X_BAD[2, 1] = NAN
ADV_BAD = ADV.copy()
ADV_BAD[3], ADV_BAD[5] = NAN, INF
MASK = np.arange(B) < 12





@pytest.fixture(scope="module")
def cfg():
    with debug_checks():
        return awr.config(K, hidden_sizes=(8,))


def test_weights_and_loss_with_bad_entries(jit_or_eager):
    """awr_weights / awr_loss (and its gradient) with NaN, inf and masked entries: 0 weight for
    them, the valid ones equal to the weights computed from the valid entries alone."""
    lp = _rng.normal(size=B).astype(np.float32)
    lp[7] = NAN

    def f(adv, lp, mask):
        return (awr.awr_weights(adv, mask=mask), awr.awr_weights(adv, normalize=False),
                awr.awr_loss(lp, adv, mask=mask), jax.grad(awr.awr_loss)(lp, adv, mask=mask))

    # the bad data are arguments: a NaN constant closed over by a jitted function is itself
    # reported by jax_debug_nans when it is staged, before any library code runs
    (w, w_raw, loss, g), plain = checked_and_plain(f, jit_or_eager, ADV_BAD, lp, MASK)
    assert_trees_close((w, w_raw, loss, g), plain)
    ok = MASK & np.isfinite(ADV_BAD)
    assert np.all(np.asarray(w)[~ok] == 0.0)
    np.testing.assert_allclose(np.asarray(w)[ok], awr.awr_weights(ADV_BAD[ok]), rtol=1e-6)
    assert np.all(np.asarray(w_raw)[[3, 5]] == 0.0)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
    assert np.all(np.asarray(g)[[3, 5, 7, 12, 13, 14, 15]] == 0.0)


def test_all_masked_weights_and_loss_are_zero(jit_or_eager):
    none = np.zeros(B, bool)
    (w, loss), plain = checked_and_plain(
        lambda adv: (awr.awr_weights(adv, mask=none), awr.awr_loss(adv, adv, mask=none)), jit_or_eager, ADV)
    assert_trees_close((w, loss), plain)
    np.testing.assert_array_equal(w, np.zeros(B, np.float32))
    assert float(loss) == 0.0


def test_init_step_predict_with_bad_rows(cfg, jit_or_eager):
    """init with a NaN feature row, a step with NaN / inf advantages and masked rows, then predict
    (on finite features: a prediction has no mask, a NaN feature gives a NaN prediction)."""
    def f(key, x_bad, adv_bad):
        s = awr.init(cfg, key, x_bad)
        s1, out = awr.step(s, x_bad, A, adv_bad, cfg, mask=MASK)
        return s, s1, out, awr.predict_log_weights(s1.policy, X), awr.predict_distribution(s1.policy, X[:3])

    (s, s1, out, pred, dist), plain = checked_and_plain(f, jit_or_eager, jax.random.key(0), X_BAD, ADV_BAD)
    assert_trees_close((s, s1, out, pred, dist), plain)
    assert np.all(np.isfinite(np.asarray(s.policy.feature_mean)))
    assert int(s1.count) == 1
    # rows 2 (NaN feature), 3, 5 (bad advantages) are invalid; rows 12..15 are masked out (not counted)
    assert (float(out["num_valid"]), int(out["n_invalid"])) == (9.0, 3)
    assert all(np.isfinite(float(v)) for v in out.values())
    assert np.all(np.isfinite(np.asarray(pred)))
    with debug_checks():
        m = awr.metrics_dict(out, cfg)
    assert m["awr/n_invalid"] == 3.0 and all(np.isfinite(v) for v in m.values())


@pytest.mark.parametrize("rows", ["all_masked", "empty"])
def test_step_without_a_valid_row_reports_zero_and_keeps_the_state(rows, cfg, jit_or_eager):
    """No valid row: the state is unchanged, the loss and the effective sample size are 0."""
    with debug_checks():
        s0 = awr.init(cfg, 0, X)
    if rows == "empty":
        args, mask = (X[:0], A[:0], ADV[:0]), None
    else:
        args, mask = (X, A, ADV_BAD), np.zeros(B, bool)
    (s, out), plain = checked_and_plain(lambda s, *args: awr.step(s, *args, cfg, mask=mask), jit_or_eager,
                                         s0, *args)
    assert_trees_close((s, out), plain)
    assert_trees_close(s, s0)
    assert {k: float(v) for k, v in out.items()} == {
        "loss": 0.0, "num_valid": 0.0, "n_invalid": 0.0, "weight_ess": 0.0, "clipped_fraction": 0.0}


def test_fit_weight_policy_with_bad_rows(cfg):
    """The host driver (jitted epochs) under the checks: finite losses, the same as unchecked."""
    with debug_checks():
        params, m = awr.fit_weight_policy(0, X_BAD, A, ADV_BAD, cfg, num_epochs=2, batch_size=5)
    params2, m2 = awr.fit_weight_policy(0, X_BAD, A, ADV_BAD, cfg, num_epochs=2, batch_size=5)
    assert_trees_close((params, m), (params2, m2))
    assert m["loss"].shape == (2,) and np.all(np.isfinite(np.asarray(m["loss"])))
    assert int(m["n_invalid"]) == 3
