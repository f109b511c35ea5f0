"""P99 TTFT against the number of replicas, one line per routing policy, with the target:
where each line crosses it is the fleet that policy needs (matplotlib, the `bench` extra)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .report import summary  # noqa: E402
from .simulate import simulate  # noqa: E402

COUNTS = (40, 50, 60, 70, 80, 90, 100, 120, 140, 170, 200, 250, 300)


def plot_p99_against_replicas(
    figures, workload, routers, from_store, warm_up, target, path: Path, counts=COUNTS
) -> dict:
    curve = {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, make in routers.items():
        ys = [
            summary(simulate(figures, workload, n, make(), from_store, warm_up))["ttft_p99_s"]
            for n in counts
        ]
        curve[name] = dict(zip(counts, ys, strict=True))
        ax.plot(counts, ys, marker="o", label=name)
    if target is not None:
        ax.axhline(target, color="0.4", linestyle="--", label=f"target {target} s")
    ax.set(
        xlabel="replicas",
        ylabel="P99 TTFT (s)",
        yscale="log",
        title=f"{workload.adapters:,} adapters, {workload.rate:,.0f} requests/s, "
        f"Zipf {workload.zipf} (simulated)",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return curve
