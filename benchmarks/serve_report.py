"""What benchmarks/serve.py reports: latency percentiles and the table (plots: plots.py)."""

from __future__ import annotations

import math

import numpy as np
from serve_workloads import Result


def summarize(results: list[Result], duration: float, slo: dict[str, float]) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]

    def meets(r: Result) -> bool:
        per_token = (r.e2e - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        return (
            r.ttft * 1e3 <= slo.get("ttft", math.inf)
            and per_token * 1e3 <= slo.get("tpot", math.inf)
            and r.e2e * 1e3 <= slo.get("e2el", math.inf)
        )

    summary = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "goodput": sum(meets(r) for r in ok) / duration,
    }
    for name, values in (
        ("ttft", [r.ttft for r in ok]),
        ("tpot", tpot),
        ("itl", itl),
        ("e2el", [r.e2e for r in ok]),
    ):
        summary |= _stats_ms(name, values)
    errors = sorted({r.error for r in results if not r.ok})
    if errors:
        summary["errors"] = errors[:5]
    return summary


STATS = ("mean", "p50", "p90", "p99")


def _stats_ms(name: str, values: list[float]) -> dict:
    if not values:
        return {f"{name}_{k}_ms": float("nan") for k in STATS}
    ms = np.asarray(values) * 1e3
    return {f"{name}_mean_ms": float(ms.mean())} | {
        f"{name}_{k}_ms": float(np.percentile(ms, int(k[1:]))) for k in STATS[1:]
    }


ROWS = [
    ("Successful requests", "completed", "{:.0f}"),
    ("Failed requests", "failed", "{:.0f}"),
    ("Benchmark duration (s)", "duration_s", "{:.2f}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_token_throughput", "{:.1f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    ("Goodput (req/s)", "goodput", "{:.2f}"),
] + [
    (f"{label} {stat} (ms)", f"{key}_{stat}_ms", "{:.1f}")
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))
    for stat in STATS
]


def table(runs: dict[str, dict]) -> str:
    names = list(runs)
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, key, fmt in ROWS:
        cells = [fmt.format(runs[n][key]) if key in runs[n] else "-" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overhead(http: dict, direct: dict) -> dict:
    return {
        "throughput_overhead_pct": 100.0
        * (direct["output_token_throughput"] - http["output_token_throughput"])
        / direct["output_token_throughput"],
        "ttft_p50_added_ms": http["ttft_p50_ms"] - direct["ttft_p50_ms"],
        "e2el_p50_added_ms": http["e2el_p50_ms"] - direct["e2el_p50_ms"],
    }


def sweep_table(points: list[dict]) -> str:
    lines = [
        "| max concurrency | output tok/s | req/s | TTFT p50 (ms) | ITL p50 (ms) |",
        "|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p['max_concurrency']} | {p['output_token_throughput']:.1f} | "
            f"{p['request_throughput']:.2f} | {p['ttft_p50_ms']:.0f} | {p['itl_p50_ms']:.1f} |"
        )
    return "\n".join(lines)
