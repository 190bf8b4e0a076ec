"""One process of the 2-process localhost run started by tests/test_multihost.py.

Run as ``python tests/multihost_worker.py --process-id I --num-processes N --port P --out DIR``
from the repository root. It joins the cluster on 127.0.0.1 (gloo CPU
collectives), then

1. syncs weights from process 0 to every process through
   ``jaxweight.sync.broadcast_weight_sync`` for a few ticks, and
2. runs data-parallel reward-training steps (``preference.training.step`` with
   ``mesh=``) on a mesh spanning both
   processes, each process feeding its half of the batch,

and writes what it saw to ``DIR/worker<I>.npz`` (NumPy, no pickle).
:func:`make_problem` is shared with the test, which computes the one-process
reference.
"""

from __future__ import annotations

import argparse
import os
import sys

SYNC_INTERVAL = 2
SYNC_TICKS = 5
DP_STEPS = 2
GLOBAL_PAIRS = 16
LEARNING_RATE = 1e-2


def make_problem(seed: int = 0):
    """(trainer, state, pairs, prefs, mask): a reward trainer and one batch of labelled fragment pairs."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxweight.preference import FragmentPairs, RewardMLP, RewardTrainer

    rng = np.random.RandomState(seed)
    p, length, d, a = GLOBAL_PAIRS, 3, 4, 2
    pairs = FragmentPairs(
        obs=jnp.asarray(rng.randn(p, 2, length + 1, d), jnp.float32),
        acts=jnp.asarray(rng.randn(p, 2, length, a), jnp.float32),
        rews=jnp.asarray(rng.randn(p, 2, length), jnp.float32),
        terminal=jnp.asarray(rng.rand(p, 2) < 0.2),
        valid=jnp.ones((p,), bool),
    )
    prefs = jnp.asarray(rng.rand(p) < 0.5, jnp.float32)
    mask = jnp.asarray(np.arange(p) % 5 != 3)  # a few padded pairs: a masked mean
    trainer = RewardTrainer(RewardMLP(hidden_sizes=(16,)), batch_size=GLOBAL_PAIRS,
                            learning_rate=LEARNING_RATE, progress=False)
    example = jax.tree.map(lambda x: x[:1], pairs).transitions()
    state = jax.jit(lambda: trainer.init(seed, example))()
    return trainer, state, pairs, prefs, mask


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--num-processes", type=int, default=2)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--local-devices", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jaxweight import distributed as dist

    addr = f"127.0.0.1:{args.port}"
    dist.initialize_cpu_cluster(addr, args.num_processes, args.process_id,
                                local_device_count=args.local_devices, bind_coordinator=addr,
                                gloo_hostname="127.0.0.1", initialization_timeout=40)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxweight import sync
    from jaxweight.preference import training

    pid = jax.process_index()
    out: dict[str, np.ndarray] = {
        "process_count": np.asarray(jax.process_count()),
        "device_count": np.asarray(jax.device_count()),
        "local_device_count": np.asarray(jax.local_device_count()),
    }

    # 1. weight sync from process 0: its learner changes every tick; the other
    #    processes pass a junk tree of the same shapes as their "learner".
    learner = {"w": jnp.zeros((3,), jnp.float32), "b": jnp.zeros((), jnp.int32)}
    actor = jax.device_put(dist.broadcast_from_process0(learner), jax.local_devices()[0])
    hook = sync.broadcast_weight_sync(SYNC_INTERVAL)
    seen, fired = [], []
    for t in range(1, SYNC_TICKS + 1):
        if pid == 0:
            learner = {"w": jnp.full((3,), float(t)), "b": jnp.asarray(10 * t, jnp.int32)}
        else:
            learner = {"w": jnp.full((3,), -999.0), "b": jnp.asarray(-1, jnp.int32)}
        actor = hook(learner, actor)
        seen.append(np.asarray(actor["w"]))
        fired.append(hook.fired)
        assert actor["w"].devices() == {jax.local_devices()[0]}
    out["sync_w"] = np.stack(seen)
    out["sync_b"] = np.asarray(actor["b"])
    out["sync_fired"] = np.asarray(fired)
    out["sync_state"] = np.asarray([hook.state_dict()[k] for k in ("counter", "version", "last_sync")])

    # 2. data-parallel reward training over a mesh spanning both processes
    trainer, state, pairs, prefs, mask = make_problem(0)
    per = GLOBAL_PAIRS // args.num_processes
    local = jax.tree.map(lambda x: x[pid * per:(pid + 1) * per], (pairs, prefs, mask))
    mesh = dist.make_mesh()
    step = jax.jit(lambda s, p, y, m: training.step(s, p, y, trainer.config, mask=m, mesh=mesh))
    st = dist.replicate(state, mesh)
    batch = dist.shard_batch(local, mesh)
    for _ in range(DP_STEPS):
        st, metrics = step(st, *batch)
    for path, leaf in jax.tree_util.tree_flatten_with_path(dist.to_host(st.params))[0]:
        out["dp" + jax.tree_util.keystr(path)] = leaf
    for name, v in dist.to_host(metrics).items():
        out["dp_metric_" + name] = v
    out["dp_steps"] = dist.to_host(st.steps)

    np.savez(os.path.join(args.out, f"worker{pid}.npz"), **out)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
