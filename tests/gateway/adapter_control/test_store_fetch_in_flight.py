"""A request for an adapter kept in the adapter store is in flight while its object is
fetched, before the engine has it: deleting the adapter waits for it too (issue 35: no
moment where a request is counted by nobody). The engine and the fetcher are faked."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from loragate.adapters import LoRARequest
from loragate.engine import InFlightRequests, RequestOutput
from loragate.gateway.adapter_control.store_engine import StoreBackedEngine, store_path

SHA = "a" * 64
OID = f"{SHA}-{'b' * 64}"
LORA = LoRARequest("kept", 1, store_path(OID))


class FakeLocal:
    def __init__(self, root: Path):
        self.root = root

    def path(self, oid: str) -> Path:
        return self.root / oid


class SlowFetcher:
    """Fetches block until the test lets them finish."""

    def __init__(self, root: Path):
        self.local = FakeLocal(root)
        self.go = threading.Event()

    def ready(self, oid: str):
        return None

    def ensure(self, oid: str) -> Path:
        assert self.go.wait(10)
        return self.local.path(oid)


class CountingEngine:
    """The engine's side: counts each request from its generate on, as AsyncLLMEngine."""

    def __init__(self):
        self.in_flight = InFlightRequests()
        self.finish = asyncio.Event()

    async def generate(self, prompt, params, request_id, lora_request=None, **options):
        self.in_flight.started(lora_request)
        try:
            await self.finish.wait()
            yield RequestOutput(request_id, None, [1], [], True, lora_request, lora_sha256=SHA)
        finally:
            self.in_flight.ended(lora_request)

    async def wait_adapter_idle(self, lora_request):
        await self.in_flight.wait_idle(lora_request)

    def adapter_in_flight(self, lora_request) -> int:
        return self.in_flight.count(lora_request)


async def drain(stream) -> list:
    return [out async for out in stream]


def test_a_request_fetching_its_object_is_waited_for(tmp_path):
    async def scenario():
        inner, fetcher = CountingEngine(), SlowFetcher(tmp_path)
        engine = StoreBackedEngine(inner, fetcher)
        stream = engine.generate([1], None, "r", lora_request=LORA)
        run = asyncio.create_task(drain(stream))
        await asyncio.sleep(0.05)  # its object is being fetched: the engine has nothing yet
        local = LoRARequest("kept", 1, str(tmp_path / OID))
        assert inner.adapter_in_flight(local) == 0
        assert engine.adapter_in_flight(LORA) == 1
        waiter = asyncio.create_task(engine.wait_adapter_idle(LORA))
        fetcher.go.set()
        await asyncio.sleep(0.05)  # fetched: the engine counts it, and it runs on
        assert inner.adapter_in_flight(local) == 1
        assert not waiter.done()
        inner.finish.set()
        (out,) = await asyncio.wait_for(run, 5)
        assert out.finished and out.lora_request == LORA
        await asyncio.wait_for(waiter, 5)
        assert engine.adapter_in_flight(LORA) == 0

    asyncio.run(scenario())
