"""How many requests are using each adapter, so a delete can let them finish first."""

from __future__ import annotations

import asyncio
from collections import Counter

from loragate.adapters import LoRARequest


class AdapterUsage:
    """Counts requests per LoRARequest; `wait_idle` returns once the count reaches zero.

    Lives on the event loop: every method is called from it, never from another thread.
    """

    def __init__(self) -> None:
        self._counts: Counter[LoRARequest] = Counter()
        self._idle: dict[LoRARequest, asyncio.Event] = {}

    def acquire(self, lora: LoRARequest) -> None:
        self._counts[lora] += 1
        self._idle.setdefault(lora, asyncio.Event()).clear()

    def release(self, lora: LoRARequest) -> None:
        self._counts[lora] -= 1
        if self._counts[lora] <= 0:
            del self._counts[lora]
            self._idle.pop(lora, asyncio.Event()).set()

    def in_use(self, lora: LoRARequest) -> int:
        return self._counts.get(lora, 0)

    async def wait_idle(self, lora: LoRARequest) -> None:
        while self._counts.get(lora, 0) > 0:
            await self._idle.setdefault(lora, asyncio.Event()).wait()
