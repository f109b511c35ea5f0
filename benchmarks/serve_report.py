"""What benchmarks/serve.py reports: latency percentiles, the table, and the plots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from png_canvas import Canvas
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
    for name, values in (("ttft", [r.ttft for r in ok]), ("tpot", tpot), ("itl", itl),
                         ("e2el", [r.e2e for r in ok])):  # fmt: skip
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


# ---- plots ------------------------------------------------------------------------------------
COLORS = {
    "loragate": (31, 119, 180),
    "engine": (255, 127, 14),
    "vllm": (44, 160, 44),
    "loragate-fixed": (214, 39, 40),
}


def plot_itl_over_time(runs: dict[str, tuple[list[Result], float]], path: Path) -> None:
    """ITL of one stream (the first request: it decodes through the burst) against time
    since its first token, one line per server: a stall shows as a spike."""
    pw, ph, pad = 900, 300, 60
    canvas = Canvas(pw + 2 * pad, ph + 2 * pad + 30)
    series = {}
    for name, (results, _) in runs.items():
        r = results[0] if results and results[0].ok else None
        if r is not None and len(r.token_times) > 1:
            t0 = r.token_times[0]
            series[name] = [
                (b - t0, (b - a) * 1e3)
                for a, b in zip(r.token_times, r.token_times[1:], strict=False)
            ]
    right = max((p[0] for pts in series.values() for p in pts), default=1.0) or 1.0
    top = max((p[1] for pts in series.values() for p in pts), default=1.0) or 1.0
    canvas.text(pad, pad - 40, "ITL MS OF ONE STREAM VS SECONDS SINCE ITS FIRST TOKEN")
    canvas.line(pad, pad + ph, pad + pw, pad + ph, (0, 0, 0), 1)
    canvas.line(pad, pad, pad, pad + ph, (0, 0, 0), 1)
    for frac in (0.0, 0.5, 1.0):
        canvas.text(pad + int(frac * pw) - 8, pad + ph + 8, f"{right * frac:.1f}")
        canvas.text(4, pad + ph - int(frac * ph) - 5, f"{top * frac:.0f}")
    for k, (name, pts) in enumerate(series.items()):
        for t, ms in pts:  # one stem per token: a stall is one tall stem
            x = pad + t / right * pw + 2 * k
            canvas.line(x, pad + ph, x, pad + ph - ms / top * ph, COLORS.get(name, (0, 0, 0)), 1)
    legend_x = pad
    for name in series:
        canvas.rect(
            legend_x, ph + 2 * pad, legend_x + 20, ph + 2 * pad + 10, COLORS.get(name, (0, 0, 0))
        )
        canvas.text(legend_x + 28, ph + 2 * pad, name)
        legend_x += 200
    canvas.save(path)


def plot_cdfs(runs: dict[str, list[Result]], path: Path) -> None:
    """Latency CDFs (TTFT, ITL, E2E), one panel each, one colour per run."""
    panels = [
        ("TTFT MS", lambda rs: [r.ttft * 1e3 for r in rs if r.ok]),
        ("ITL MS", lambda rs: [x * 1e3 for r in rs if r.ok for x in r.itl]),
        ("E2E MS", lambda rs: [r.e2e * 1e3 for r in rs if r.ok]),
    ]
    pw, ph, pad = 360, 260, 50
    canvas = Canvas(pad + len(panels) * (pw + pad), ph + 2 * pad + 30)
    for i, (title, pick) in enumerate(panels):
        x0, y0 = pad + i * (pw + pad), pad
        series = {name: np.sort(np.asarray(pick(rs))) for name, rs in runs.items()}
        top = max((float(s[-1]) for s in series.values() if len(s)), default=1.0) or 1.0
        canvas.text(x0, y0 - 25, title)
        canvas.line(x0, y0 + ph, x0 + pw, y0 + ph, (0, 0, 0), 1)
        canvas.line(x0, y0, x0, y0 + ph, (0, 0, 0), 1)
        for frac in (0.0, 0.5, 1.0):
            canvas.text(x0 + int(frac * pw) - 8, y0 + ph + 8, f"{top * frac:.0f}", scale=2)
            canvas.text(x0 - 30, y0 + ph - int(frac * ph) - 5, f"{frac:.1f}", scale=2)
        for name, values in series.items():
            if not len(values):
                continue
            ys = np.arange(1, len(values) + 1) / len(values)
            points = [
                (x0 + v / top * pw, y0 + ph - y * ph) for v, y in zip(values, ys, strict=True)
            ]
            for (ax, ay), (bx, by) in zip(points, points[1:], strict=False):
                canvas.line(ax, ay, bx, by, COLORS.get(name, (0, 0, 0)))
    legend_x = pad
    for name in runs:
        canvas.rect(
            legend_x, ph + 2 * pad, legend_x + 20, ph + 2 * pad + 10, COLORS.get(name, (0, 0, 0))
        )
        canvas.text(legend_x + 28, ph + 2 * pad, name)
        legend_x += 160
    canvas.save(path)


# ---- main -----------------------------------------------------------------------------------
