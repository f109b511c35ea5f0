"""The event loop: arrivals, adapter loads and engine steps over R replicas, in simulated
time (heapq; no wall clock). One run gives every request's TTFT and where its adapter was.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .figures import Figures
from .replica import Replica, Request
from .routing import Holders
from .workload import Workload

ARRIVE, LOADED, STEPPED, REPORTED, WORKED = 0, 1, 2, 3, 4
# Ray Serve's replicas push the model ids they hold and load to the router every 0.1 s
# (PUSH_MULTIPLEXED_MODEL_IDS_INTERVAL_S), each on its own timer; the router routes on what
# it last heard.
PUSH_INTERVAL_S = 0.1


@dataclass
class Run:
    policy: str
    replicas: int
    workload: Workload
    requests: list[Request]
    loads: dict[str, int]
    duration_s: float
    overhead_ms: np.ndarray  # each request's, in the order of `requests`
    spilled: int = 0
    per_replica: list[int] = field(default_factory=list)
    disk_load_ms_mean: float = 0.0  # every disk load's, warm-up included

    def ttfts(self) -> np.ndarray:
        return np.array([r.first_token - r.arrival for r in self.requests]) + self.overhead_ms / 1e3


def simulate(
    figures: Figures,
    workload: Workload,
    replicas: int,
    router,
    from_store: bool = False,
    warm_up: float = 0.0,
    seed: int = 0,
) -> Run:
    """Serve the workload; `warm_up` of the requests (a fraction, from the first) fill the
    tiers and are left out of the results."""
    times, picks = workload.requests()
    fleet = [
        Replica(i, figures, workload.output_len, workload.input_len, from_store, seed)
        for i in range(replicas)
    ]
    holders = Holders()
    events: list[tuple] = []
    seq = 0

    def push(t: float, kind: int, what) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, what))

    def kick(r: Replica, now: float) -> None:
        if r.step is None:
            step = r.plan_step(now)
            if step is not None:
                push(step.end, STEPPED, r)

    def load_next(r: Replica, now: float) -> None:
        nxt = r.start_load()
        if nxt is not None:
            adapter, seconds, dropped = nxt
            push(now + seconds, WORKED, (r, adapter))
            if dropped is not None:
                report(r, now)

    def report(r: Replica, now: float) -> None:
        if not r.report_due:
            r.report_due = True
            phase = (r.index * 0.618034) % 1.0 * PUSH_INTERVAL_S
            tick = (int((now - phase) // PUSH_INTERVAL_S) + 1) * PUSH_INTERVAL_S + phase
            push(tick, REPORTED, r)

    requests = [
        Request(i, float(t), int(a)) for i, (t, a) in enumerate(zip(times, picks, strict=True))
    ]
    for req in requests:
        push(req.arrival, ARRIVE, req)
    skip = int(len(requests) * warm_up)
    before, start = {"store": 0, "disk": 0, "slot": 0}, 0.0  # the loads when results start
    now = 0.0
    while events:
        now, _, kind, what = heapq.heappop(events)
        if kind == ARRIVE:
            if what.index == skip and skip:
                before, start = _loads(fleet), now
            r = router.choose(what.adapter, fleet, holders)
            loads_before = len(r.loading)
            if r.accept(what):
                load_next(r, now)
            if len(r.loading) > loads_before:
                report(r, now)
            kick(r, now)
        elif kind == WORKED:  # the load's work is done; paced, it pauses before it ends
            push(now + what[0].pause_after_load(), LOADED, what)
        elif kind == LOADED:
            r, adapter = what
            r.finish_load(adapter)
            load_next(r, now)
            kick(r, now)
        elif kind == STEPPED:
            what.finish_step()
            kick(what, now)
        else:
            r, r.report_due = what, False
            now_held = r.model_ids()
            for a in r.reported - now_held:
                holders.drop(a, r.index)
            for a in now_held - r.reported:
                holders.add(a, r.index)
            r.reported = now_held
    after = _loads(fleet)
    counts = Counter(q.replica for q in requests[skip:])
    return Run(
        policy=router.name,
        replicas=replicas,
        workload=workload,
        requests=requests[skip:],
        loads={k: after[k] - before[k] for k in after},
        duration_s=now - start,
        overhead_ms=overheads(figures, len(requests) - skip, seed),
        spilled=getattr(router, "spilled", 0),
        per_replica=[counts[r.index] for r in fleet],
        disk_load_ms_mean=sum(r.disk_load_s for r in fleet)
        * 1e3
        / max(1, sum(r.loads["disk"] for r in fleet)),
    )


def _loads(fleet: list[Replica]) -> dict[str, int]:
    return {k: sum(r.loads[k] for r in fleet) for k in ("store", "disk", "slot")}


def overheads(figures: Figures, n: int, seed: int) -> np.ndarray:
    """Each request's ingress overhead (ms): drawn from the measured spread, else the mean."""
    if not figures.overhead_spread_ms:
        return np.full(n, figures.overhead_ms)
    rng = np.random.default_rng(seed)
    return rng.choice(np.array(figures.overhead_spread_ms), n)
