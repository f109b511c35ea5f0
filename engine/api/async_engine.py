"""The engine beside an asyncio event loop: steps run in a thread, outputs stream to awaiters.

The event loop never waits on a forward pass. Requests and aborts reach the engine thread
through an inbox. The engine thread only steps: each step's new token ids go to an output
thread, which detokenizes them, finds stop strings and builds the outputs while the next
step computes (vLLM V1's output processor), and sends them with `call_soon_threadsafe` into
one queue per request. A stop string it finds comes back through the inbox, and the engine
thread finishes that sample (freeing its blocks) before its next step.
An adapter's files are read and validated on the adapter residency's loader threads (an
adapter store object fetched by hash first), within a time limit, before its request reaches
the inbox, and the request is admitted under the weights read there; so neither the loop nor
the engine thread reads a file. The residency (engine/lora/adapter_residency.py) owns all of it:
it counts the request in flight from the call on, and announces weights that changed behind
the adapter's name.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.adapters import LoRARequest, WeightsIdentity
from loragate.adapters.store import AdapterFetcher
from loragate.engine.api import engine_stats
from loragate.engine.api.chat_prompt import ChatPrompt
from loragate.engine.api.config import EngineConfig
from loragate.engine.api.engine_args import engine_config_from
from loragate.engine.api.engine_request import EngineRequest
from loragate.engine.api.engine_stats import EngineStats
from loragate.engine.api.input_processor import InputProcessor
from loragate.engine.api.model_info import ModelInfo, runtime_info
from loragate.engine.api.prompt_thread import PromptThread
from loragate.engine.api.thread_bridge import deliver, resolve
from loragate.engine.core import gil_handoff, startup_heap
from loragate.engine.core.llm_engine import LLMEngine, PromptInput
from loragate.engine.core.step_output import SeqStop
from loragate.engine.lora.adapter_events import WeightsListener
from loragate.engine.outputs.request_output import RequestOutput
from loragate.engine.sampling.sampling_params import SamplingParams
from loragate.kernels import release_thread_pool

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread failed; no request can be served until a restart."""


@dataclass
class _Add:
    request: EngineRequest  # naming the adapter's local copy (a store object's, fetched)
    adapter_identity: WeightsIdentity | None
    loop: asyncio.AbstractEventLoop
    accepted: asyncio.Future
    outputs: asyncio.Queue


@dataclass
class _Abort:
    request_id: Hashable


@dataclass
class _Stop:
    """Samples the output thread stopped (stop strings): the engine thread finishes them."""

    stops: list[SeqStop]


@dataclass
class _Call:
    """Run a function on the engine thread (for anything that touches engine state)."""

    fn: Any
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


# How long reading and validating one adapter may take unless the caller says otherwise.
DEFAULT_ADAPTER_LOAD_TIMEOUT_S = 60.0


