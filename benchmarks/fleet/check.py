"""The model against a real run: the same workload, capacities and routing, simulated with
the figures measured on the run's machine; TTFT and load counts side by side with their
relative error. The model's router draws are random (Ray Serve's two choices), so each
figure is the mean over `seeds` simulations.

The recorded runs: benchmarks/fleet_check.json with benchmarks/fleet_figures.json, and each
folder of benchmarks/fleet_runs/ holding a run's fleet_check.json and the fleet_figures.json
measured beside it (`recorded_runs`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .figures import FIGURES_JSON, Figures, StepTime, load_figures
from .report import summary
from .routing import POLICIES
from .simulate import simulate
from .workload import Workload

CHECK_JSON = Path(__file__).resolve().parent.parent / "fleet_check.json"
RUNS_DIR = Path(__file__).resolve().parent.parent / "fleet_runs"
# tests/test_fleet_sim.py holds TTFT and the load counts within 20%; the mean disk load (the
# engine's `load_seconds` in the run, paced and not, against the model's) is shown beside
# them: the model takes its load times from fleet.measure, never from the run.
METRICS = ("ttft_p50_s", "ttft_p99_s", "disk_loads", "slot_loads", "disk_load_ms_mean")


@dataclass(frozen=True)
class Row:
    config: str
    metric: str
    measured: float
    simulated: float

    @property
    def error(self) -> float:
        return abs(self.simulated - self.measured) / self.measured


@dataclass(frozen=True)
class RecordedRun:
    name: str
    figures: Path  # fleet.measure's figures, taken on the run's machine
    check: Path  # fleet.check_run's record


def recorded_runs(
    check: Path = CHECK_JSON, figures: Path = FIGURES_JSON, runs_dir: Path = RUNS_DIR
) -> list[RecordedRun]:
    """The run the check names by default, then every run kept in `runs_dir` (a folder each,
    with both files), by folder name."""
    runs = [RecordedRun(check.name, figures, check)]
    for folder in sorted(runs_dir.glob("*/")) if runs_dir.is_dir() else ():
        kept = (folder / FIGURES_JSON.name, folder / CHECK_JSON.name)
        if all(p.exists() for p in kept):
            runs.append(RecordedRun(folder.name, *kept))
    return runs


def simulated(figures: Figures, record: dict, policy: str, seeds: int) -> dict:
    workload = Workload(**record["workload"])
    out = dict.fromkeys((*METRICS, "e2e_p50_s"), 0.0)
    for seed in range(seeds):
        kw = {"spill_at": record["spill_at"]} if policy == "spill" else {}
        s = summary(simulate(figures, workload, 2, POLICIES[policy](seed, **kw), seed=seed))
        out["ttft_p50_s"] += s["ttft_p50_s"] / seeds
        out["ttft_p99_s"] += s["ttft_p99_s"] / seeds
        out["disk_loads"] += s["loads"]["disk"] / seeds
        out["slot_loads"] += s["loads"]["slot"] / seeds
        out["disk_load_ms_mean"] += s["disk_load_ms_mean"] / seeds
        out["e2e_p50_s"] += s["e2e_p50_s"] / seeds
    return out


def decode_ms(ttft_p50: float, e2e_p50: float, output_len: int) -> float:
    return (e2e_p50 - ttft_p50) / (output_len - 1) * 1e3


def decode_scaled(figures: Figures, record: dict, policy: str, seeds: int) -> Figures:
    """For a run recorded without a trace: the figures with `step_scale` set so that the
    model decodes as fast as the real run of `policy` did (its median request's time from
    first token to last against the model's own)."""
    out = record["workload"]["output_len"]
    real = record["results"][policy]
    want = decode_ms(real["ttft_p50_s"], real["e2e_p50_s"], out)
    scale = 1.0
    for _ in range(3):  # batches grow as steps slow down: settle the scale
        sim = simulated(replace(figures, step_scale=scale), record, policy, seeds)
        scale *= want / decode_ms(sim["ttft_p50_s"], sim["e2e_p50_s"], out)
    return replace(figures, step_scale=round(scale, 3))


def in_run(figures: Figures, record: dict, policy: str, seeds: int = 5) -> Figures:
    """The figures as the run of `policy` measured them in its own replicas (fleet/in_run.py,
    recorded by fleet/check_run.py): the step time fitted on its steps and their spread
    about the fit, and its requests' ingress overheads. The load times and capacities stay
    the given ones (fleet/measure.py's, the engine settings): the check is of those, and of
    the model's queueing of requests behind steps and loads."""
    if "in_run" not in record["results"][policy]:
        return decode_scaled(figures, record, policy, seeds)
    run = record["results"][policy]["in_run"]
    return replace(
        figures,
        step=StepTime(**run["step"]),
        step_scale=1.0,
        step_noise=tuple(run["step_noise"]),
        overhead_ms=run["overhead_ms_median"],
        overhead_spread_ms=tuple(run["overhead_spread_ms"]),
    )


def compare(
    figures: Figures | None = None,
    path: Path = CHECK_JSON,
    seeds: int = 5,
    capacity: dict | None = None,
) -> list[Row]:
    """Every figure of the recorded run beside the model's; `capacity` overrides the run's
    capacities (to check that a wrong one shows)."""
    record = json.loads(Path(path).read_text())
    figures = (figures or load_figures()).with_capacity(**record["capacity"] | (capacity or {}))
    rows = []
    for policy, measured in record["results"].items():
        sim = simulated(in_run(figures, record, policy, seeds), record, policy, seeds)
        rows += [Row(policy, m, float(measured[m]), sim[m]) for m in METRICS if m in measured]
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| routing | figure | measured | simulated | error |", "|---|---|---|---|---|"]
    for r in rows:
        fmt = "{:.3f} s" if r.metric.endswith("_s") else "{:.0f}"
        lines.append(
            f"| {r.config} | {r.metric} | {fmt.format(r.measured)} | "
            f"{fmt.format(r.simulated)} | {r.error:.0%} |"
        )
    return "\n".join(lines)
