"""Admitting a route's engine requests: the caller's quotas admit one HTTP request (`begin`),
the queue admits each engine request (`start`), and when they end the lease goes back and
the usage is recorded.

Routes never touch the engine directly: they `begin` a MeteredRequest, start Generations
through it (each is admitted to the queue and measured; the engine counts it against its
adapter) and
format what they yield; `end()` gives everything back and records the usage.
"""

from __future__ import annotations

import asyncio
from itertools import count
from typing import Protocol
from uuid import uuid4

from loragate.adapters import LoRARequest
from loragate.engine import EngineClient, SamplingParams
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.errors import EngineUnavailableError
from loragate.gateway.serving.admission import Admission
from loragate.gateway.serving.generation import Generation
from loragate.gateway.serving.metered import MeteredRequest
from loragate.gateway.tenancy.principal import Principal
from loragate.gateway.tenancy.quotas import QuotaKeeper
from loragate.gateway.tenancy.request_cost import NO_COST, RequestCost
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import UsageCounts, split_adapter_key


class RequestObserver(Protocol):
    """Where the gateway's metrics hear of each engine request (operations' GatewayMetrics)."""

    def count_rejected(self, reason: str) -> None: ...

    def observe_generation(
        self, gen: Generation, lora: LoRARequest | None, tenant: str | None
    ) -> None: ...


class Generations:
    def __init__(
        self,
        engine: EngineClient,
        admission: Admission,
        adapters: AdapterManager,
        quotas: QuotaKeeper,
        usage_meter: UsageMeter,
        observer: RequestObserver,
    ):
        self.engine = engine
        self.admission = admission
        self.adapters = adapters
        self.quotas = quotas
        self.usage_meter = usage_meter
        self.observer = observer
        self._ids = count()
        self._prefix = uuid4().hex[:8]
        self._background: set[asyncio.Task] = set()

    def new_request_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}{next(self._ids):06d}"

    async def begin(
        self, caller: Principal, lora: LoRARequest | None, cost: RequestCost = NO_COST
    ) -> MeteredRequest:
        """The caller's quotas admit one HTTP request of this worst-case `cost` (429 if not
        now, 400 if never)."""
        lease = await self.quotas.admit(caller, cost)

        def account(counts: UsageCounts, unrecorded: UsageCounts) -> asyncio.Task:
            return self._in_background(self._account(caller, lora, lease, counts, unrecorded))

        def record(counts: UsageCounts) -> asyncio.Task:
            return self._in_background(self._record_usage(caller, lora, counts))

        return MeteredRequest(self.start, account, caller, lora, record)

    def _in_background(self, work) -> asyncio.Task:
        """A task that shutdown waits for (briefly), whoever awaits it."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def accounting(self) -> set[asyncio.Task]:
        """The accounting under way (leases given back, usage recorded)."""
        return set(self._background)

    async def _account(
        self,
        caller: Principal,
        lora: LoRARequest | None,
        lease: str | None,
        counts: UsageCounts,
        unrecorded: UsageCounts,
    ) -> None:
        """The lease given back with every token used (`counts`); the usage not yet
        recorded as a stream went (`unrecorded`) recorded."""
        await self.quotas.finish(caller, lease, counts.prompt_tokens + counts.completion_tokens)
        if unrecorded != UsageCounts():
            await self._record_usage(caller, lora, unrecorded)

    async def _record_usage(
        self, caller: Principal, lora: LoRARequest | None, counts: UsageCounts
    ) -> None:
        adapter = None if lora is None else usage_adapter_name(caller, lora)
        await self.usage_meter.record(caller.usage_name, adapter, counts)

    def start(
        self,
        prompt,
        params: SamplingParams,
        lora: LoRARequest | None,
        *,
        request_id: str,
        field_names: dict[str, str],
        adapter_param: str = "model",
        cache_salt: str | None = None,
        tenant: str | None = None,
        tenant_weight: float = 1.0,
        priority: int = 0,
    ) -> Generation:
        """Admit one engine request (429 if the queue is full); call `prime()` next.

        `cache_salt` (the tenant) keeps prefix-cache blocks from being shared across tenants;
        `tenant` (its name) is what engine plugins and fair shares see, with its
        `tenant_weight` (the tenant record's share); `priority` is vLLM's.
        """
        if not self.engine.is_running:
            raise EngineUnavailableError(f"the engine is not running: {self.engine.dead_error}")
        num_seqs = max(params.n, params.best_of or 1)
        try:
            self.admission.admit(num_seqs)
        except Exception:
            self.observer.count_rejected("queue_full")
            raise

        def on_close(gen: Generation) -> None:
            self.admission.release(num_seqs)
            if gen.latest is not None:
                self.observer.observe_generation(gen, lora, tenant)

        outputs = self.engine.generate(
            prompt,
            params,
            request_id,
            lora_request=lora,
            cache_salt=cache_salt,
            tenant=tenant,
            tenant_weight=tenant_weight,
            priority=priority,
        )
        return Generation(
            outputs,
            request_id,
            on_close=on_close,
            field_names=field_names,
            adapter_param=adapter_param,
            scrub=self.adapters.scrub,
        )


def usage_adapter_name(caller: Principal, lora: LoRARequest) -> str:
    """The adapter as the caller names it in its usage: the operator by key; a tenant by the
    bare name, so a public adapter's owner never shows in a tenant's usage."""
    return lora.lora_name if caller.is_operator else split_adapter_key(lora.lora_name)[1]
