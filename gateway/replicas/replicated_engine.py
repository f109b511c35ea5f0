"""The ingress's engine when replicas serve: AsyncLLMEngine's public surface, each call
forwarded through a Ray Serve handle to the EngineReplica deployment.

A request for an adapter names it as the multiplexed model id (Ray Serve routes it to a
replica holding it, or to the one holding fewest); a base-model request names none (the
least loaded of two replicas picked at random). Streams come back through Ray Serve's
streaming handles, and closing one cancels the request on its replica (which aborts it).
A replica that dies mid-call ends the call with EngineDeadError, which the gateway answers
with 503 (an SSE error event once the stream has begun); Ray Serve starts a replacement.
A request whose replica cannot be reached before it sent anything (a node lost, a replica
that died, which Ray Serve's router may still pick for a moment; a stream that ends before
its first item; a replica whose engine had stopped) is sent again, up to
`RETRIES` times with a backoff doubling up to `RETRY_BACKOFF_CAP_S` (about 40 s in all): Ray's
router drops a replica once Ray has found it dead, so the retry goes to a live one, and
nothing had reached the client or been counted. A node whose raylet is killed is only found
dead after Ray's health checks miss it for some seconds, and meanwhile adapter affinity
keeps routing that adapter's requests to the replica there: the window covers that.

Every request to any replica goes through this ingress, so it counts the requests in flight
per adapter itself, from the call on (idle here is idle on every replica), and it announces
changed weights behind a name from the weights each request's replica admitted it under
(the first output says which).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import aclosing
from pathlib import Path

from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException

from loragate.adapters import LoRARequest
from loragate.engine import (
    AdapterEvents,
    ChatPrompt,
    EngineDeadError,
    EngineRequest,
    EngineStats,
    InFlightRequests,
    ModelInfo,
    PromptInput,
    PromptThread,
    RequestOutput,
    SamplingParams,
    WeightsListener,
)
from loragate.gateway.replicas.aggregate import combined_stats
from loragate.gateway.replicas.wire import AdapterSummary, Failure, ReplicaReport

# Errors that mean "the replica (or Ray) went away", not "the request was bad".
_GONE = (RayError, RayServeException)
# A request that reached no live replica is sent again this many times, after these waits.
RETRIES = 14
RETRY_BACKOFF_S = 0.1
RETRY_BACKOFF_CAP_S = 4.0


class ReplicatedEngine:
    """An EngineClient (loragate.engine) whose engine is the replicas behind a handle."""

    def __init__(self, handle, board, model_info: ModelInfo, prompts):
        self._handle = handle
        self._board = board
        self.model_info = model_info
        # A replica's own prompt processor, so the ingress tokenizes exactly as it, on a
        # thread of its own: never on the event loop.
        self._prompts = PromptThread(prompts)
        self.dead_error: BaseException | None = None
        self._stopped = False
        self._streams: dict[Hashable, object] = {}  # request id -> its open replica stream
        self._aborted: set[Hashable] = set()  # aborted while being sent: never sent again
        self.retried = 0  # requests sent again because no replica answered the first time
        self._in_flight = InFlightRequests()  # requests per adapter, on every replica
        self._events = AdapterEvents()  # the weights each name's requests were admitted under

    # ---- what the gateway calls, as on AsyncLLMEngine ---------------------------------
    @property
    def is_running(self) -> bool:
        return not self._stopped

    @property
    def tokenizer(self):
        return self.model_info.tokenizer

    async def generate(
        self,
        prompt: PromptInput,
        sampling_params: SamplingParams,
        request_id: Hashable,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
        tenant_weight: float = 1.0,
    ) -> AsyncIterator[RequestOutput]:
        request = EngineRequest(
            prompt,
            sampling_params,
            request_id,
            lora_request,
            cache_salt,
            tenant,
            priority,
            tenant_weight,
        )
        async with aclosing(self.generate_request(request)) as outputs:
            async for out in outputs:
                yield out

    async def generate_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """The request, sent whole to a replica (its adapter's, by Ray Serve's multiplexing)."""
        lora_request = request.lora_request
        if lora_request is not None:  # in flight from here, before anything is awaited
            self._in_flight.started(lora_request)
        finished = False
        try:
            options = {"stream": True}
            if lora_request is not None:
                options["multiplexed_model_id"] = lora_request.lora_name
            items = await self._send(request, options)
            first = True
            async for item in items:
                if isinstance(item, Failure):
                    raise item.error
                if first and lora_request is not None and item.lora_sha256 is not None:
                    self._events.admitted(lora_request, item.lora_sha256)
                    await self._events.settled(lora_request)
                first = False
                finished = item.finished
                yield item
            if not finished:
                raise EngineDeadError("the replica ended the request without finishing it")
        finally:
            self._aborted.discard(request.request_id)
            stream = self._streams.pop(request.request_id, None)
            if stream is not None and not finished:
                stream.cancel()  # the replica's generator is cancelled and aborts it
            if lora_request is not None:
                self._in_flight.ended(lora_request)

    async def abort(self, request_id: Hashable) -> None:
        """Cancel the request's stream: its replica aborts it (and its generate ends)."""
        stream = self._streams.get(request_id)
        if stream is not None:
            self._aborted.add(request_id)
            stream.cancel()

    async def add_adapter(self, lora_request: LoRARequest, timeout: float | None = None):
        """Read and validate the adapter on the replica its requests will go to (into its CPU
        tier): its summary."""
        routed = self._handle.options(multiplexed_model_id=lora_request.lora_name)
        summary = await self._call(routed.add_adapter, lora_request, timeout)
        assert isinstance(summary, AdapterSummary)
        return summary

    async def remove_adapter(self, lora_request: LoRARequest) -> bool:
        """Every replica drops the adapter's weights when it next reports (within a second)."""
        await _ray(self._board.retire.remote(lora_request))
        return True

    async def wait_adapter_idle(self, lora_request: LoRARequest) -> None:
        await self._in_flight.wait_idle(lora_request)

    def adapter_in_flight(self, lora_request: LoRARequest) -> int:
        return self._in_flight.count(lora_request)

    def on_adapter_weights_changed(self, listener: WeightsListener) -> Callable[[], None]:
        return self._events.subscribe(listener)

    async def adopt_adapter_object(self, oid: str, directory: Path) -> None:
        """Nothing: each replica fetches the objects it is routed from the store itself."""

    async def forget_adapter_object(self, oid: str) -> None:
        """Nothing: each replica drops its copies of deleted objects when it prunes
        (gateway/replicas/engine_replica.py)."""

    async def prune_adapter_objects(self) -> list[str]:
        """Nothing here: each replica prunes its own cache (gateway/replicas/engine_replica.py)."""
        return []

    async def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        return await self._prompts.encode(text, add_special_tokens)

    async def apply_chat_template(self, chat: ChatPrompt) -> list[int]:
        """By a replica's own prompt processor, so the ingress templates exactly as it."""
        return await self._prompts.apply_chat_template(chat)

    async def stats(self) -> EngineStats:
        """The whole deployment as one engine: every live replica's counts added up."""
        return combined_stats([r.stats for r in await self.replica_reports()])

    async def replica_reports(self) -> list[ReplicaReport]:
        """Each live replica's latest state (GET /v1/replicas, /metrics by replica)."""
        return await _ray(self._board.reports.remote())

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopped = True
        self._prompts.close()

    # ---- inside -------------------------------------------------------------------------
    async def _send(self, request: EngineRequest, options: dict):
        """Open the request's stream on a replica and wait for its first item: its items,
        the first one included. Sent again while no replica answered."""
        for attempt in range(RETRIES + 1):
            stream = self._handle.options(**options).generate.remote(request)
            self._streams[request.request_id] = stream
            items = _replica_stream(stream)
            try:
                first = await anext(items)
                if _replica_gone(first):
                    raise first.error
            except (EngineDeadError, StopAsyncIteration) as exc:
                # No replica answered: Ray raised for a dead or unreachable one, the stream
                # ended before its first item (a replica always sends one: an output or a
                # Failure), or the replica's own engine had stopped. Nothing was sent.
                stream.cancel()
                if attempt == RETRIES or self._stopped or request.request_id in self._aborted:
                    why = str(exc) or "its stream ended before any output"
                    raise EngineDeadError(
                        f"no replica answered the request in {attempt + 1} tries: {why}"
                    ) from exc
                self.retried += 1
                await asyncio.sleep(min(RETRY_BACKOFF_S * 2**attempt, RETRY_BACKOFF_CAP_S))
                continue
            return _chain(first, items)
        raise AssertionError("unreachable")

    async def _call(self, method, *args):
        try:
            result = await method.remote(*args)
        except _GONE as exc:
            raise EngineDeadError(f"the replica is not reachable: {_first_line(exc)}") from exc
        if isinstance(result, Failure):
            raise result.error
        return result


def _replica_gone(item) -> bool:
    """A first item that says its replica's engine had stopped before the request began."""
    return isinstance(item, Failure) and isinstance(item.error, EngineDeadError)


async def _chain(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for item in rest:
        yield item


async def _replica_stream(stream) -> AsyncIterator:
    """The stream's items; EngineDeadError if its replica dies or cannot be reached."""
    try:
        async for item in stream:
            yield item
    except _GONE as exc:
        raise EngineDeadError(f"the replica serving it stopped: {_first_line(exc)}") from exc


async def _ray(ref):
    try:
        return await ref
    except _GONE as exc:
        raise EngineDeadError(f"the replicas' board is not reachable: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
