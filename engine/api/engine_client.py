"""EngineClient: everything a server may ask of an engine, and nothing more.

Two engines implement it: `AsyncLLMEngine` (the engine in this process, stepping on its own
thread) and the gateway's `ReplicatedEngine` (N engine replicas on Ray Serve). The gateway
is typed against this protocol alone, so every route works the same on one process or on
many; `tests/engine/test_engine_client.py` checks that both implement every member with
the same signature (vLLM has a protocol of the same name and purpose).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable
from pathlib import Path
from typing import Protocol, runtime_checkable

from loragate.adapters import LoRARequest
from loragate.engine.api.chat_prompt import ChatPrompt
from loragate.engine.api.engine_request import EngineRequest
from loragate.engine.api.engine_stats import EngineStats
from loragate.engine.api.input_processor import PromptInput
from loragate.engine.api.model_info import ModelInfo
from loragate.engine.lora.adapter_events import WeightsListener
from loragate.engine.outputs.request_output import RequestOutput
from loragate.engine.sampling.sampling_params import SamplingParams


@runtime_checkable
class EngineClient(Protocol):
    """The engine as a server sees it: the model it serves, requests, adapters, stats."""

    @property
    def is_running(self) -> bool:
        """False once the engine stopped or died (a dead one says why in `dead_error`)."""
        ...

    @property
    def dead_error(self) -> BaseException | None:
        """What killed the engine, if it died."""
        ...

    @property
    def model_info(self) -> ModelInfo:
        """The served model: names, context length, LoRA limits, tokenizer, runtime."""
        ...

    @property
    def tokenizer(self):
        """The model's tokenizer (for detokenizing and counting on the caller's side)."""
        ...

    def generate(
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
        """vLLM's call shape: `generate_request` of the EngineRequest these values make."""
        ...

    def generate_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Outputs until the request finishes (cumulative, or deltas as its sampling params'
        `output_kind` asks); leaving early aborts it. The one way the gateway starts one: the
        request travels whole, over the replica wire too."""
        ...

    async def abort(self, request_id: Hashable) -> None:
        """Stop a request and free what it holds."""
        ...

    async def add_adapter(self, lora_request: LoRARequest, timeout: float | None = None):
        """Read and validate the adapter into memory; a summary of what was read (rank,
        alpha, target modules, sha256, size). AdapterError for a bad one."""
        ...

    async def remove_adapter(self, lora_request: LoRARequest) -> bool:
        """Drop the adapter's weights from every tier; True if the engine had them."""
        ...

    async def wait_adapter_idle(self, lora_request: LoRARequest) -> None:
        """Return once no request for ``lora_request`` is in flight (on every replica): each
        one handed to `generate`, still loading or queued included, has ended."""
        ...

    def adapter_in_flight(self, lora_request: LoRARequest) -> int:
        """How many requests for ``lora_request`` were handed to `generate` and not ended."""
        ...

    def on_adapter_weights_changed(self, listener: WeightsListener) -> Callable[[], None]:
        """Call ``listener(AdapterWeightsChanged)`` once each time a request is admitted
        under weights (sha256) other than those last admitted for its adapter's name, the
        first for a name included; that request's first output waits until it returns.
        Calling what this returns stops it."""
        ...

    async def adopt_adapter_object(self, oid: str, directory: Path) -> None:
        """``directory``'s files were just written to the adapter store as object ``oid``:
        an engine that fetches from the store into a cache here keeps them there, so it does
        not download them again (replicas, which fetch for themselves, do nothing)."""
        ...

    async def forget_adapter_object(self, oid: str) -> None:
        """The adapter store deleted object ``oid``: an engine with a cache here drops its
        copy and what its check of it vouched for (replicas prune their own caches)."""
        ...

    async def prune_adapter_objects(self) -> list[str]:
        """Drop the cached copies of objects the adapter store no longer holds (deleted by
        another replica): their ids; [] where the engine keeps no cache here."""
        ...

    async def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """A text prompt's token ids, with the model's special-token rule."""
        ...

    async def apply_chat_template(self, chat: ChatPrompt) -> list[int]:
        """A conversation's prompt token ids, by the model's chat template (or the one
        `chat` names), with its tools laid out where the template knows them."""
        ...

    async def stats(self) -> EngineStats:
        """One snapshot of queues, KV blocks, adapter residency and adapter store fetches
        (all replicas summed)."""
        ...

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop serving; running requests end."""
        ...
