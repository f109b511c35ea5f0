"""Progress of a long CPU job as plain lines: one per stage, and one every tenth of a loop
with the time left. Lines rather than a bar, because the same words go to a terminal and to
a log file, where a redrawn bar is noise; and a job silent for minutes looks hung."""

from __future__ import annotations

import time
from collections.abc import Callable

Report = Callable[[str], None]


class Progress:
    def __init__(self, report: Report, stages: int, clock: Callable[[], float] = time.perf_counter):
        self.report, self.stages, self.clock = report, stages, clock
        self.number = 0
        self.started = clock()

    def stage(self, what: str) -> None:
        self.number += 1
        self.report(f"[{self.number}/{self.stages}] {what}")

    def steps(self, what: str, total: int) -> Callable[[int], None]:
        """`step(i)` after step i (from 1) of `total`: a line every tenth, and at the last."""
        every = max(1, round(total / 10))
        begun = self.clock()

        def step(i: int) -> None:
            if i % every and i != total:
                return
            spent = self.clock() - begun
            left = spent / i * (total - i)
            self.report(f"  {what}: step {i}/{total}, {spent:.1f} s, about {left:.0f} s left")

        return step

    def done(self, what: str) -> None:
        self.report(f"{what} in {self.clock() - self.started:.1f} s")
