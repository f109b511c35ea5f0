"""What benchmarks/loadgen_curves.py reads from the load generators' own reports (guidellm's
JSON, inference-perf's per-stage lifecycle reports), the knee it finds on the curves, its
table, and its plots (with benchmarks/plots.py's helpers). No servers and no tools here, so a
test can run it on fixed sample reports."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.ticker import NullFormatter, ScalarFormatter
from plots import COLORS, _legend, _save, plt


# ---- parsing the tools' own reports ----------------------------------------------------------
def _pcts(summary: dict | None, scale: float, count: int = 1) -> dict:
    """p50 and p99 of one tool's distribution summary, in ms; none of a point where no
    request succeeded (guidellm then writes zeros)."""
    if not summary or count == 0:
        return {"p50": None, "p99": None}
    inner = summary.get("percentiles", summary)  # guidellm nests them, inference-perf not
    p50 = inner.get("p50", inner.get("median"))
    p99 = inner.get("p99")
    return {
        "p50": None if p50 is None else p50 * scale,
        "p99": None if p99 is None else p99 * scale,
    }


def parse_guidellm(report: dict) -> list[dict]:
    """One point per benchmark of guidellm's JSON report (a sweep: synchronous, throughput,
    constant rates): the rate it asked for (None for synchronous and throughput), the rate
    it achieved (successful requests/s), TTFT and ITL p50/p99 in ms of the successful
    requests, and the request counts."""
    points = []
    for bench in report["benchmarks"]:
        strategy = bench["config"]["strategy"]
        metrics = bench["metrics"]
        totals = metrics["request_totals"]
        ok = totals["successful"]
        ttft = metrics["time_to_first_token_ms"]["successful"]
        points.append(
            {
                "strategy": strategy.get("type_", strategy.get("type")),
                "target_rate": strategy.get("rate"),
                "rate": metrics.get("requests_per_second", metrics.get("request_throughput"))[
                    "successful"
                ]["mean"],
                "ttft_ms": _pcts(ttft, 1.0, ok),
                "itl_ms": _pcts(metrics["inter_token_latency_ms"]["successful"], 1.0, ok),
                "successful": totals["successful"],
                "errored": totals["errored"],
                "incomplete": totals["incomplete"],
            }
        )
    return sorted(points, key=lambda p: p["rate"])


def parse_inference_perf(reports: Path) -> list[dict]:
    """One point per stage of inference-perf's per-stage lifecycle reports
    (stage_<i>_lifecycle_metrics.json; its latencies are in seconds)."""
    points = []
    files = sorted(
        reports.glob("stage_*_lifecycle_metrics.json"), key=lambda p: int(p.name.split("_")[1])
    )
    for path in files:
        stage = json.loads(path.read_text())
        load = stage.get("load_summary", {})
        ok = stage["successes"]
        points.append(
            {
                "stage": int(path.name.split("_")[1]),
                "target_rate": load.get("requested_rate"),
                "rate": ok["throughput"]["requests_per_sec"],
                "sent_rate": load.get("achieved_rate"),
                "ttft_ms": _pcts(ok["latency"]["time_to_first_token"], 1e3, ok["count"]),
                "itl_ms": _pcts(ok["latency"]["inter_token_latency"], 1e3, ok["count"]),
                "successful": ok["count"],
                "errored": stage["failures"]["count"],
            }
        )
    return points


def knee(points: list[dict], ttft_ms: float) -> dict | None:
    """The highest achieved rate whose P99 TTFT is at or under `ttft_ms` (None when no
    point is): the rate a server sustains at that first-token tail."""
    under = [
        p for p in points if p["ttft_ms"]["p99"] is not None and p["ttft_ms"]["p99"] <= ttft_ms
    ]
    if not under:
        return None
    best = max(under, key=lambda p: p["rate"])
    return {"rate": best["rate"], "ttft_p99_ms": best["ttft_ms"]["p99"]}


def knees(curves: dict[str, list[dict]], thresholds) -> dict[str, dict]:
    """Per threshold: each server's knee and loragate's over vLLM's (`ratio`; a loragate
    variant such as loragate-f32 gets its own `ratio_<name>`)."""
    out = {}
    for ms in thresholds:
        row = {name: knee(points, ms) for name, points in curves.items()}
        theirs = row.get("vllm")
        ratios = {}
        for name in curves:
            if not name.startswith("loragate"):
                continue
            ours = row[name]
            ratio = ours["rate"] / theirs["rate"] if ours and theirs and theirs["rate"] else None
            ratios["ratio" if name == "loragate" else f"ratio_{name}"] = ratio
        out[f"{ms:g}"] = row | {"ratio": None} | ratios
    return out


# ---- the plots ------------------------------------------------------------------------------
def plot_curves(
    tool: str, curves: dict[str, list[dict]], knee_ms: float, path: Path, note, adapters: int = 16
):
    """TTFT and ITL (p50 solid, p99 dashed) against the achieved request rate, one panel
    each, one colour per server; each server's knee at `knee_ms` circled on the TTFT panel."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, metric, title in zip(
        axes, ("ttft_ms", "itl_ms"), ("TTFT (ms)", "ITL (ms)"), strict=True
    ):
        for name, points in curves.items():
            points = [p for p in points if p[metric]["p50"] is not None]
            if not points:
                continue
            xs = [p["rate"] for p in points]
            colour = COLORS.get(name, f"C{3 + list(curves).index(name)}")
            ax.plot(xs, [p[metric]["p50"] for p in points], "o-", color=colour, label=f"{name} p50")
            ax.plot(
                xs, [p[metric]["p99"] for p in points], "s--", color=colour, label=f"{name} p99"
            )
            found = knee(points, knee_ms) if metric == "ttft_ms" else None
            if found:
                ax.plot(
                    found["rate"],
                    found["ttft_p99_ms"],
                    "o",
                    ms=16,
                    mfc="none",
                    mec=colour,
                    mew=2,
                    label=f"{name} knee {found['rate']:.2f} req/s",
                )
        if metric == "ttft_ms":
            ax.axhline(knee_ms, color="0.5", lw=1, ls=":", label=f"P99 TTFT {knee_ms:g} ms")
        ax.set(xlabel="achieved request rate (req/s)", ylabel=title)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        _legend(ax, fontsize=7)
    fig.suptitle(f"{tool}: latency against request rate, {adapters} adapters served")
    _save(fig, path, note)


