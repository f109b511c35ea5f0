"""The fleet model (benchmarks/fleet_sim.py, benchmarks/fleet/) against the real run it was
checked on (benchmarks/fleet_check.json: two replicas on Ray Serve, 200 adapters, measured
once on this machine): simulated TTFT and load counts within 20% of the measured ones, for
each routing policy. A deliberately wrong figure must fail the same check, so the check can
fail. Plus the pieces on their own: the workload's popularity and rates, each router's
choice, and the scheduler's slot rule."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from fleet.check import CHECK_JSON, compare, recorded_runs, table  # noqa: E402
from fleet.figures import Capacity, Figures, LoadTimes, StepTime, load_figures  # noqa: E402
from fleet.in_run import figures_of, spread  # noqa: E402
from fleet.measure import loads_beside_steps, other_steppers  # noqa: E402
from fleet.replica import Replica, Request  # noqa: E402
from fleet.routing import Holders, Multiplexed, RoundRobin, Spill  # noqa: E402
from fleet.workload import Workload  # noqa: E402

TOLERANCE = 0.20
LOADS = ("disk_loads", "slot_loads")
TTFTS = ("ttft_p50_s", "ttft_p99_s")


def _off(rows, metrics) -> list:
    return [r for r in rows if r.metric in metrics and r.error > TOLERANCE]


@pytest.fixture(scope="module")
def rows():
    assert CHECK_JSON.exists(), "benchmarks/fleet_check.json: run `python -m fleet.check_run`"
    rows = compare(load_figures())
    assert len(rows) == 15  # three policies x TTFT p50, p99, disk and slot loads, load ms
    return rows


@pytest.fixture(scope="module", params=recorded_runs(), ids=lambda run: run.name)
def run_rows(request):
    """Each recorded run, and the check's rows against it on the figures measured beside it."""
    run = request.param
    return run, compare(load_figures(run.figures), run.check)


def test_every_recorded_run_is_checked(tmp_path):
    kept = tmp_path / "runs"
    for name, files in (("b", 2), ("a", 2), ("half", 1)):
        (kept / name).mkdir(parents=True)
        for f in ("fleet_check.json", "fleet_figures.json")[:files]:
            (kept / name / f).write_text("{}")
    runs = recorded_runs(tmp_path / "c.json", tmp_path / "f.json", kept)
    assert [r.name for r in runs] == ["c.json", "a", "b"]
    assert runs[1].figures == kept / "a" / "fleet_figures.json"
    assert len(recorded_runs()) >= 2  # the test's run and the AVX2 EPYC's


def test_load_counts_match_the_measured_run(run_rows):
    _, rows = run_rows
    assert not _off(rows, LOADS), "the model's loads drifted:\n" + table(rows)


UNPACED_FIGURES = pytest.mark.xfail(
    strict=True,
    reason="known gap, BENCHMARKS.md (fleet model): the model's TTFT runs 25-50% below the "
    "recorded run's (a loaded AVX-512 EPYC), and 27-62% below a quiet rerun on an AVX2 EPYC "
    "(benchmarks/fleet_runs/): their figures hold no load timed beside running steps "
    "(fleet.measure's disk_paced_ms), and loads took 2.5x their alone time in the AVX2 run",
)


def test_ttft_matches_the_measured_run(run_rows, request):
    """Within 20% of every recorded run; an expected failure (strict) for a run whose figures
    were measured before fleet.measure timed paced loads. A run recorded with them is held
    to it."""
    run, rows = run_rows
    if load_figures(run.figures).load.disk_paced_ms is None:
        request.applymarker(UNPACED_FIGURES)
    assert not _off(rows, TTFTS), "the model's TTFT drifted:\n" + table(rows)


