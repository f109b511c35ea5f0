"""One admitted engine request, as the routes see it.

`prime()` waits for the first output, so bad input (a ValueError from the engine) becomes a
400 before any byte of a streamed answer is sent.
An output carrying `error` (this request alone failed on the engine: a plugin, or anything
else) raises PluginFailedError or RequestFailedError as it is read past `prime()`: a 500 for
a whole answer, an error event in a stream; the engine and every other request go on.
`aclose()` is idempotent and ends the engine request (if unfinished, the engine aborts it and
frees its KV blocks); its HTTP request's account (serving/accounting.py) closes it and gives
back its queue place.

The engine is asked for deltas (`RequestOutputKind.DELTA`: each output holds only what is new,
in-process and over the replica wire), so no hop copies a stream's whole output each step;
a Generation grows its one cumulative output (`latest`) from them in place, which is what
the routes, the metering and the metrics read.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

from loragate.adapters import AdapterError
from loragate.adapters.store import AdapterStoreError
from loragate.engine import (
    CompletionOutput,
    EngineDeadError,
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
)
from loragate.gateway.adapter_control.adapter_store_objects import store_error
from loragate.gateway.errors import (
    EngineUnavailableError,
    InvalidRequestError,
    PluginFailedError,
    RequestFailedError,
    param_of,
)
from loragate.plugins import PluginError

# The `code` of a 503 (or a stream's error event) when the engine, or the replica serving
# the request, stopped: the client may retry, as nothing of the request is kept.
ENGINE_UNAVAILABLE = "engine_unavailable"


class Generation:
    def __init__(
        self,
        outputs: AsyncIterator[RequestOutput],
        request_id: str,
        *,
        field_names: dict[str, str],
        adapter_param: str,
        scrub: Callable[[str], str] = lambda text: text,
    ):
        self.request_id = request_id
        self.latest: RequestOutput | None = None
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.token_gaps: list[float] = []  # seconds between output tokens, for the metrics
        self._tokens_seen = 0
        self._last_token_at = self.started
        self._outputs = outputs
        self._field_names = field_names
        self._adapter_param = adapter_param
        self._scrub = scrub
        self._closed = False
        self.engine_lost = False  # its engine (a replica) stopped after it had begun

    @property
    def finished(self) -> bool:
        return self.latest is not None and self.latest.finished

    async def prime(self) -> RequestOutput:
        """The first output; raises InvalidRequestError (400) for input the engine refused."""
        try:
            out = await anext(self._outputs)
        except StopAsyncIteration as exc:
            raise EngineUnavailableError("the engine ended the request without output") from exc
        except EngineDeadError as exc:
            raise EngineUnavailableError(
                f"the engine is not running: {exc}", code=ENGINE_UNAVAILABLE
            ) from exc
        except AdapterStoreError as exc:  # its files could not be fetched by hash
            raise store_error(exc) from exc
        except AdapterError as exc:
            raise InvalidRequestError(
                f"adapter could not be loaded: {self._scrub(str(exc))}",
                param=self._adapter_param,
                code="invalid_adapter",
            ) from exc
        except ValueError as exc:
            message = self._scrub(str(exc))
            raise InvalidRequestError(message, param=param_of(exc, self._field_names)) from exc
        except PluginError as exc:  # a plugin refused this request as it was queued
            raise PluginFailedError(self._scrub(str(exc)), code="plugin_error") from exc
        return self._seen(out)

    async def rest(self) -> AsyncIterator[RequestOutput]:
        """Every output after the primed one, until the request finishes."""
        if self.finished:
            return
        try:
            async for out in self._outputs:
                yield checked(self._seen(out))
        except EngineDeadError as exc:
            self.engine_lost = True
            raise EngineUnavailableError(
                f"the engine stopped mid-request: {exc}", code=ENGINE_UNAVAILABLE
            ) from exc

    async def result(self) -> RequestOutput:
        """The final output (waits for the request to finish)."""
        async for _ in self.rest():
            pass
        assert self.latest is not None
        return checked(self.latest)

    def _seen(self, delta: RequestOutput) -> RequestOutput:
        """The output so far, grown by the engine's `delta`."""
        self.latest = out = grown(self.latest, delta)
        now = time.perf_counter()
        if self.first_token_at is None and any(c.token_ids for c in out.outputs):
            self.first_token_at = now
        tokens = sum(len(c.token_ids) for c in out.outputs)
        if tokens > self._tokens_seen and self._tokens_seen:
            gap = (now - self._last_token_at) / (tokens - self._tokens_seen)
            self.token_gaps.extend([gap] * (tokens - self._tokens_seen))
        if tokens > self._tokens_seen:
            self._tokens_seen, self._last_token_at = tokens, now
        if out.finished:
            self.finished_at = now
        return out

    @property
    def num_output_tokens(self) -> int:
        return (
            0
            if self.latest is None
            else max((len(c.token_ids) for c in self.latest.outputs), default=0)
        )

    async def aclose(self) -> None:
        """End the engine request; an unfinished one is aborted and its KV blocks freed."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._outputs.aclose()
        except RuntimeError:  # the iterator is mid-step in a cancelled task: it aborts itself
            pass


def deltas_of(params: SamplingParams) -> SamplingParams:
    """`params` asking the engine for deltas (what a Generation reads)."""
    params = copy.copy(params)
    params.output_kind = RequestOutputKind.DELTA
    return params


def grown(total: RequestOutput | None, delta: RequestOutput) -> RequestOutput:
    """The cumulative output: `total` (what a Generation has so far, which it owns) with the
    engine's next `delta` added, each sample's lists extended in place (by sample index: at
    the end of a best_of request the engine names the n kept, and the others)."""
    if total is None:
        return dataclasses.replace(
            delta,
            outputs=[_grown(None, c) for c in delta.outputs],
            best_of_sequences=_all_grown({}, delta.best_of_sequences),
        )
    by_index = {c.index: c for c in (*total.outputs, *(total.best_of_sequences or ()))}
    return dataclasses.replace(
        delta,
        outputs=[_grown(by_index.get(c.index), c) for c in delta.outputs],
        best_of_sequences=_all_grown(by_index, delta.best_of_sequences),
        prompt_logprobs=(
            delta.prompt_logprobs if delta.prompt_logprobs is not None else total.prompt_logprobs
        ),
    )


def _all_grown(by_index: dict, deltas: list[CompletionOutput] | None):
    return None if deltas is None else [_grown(by_index.get(c.index), c) for c in deltas]


def _grown(total: CompletionOutput | None, delta: CompletionOutput) -> CompletionOutput:
    if total is None:
        logprobs = None if delta.logprobs is None else list(delta.logprobs)
        return dataclasses.replace(delta, token_ids=list(delta.token_ids), logprobs=logprobs)
    total.text += delta.text
    total.token_ids.extend(delta.token_ids)
    if delta.logprobs is not None:
        if total.logprobs is None:
            total.logprobs = []
        total.logprobs.extend(delta.logprobs)
    total.cumulative_logprob = delta.cumulative_logprob
    total.finish_reason, total.stop_reason = delta.finish_reason, delta.stop_reason
    return total


async def prime_all(gens: list[Generation]) -> list[RequestOutput]:
    """Prime every generation; all settle before the first error (if any) is raised."""
    results = await asyncio.gather(*(g.prime() for g in gens), return_exceptions=True)
    return _raise_first(results)


async def results_all(gens: list[Generation]) -> list[RequestOutput]:
    results = await asyncio.gather(*(g.result() for g in gens), return_exceptions=True)
    return _raise_first(results)


async def outputs_of(gen: Generation) -> AsyncIterator[RequestOutput]:
    """The primed output, then the rest."""
    assert gen.latest is not None, "prime() first"
    yield checked(gen.latest)
    async for out in gen.rest():
        yield out


def checked(out: RequestOutput) -> RequestOutput:
    """`out`, unless the request failed: then PluginFailedError naming the plugin, or
    RequestFailedError for any other per-request failure on the engine."""
    if out.error is None:
        return out
    if out.error_type == "plugin_error":
        raise PluginFailedError(out.error, code="plugin_error")
    raise RequestFailedError(out.error, code="request_failed")


def _raise_first(results: list) -> list:
    for item in results:
        if isinstance(item, BaseException):
            raise item
    return results
