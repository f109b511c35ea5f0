"""The ingress sends a request again when no replica answered it (issue 46: a node lost
under load must not turn later requests into 5xx while Ray Serve's router still picks the
dead replica). Only a request that got nothing back is sent again; one that had begun ends
with EngineDeadError (the client saw part of it), and an aborted one is never resent.

A fake Ray Serve handle stands in for the deployment: each call opens the next scripted
stream, which yields items or raises the error Ray raises for a dead actor."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError

from loragate.engine import EngineDeadError
from loragate.gateway.replicas import replicated_engine
from loragate.gateway.replicas.replicated_engine import RETRIES, ReplicatedEngine
from loragate.gateway.replicas.wire import Failure

DONE = SimpleNamespace(finished=True, lora_sha256=None)
PART = SimpleNamespace(finished=False, lora_sha256=None)


class FakeStream:
    def __init__(self, script: list):
        self.script = script
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    async def __aiter__(self):
        for step in self.script:
            await asyncio.sleep(0)
            if isinstance(step, BaseException):
                raise step
            yield step


class FakeHandle:
    """`handle.options(...).generate.remote(call)` opens the next scripted stream."""

    def __init__(self, scripts: list[list], on_open=None):
        self.scripts = scripts
        self.on_open = on_open
        self.opened: list[FakeStream] = []
        self.generate = SimpleNamespace(remote=self._open)

    def options(self, **options):
        return self

    def _open(self, call):
        stream = FakeStream(self.scripts[len(self.opened)])
        self.opened.append(stream)
        if self.on_open is not None:
            self.on_open()
        return stream


def dead() -> ActorDiedError:
    return ActorDiedError()


async def run(engine: ReplicatedEngine, request_id: str = "r1") -> list:
    return [item async for item in engine.generate("hi", None, request_id)]


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(replicated_engine, "RETRY_BACKOFF_S", 0.0)


def test_a_request_no_replica_answered_is_sent_again():
    handle = FakeHandle([[dead()], [dead()], [PART, DONE]])
    engine = ReplicatedEngine(handle, None, None, None)
    assert asyncio.run(run(engine)) == [PART, DONE]
    assert len(handle.opened) == 3 and engine.retried == 2
    assert [s.cancelled for s in handle.opened] == [True, True, False]


def test_a_stream_that_ended_before_its_first_item_is_sent_again():
    """A replica always sends one item (an output or a Failure): a stream with none is a
    replica that went away before answering (seen in CI after a node was removed)."""
    handle = FakeHandle([[], [PART, DONE]])
    engine = ReplicatedEngine(handle, None, None, None)
    assert asyncio.run(run(engine)) == [PART, DONE]
    assert len(handle.opened) == 2 and engine.retried == 1


def test_a_replica_whose_engine_had_stopped_passes_the_request_on():
    handle = FakeHandle([[Failure(EngineDeadError("stopped"))], [PART, DONE]])
    engine = ReplicatedEngine(handle, None, None, None)
    assert asyncio.run(run(engine)) == [PART, DONE]
    assert engine.retried == 1


def test_a_failure_of_the_request_itself_is_not_sent_again():
    handle = FakeHandle([[Failure(ValueError("max_tokens too large"))], [PART, DONE]])
    engine = ReplicatedEngine(handle, None, None, None)
    with pytest.raises(ValueError, match="max_tokens"):
        asyncio.run(run(engine))
    assert len(handle.opened) == 1 and engine.retried == 0


def test_a_request_that_had_begun_is_not_sent_again():
    handle = FakeHandle([[PART, dead()], [PART, DONE]])
    engine = ReplicatedEngine(handle, None, None, None)
    with pytest.raises(EngineDeadError):
        asyncio.run(run(engine))
    assert len(handle.opened) == 1 and engine.retried == 0


def test_retries_end_with_engine_dead_when_no_replica_answers():
    handle = FakeHandle([[dead()]] * RETRIES + [[]])
    engine = ReplicatedEngine(handle, None, None, None)
    with pytest.raises(EngineDeadError, match=f"no replica answered the request in {RETRIES + 1}"):
        asyncio.run(run(engine))
    assert len(handle.opened) == RETRIES + 1


def test_an_aborted_request_is_not_sent_again():
    engine = None

    def client_goes_away():  # while the first replica is being reached
        asyncio.get_running_loop().create_task(engine.abort("r1"))

    handle = FakeHandle([[dead()], [PART, DONE]], on_open=client_goes_away)
    engine = ReplicatedEngine(handle, None, None, None)
    with pytest.raises(EngineDeadError):
        asyncio.run(run(engine))
    assert len(handle.opened) == 1
