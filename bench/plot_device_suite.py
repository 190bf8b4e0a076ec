"""The device suite's figure, drawn on the CPU machine after the calls came back.

``python bench/plot_device_suite.py CALL1.json CALL2.json OUT.png``: three panels from the calls'
JSONs (``device-suite-call<N>-<size>.json``), each left empty with a note when its part is absent
or did not finish: the hot paths' roofline fractions (latency rows as time per iteration), PPO's
env-steps/s against brax's PPO per seed (compile left out on both sides), and the preference
loop's wall per seed against the number of vmapped seeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _points(calls: list[dict], part: str) -> list[dict]:
    return [p for c in calls for p in c.get(part, {}).get("points", []) if p.get("status", "ok") == "ok"]


def _empty(ax, title: str, calls: list[dict], part: str) -> None:
    st = next((c[part].get("status") for c in calls if part in c), "absent")
    ax.text(0.5, 0.5, f"{part}: {st}", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)


def plot(calls: list[dict], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12.8, 4.2))
    meta = next((c["meta"] for c in calls if "meta" in c), {})

    ax = axes[0]
    hp = [p for p in _points(calls, "hot_paths") if "key" in p]
    mem = [p for p in hp if p.get("roofline_fraction") is not None]
    if mem:
        ax.barh([p["key"] for p in mem], [100 * p["roofline_fraction"] for p in mem], color="C0")
        ax.axvline(100, color="k", lw=0.8)
        ax.set_xlabel("% of the stream measured beside it")
        ax.set_title("hot paths (memory rows)")
    else:
        _empty(ax, "hot paths (memory rows)", calls, "hot_paths")

    ax = axes[1]
    ppo = _points(calls, "ppo_vs_brax")
    sides = [(p["side"], p.get("seed"), p.get("steady_steps_per_s") or p.get("sps")) for p in ppo if "side" in p]
    sides = [s for s in sides if s[2]]
    if sides:
        ax.bar([f"{s}\nseed {k}" for s, k, _ in sides], [v for *_, v in sides],
               color=["C1" if s == "jaxweight" else "C2" for s, *_ in sides])
        ax.set_ylabel("env-steps/s (compile left out)")
        ax.set_title("PPO against brax's PPO")
    else:
        _empty(ax, "PPO against brax's PPO", calls, "ppo_vs_brax")

    ax = axes[2]
    ps = sorted((p["seeds"], p["wall_per_seed_s"]) for p in _points(calls, "preference_seeds") if "seeds" in p)
    if ps:
        ax.loglog([s for s, _ in ps], [w for _, w in ps], "o-", color="C3")
        ax.set_xlabel("vmapped seeds")
        ax.set_ylabel("wall per seed (s)")
        ax.set_title("preference loop, CartPole")
    else:
        _empty(ax, "preference loop, CartPole", calls, "preference_seeds")

    fig.suptitle(f"device suite, size {meta.get('size', '?')}, {meta.get('date', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python bench/plot_device_suite.py CALL.json [CALL.json ...] OUT.png")
    plot([json.loads(Path(a).read_text()) for a in sys.argv[1:-1]], sys.argv[-1])
