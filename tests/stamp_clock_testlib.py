"""A stamp clock for tests (adapters/identity.py): the system's time, moved ahead on demand,
so files become old enough for a stat to vouch for them without sleeping out the racy
window."""

from __future__ import annotations

import time

from loragate.adapters import identity as identity_module
from loragate.adapters.identity import StampClock


class AheadClock(StampClock):
    """The system's clock plus an offset that only grows. ``settle()``: every file written
    until now is older than the racy window by this clock's time (files written after it
    are trusted at once, being older by the offset too: settle last)."""

    def __init__(self) -> None:
        self.ahead_ns = 0

    def now_ns(self) -> int:
        return time.time_ns() + self.ahead_ns

    def settle(self) -> None:
        self.ahead_ns += identity_module.RACY_NS + 1_000_000
