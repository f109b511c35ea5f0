"""The benchmarks' plots (benchmarks/plots.py, matplotlib): each writes a PNG of the size
asked for, with the lines drawn in it, from the same records the benchmarks produce."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.image as plt_image  # the `bench` extra, which `make` installs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from plots import (  # noqa: E402
    plot_itl_over_time,
    plot_latency_distributions,
    plot_throughput_vs_adapters,
    plot_throughput_vs_concurrency,
)
from serve_workloads import Result  # noqa: E402

C0 = np.array([0x1F, 0x77, 0xB4]) / 255  # matplotlib's first colour: the first series


def _results(seed: int) -> list[Result]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(20):
        gaps = list(rng.uniform(0.01, 0.05, 15))
        times = list(np.cumsum([0.1, *gaps]))
        out.append(Result(True, 10, 16, times[0], times[-1], gaps, token_times=times))
    return out + [Result(False, error="refused")]


def _pixels_of(path: Path, colour) -> int:
    image = plt_image.imread(path)[..., :3]
    return int((np.abs(image - colour).max(axis=-1) < 0.05).sum())


def test_each_plot_is_a_png_with_its_series_drawn(tmp_path):
    runs = {"loragate": _results(0), "vllm": _results(1)}
    written = {
        "latency": lambda p: plot_latency_distributions(runs, p, "note: 2 CPUs, loaded"),
        "itl": lambda p: plot_itl_over_time({k: (v, 1.0) for k, v in runs.items()}, p),
        "concurrency": lambda p: plot_throughput_vs_concurrency(
            [
                {"max_concurrency": c, "output_token_throughput": 10.0 * c, "ttft_p50_ms": 5.0 * c}
                for c in (1, 4, 16)
            ],
            p,
        ),
        "adapters": lambda p: plot_throughput_vs_adapters(
            [(1, 300.0), (4, 280.0), (16, 250.0)], {"base only": 320.0, "PEFT": 90.0}, p
        ),
    }
    for name, draw in written.items():
        path = tmp_path / f"{name}.png"
        draw(path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert _pixels_of(path, C0) > 200, f"{name}: its first series is not drawn"


def test_a_run_with_no_successful_request_still_plots(tmp_path):
    failed = {"loragate": [Result(False, error="refused")]}
    plot_latency_distributions(failed, tmp_path / "latency.png")
    plot_itl_over_time({"loragate": (failed["loragate"], 1.0)}, tmp_path / "itl.png")
    assert (tmp_path / "latency.png").stat().st_size > 0
    assert (tmp_path / "itl.png").stat().st_size > 0
