"""A discrete-event model of a loragate fleet: R replicas, A adapters with Zipf popularity,
Poisson or bursty arrivals, run on figures measured on this machine
(benchmarks/fleet_figures.json: step time against prompt tokens, running sequences and
distinct adapters; adapter load times from the store, disk and CPU tier, and from disk
beside running steps, paced, where measured). It compares round
robin, Ray Serve's multiplexed routing and loragate's spill rule: where each request found
its adapter (slot, CPU tier, a load in progress, the replica's disk, the store), loads per
second, P50/P99 TTFT, and the fewest replicas that keep P99 TTFT within a target.

The model's pieces are in benchmarks/fleet/ (one idea a file); `--check` compares it with
the real two-replica runs recorded in benchmarks/fleet_check.json and benchmarks/fleet_runs/,
each on the figures measured on its machine (tests/test_fleet_sim.py holds load counts
within 20%; TTFT is an expected failure until the figures hold paced load times).

    cd benchmarks && ../.venv/bin/python fleet_sim.py --check
    cd benchmarks && ../.venv/bin/python fleet_sim.py --adapters 100000 --replicas 100 \\
        --rate 1000 --ttft-target 1.0
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fleet.check import compare, recorded_runs, table
from fleet.figures import load_figures
from fleet.report import TIERS, replicas_needed, summary
from fleet.routing import POLICIES
from fleet.simulate import simulate
from fleet.workload import Workload


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--check",
        action="store_true",
        help="compare with benchmarks/fleet_check.json and the runs in benchmarks/fleet_runs/",
    )
    p.add_argument("--adapters", type=int, default=100_000)
    p.add_argument("--replicas", type=int, default=100)
    p.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds of arrivals")
    p.add_argument("--warm-up", type=float, default=0.3, help="share of requests left out")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent")
    p.add_argument("--arrivals", choices=["poisson", "bursty"], default="poisson")
    p.add_argument("--burst-factor", type=float, default=4.0)
    p.add_argument("--burst-fraction", type=float, default=0.2)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--slots", type=int, default=8, help="max_loras per replica")
    p.add_argument("--cpu-tier", type=int, default=64, help="max_cpu_loras per replica")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--spill-at", type=int, default=4)
    p.add_argument("--spill-idle-at", type=int, default=1)
    p.add_argument(
        "--local-disk",
        action="store_true",
        help="adapters on every replica's disk (no store fetch)",
    )
    p.add_argument("--ttft-target", type=float, default=None, help="P99 TTFT (s) to size for")
    p.add_argument("--search", default="10,400", help="replica counts to search between")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/fleet_sim.json"))
    p.add_argument("--plot", type=Path, default=None, help="a PNG of P99 TTFT against replicas")
    p.add_argument("--plot-counts", default="100,150,200,280,400,600,800")
    return p.parse_args()


def routers(args):
    return {
        "round-robin": lambda: POLICIES["round-robin"](args.seed),
        "multiplexed": lambda: POLICIES["multiplexed"](args.seed),
        "spill": lambda: POLICIES["spill"](args.seed, args.spill_at, args.spill_idle_at),
    }


def print_runs(rows: list[dict]) -> None:
    print(
        "| routing | replicas | TTFT p50 | TTFT p99 | "
        + " | ".join(f"{t} hits" for t in TIERS)
        + " | store fetches/s | disk loads/s | slot loads/s | busiest replica |"
    )
    print("|---" * (10 + len(TIERS) - 1) + "|")
    for s in rows:
        hits = " | ".join(f"{s['hit'][t]:.1%}" for t in TIERS)
        lps = s["loads_per_s"]
        print(
            f"| {s['policy']} | {s['replicas']} | {s['ttft_p50_s']:.3f} s | "
            f"{s['ttft_p99_s']:.3f} s | {hits} | {lps['store']:.0f} | {lps['disk']:.0f} | "
            f"{lps['slot']:.0f} | {s['busiest_replica_share']:.1%} |"
        )


def main() -> None:
    args = parse_args()
    figures = load_figures()
    if args.check:
        for run in recorded_runs():
            print(f"\n{run.name} ({run.check}, on {run.figures}):")
            print(table(compare(load_figures(run.figures), run.check)))
        return
    figures = figures.with_capacity(
        slots=args.slots, cpu_tier=args.cpu_tier, max_num_seqs=args.max_num_seqs
    )
    workload = Workload(
        adapters=args.adapters,
        rate=args.rate,
        num_requests=int(args.rate * args.duration),
        zipf=args.zipf,
        arrivals=args.arrivals,
        burst_factor=args.burst_factor,
        burst_fraction=args.burst_fraction,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=args.seed,
    )
    from_store = not args.local_disk
    record = {"args": {k: str(v) for k, v in vars(args).items()}, "figures": figures.to_json()}
    started = time.perf_counter()
    runs = [
        summary(simulate(figures, workload, args.replicas, make(), from_store, args.warm_up))
        for make in routers(args).values()
    ]
    record["at_replicas"] = runs
    print_runs(runs)
    if args.ttft_target is not None:
        lo, hi = map(int, args.search.split(","))
        sized = []
        for name, make in routers(args).items():
            n, s = replicas_needed(
                figures, workload, make, args.ttft_target, lo, hi, from_store, args.warm_up
            )
            sized.append({"routing": name, "replicas_needed": n, "at_that": s})
            print(
                f"{name}: {n if n is not None else f'more than {hi}'} replicas for P99 TTFT "
                f"<= {args.ttft_target} s",
                flush=True,
            )
        record["sized"] = sized
        print()
        print_runs([row["at_that"] for row in sized])
    if args.plot is not None:
        from fleet.plot import plot_p99_against_replicas

        counts = tuple(map(int, args.plot_counts.split(",")))
        counts = tuple(map(int, args.plot_counts.split(",")))
        record["curve"] = plot_p99_against_replicas(
            figures,
            workload,
            routers(args),
            from_store,
            args.warm_up,
            args.ttft_target,
            args.plot,
            counts,
        )
    print(f"simulated in {time.perf_counter() - started:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
