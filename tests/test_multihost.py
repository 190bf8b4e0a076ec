"""Two processes on localhost (gloo CPU collectives): weight broadcast and data-parallel training.

The test starts both workers itself (tests/multihost_worker.py) on a free port
of 127.0.0.1, waits with a timeout and kills them on failure. The workers do
not inherit the 8-fake-device ``XLA_FLAGS`` of the test process: each gets 2
CPU devices on purpose (``jax_num_cpu_devices``), so the mesh spans 4 devices
on 2 processes.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

pytestmark = pytest.mark.slow

from tests import multihost_worker as worker

ROOT = Path(__file__).resolve().parents[1]
NUM_PROCESSES = 2
# a normal run takes 15-30 s on 2 busy cores; the limit only guards against hangs
TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env() -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run_workers(out_dir: Path) -> list[str]:
    """Start the workers, wait for all of them (at most TIMEOUT_S), kill them on any failure."""
    port = _free_port()
    procs, logs = [], []
    timed_out = False
    try:
        for i in range(NUM_PROCESSES):
            log = open(out_dir / f"worker{i}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "multihost_worker.py"), "--process-id", str(i),
                 "--num-processes", str(NUM_PROCESSES), "--port", str(port), "--out", str(out_dir)],
                cwd=ROOT, env=_worker_env(), stdout=log, stderr=subprocess.STDOUT,
            ))
        deadline = time.monotonic() + TIMEOUT_S
        # a crashed worker leaves the others blocked in a collective: stop waiting at once
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    codes = [p.returncode for p in procs]
    if timed_out or any(c != 0 for c in codes):
        why = f"timed out after {TIMEOUT_S} s" if timed_out else "failed"
        pytest.fail(f"workers {why}, exit codes {codes}:\n" + "\n---\n".join(t[-3000:] for t in texts))
    return texts


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost")
    _run_workers(out)
    return [dict(np.load(out / f"worker{i}.npz", allow_pickle=False)) for i in range(NUM_PROCESSES)]


def test_cluster_shape(results):
    for r in results:
        assert int(r["process_count"]) == 2
        assert int(r["local_device_count"]) == 2
        assert int(r["device_count"]) == 4


def test_weight_broadcast_from_process0_follows_fire_pattern(results):
    k = worker.SYNC_INTERVAL
    ticks = range(1, worker.SYNC_TICKS + 1)
    # process 0's learner holds w = t at tick t; the actor shows the last fired tick (0 before any)
    want = np.stack([np.full(3, float((t // k) * k)) for t in ticks])
    last = (worker.SYNC_TICKS // k) * k
    for r in results:
        np.testing.assert_array_equal(r["sync_w"], want)
        assert r["sync_fired"].tolist() == [t % k == 0 for t in ticks]
        assert int(r["sync_b"]) == 10 * last
        assert r["sync_state"].tolist() == [worker.SYNC_TICKS, worker.SYNC_TICKS // k, last]


# The final bias of a Bradley-Terry reward net cancels in every return difference: its
# gradient is float noise, which AdamW turns into summation-order-dependent steps of
# size ~lr. It is checked through its gradient and the model's predictions instead
# (tests/test_multidevice.py has the same check).
_UNIDENTIFIABLE = "['params']['dense_final']['bias']"


def test_data_parallel_reward_step_matches_one_process(results):
    from jaxweight.preference import cross_entropy_loss, preference_probabilities, training

    trainer, state, pairs, prefs, mask = worker.make_problem(0)
    step = jax.jit(lambda s, p, y, m: training.step(s, p, y, trainer.config, mask=m))
    ref = state
    for _ in range(worker.DP_STEPS):
        ref, metrics = step(ref, pairs, prefs, mask)
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), ref.params, state.params)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the steps really changed the params
    g = jax.grad(lambda p: cross_entropy_loss(preference_probabilities(trainer.module, p, pairs)[0], prefs,
                                              mask)[0])(state.params)
    g_max = max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(g))
    assert float(np.abs(np.asarray(g["params"]["dense_final"]["bias"])).max()) <= 1e-6 * g_max
    flat = jax.tree_util.tree_flatten_with_path(ref.params)[0]
    probs = jax.jit(lambda p: preference_probabilities(trainer.module, p, pairs)[0])
    for r in results:
        assert int(r["dp_steps"]) == worker.DP_STEPS
        got = jax.tree_util.tree_unflatten(jax.tree.structure(ref.params),
                                           [r["dp" + jax.tree_util.keystr(path)] for path, _ in flat])
        for path, leaf in flat:
            key = jax.tree_util.keystr(path)
            if key != _UNIDENTIFIABLE:
                np.testing.assert_allclose(r["dp" + key], np.asarray(leaf), rtol=1e-5, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(np.asarray(probs(got)), np.asarray(probs(ref.params)), rtol=1e-5, atol=1e-6)
        for name, v in metrics.items():
            np.testing.assert_allclose(r["dp_metric_" + name], np.asarray(v), rtol=1e-5, atol=1e-7, err_msg=name)
