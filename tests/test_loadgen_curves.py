"""benchmarks/loadgen_reports.py (issue 62's serving curves): what it reads from guidellm's JSON
report and inference-perf's per-stage reports (fixed samples, shaped as guidellm 0.8.1 and
inference-perf 0.7.0 write them), the knee it finds, and the plot it draws. No servers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib.image as plt_image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from loadgen_reports import (  # noqa: E402
    knee,
    knees,
    parse_guidellm,
    parse_inference_perf,
    plot_curves,
    table,
)


def _dist(p50: float, p99: float) -> dict:
    """guidellm's StatusDistributionSummary of one status, cut to what is read."""
    return {"mean": p50, "percentiles": {"p50": p50, "p90": p99, "p99": p99}}


def _guidellm_benchmark(strategy: dict, rate: float, ttft, itl, ok: int, incomplete: int = 0):
    return {
        "config": {"strategy": strategy},
        "metrics": {
            "request_totals": {
                "successful": ok,
                "errored": 0,
                "incomplete": incomplete,
                "total": ok + incomplete,
            },
            "requests_per_second": {"successful": {"mean": rate}},
            "time_to_first_token_ms": {"successful": _dist(*ttft)},
            "inter_token_latency_ms": {"successful": _dist(*itl)},
        },
    }


GUIDELLM = {
    "benchmarks": [
        _guidellm_benchmark({"type_": "synchronous"}, 2.0, (40, 60), (10, 14), 60, 1),
        _guidellm_benchmark(
            {"type_": "throughput", "rate": None}, 9.0, (3000, 9000), (60, 90), 270
        ),
        _guidellm_benchmark({"type_": "constant", "rate": 3.75}, 3.7, (70, 150), (12, 20), 111),
        _guidellm_benchmark({"type_": "constant", "rate": 5.5}, 5.4, (90, 700), (15, 30), 162),
        _guidellm_benchmark({"type_": "constant", "rate": 7.25}, 7.0, (400, 2500), (30, 60), 210),
        # a point where nothing completed in time: guidellm writes zeros, not a fast server
        _guidellm_benchmark({"type_": "constant", "rate": 9.1}, 0.0, (0, 0), (0, 0), 0, 64),
    ]
}


def _stage(requested: float, per_second: float, ttft_s, itl_s, ok: int, failed: int = 0) -> dict:
    def summary(p50, p99):
        return {"mean": p50, "median": p50, "p90": p99, "p99": p99}

    return {
        "load_summary": {"count": ok + failed, "requested_rate": requested, "achieved_rate": 0.0},
        "successes": {
            "count": ok,
            "latency": {
                "time_to_first_token": summary(*ttft_s),
                "inter_token_latency": summary(*itl_s),
            },
            "throughput": {"requests_per_sec": per_second},
        },
        "failures": {"count": failed},
    }


def test_guidellm_points_are_its_benchmarks_by_achieved_rate():
    points = parse_guidellm(GUIDELLM)
    assert [p["rate"] for p in points] == [0.0, 2.0, 3.7, 5.4, 7.0, 9.0]
    assert points[0]["ttft_ms"] == points[0]["itl_ms"] == {"p50": None, "p99": None}
    points = points[1:]
    assert [p["strategy"] for p in points] == [
        "synchronous",
        "constant",
        "constant",
        "constant",
        "throughput",
    ]
    assert points[0]["target_rate"] is None and points[1]["target_rate"] == 3.75
    assert points[2]["ttft_ms"] == {"p50": 90, "p99": 700}
    assert points[2]["itl_ms"] == {"p50": 15, "p99": 30}
    assert (points[0]["successful"], points[0]["incomplete"]) == (60, 1)


def test_inference_perf_points_are_its_stages_in_ms(tmp_path):
    # stage_10 after stage_2: the stage number, not the file name's order
    for i, stage in {
        0: _stage(1.0, 0.98, (0.05, 0.08), (0.010, 0.02), 30),
        2: _stage(3.0, 2.9, (0.2, 1.5), (0.02, 0.05), 90, failed=1),
        10: _stage(6.0, 4.1, (2.0, 6.0), (0.05, 0.2), 120),
        11: _stage(9.0, 0.0, (0.0, 0.0), (0.0, 0.0), 0, failed=3),
    }.items():
        (tmp_path / f"stage_{i}_lifecycle_metrics.json").write_text(json.dumps(stage))
    (tmp_path / "summary_lifecycle_metrics.json").write_text("{}")
    points = parse_inference_perf(tmp_path)
    assert [p["stage"] for p in points] == [0, 2, 10, 11]
    assert [p["target_rate"] for p in points] == [1.0, 3.0, 6.0, 9.0]
    assert [p["rate"] for p in points] == [0.98, 2.9, 4.1, 0.0]
    assert points[3]["ttft_ms"] == {"p50": None, "p99": None}  # nothing succeeded
    assert knee(points, 10_000)["rate"] == 4.1
    assert points[1]["ttft_ms"] == {"p50": 200.0, "p99": 1500.0}
    assert points[1]["itl_ms"] == {"p50": 20.0, "p99": 50.0}
    assert (points[1]["successful"], points[1]["errored"]) == (90, 1)


def test_the_knee_is_the_highest_rate_whose_p99_ttft_stays_under_the_threshold():
    points = parse_guidellm(GUIDELLM)
    assert knee(points, 1000) == {"rate": 5.4, "ttft_p99_ms": 700}
    assert knee(points, 2500) == {"rate": 7.0, "ttft_p99_ms": 2500}  # at it counts
    assert knee(points, 50) is None
    # a point past the knee that dips under again (noise at saturation) still counts: the
    # knee is the highest rate under the threshold, not the first crossing
    noisy = points + [{**points[-1], "rate": 9.5, "ttft_ms": {"p50": 100, "p99": 900}}]
    assert knee(noisy, 1000)["rate"] == 9.5


def test_knees_compare_loragate_with_vllm_per_threshold():
    ours = parse_guidellm(GUIDELLM)
    theirs = [{**p, "rate": p["rate"] / 2} for p in ours]
    found = knees({"loragate": ours, "vllm": theirs}, [50, 1000])
    assert found["1000"]["loragate"]["rate"] == 5.4
    assert found["1000"]["vllm"]["rate"] == 2.7
    assert found["1000"]["ratio"] == 2.0
    assert found["50"] == {"loragate": None, "vllm": None, "ratio": None}
    assert knees({"loragate": ours}, [1000])["1000"]["ratio"] is None  # no peer run
    variant = knees({"loragate-f32": theirs, "vllm": theirs}, [1000])["1000"]
    assert variant["ratio_loragate-f32"] == 1.0 and variant["ratio"] is None


def test_the_plot_and_the_table_show_both_servers(tmp_path):
    ours = parse_guidellm(GUIDELLM)
    curves = {"loragate": ours, "vllm": [{**p, "rate": p["rate"] / 2} for p in ours]}
    path = tmp_path / "curves.png"
    plot_curves("guidellm", curves, 1000, path, "a note")
    image = plt_image.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 1000
    result = {
        "runs": {name: {"guidellm": pts, "inference_perf": []} for name, pts in curves.items()},
        "knees": {"guidellm": knees(curves, [1000])},
    }
    text = table(result)
    assert "| guidellm | vllm | constant | 3.75 | 1.85 | 70 / 150 | 12 / 20 | 111 / 0 |" in text
    knee_line = "knee (guidellm, P99 TTFT <= 1000 ms): loragate 5.40, vllm 2.70 req/s"
    assert f"{knee_line}, loragate / vllm 2.00x" in text
