"""With replicas, every request goes through the ingress's ReplicatedEngine, which counts
each adapter's requests in flight from the call on (idle there is idle on every replica),
and tells listeners once when a replica admits a name's requests under other weights.

Ray Serve's handle is faked: each request's replica stream is a queue the test feeds."""

from __future__ import annotations

import asyncio

from loragate.adapters import LoRARequest
from loragate.engine import RequestOutput, SamplingParams
from loragate.gateway.replicas.replicated_engine import ReplicatedEngine
from loragate.gateway.replicas.wire import Failure

LORA = LoRARequest("a", 1, "/adapters/a")


class FakeStream:
    """One request's stream from its replica, fed by the test."""

    def __init__(self):
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    async def _items(self):
        while (item := await self.items.get()) is not None:
            yield item

    def __aiter__(self):
        return self._items()

    def cancel(self):
        self.cancelled = True
        self.items.put_nowait(None)


class FakeHandle:
    def __init__(self):
        self.streams: dict[str, FakeStream] = {}
        self.generate = self

    def options(self, **options):
        return self

    def remote(self, call):
        self.streams[call.request_id] = FakeStream()
        return self.streams[call.request_id]


def output(request_id: str, sha256: str, finished: bool = False) -> RequestOutput:
    return RequestOutput(request_id, None, [1], [], finished, LORA, lora_sha256=sha256)


def finish(stream: FakeStream, out: RequestOutput) -> None:
    """The replica's last output, then the end of its stream."""
    stream.items.put_nowait(out)
    stream.items.put_nowait(None)


async def consume(stream) -> list:
    return [out async for out in stream]


def test_the_ingress_counts_requests_until_their_streams_end():
    async def scenario():
        handle = FakeHandle()
        engine = ReplicatedEngine(handle, None, None, None)
        params = SamplingParams(max_tokens=2)
        runs = {
            rid: asyncio.create_task(consume(engine.generate([1], params, rid, LORA)))
            for rid in ("done", "failed", "left")
        }
        await asyncio.sleep(0)
        assert engine.adapter_in_flight(LORA) == 3  # counted before any replica answers
        waiter = asyncio.create_task(engine.wait_adapter_idle(LORA))
        finish(handle.streams["done"], output("done", "s1", finished=True))
        await runs["done"]
        handle.streams["failed"].items.put_nowait(Failure(ValueError("bad prompt")))
        await asyncio.wait([runs["failed"]])
        assert isinstance(runs["failed"].exception(), ValueError)
        await asyncio.sleep(0.01)
        assert engine.adapter_in_flight(LORA) == 1 and not waiter.done()
        runs["left"].cancel()  # the client went away: its replica stream is cancelled
        await asyncio.wait([runs["left"]])
        await asyncio.wait_for(waiter, 5)
        assert handle.streams["left"].cancelled
        assert engine.adapter_in_flight(LORA) == 0

    asyncio.run(scenario())


def test_the_ingress_tells_listeners_once_per_change_of_weights():
    async def scenario():
        handle = FakeHandle()
        engine = ReplicatedEngine(handle, None, None, None)
        heard = []

        async def listener(event):
            await asyncio.sleep(0.05)
            heard.append((event.sha256, event.previous_sha256))

        engine.on_adapter_weights_changed(listener)
        for rid, sha in (("1", "s1"), ("2", "s1"), ("3", "s2"), ("4", "s2"), ("5", "s1")):
            run = asyncio.create_task(consume(engine.generate([1], None, rid, LORA)))
            await asyncio.sleep(0)
            finish(handle.streams[rid], output(rid, sha, finished=True))
            outs = await run
            assert outs[0].lora_sha256 == sha
            assert heard[-1][0] == sha  # answered after the listener heard of its weights
        assert heard == [("s1", None), ("s2", "s1"), ("s1", "s2")]

    asyncio.run(scenario())
