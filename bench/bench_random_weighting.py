"""Benchmarks of ``jaxweight.random_weighting``.

Size: 10^4 trajectories x 100 steps x 10 components of log-weights, drawn with
``sample_schedule`` in one jitted call. References measured in the same run:

1. the algorithm the way torchref runs it: one Python object per trajectory,
   drawing one scalar per component per step from a NumPy ``RandomState``
   and returning a dict of float weights (written here; timed on a subset of
   the trajectories and scaled linearly when the whole would take > ~20 s).
   Goal: >= 200x.
2. the RNG floor: a bare jitted ``jax.random.normal`` of the same shape plus a
   clip. Goal: ``sample_schedule`` within 1.3x of it.

Two further rows are for information: the key contract written with vmapped
``init`` / ``step`` (what a straightforward JAX port does) and a hand-fused floor (the unrolled threefry
hash of ``sample_schedule`` on flat counters, normal transform and clip: the
same number of draws without any key structure, flat output). The gap
between the floors is how jax lowers threefry on CPU (a rolled 5-iteration
loop that materialises two full-size arrays per iteration, versus one fused
pass) and the [T, S, 10] layout (XLA's CPU loop does not vectorise an
innermost dimension of 10, so the floor is also timed on a flat (N,) array).

Run: ``python bench/bench_random_weighting.py [--quick] [--json out.json]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import main, record, time_call, time_jax  # noqa: E402
from jax import lax  # noqa: E402

from jaxweight import random_weighting as rw  # noqa: E402

MODULE = "random_weighting"


class TorchrefStyleScheme:
    """Baseline: the sampling law the way torchref runs it, one trajectory per object.

    As torchref's ``RandomWeightingScheme``: one ``np.random.RandomState`` per
    object; per component and draw one ``rng.normal(mean, sigma)`` scalar,
    ``np.clip`` to the bounds, the current log-weights and weights kept as
    dicts of floats; every step returns a copy of the weight dict. torchref
    additionally mirrors each value into a torch buffer (``fill_``/``item``);
    that is left out (torch is not a dependency), so this baseline is faster
    than torchref itself.
    """

    def __init__(self, components, mu, trajectory_sigma, step_sigma, lower, upper, seed):
        self.components = tuple(components)
        self.mu = dict(zip(self.components, map(float, mu)))
        self.ts = dict(zip(self.components, map(float, trajectory_sigma)))
        self.ss = dict(zip(self.components, map(float, step_sigma)))
        self.lo = dict(zip(self.components, map(float, lower)))
        self.hi = dict(zip(self.components, map(float, upper)))
        self.rng = np.random.RandomState(seed)
        self.resample_trajectory()

    def _update_weights(self):
        self.current_weights = {c: float(np.exp(v)) for c, v in self.log_weights.items()}

    def resample_trajectory(self) -> dict[str, float]:
        self.base = {}
        for c in self.components:
            self.base[c] = float(np.clip(self.rng.normal(self.mu[c], self.ts[c]), self.lo[c], self.hi[c]))
        self.log_weights = dict(self.base)
        self.sample_count = 0
        self._update_weights()
        return self.current_weights.copy()

    def step(self) -> dict[str, float]:
        for c in self.components:
            v = self.base[c] + self.rng.normal(0.0, self.ss[c])
            self.log_weights[c] = float(np.clip(v, self.lo[c], self.hi[c]))
        self.sample_count += 1
        self._update_weights()
        return self.current_weights.copy()


def _baseline_schedule(cfg, T, S, seed=0):
    args = [np.asarray(getattr(cfg, f)) for f in ("mu", "trajectory_sigma", "step_sigma", "lower", "upper")]
    out = []
    for j in range(T):
        sch = TorchrefStyleScheme(cfg.components, *args, seed=seed + j)
        out.append([sch.step() for _ in range(S)])
    return out


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 (20 rounds) written out as integer ops, the hash jax.random uses (Salmon et al. 2011)."""
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = x0 ^ ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r)))
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _hand_fused_floor(key, n):
    """Flat counters -> unrolled threefry -> normal (jax.random's transform) -> clip: the draws
    without key structure.

    Flat output: reshaped to [T, S, 10] XLA would run the fused loop with 10
    innermost, which the CPU backend does not vectorise (about 10x slower).
    """
    kd = jax.random.key_data(key)
    g0, g1 = _threefry2x32(kd[0], kd[1], np.uint32(0), lax.iota(jnp.uint32, n))
    u = lax.bitcast_convert_type(lax.shift_right_logical(g0 ^ g1, np.uint32(9)) | np.uint32(0x3F800000),
                                 jnp.float32) - np.float32(1.0)
    lo = np.nextafter(np.float32(-1.0), np.float32(0.0), dtype=np.float32)
    u = lax.max(lo, u * (np.float32(1.0) - lo) + lo)
    return jnp.clip(np.float32(np.sqrt(2)) * lax.erf_inv(u), -3.0, 3.0)


def _vmapped_contract(key, cfg, T, S):
    """The schedule's key contract written the straightforward way: init/step vmapped over split keys."""
    def trajectory(k):
        k_init, k_steps = jax.random.split(k)
        s = rw.init(cfg, k_init)
        return jax.vmap(lambda ks: rw.step(s, ks, cfg).log_weights)(jax.random.split(k_steps, S))

    return jax.vmap(trajectory)(jax.random.split(key, T))