class AsyncLLMEngine:
    """What a server needs of the engine, by name: the model it serves, requests, adapters
    (add, remove, requests in flight) and one stats snapshot. Anything that reads or changes
    engine state runs on the engine thread; adapters are the residency's to answer for."""

    def __init__(
        self, engine: LLMEngine, adapter_load_timeout: float = DEFAULT_ADAPTER_LOAD_TIMEOUT_S
    ):
        self.engine = engine
        self.adapter_load_timeout = adapter_load_timeout
        self._inbox: queue.Queue = queue.Queue()
        # Steps' token ids, from the engine thread to the output thread (None: stop).
        self._steps: queue.Queue = queue.Queue()
        # request_id -> (loop, queue, the Request): written by the engine thread when a
        # request is added or aborted, read and emptied by the output thread.
        self._streams: dict[Hashable, tuple[asyncio.AbstractEventLoop, asyncio.Queue, Any]] = {}
        self._stop = threading.Event()
        self.dead_error: BaseException | None = None
        # Prompts are tokenized on a thread of their own, with a tokenizer of their own: a
        # request never waits for the step in progress to learn its length (its quota's cost).
        self._prompts = PromptThread.copy_of(engine.inputs)
        self._thread = threading.Thread(target=self._loop, name="loragate-engine", daemon=True)
        self._output_thread = threading.Thread(
            target=self._output_loop, name="loragate-output", daemon=True
        )
        # The step runs on the engine thread from now on: this thread's OpenMP workers (left
        # from loading the model) would halve its speed (kernels/omp_runtime.py).
        release_thread_pool()
        self._output_thread.start()
        self._thread.start()
        # Collections walk only what is made from now on (engine/core/startup_heap.py), and the
        # engine thread gets the GIL back within half a millisecond (engine/core/gil_handoff.py).
        startup_heap.engine_started()
        gil_handoff.engine_started()
        self._heap_frozen = True
        # A process that exits with the engine running stops it first: its threads would
        # otherwise be inside torch while the interpreter tears the modules down.
        atexit.register(self.shutdown)

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        adapter_load_timeout: float = DEFAULT_ADAPTER_LOAD_TIMEOUT_S,
        adapter_fetcher: AdapterFetcher | None = None,
    ) -> AsyncLLMEngine:
        """The engine for ``config``; ``adapter_fetcher`` finds adapters named by their
        adapter store object (engine/lora/stored_adapters.py)."""
        return cls(LLMEngine(config, adapter_fetcher=adapter_fetcher), adapter_load_timeout)

    @classmethod
    def from_engine_args(
        cls, engine_args, adapter_load_timeout: float = DEFAULT_ADAPTER_LOAD_TIMEOUT_S
    ) -> AsyncLLMEngine:
        """vLLM's constructor: an engine from AsyncEngineArgs (or EngineArgs)."""
        return cls.from_config(engine_config_from(engine_args), adapter_load_timeout)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.dead_error is None

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_info(self) -> ModelInfo:
        engine = self.engine
        return ModelInfo(
            served_name=engine.model_name,
            base_model_name=engine.base_model_name,
            max_model_len=engine.max_model_len,
            max_num_seqs=engine.config.max_num_seqs,
            lora_enabled=engine.residency is not None,
            tokenizer=engine.tokenizer,
            **runtime_info(engine),
        )

    @property
    def prompt_processor(self) -> InputProcessor:
        """How prompts become token ids (tokenizer, special-token rule, chat template): plain,
        picklable data, so an ingress without the model tokenizes exactly as the engine."""
        return self.engine.inputs

    @property
    def num_requests(self) -> int:
        return len(self._streams)

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
        """vLLM's call shape: `generate_request` of the EngineRequest these values make
        (engine/api/engine_request.py says what each is); a bad value raises as the first
        output is awaited. `request_id` may be any hashable value (the seed passes 1)."""
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
        """Yield outputs until the request finishes (each cumulative, or only what is new
        under `RequestOutputKind.DELTA`, as vLLM's). Leaving early aborts it.

        Each output's `request_id` is the request's. A request for an adapter is in flight
        (`adapter_in_flight`) from this call's first step, before anything is awaited, until
        it ends, whichever way. Its outputs name its `lora_request` as given (an adapter store
        object's path included, whose local copy the engine runs).
        """
        self._check_alive()
        lora_request = request.lora_request
        residency = self.engine.residency
        counted = lora_request is not None and residency is not None
        if counted:  # in flight from here, before anything is awaited, until it ends
            residency.started(lora_request)
        streaming = finished = False
        try:
            identity, local = None, request
            if counted:  # its weights: one stat, or fetched and read on a loader thread
                fetched, identity = await residency.admit_request(
                    lora_request, self.adapter_load_timeout
                )
                if fetched is not lora_request:
                    local = dataclasses.replace(request, lora_request=fetched)
            loop = asyncio.get_running_loop()
            outputs: asyncio.Queue = asyncio.Queue()
            accepted = loop.create_future()
            self._inbox.put(_Add(local, identity, loop, accepted, outputs))
            await accepted  # raises the engine's ValueError for bad input
            streaming = first = True
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"engine failed: {item}") from item
                if first and counted:  # the listeners told of changed weights are done
                    await residency.settled(lora_request)
                first = False
                finished = item.finished
                if local is not request:
                    item = dataclasses.replace(item, lora_request=lora_request)
                yield item
        finally:
            if streaming and not finished:
                self._inbox.put(_Abort(request.request_id))
            if counted:
                residency.ended(lora_request)

    async def abort(self, request_id: Hashable) -> None:
        self._inbox.put(_Abort(request_id))

    async def add_adapter(self, lora_request: LoRARequest, timeout: float | None = None):
        """Fetch the adapter if it is a store object, then read and validate it into the CPU
        tier on a loader thread: its LoRAAdapter. AdapterError for a bad one,
        AdapterLoadTimeoutError past `timeout` seconds (default: adapter_load_timeout).
        None when LoRA is disabled (the engine then refuses its requests itself)."""
        residency = self.engine.residency
        if residency is None:
            return None
        limit = self.adapter_load_timeout if timeout is None else timeout
        return await residency.read(await residency.fetched(lora_request), limit)

    async def remove_adapter(self, lora_request: LoRARequest) -> bool:
        """Drop the adapter's weights from every tier (its slot is zeroed); True if any were
        cached. ValueError, changing nothing, while running sequences use its slot."""
        if not self.is_running or self.engine.residency is None:
            return False
        return await self._on_engine_thread(lambda engine: engine.remove_adapter(lora_request))

    async def wait_adapter_idle(self, lora_request: LoRARequest) -> None:
        """Return once no request for ``lora_request`` is in flight: every one handed to
        `generate` ended (finished, aborted or failed), fetching, loading or queued ones
        included."""
        if self.engine.residency is not None:
            await self.engine.residency.wait_idle(lora_request)

    def adapter_in_flight(self, lora_request: LoRARequest) -> int:
        """Requests for ``lora_request`` handed to `generate` and not yet ended."""
        if self.engine.residency is None:
            return 0
        return self.engine.residency.in_flight(lora_request)

    def on_adapter_weights_changed(self, listener: WeightsListener) -> Callable[[], None]:
        """Call ``listener`` (a coroutine function, on the requests' event loop) once each
        time a request is admitted under weights other than those last admitted for its
        adapter's name (engine/lora/adapter_events.py); that request's first output waits for it.
        Calling what this returns stops it."""
        if self.engine.residency is None:
            return lambda: None
        return self.engine.residency.subscribe(listener)

    async def adopt_adapter_object(self, oid: str, directory: Path) -> None:
        """Cache ``directory``'s files, just written to the adapter store as ``oid``, where
        this engine fetches store objects (engine/lora/stored_adapters.py): its first
        request for them downloads nothing. On a worker thread (a copy)."""
        if self.engine.residency is not None:
            await asyncio.to_thread(self.engine.residency.adopt_object, oid, directory)

    async def forget_adapter_object(self, oid: str) -> None:
        """Drop this engine's cached copy of ``oid`` (the store deleted it) and what its
        check vouched for. On a worker thread (a delete)."""
        if self.engine.residency is not None:
            await asyncio.to_thread(self.engine.residency.forget_object, oid)

    async def prune_adapter_objects(self) -> list[str]:
        """Drop this engine's cached copies of objects the store no longer holds; their ids.
        On a worker thread (one existence check per object)."""
        if self.engine.residency is None:
            return []
        return await asyncio.to_thread(self.engine.residency.prune_objects)

    async def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """A text prompt's token ids as the engine makes them (the model's BOS rule), on the
        prompt thread (engine/api/prompt_thread.py): never behind an engine step."""
        return await self._prompts.encode(text, add_special_tokens)

    async def apply_chat_template(self, chat: ChatPrompt) -> list[int]:
        """The chat's prompt token ids, by its chat template, on the prompt thread."""
        return await self._prompts.apply_chat_template(chat)

    async def stats(self) -> EngineStats:
        """One snapshot of queues, KV blocks and adapter residency, copied between steps."""
        return await self._on_engine_thread(engine_stats.snapshot)

    async def check_integrity(self) -> None:
        """Between steps: AssertionError if any KV block or reference count is astray."""
        await self._on_engine_thread(lambda engine: engine.check_integrity())

    async def _on_engine_thread(self, fn):
        """Run `fn(engine)` on the engine thread and return its result."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._inbox.put(_Call(fn, loop, done))
        return await done

    def shutdown(self, timeout: float = 5.0) -> None:
        atexit.unregister(self.shutdown)
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout)
        self._steps.put(None)
        self._output_thread.join(timeout)
        self._prompts.close()
        if self._heap_frozen:
            self._heap_frozen = False
            startup_heap.engine_stopped()
            gil_handoff.engine_stopped()

    # ---- engine thread ------------------------------------------------------------------
    def _loop(self) -> None:
        engine = self.engine
        try:
            while not self._stop.is_set():
                self._drain_inbox(block=not engine.has_unfinished_requests())
                if engine.has_unfinished_requests():
                    step = engine.step_tokens()
                else:
                    step = engine.step_output()  # requests aborted since the last step
                if step.events or step.requests:
                    self._steps.put(step)
        except BaseException as exc:  # the engine is unusable: tell every waiter
            log.exception("engine thread died")
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        self.dead_error = exc
        self._steps.put(None)
        for loop, outputs, _ in list(self._streams.values()):
            deliver(loop, outputs.put_nowait, exc)
        self._streams.clear()
        self._fail_inbox(exc)

    # ---- output thread ------------------------------------------------------------------
    def _output_loop(self) -> None:
        """Each step's text, stop strings and outputs, in step order, beside the engine."""
        processor = self.engine.output_processor
        try:
            while (step := self._steps.get()) is not None:
                outputs, stops = processor.process(step, answer_aborts=True)
                if stops:  # before the outputs: a caller that sees its request end may reuse its id
                    self._inbox.put(_Stop(stops))
                for request, out in outputs:
                    self._publish(request, out)
        except BaseException as exc:  # no output can be built any more: the engine is dead
            log.exception("output thread died")
            self._stop.set()
            self._inbox.put(None)
            self._die(exc)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                item = None

    def _handle(self, item) -> None:
        if isinstance(item, _Add):
            try:
                request = self.engine.add(item.request, item.adapter_identity)
            except Exception as exc:  # bad input: that request alone fails
                resolve(item.loop, item.accepted, error=exc)
                return
            request_id = item.request.request_id
            self._streams[request_id] = (item.loop, item.outputs, request)
            if not resolve(item.loop, item.accepted, result=None):
                self._caller_gone(request_id)
        elif isinstance(item, _Abort):
            # Its stream stays until its last output (finished by the abort, or by the step
            # before it) reaches the caller, who may still be waiting on it.
            self.engine.abort_request(item.request_id)
        elif isinstance(item, _Stop):
            self.engine.stop_sequences(item.stops)
        elif isinstance(item, _Call):
            try:
                resolve(item.loop, item.done, result=item.fn(self.engine))
            except Exception as exc:
                resolve(item.loop, item.done, error=exc)

    def _publish(self, request, out: RequestOutput) -> None:
        target = self._streams.get(out.request_id)
        if target is None or target[2] is not request:  # aborted (its id may be reused)
            return
        if out.finished:
            self._streams.pop(out.request_id, None)
        loop, outputs, _ = target
        if not deliver(loop, outputs.put_nowait, out):
            self._caller_gone(out.request_id)

    def _caller_gone(self, request_id) -> None:
        """The request's event loop closed: nobody reads its outputs any more (from either
        thread: the abort goes through the inbox)."""
        self._streams.pop(request_id, None)
        self._inbox.put(_Abort(request_id))

    def _fail_inbox(self, exc: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Add):
                resolve(item.loop, item.accepted, error=EngineDeadError(str(exc)))
            elif isinstance(item, _Call):
                resolve(item.loop, item.done, error=EngineDeadError(str(exc)))

    def _check_alive(self) -> None:
        if not self.is_running:
            raise EngineDeadError(f"engine is not running: {self.dead_error}")
