"""How many requests each adapter has in flight, so a caller can wait until none uses it.

A request counts from the moment it is handed to the engine (before anything is awaited:
its adapter may still be loading, or the request waiting in the inbox or the queue) until
it ends, however it ends: finished, aborted, refused or failed. Counted per LoRARequest, so
a name registered again (another id or path) waits only for its own requests. Thread-safe:
requests start and end on event loops, and a waiter may sit on any loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import Future

from loragate.adapters import LoRARequest


class InFlightRequests:
    """Requests per LoRARequest, started and not yet ended; `wait_idle` returns at zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[LoRARequest] = Counter()
        self._waiters: dict[LoRARequest, list[Future]] = {}

    def started(self, lora: LoRARequest) -> None:
        with self._lock:
            self._counts[lora] += 1

    def ended(self, lora: LoRARequest) -> None:
        """One request for ``lora`` ended; called exactly once for each `started`."""
        with self._lock:
            left = self._counts[lora] - 1
            if left < 0:
                raise AssertionError(f"adapter {lora.lora_name}: a request ended twice")
            if left:
                self._counts[lora] = left
                return
            del self._counts[lora]
            waiters = self._waiters.pop(lora, [])
        for waiter in waiters:
            if waiter.set_running_or_notify_cancel():  # False: its waiter left
                waiter.set_result(None)

    def count(self, lora: LoRARequest) -> int:
        with self._lock:
            return self._counts.get(lora, 0)

    def by_name(self) -> dict[str, int]:
        """Requests in flight per adapter name (every registration of a name together)."""
        names: Counter[str] = Counter()
        with self._lock:
            for lora, count in self._counts.items():
                names[lora.lora_name] += count
        return dict(names)

    async def wait_idle(self, lora: LoRARequest) -> None:
        """Return once no request for ``lora`` is in flight (at once if none is)."""
        with self._lock:
            if not self._counts.get(lora):
                return
            waiter: Future = Future()
            self._waiters.setdefault(lora, []).append(waiter)
        await asyncio.wrap_future(waiter)
