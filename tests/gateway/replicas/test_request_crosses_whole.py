"""The ingress sends a request to its replica as the one EngineRequest it was given, and the
replica hands that same object to its engine (issue 58: nothing on the wire re-describes
the request's values). Ray Serve's handle and the replica's engine are faked."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from loragate.adapters import LoRARequest
from loragate.engine import EngineRequest, SamplingParams
from loragate.gateway.replicas.engine_replica import EngineReplica
from loragate.gateway.replicas.replicated_engine import ReplicatedEngine

LORA = LoRARequest("sql", 1, "/adapters/sql")


def test_the_ingress_sends_it_and_the_replica_hands_it_on_as_it_is():
    request = EngineRequest("hi", SamplingParams(max_tokens=1), "r-1", LORA, tenant="acme")
    done = SimpleNamespace(finished=True, lora_sha256=None)
    sent, handed = [], []

    class Stream:
        def cancel(self):
            pass

        async def __aiter__(self):
            yield done

    class Handle:
        def options(self, **options):
            return self

        @property
        def generate(self):
            return SimpleNamespace(remote=lambda call: sent.append(call) or Stream())

    class Engine:
        async def generate_request(self, call):
            handed.append(call)
            yield done

    async def scenario():
        ingress = ReplicatedEngine(Handle(), None, None, None)
        assert [out async for out in ingress.generate_request(request)] == [done]
        replica = SimpleNamespace(engine=Engine(), _make_resident=_resident)
        assert [out async for out in EngineReplica.generate(replica, sent[0])] == [done]

    async def _resident(lora):
        pass

    asyncio.run(scenario())
    assert sent == [request] and sent[0] is request
    assert handed == [request] and handed[0] is request