def run(quick: bool = False) -> list[dict]:
    T, S = (1000, 100) if quick else (10_000, 100)
    cfg = rw.config()
    K = cfg.num_components
    size = f"{T}x{S}x{K}"
    n_rep = 5 if quick else 10
    key = jax.random.key(0)
    recs = []

    sched = jax.jit(lambda k, c: rw.sample_schedule(k, c, T, S))
    t_ours = time_jax(sched, key, cfg, n=n_rep)
    sched_vmap = jax.jit(lambda k, c: _vmapped_contract(k, c, T, S))
    t_vmap = time_jax(sched_vmap, key, cfg, n=max(3, n_rep // 2))
    floor = jax.jit(lambda k: jnp.clip(jax.random.normal(k, (T, S, K), jnp.float32), -3.0, 3.0))
    t_floor = time_jax(floor, key, n=n_rep)
    floor_flat = jax.jit(lambda k: jnp.clip(jax.random.normal(k, (T * S * K,), jnp.float32), -3.0, 3.0))
    t_floor_flat = time_jax(floor_flat, key, n=n_rep)
    fused = jax.jit(lambda k: _hand_fused_floor(k, T * S * K))
    t_fused = time_jax(fused, key, n=n_rep)

    # torchref-style baseline on a subset, scaled linearly if the whole would take > ~20 s
    sub = min(T, 200 if quick else 500)
    t0 = time.perf_counter()
    _baseline_schedule(cfg, sub, S)
    per_traj = (time.perf_counter() - t0) / sub
    n_full = T if per_traj * T <= 20.0 else sub
    if n_full == T and sub < T:
        b = time_call(lambda: _baseline_schedule(cfg, T, S), n=1, warmup=0)
        base_s, scaled = b.median, False
    else:
        b = time_call(lambda: _baseline_schedule(cfg, sub, S), n=3 if quick else 2, warmup=0)
        base_s, scaled = b.median * T / sub, sub < T
    note_base = (f"baseline timed on {sub} of {T} trajectories and scaled linearly ({b.median:.2f} s measured); "
                 if scaled else "")
    note_base += (f"{base_s / (T * S) * 1e6:.1f} us per step (10 scalar normal + np.clip + exp, dict of floats; "
                  f"torchref's torch-buffer mirroring left out); sample_schedule compile {t_ours['compile_s']:.2f} s")
    recs.append(record(MODULE, "sample_schedule vs torchref-style objects", size, t_ours.median,
                       "torchref-style (NumPy RandomState, dict per step)", base_s,
                       goal=">= 200x", met=base_s / t_ours.median >= 200, note=note_base,
                       compile_s=t_ours["compile_s"], spread_s=[t_ours["q25_s"], t_ours["q75_s"]],
                       baseline_scaled=scaled))
    ratio_floor = t_ours.median / t_floor.median
    recs.append(record(MODULE, "sample_schedule vs RNG floor", size, t_ours.median,
                       "jax.random.normal + clip (same shape)", t_floor.median,
                       goal="<= 1.3x the floor", met=ratio_floor <= 1.3,
                       note=(f"sample_schedule takes {ratio_floor:.2f}x the floor's time; "
                             f"floor compile {t_floor['compile_s']:.2f} s"),
                       compile_s=t_ours["compile_s"]))
    recs.append(record(MODULE, "sample_schedule vs RNG floor, flat", size, t_ours.median,
                       "jax.random.normal + clip, flat (N,)", t_floor_flat.median,
                       note=("the floor without the [T, S, 10] layout, whose innermost 10 keeps XLA's CPU loop "
                             "from vectorising (information)"),
                       compile_s=t_ours["compile_s"]))
    recs.append(record(MODULE, "vmapped init/step (same key contract) vs RNG floor", size, t_vmap.median,
                       "jax.random.normal + clip (same shape)", t_floor.median,
                       note="straightforward vmapped jax.random formulation of the same key contract (information)",
                       compile_s=t_vmap["compile_s"]))
    recs.append(record(MODULE, "sample_schedule vs hand-fused floor", size, t_ours.median,
                       "unrolled threefry + normal + clip, flat (N,)", t_fused.median,
                       note=(f"same draws without key structure (information): sample_schedule takes "
                             f"{t_ours.median / t_fused.median:.2f}x; the two-level keys add one hash per "
                             f"(trajectory, step) and a transpose"),
                       compile_s=t_fused["compile_s"]))

    # one step of 10^4 trajectories at once (a training loop that resamples every step)
    Tn = T
    states = jax.vmap(rw.init, in_axes=(None, 0))(cfg, jax.random.split(key, Tn))
    keys = jax.random.split(jax.random.key(1), Tn)
    vstep = jax.jit(jax.vmap(rw.step, in_axes=(0, 0, None)))
    t_step = time_jax(vstep, states, keys, cfg, n=n_rep * 2)
    objs = [TorchrefStyleScheme(cfg.components, *[np.asarray(getattr(cfg, f)) for f in
                                                  ("mu", "trajectory_sigma", "step_sigma", "lower", "upper")], seed=j)
            for j in range(min(Tn, 1000))]
    b_step = time_call(lambda: [o.step() for o in objs], n=5)
    b_step_s = b_step.median * Tn / len(objs)
    recs.append(record(MODULE, "vmapped step (one step, all trajectories)", f"{Tn}x{K}", t_step.median,
                       "torchref-style objects, one step each", b_step_s,
                       note=(f"baseline timed on {len(objs)} objects, scaled linearly; " if len(objs) < Tn else "")
                       + "per-step use inside a Python loop (dispatch-bound on CPU; information)",
                       compile_s=t_step["compile_s"]))
    return recs


if __name__ == "__main__":
    main(run)
