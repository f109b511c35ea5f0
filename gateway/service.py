"""What every route shares: the async engine, the adapters, the queue bound and the metrics.

Routes never touch the engine directly: they resolve a model name, `start` a Generation
(which is admitted, counted against its adapter and measured) and format what it yields.
"""

from __future__ import annotations

import logging
import time
from itertools import count
from uuid import uuid4

from litestar.di import NamedDependency

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.async_engine import AsyncLLMEngine, EngineDeadError
from loragate.gateway.adapter_manager import AdapterManager
from loragate.gateway.adapter_usage import AdapterUsage
from loragate.gateway.admission import Admission
from loragate.gateway.errors import EngineUnavailableError, InvalidRequestError
from loragate.gateway.generation import Generation
from loragate.gateway.metrics import GatewayGauges, GatewayMetrics, read_engine_snapshot
from loragate.gateway.registry import AdapterRegistry, InMemoryAdapterRegistry
from loragate.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


class GatewayService:
    def __init__(
        self,
        settings: GatewaySettings,
        engine: AsyncLLMEngine,
        registry: AdapterRegistry | None = None,
    ):
        self.settings = settings
        self.engine = engine
        self.registry = registry if registry is not None else InMemoryAdapterRegistry()
        self.admission = Admission(
            engine.engine.config.max_num_seqs, settings.max_queue, settings.retry_after_seconds
        )
        self.usage = AdapterUsage()
        self.metrics = GatewayMetrics()
        self.adapters = AdapterManager(
            engine, self.registry, self.usage, settings.adapter_root, self.model_name
        )
        self.started_at = int(time.time())
        self._ids = count()
        self._prefix = uuid4().hex[:8]

    # ---- what the routes read -----------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.engine.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    @property
    def tokenizer(self):
        return self.engine.engine.tokenizer

    def new_request_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}{next(self._ids):06d}"

    async def resolve_model(self, name: str | None, param: str = "model") -> LoRARequest | None:
        """None for the base model; the adapter's LoRARequest; NotFoundError (404) otherwise."""
        if name is None or name == "" or name == self.model_name:
            return None
        return (await self.adapters.lookup(name, param)).lora_request

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        try:
            return self.engine.engine.apply_chat_template(messages, add_generation_prompt)
        except Exception as exc:  # jinja errors are not ValueErrors; all are the client's input
            raise InvalidRequestError(f"messages: {exc}", param="messages") from exc

    # ---- running requests ---------------------------------------------------------------
    def start(
        self,
        prompt,
        params: SamplingParams,
        lora: LoRARequest | None,
        *,
        request_id: str,
        field_names: dict[str, str],
        adapter_param: str = "model",
    ) -> Generation:
        """Admit one engine request (429 if the queue is full); call `prime()` next."""
        if not self.engine.is_running:
            raise EngineUnavailableError(f"the engine is not running: {self.engine.dead_error}")
        num_seqs = max(params.n, params.best_of or 1)
        try:
            self.admission.admit(num_seqs)
        except Exception:
            self.metrics.rejected.labels("queue_full").inc()
            raise
        if lora is not None:
            self.usage.acquire(lora)

        def on_close(gen: Generation) -> None:
            self.admission.release(num_seqs)
            if lora is not None:
                self.usage.release(lora)
            if gen.latest is not None:
                finish = gen.latest.outputs[0].finish_reason if gen.finished else None
                ttft = None if gen.first_token_at is None else gen.first_token_at - gen.started
                e2e = (gen.finished_at or gen.started) - gen.started
                self.metrics.observe_request(ttft, e2e, gen.num_output_tokens, finish)

        outputs = self.engine.generate(prompt, params, request_id, lora_request=lora)
        return Generation(
            outputs,
            request_id,
            on_close=on_close,
            field_names=field_names,
            adapter_param=adapter_param,
            scrub=self.adapters.scrub,
        )

    # ---- lifecycle and observability ----------------------------------------------------
    async def startup(self) -> None:
        if self.settings.preload_adapters and self.engine.engine.adapters is not None:
            names = await self.adapters.preload_root()
            if names:
                log.info("preloaded %d adapters from %s", len(names), self.settings.adapter_root)

    async def metrics_text(self) -> bytes:
        snapshot = None
        if self.engine.is_running:
            try:
                snapshot = await self.engine.call(read_engine_snapshot)
            except EngineDeadError:
                snapshot = None
        gauges = GatewayGauges(
            in_flight=self.admission.in_flight,
            queued=self.admission.waiting,
            queue_capacity=self.admission.capacity,
            registered_adapters=len(await self.registry.list()),
            engine_up=self.engine.is_running,
        )
        return self.metrics.render(snapshot, gauges)


# How route handlers ask Litestar for the service (injected by name from app state).
Service = NamedDependency[GatewayService]
