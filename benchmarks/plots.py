"""The benchmarks' PNG plots, drawn with matplotlib (the `bench` extra:
`pip install -e '.[bench]'`): latency distributions and ITL over time for serve.py,
throughput against concurrency, and throughput against the number of adapters for
multi_lora.py. Written beside each run's table so a reader can see the shape, not just
the percentiles."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"loragate": "C0", "engine": "C1", "vllm": "C2", "loragate-fixed": "C3"}


def _legend(ax, **kw) -> None:
    """A legend, or a word saying there is nothing to show (every request failed)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)
    else:
        ax.text(0.5, 0.5, "no successful requests", transform=ax.transAxes, ha="center")


def _save(fig, path: Path, note: str | None) -> None:
    if note:
        fig.text(0.01, 0.01, note, fontsize=8, color="0.4")
    lines = note.count("\n") + 1 if note else 0
    fig.tight_layout(rect=(0, 0.03 * lines, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency_distributions(runs: dict[str, list], path: Path, note: str | None = None):
    """TTFT, ITL and E2E as CDFs, one panel each, one line per server: the whole
    distribution, tails included, where a table gives four percentiles."""
    panels = [
        ("TTFT (ms)", lambda rs: [r.ttft * 1e3 for r in rs if r.ok]),
        ("ITL (ms)", lambda rs: [x * 1e3 for r in rs if r.ok for x in r.itl]),
        ("E2E latency (ms)", lambda rs: [r.e2e * 1e3 for r in rs if r.ok]),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 4))
    for ax, (title, pick) in zip(axes, panels, strict=True):
        for name, results in runs.items():
            values = np.sort(np.asarray(pick(results)))
            if len(values):
                ys = np.arange(1, len(values) + 1) / len(values)
                ax.step(values, ys, where="post", label=name, color=COLORS.get(name))
        ax.set(xlabel=title, ylabel="fraction of samples", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    _legend(axes[0], loc="lower right")
    fig.suptitle("Latency distributions (CDF)")
    _save(fig, path, note)


def plot_itl_over_time(runs: dict[str, tuple[list, float]], path: Path, note: str | None = None):
    """ITL of one stream (the first request: it decodes through the burst) against the time
    since its first token, one line per server: a stall shows as a spike."""
    fig, ax = plt.subplots(figsize=(11, 3.8))
    for name, (results, _) in runs.items():
        r = results[0] if results and results[0].ok else None
        if r is None or len(r.token_times) < 2:
            continue
        times = np.asarray(r.token_times)
        ax.plot(times[1:] - times[0], np.diff(times) * 1e3, label=name, color=COLORS.get(name))
    ax.set(xlabel="seconds since the stream's first token", ylabel="ITL (ms)")
    ax.set_title("Inter-token latency of one stream over time")
    ax.grid(alpha=0.3)
    _legend(ax)
    _save(fig, path, note)


def plot_throughput_vs_concurrency(points: list[dict], path: Path, note: str | None = None):
    """Output tokens/s and TTFT p50 at each --max-concurrency of the sweep."""
    xs = [p["max_concurrency"] for p in points]
    fig, left = plt.subplots(figsize=(7, 4))
    left.plot(xs, [p["output_token_throughput"] for p in points], "o-", color="C0")
    left.set(xlabel="max concurrency (requests in flight)", ylabel="output tokens/s")
    left.set_xscale("log", base=2)
    left.set_xticks(xs, [str(x) for x in xs])
    right = left.twinx()
    right.plot(xs, [p["ttft_p50_ms"] for p in points], "s--", color="C3")
    right.set_ylabel("TTFT p50 (ms)", color="C3")
    left.set_title("loragate serve: throughput and TTFT against concurrency")
    left.grid(alpha=0.3)
    _save(fig, path, note)


def plot_throughput_vs_adapters(
    sweep: list[tuple[int, float]], references: dict[str, float], path: Path, note=None
):
    """Engine tokens/s against the number of distinct adapters in the batch, with the
    base-model-only and PEFT runs as horizontal references."""
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [n for n, _ in sweep]
    ax.plot(xs, [t for _, t in sweep], "o-", color="C0", label="engine, round-robin adapters")
    for i, (label, tps) in enumerate(references.items()):
        ax.axhline(tps, linestyle="--", color=f"C{i + 1}", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set(xlabel="distinct adapters", ylabel="output tokens/s", ylim=(0, None))
    ax.set_title("Multi-LoRA throughput against the number of adapters")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path, note)
