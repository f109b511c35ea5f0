"""Requests and tokens per name over the last minute, for the dashboard's usage-against-quota
columns. Quotas are per minute, so a lifetime total says nothing about how close a tenant is
to its limit. Counts are this replica's (the store's own windows are write-only); names idle
for a minute are dropped, so thousands of tenants cost nothing while quiet."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

WINDOW_SECONDS = 60


class MinuteWindow:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._seconds: dict[str, dict[int, list[int]]] = {}  # name -> second -> [req, tok]
        self._lock = threading.Lock()

    def add(self, name: str, tokens: int, requests: int = 1) -> None:
        second = math.floor(self._clock())
        with self._lock:
            bucket = self._seconds.setdefault(name, {}).setdefault(second, [0, 0])
            bucket[0] += requests
            bucket[1] += tokens

    def totals(self) -> dict[str, tuple[int, int]]:
        """name -> (requests, tokens) over the last 60 seconds, this one included."""
        oldest = math.floor(self._clock()) - WINDOW_SECONDS + 1
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for name in list(self._seconds):
                seconds = self._seconds[name]
                for second in [s for s in seconds if s < oldest]:
                    del seconds[second]
                if not seconds:
                    del self._seconds[name]
                    continue
                out[name] = (
                    sum(b[0] for b in seconds.values()),
                    sum(b[1] for b in seconds.values()),
                )
        return out
