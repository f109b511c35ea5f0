"""Stream operations recorded in order (adapters/slot_copies.py's Streams), for the CPU,
which has no CUDA streams: the copies run at once, so a test can read each layer's rows at
the moment its event is marked, and see which layer the step waited for before which read."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager


class RecordedStreams:
    def __init__(self):
        self.log: list[tuple] = []  # ("side",), ("mark", event), ("wait", event), and tests'
        self.on_mark: Callable[[int], None] | None = None  # called with each event's number
        self.on_side = False
        self.marks = 0

    @contextmanager
    def side_after_step(self):
        self.log.append(("side",))
        self.on_side = True
        try:
            yield
        finally:
            self.on_side = False

    def mark(self) -> int:
        assert self.on_side, "an event is marked on the side stream"
        event = self.marks
        self.marks += 1
        if self.on_mark is not None:
            self.on_mark(event)
        self.log.append(("mark", event))
        return event

    def wait(self, event: int) -> None:
        assert not self.on_side, "the step's stream waits, outside the side stream"
        self.log.append(("wait", event))
