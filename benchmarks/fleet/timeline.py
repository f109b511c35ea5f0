"""Where the check run's requests spent their time to the first token, from its trace
(benchmarks/results/fleet_check_trace.json, written by fleet/check_run.py): for each
request, the way to its replica (client to the replica's `generate`), the wait for its
adapter through Ray Serve's multiplexed path (the lock, any loads queued before it and its
own), the engine (admitted to the first token out), and the way back. Printed for the
median request and the slowest ones, per routing policy.

    cd benchmarks && ../.venv/bin/python -m fleet.timeline
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from .check_run import TRACE_JSON

PARTS = ("to_replica", "adapter", "engine", "back")


def timelines(trace: dict) -> list[dict]:
    """One row per request: its TTFT and the four parts it adds up to (seconds)."""
    on_replica = {r["id"]: r for r in trace["request"]}
    rows = []
    for c in trace["client"]:
        r = on_replica.get(c["id"])
        if r is None or "first" not in c:
            continue
        resident = r.get("resident", r["arrived"])
        rows.append(
            {
                "id": c["id"],
                "adapter": c["adapter"],
                "pid": r["pid"],
                "ttft": c["first"] - c["sent"],
                "to_replica": r["arrived"] - c["sent"],
                "adapter_wait": resident - r["arrived"],
                "engine": r["first"] - resident,
                "back": c["first"] - r["first"],
                "sent": c["sent"],
            }
        )
    for row in rows:
        row["adapter"] = row.pop("adapter_wait")
    return sorted(rows, key=lambda row: row["ttft"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=TRACE_JSON)
    p.add_argument("--slowest", type=int, default=5)
    args = p.parse_args()
    data = json.loads(args.trace.read_text())
    for policy, trace in data.items():
        rows = timelines(trace)
        print(f"\n{policy}: {len(rows)} requests")
        print("| request | TTFT | " + " | ".join(PARTS) + " |")
        mid = {k: statistics.median(r[k] for r in rows) for k in ("ttft", *PARTS)}
        print("| median of each | " + " | ".join(f"{mid[k] * 1e3:.0f}" for k in ("ttft", *PARTS)))
        for r in rows[-args.slowest :]:
            print(
                f"| {r['id']} ({r['adapter']}) | "
                + " | ".join(f"{r[k] * 1e3:.0f}" for k in ("ttft", *PARTS))
            )
        steps = trace["step"]
        ms = sorted(s["ms"] for s in steps)
        if ms:
            print(
                f"steps: {len(ms)}, ms p50 {ms[len(ms) // 2]:.1f}, p99 "
                f"{ms[int(0.99 * (len(ms) - 1))]:.1f}, max {ms[-1]:.1f}"
            )
        loads = [e["end"] - e["start"] for e in trace["load"]]
        if loads:
            loads.sort()
            print(
                f"loads: {len(loads)}, ms p50 {loads[len(loads) // 2] * 1e3:.0f}, "
                f"p90 {loads[int(0.9 * (len(loads) - 1))] * 1e3:.0f}, max {loads[-1] * 1e3:.0f}"
            )


if __name__ == "__main__":
    main()
