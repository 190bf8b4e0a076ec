"""The cost-against-size plot of ``bench_roofline.py --sweep``: time per call against size, log-log.

``python bench/plot_roofline_sweep.py SWEEP.json OUT.png``: one line per hot path (its sizes over
two decades or more), each labelled with its growth exponent (the slope over the upper half of its
sizes) and the size up to which it stays within 2x of its smallest size's time (the latency regime).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(recs: list[dict], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(r["key"] for r in recs))
    fig, ax = plt.subplots(figsize=(12.8, 6.4))
    for i, k in enumerate(keys):
        pts = [r for r in recs if r["key"] == k]
        x = [p["n_size"] / pts[0]["n_size"] for p in pts]
        y = [p["jaxweight_s"] for p in pts]
        ax.loglog(x, y, "o-", color=f"C{i % 10}",
                  label=f"{k}: slope {pts[0]['growth_exponent']:.2f}, flat to n={pts[0]['latency_until']:g}")
    ax.set_xlabel("size relative to the path's smallest size (each path's own unit: see the table)")
    ax.set_ylabel("seconds per call (median)")
    ax.set_title(f"cost against size, {recs[0]['device']}, jax {recs[0]['jax_version']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    plot(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