@pytest.mark.parametrize(
    "wrong, capacity",
    [
        pytest.param(lambda f: f, {"cpu_tier": 16}, id="a CPU tier twice as large"),
        pytest.param(lambda f: f, {"slots": 2}, id="half the slots"),
        pytest.param(
            lambda f: replace(f, load=replace(f.load, disk_ms=f.load.disk_ms * 3)),
            None,
            id="disk loads 3x slower",
        ),
        pytest.param(
            lambda f: replace(f, load=replace(f.load, paced_ratio=0.0, disk_paced_ms=None)),
            None,
            id="loads not paced",
        ),
    ],
)
def test_a_wrong_figure_fails_the_check(rows, wrong, capacity):
    """The check is not vacuous: each mistake in the model's inputs moves some figure that
    the right inputs hold within 20% out of it."""
    checked = (*LOADS, *TTFTS)  # the figures the check holds (not the mean load's time)
    held = {(r.config, r.metric) for r in rows if r.metric in checked and r.error <= TOLERANCE}
    assert held
    bad = compare(wrong(load_figures()), capacity=capacity)
    assert [r for r in bad if (r.config, r.metric) in held and r.error > TOLERANCE], (
        "a wrong figure passed the check:\n" + table(bad)
    )


PACED_RUNS = [r for r in recorded_runs() if load_figures(r.figures).load.disk_paced_ms]


def _paced_times(factor: float):
    def wrong(f: Figures) -> Figures:
        samples = tuple(factor * s for s in f.load.disk_paced_samples_ms)
        load = f.load
        return replace(
            f,
            load=replace(
                load, disk_paced_ms=factor * load.disk_paced_ms, disk_paced_samples_ms=samples
            ),
        )

    return wrong


@pytest.mark.parametrize("run", PACED_RUNS, ids=lambda run: run.name)
@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param(_paced_times(3.0), id="loads beside steps 3x slower"),
        pytest.param(_paced_times(1 / 3), id="loads beside steps 3x faster"),
    ],
)
def test_a_wrong_load_time_fails_the_check_of_a_run_held_to_its_ttft(run, wrong):
    """On a run recorded with load times measured beside steps, whose TTFT the check holds
    too: those times taken 3x too slow or too fast move a held TTFT out of 20%. (Half the
    slots or twice the CPU tier do not, on the Xeon's run at 1.2 requests/s: its slot loads
    move 4-12% and its TTFT under 20%; the test's default run holds those.)"""
    rows = compare(load_figures(run.figures), run.check)
    held = {(r.config, r.metric) for r in rows if r.metric in TTFTS and r.error <= TOLERANCE}
    assert {m for _, m in held} == set(TTFTS), "the run's TTFT is held"
    bad = compare(wrong(load_figures(run.figures)), run.check)
    assert [r for r in bad if (r.config, r.metric) in held and r.error > TOLERANCE], (
        "a wrong figure passed the check:\n" + table(bad)
    )


def test_a_run_is_held_to_its_ttft():
    assert PACED_RUNS, "a recorded run with paced load figures (fleet_runs/2026-11-27-xeon-amx)"


def test_zipf_popularity_and_poisson_rate():
    w = Workload(adapters=1000, rate=50.0, num_requests=20_000, zipf=1.0, seed=3)
    times, picks = w.requests()
    assert np.all(np.diff(times) >= 0)
    harmonic = (1 / np.arange(1, 1001)).sum()
    assert abs(np.mean(picks == 0) - 1 / harmonic) < 0.01  # the top adapter's share
    assert abs(np.mean(picks == 1) - 0.5 / harmonic) < 0.01
    assert abs(len(times) / times[-1] - 50.0) < 2.5
    steep = Workload(adapters=1000, rate=50.0, num_requests=20_000, zipf=2.0, seed=3)
    assert np.mean(steep.requests()[1] == 0) > 0.5


def test_bursty_arrivals_keep_the_mean_rate_and_burst():
    w = Workload(
        adapters=10,
        rate=20.0,
        num_requests=40_000,
        arrivals="bursty",
        burst_factor=4.0,
        burst_fraction=0.2,
        burst_period_s=5.0,
        seed=1,
    )
    times, _ = w.requests()
    assert abs(len(times) / times[-1] - 20.0) < 2.0
    per_second = np.bincount(times.astype(int))
    assert per_second.max() > 2.5 * 20 and per_second.min() < 0.5 * 20


