"""What one simulated run shows (TTFT percentiles, where adapters were found, loads per
second), and the fewest replicas that serve a workload within a P99 TTFT target."""

from __future__ import annotations

from collections import Counter

from .figures import Figures
from .simulate import Run, simulate
from .workload import Workload

TIERS = ("slot", "cpu", "loading", "disk", "store")


def pct(values, p: float) -> float:
    """The percentile as benchmarks/replicas.py takes it (nearest rank)."""
    values = sorted(values)
    return float(values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))])


def summary(run: Run) -> dict:
    ttfts = run.ttfts()
    tiers = Counter(r.tier for r in run.requests)
    n = len(run.requests)
    return {
        "policy": run.policy,
        "replicas": run.replicas,
        "requests": n,
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p99_s": pct(ttfts, 99),
        "e2e_p50_s": pct(
            [
                r.finished - r.arrival + o / 1e3
                for r, o in zip(run.requests, run.overhead_ms, strict=True)
            ],
            50,
        ),
        "hit": {t: tiers[t] / n for t in TIERS},
        "loads": run.loads,
        "loads_per_s": {k: v / run.duration_s for k, v in run.loads.items()},
        "disk_load_ms_mean": run.disk_load_ms_mean,
        "spilled": run.spilled,
        "busiest_replica_share": max(run.per_replica) / max(1, n),
    }


def replicas_needed(
    figures: Figures,
    workload: Workload,
    make_router,
    target_p99_s: float,
    lo: int,
    hi: int,
    from_store: bool = True,
    warm_up: float = 0.3,
) -> tuple[int | None, dict]:
    """The fewest replicas in [lo, hi] whose P99 TTFT meets the target (bisection: more
    replicas never hurt much in this model), with that run's summary; None if hi does not."""

    def run(r: int) -> dict:
        return summary(simulate(figures, workload, r, make_router(), from_store, warm_up))

    best = run(hi)
    if best["ttft_p99_s"] > target_p99_s:
        return None, best
    while hi - lo > max(1, lo // 50):
        mid = (lo + hi) // 2
        s = run(mid)
        if s["ttft_p99_s"] <= target_p99_s:
            hi, best = mid, s
        else:
            lo = mid
    return hi, best