def table(result: dict) -> str:
    lines = [
        "| tool | server | point | target req/s | achieved req/s | TTFT p50 / p99 ms | "
        "ITL p50 / p99 ms | ok / errored |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def ms(d):
        return " / ".join("-" if v is None else f"{v:.0f}" for v in (d["p50"], d["p99"]))

    for name, run in result["runs"].items():
        for tool in ("guidellm", "inference_perf"):
            for p in run[tool]:
                point = p.get("strategy") or f"stage {p['stage']}"
                target = "-" if p["target_rate"] is None else f"{p['target_rate']:.2f}"
                lines.append(
                    f"| {tool} | {name} | {point} | {target} | {p['rate']:.2f} | "
                    f"{ms(p['ttft_ms'])} | {ms(p['itl_ms'])} | {p['successful']} / {p['errored']} |"
                )
    lines.append("")
    for tool, rows in result["knees"].items():
        for ms_, row in rows.items():
            parts = [
                f"{n} {row[n]['rate']:.2f}" if row.get(n) else f"{n} none" for n in result["runs"]
            ]
            ratio = "".join(
                f", {'loragate' if key == 'ratio' else key[len('ratio_') :]} / vllm {value:.2f}x"
                for key, value in row.items()
                if key.startswith("ratio") and value is not None
            )
            lines.append(f"knee ({tool}, P99 TTFT <= {ms_} ms): {', '.join(parts)} req/s{ratio}")
    return "\n".join(lines)