def _figures(**cap) -> Figures:
    return Figures(StepTime(10.0, 0.1, 0.1, 0.5), LoadTimes(80.0, 30.0, 1.0), Capacity(**cap))


def _fleet(n: int, **cap) -> list[Replica]:
    return [Replica(i, _figures(**cap), 16, 32, from_store=True) for i in range(n)]


def test_routers_choose_as_the_real_ones():
    fleet, holders = _fleet(4), Holders()
    assert [RoundRobin().choose(7, fleet, holders).index for _ in range(1)] == [0]
    rr = RoundRobin()
    assert [rr.choose(7, fleet, holders).index for _ in range(5)] == [0, 1, 2, 3, 0]
    holders.add(7, 2)
    mux = Multiplexed(seed=0)
    assert {mux.choose(7, fleet, holders).index for _ in range(20)} == {2}  # affinity
    fleet[2].in_flight = 9
    assert {mux.choose(7, fleet, holders).index for _ in range(20)} == {2}  # even when busy
    spill = Spill(seed=0, spill_at=4, idle_at=1)
    fleet[0].in_flight, fleet[1].in_flight, fleet[3].in_flight = 3, 1, 0
    assert spill.choose(7, fleet, holders).index == 3 and spill.spilled == 1
    fleet[3].in_flight = 2  # nobody idle: routed as Ray Serve routes it
    assert spill.choose(7, fleet, holders).index == 1
    fleet[1].in_flight = 2
    assert spill.choose(7, fleet, holders).index == 2 and spill.spilled == 2


def test_a_request_without_a_free_slot_blocks_the_adapters_behind_it():
    (r,) = _fleet(1, slots=1, cpu_tier=4)
    for a in (1, 2):
        r.accept(Request(a, 0.0, a))
        r.start_load()
        r.finish_load(a)
    step = r.plan_step(0.0)
    assert [q.adapter for q in step.prefills] == [1]  # adapter 2 waits for the one slot
    r.accept(Request(3, 0.0, 1))  # adapter 1 again, behind the blocked one
    r.finish_step()
    step = r.plan_step(0.1)
    assert [q.adapter for q in step.prefills] == []
    assert r.loads == {"store": 2, "disk": 2, "slot": 1}


def test_one_adapter_copied_into_a_slot_a_step():
    (r,) = _fleet(1, slots=4, cpu_tier=4)
    for a in (1, 2, 3):
        r.accept(Request(a, 0.0, a))
        r.start_load()
        r.finish_load(a)
    assert [q.adapter for q in r.plan_step(0.0).prefills] == [1]
    r.finish_step()
    assert [q.adapter for q in r.plan_step(0.1).prefills] == [2]
    assert r.loads["slot"] == 2


def test_in_run_figures_come_from_the_trace_alone():
    """The step fit, its spread and the overheads the check gives the model are read from
    the run's trace: steps of a known cost (doubled one time in ten) give back that cost,
    and each request's time outside its replica is its overhead."""
    rng = np.random.default_rng(0)
    steps = []
    for i in range(400):
        p, d, a = int(rng.integers(0, 4)) * 32, int(rng.integers(0, 20)), int(rng.integers(1, 5))
        ms = (20 + 1.0 * p + 2.0 * d + 0.5 * a) * (2.0 if i % 10 == 0 else 1.0)
        steps.append({"t": float(i), "ms": ms, "prefill": p, "decodes": d, "adapters": a})
    client = [{"id": f"r{i}", "sent": 10.0 * i, "first": 10.0 * i + 1.0} for i in range(50)]
    on_replica = [
        {"id": f"r{i}", "arrived": 10.0 * i + 0.01 * (i % 5), "first": 10.0 * i + 0.98}
        for i in range(50)
    ]
    got = figures_of({"step": steps, "client": client, "request": on_replica, "load": []})
    fit = StepTime(**got["step"])
    assert fit.ms(32, 4, 2) == pytest.approx((20 + 32 + 8 + 1) * 1.1, rel=0.1)
    assert len([n for n in got["step_noise"] if n > 1.5]) == 10  # the slow tenth, kept
    assert got["overhead_ms_median"] == pytest.approx(20 + 20, abs=0.5)
    assert spread([1.0, 2.0, 3.0, 4.0], 2) == [1.75, 3.25]  # the quartiles


def test_a_paced_load_takes_its_measured_time():
    """Beside running sequences a disk load takes `disk_paced_ms` when measured (its pauses
    then the rest past its alone work), else (1 + ratio) times its alone time; with nothing
    running it takes its alone time."""
    measured = Figures(StepTime(10.0, 0.1, 0.1, 0.5), LoadTimes(80.0, 30.0, 1.0, 8.0, 400.0))
    (r,) = [Replica(0, measured, 16, 32, from_store=False)]
    r.accept(Request(0, 0.0, 1))
    _, seconds, _ = r.start_load()
    assert seconds == pytest.approx(0.030)
    assert r.pause_after_load() == 0.0  # nothing running
    r.running.append(Request(1, 0.0, 2))
    assert r.pause_after_load() == pytest.approx(0.370)
    assert r.disk_load_s == pytest.approx(0.030 + 0.370)  # the engine's load_seconds
    older = Figures.from_json(
        measured.to_json() | {"load": {"store_ms": 80, "disk_ms": 30, "slot_ms": 1}}
    )
    assert older.load.disk_paced_ms is None and older.load.paced_ms() == pytest.approx(270.0)
    assert Figures.from_json(measured.to_json()).load.paced_ms() == 400.0


def test_paced_loads_draw_from_the_measured_spread():
    """With the paced loads' samples measured, each paced load takes one of them (the
    replica's seeded draws), and the figures keep them through their JSON."""
    load = LoadTimes(80.0, 30.0, 1.0, 8.0, 300.0, (130.0, 530.0))
    figures = Figures.from_json(Figures(StepTime(10.0, 0.1, 0.1, 0.5), load).to_json())
    assert figures.load.disk_paced_samples_ms == (130.0, 530.0)
    r = Replica(0, figures, 16, 32, from_store=False)
    r.running.append(Request(1, 0.0, 2))
    pauses = {round(r.pause_after_load(), 3) for _ in range(50)}
    assert pauses == {0.1, 0.5}
    assert figures.load.paced_ms() == 300.0  # no draw: the median


class LoadClock:
    """fleet.measure's `time` in a test: `perf_counter` moves only when a load says it took
    a while; `sleep` (its polls) is the real one."""

    sleep = staticmethod(time.sleep)

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_loads_beside_steps_times_only_loads_paced_throughout(monkeypatch):
    """fleet.measure's paced loads: each starts while sequences run on the stepping thread,
    one that ends beside none is not kept, and the steps are stopped at the end. Each load
    takes 20 ms on a clock of the test's (no wall-clock margin): each kept one says 20 ms."""
    clock = LoadClock()
    monkeypatch.setattr("fleet.measure.time", clock)
    state = {"running": False, "steps_ran": False}

    def steps(stop):
        state["running"] = True
        while not stop.is_set():
            state["steps_ran"] = True
            time.sleep(0.001)
        state["running"] = False

    tried = []

    def load(i):
        tried.append(i)
        clock.now += 0.02
        if i == 1:  # the sequences ended during this load
            state["running"] = False

    def running():
        if not state["running"] and state["steps_ran"]:
            state["running"] = True  # the next batch starts
            return False
        return state["running"]

    got = loads_beside_steps(load, steps, running, count=3, settle_s=0.0)
    assert got == pytest.approx([20.0] * 3)
    assert tried == [0, 1, 2, 3]  # the load that ended beside no sequence, tried again
    assert state["steps_ran"] and not state["running"]


def test_other_steppers_run_until_stopped():
    """The processes standing for the other replicas' step threads stay busy until told."""
    procs, stop = other_steppers(1)
    time.sleep(1.0)
    assert [p.is_alive() for p in procs] == [True]
    stop.set()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0]
