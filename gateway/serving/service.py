"""What every route shares: the async engine, the adapters, the registry store, the caller's
authentication and quotas, the queue bound and the metrics.

Routes never touch the engine directly: they resolve a model name for their caller, `begin`
a MeteredRequest (the tenant's quotas admit it), start Generations through it (each is
admitted to the queue, counted against its adapter and measured) and format what they
yield; `end()` gives everything back and records the usage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from itertools import count
from uuid import uuid4

from litestar.di import NamedDependency

from loragate.adapters import LoRARequest
from loragate.engine import EngineClient, EngineDeadError, SamplingParams
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.store_setup import adapter_uploads, with_adapter_store
from loragate.gateway.adapter_control.sync import RegistrySync
from loragate.gateway.adapter_control.usage import AdapterUsage
from loragate.gateway.errors import EngineUnavailableError, InvalidRequestError
from loragate.gateway.openai.chat_template import load_chat_template
from loragate.gateway.operations.labels import BASE
from loragate.gateway.operations.metrics import GatewayGauges, GatewayMetrics
from loragate.gateway.operations.registry_care import RegistryCare
from loragate.gateway.operations.scrape import AdapterView
from loragate.gateway.operations.settings import GatewaySettings
from loragate.gateway.operations.settings_checks import lora_modules
from loragate.gateway.operations.traffic import request_record
from loragate.gateway.replicas.metrics import replica_metrics_text
from loragate.gateway.replicas.wire import ReplicaReport
from loragate.gateway.serving.admission import Admission
from loragate.gateway.serving.generation import Generation
from loragate.gateway.serving.metered import MeteredRequest
from loragate.gateway.serving.request_cost import NO_COST, RequestCost, request_cost
from loragate.gateway.store_seam import StoreSeam
from loragate.gateway.tenancy.auth import Authenticator
from loragate.gateway.tenancy.principal import OPERATOR, UNTENANTED, Principal
from loragate.gateway.tenancy.quotas import QuotaKeeper
from loragate.gateway.tenancy.tenants import TenantService
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import RegistryStore, UsageCounts, make_registry_store, split_adapter_key

log = logging.getLogger(__name__)


class GatewayService:
    def __init__(
        self,
        settings: GatewaySettings,
        engine: EngineClient,
        store: RegistryStore | None = None,
        replica_reports: Callable[[], Awaitable[list[ReplicaReport]]] | None = None,
    ):
        self.settings = settings
        self.engine = engine
        # The replicas' own reports (Ray Serve); None: this process's engine is the one.
        self._replica_reports = replica_reports
        self.model = engine.model_info
        self.store = StoreSeam(store if store is not None else build_store(settings))
        self.health = self.store.health
        self.admission = Admission(
            self.model.max_num_seqs, settings.max_queue, settings.retry_after_seconds
        )
        self.usage = AdapterUsage()
        self.metrics = GatewayMetrics(self.model.served_name, settings.metrics_label_limit)
        in_process = replica_reports is None
        self.engine, objects = with_adapter_store(settings, engine, self.store, in_process)
        self.adapters = AdapterManager(
            self.engine,
            self.store,
            self.usage,
            settings.adapter_root,
            self.model_name,
            load_timeout=settings.adapter_load_timeout_seconds,
            objects=objects,
        )
        self.uploads = adapter_uploads(settings, self.adapters, objects)
        self.auth = Authenticator(
            settings.admin_key, self.store, settings.auth_cache_seconds, api_key=settings.api_key
        )
        self.quotas = QuotaKeeper(self.store, settings.quota_lease_seconds)
        self.usage_meter = UsageMeter(self.store)
        self.tenants = TenantService(self.store, self.auth, self.adapters, self.usage_meter)
        self.sync = RegistrySync(
            self.store,
            self.adapters.catalog,
            self.auth,
            self.usage_meter,
            settings.registry_resync_seconds,
        )
        self.auth.check_for_reset = self.sync.resync
        self.care = RegistryCare(
            self.store,
            settings,
            lambda: bool(self.adapters.catalog.orphans or self.auth.orphans),
        )
        # vLLM's --chat-template, in place of the model's own (None: the model's).
        self.chat_template = load_chat_template(settings.chat_template)
        self.started_at = int(time.time())
        self._ids = count()
        self._prefix = uuid4().hex[:8]
        self._background: set[asyncio.Task] = set()
        self._lease_keeper: asyncio.Task | None = None

    # ---- what the routes read -----------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.model.served_name

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def new_request_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}{next(self._ids):06d}"

    async def resolve_model(
        self, name: str | None, param: str = "model", caller: Principal = OPERATOR
    ) -> LoRARequest | None:
        """None for the base model; the adapter's LoRARequest if `caller` may use it;
        NotFoundError (404) otherwise, the same whether it is missing or another tenant's."""
        if name is None or name == "" or name == self.model_name:
            return None
        if name in self.settings.model_aliases:
            return None
        return (await self.adapters.lookup(name, param, caller)).lora_request

    @property
    def chat_template_text(self) -> str | None:
        """The template chats go through: --chat-template's, or the model's own."""
        return self.chat_template or getattr(self.tokenizer, "chat_template", None)

    @property
    def auto_tool_parser(self) -> str | None:
        """The parser of tool_choice "auto", when the server was started to allow it."""
        settings = self.settings
        return settings.tool_call_parser if settings.enable_auto_tool_choice else None

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool,
        add_special_tokens: bool = False,
        tools: list[dict] | None = None,
    ) -> list[int]:
        try:
            return self.engine.apply_chat_template(
                messages,
                add_generation_prompt,
                add_special_tokens,
                tools=tools,
                chat_template=self.chat_template,
            )
        except Exception as exc:  # jinja errors are not ValueErrors; all are the client's input
            raise InvalidRequestError(f"messages: {exc}", param="messages") from exc

    async def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """A text prompt's token ids as the engine makes them (the model's BOS rule), on the
        engine thread, which is the tokenizer's only user."""
        return await self.engine.encode(text, add_special_tokens)

    async def measure(
        self, caller: Principal, prompts: list, params: SamplingParams, field_names: dict
    ) -> tuple[list, RequestCost]:
        """The prompts as the engine will get them, and what the request costs the caller's
        quotas (see request_cost).

        Each text prompt is tokenized here, as the engine would, and handed to the engine as
        token ids (tokenized once): a tokens/minute quota needs the lengths, and so does the
        check that `max_tokens` fits the context (vLLM's 400, rather than a long answer cut
        at the context's end).
        """
        prompts = [await self._tokenized(p) for p in prompts]
        lengths = [_prompt_length(p) for p in prompts]
        _check_max_tokens(lengths, params.max_tokens, self.max_model_len, field_names)
        widest = "best_of" if (params.best_of or 1) > params.n else "n"
        if max(params.n, params.best_of or 1) == 1:
            widest = "prompt"
        cost = request_cost(
            lengths,
            params,
            self.max_model_len,
            max_tokens_param=field_names.get("max_tokens", "max_tokens"),
            sequences_param=field_names.get(widest, widest),
        )
        return prompts, cost

    async def _tokenized(self, prompt):
        """A text prompt (a string or {"prompt", "add_special_tokens"}) as token ids."""
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        if not isinstance(prompt, dict) or "prompt_token_ids" in prompt or not prompt["prompt"]:
            return prompt  # token ids already, or empty: the engine refuses that itself
        text, special = prompt["prompt"], prompt.get("add_special_tokens")
        ids = await self.encode(text, special)
        return {"prompt": text, "prompt_token_ids": ids}

    # ---- running requests ---------------------------------------------------------------
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
            self.metrics.rejected.labels("queue_full").inc()
            raise
        if lora is not None:
            self.usage.acquire(lora)

        def on_close(gen: Generation) -> None:
            self.admission.release(num_seqs)
            if lora is not None:
                self.usage.release(lora)
            if gen.latest is not None:
                adapter = BASE if lora is None else lora.lora_name
                self.metrics.observe_request(request_record(gen, adapter, tenant or UNTENANTED))

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
            on_first_output=None if lora is None else self.adapters.note_served,
        )

    # ---- lifecycle and observability ----------------------------------------------------
    async def startup(self) -> None:
        await self.care.check_persistence()  # RegistryNotDurable stops the start here
        await self.sync.start()
        self.care.start()
        self.adapters.start()
        if self.settings.preload_adapters and self.model.lora_enabled:
            await self._preload()
        for name, path in lora_modules(self.settings.lora_modules):
            await self.adapters.register(name, path, source="cli", anywhere=True, replace=True)
            log.info("registered --lora-modules adapter %s from %s", name, path)
        self.sync.on_subscribed = self._preload_waiting_folders
        self._lease_keeper = asyncio.create_task(self.quotas.keep_leases_alive())

    async def _preload(self, only: set[str] | None = None) -> None:
        names = await self.adapters.preload_root(only)
        if names:
            log.info("preloaded %d adapters from %s", len(names), self.settings.adapter_root)

    def _preload_waiting_folders(self) -> None:
        """The store answers again: register the folders that waited for it (once at a time)."""
        waiting = set(self.adapters.preload_waiting)
        if waiting and not any(t.get_name() == "preload" for t in self._background):
            task = asyncio.create_task(self._preload(waiting), name="preload")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def shutdown(self) -> None:
        """Stop the loops; let accounting already under way finish (briefly), then close."""
        await self.care.stop()
        await self.sync.stop()
        self.quotas.stop()
        if self._lease_keeper is not None:
            self._lease_keeper.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)
        await self.usage_meter.flush()
        await self.adapters.close()
        await self.store.close()

    async def metrics_text(self) -> bytes:
        snapshot = None
        if self.engine.is_running:
            try:
                snapshot = await self.engine.stats()
            except EngineDeadError:
                snapshot = None
        records = await self.adapters.catalog.list(OPERATOR)
        gauges = GatewayGauges(
            in_flight=self.admission.in_flight,
            queued=self.admission.waiting,
            queue_capacity=self.admission.capacity,
            registered_adapters=len(records),
            engine_up=self.engine.is_running,
            registry_reachable=self.health.reachable,
            usage_pending=self.usage_meter.pending,
            registry_durable=self.care.persistence is not None and self.care.persistence.durable,
            registry_backup_at=self.care.newest_backup.exported_at
            if self.care.newest_backup
            else 0,
        )
        view = AdapterView(
            sha256_of={r.key: r.sha256 for r in records},
            max_loras=self.model.max_loras,
        )
        text = self.metrics.render(snapshot, gauges, view)
        if self.settings.replicated:
            text += replica_metrics_text(await self.replica_reports())
        return text

    async def replica_reports(self) -> list[ReplicaReport]:
        """Each engine replica's latest state; the one local engine unless replicated."""
        if self._replica_reports is not None:
            try:
                return await self._replica_reports()
            except EngineDeadError:
                return []
        if not self.engine.is_running:
            return []
        try:
            fetcher = self.adapters.objects.fetcher
            fetches = fetcher.fetches if fetcher is not None else 0
            stats = await self.engine.stats()
            return [ReplicaReport("local", "", stats, store_fetches=fetches)]
        except EngineDeadError:
            return []

    async def adapter_names_by_weights(self) -> dict[str, list[str]]:
        """Weights sha256 -> the registered adapter keys with those weights."""
        names: dict[str, list[str]] = {}
        for record in await self.adapters.catalog.list(OPERATOR):
            names.setdefault(record.sha256, []).append(record.key)
        return names


def _check_max_tokens(lengths: list[int], max_tokens, max_model_len: int, names: dict) -> None:
    if max_tokens is None:
        return
    for length in lengths:
        if length < max_model_len and length + max_tokens > max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {length + max_tokens} tokens ({length} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion.",
                param=names.get("max_tokens", "max_tokens"),
            )


def _prompt_length(prompt) -> int:
    """Tokens of an engine prompt; 0 for text not tokenized here (no tokens quota asks)."""
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt_token_ids"), list):
        return len(prompt["prompt_token_ids"])
    return 0


def usage_adapter_name(caller: Principal, lora: LoRARequest) -> str:
    """The adapter as the caller names it in its usage: the operator by key; a tenant by the
    bare name, so a public adapter's owner never shows in a tenant's usage."""
    return lora.lora_name if caller.is_operator else split_adapter_key(lora.lora_name)[1]


def build_store(settings: GatewaySettings) -> RegistryStore:
    """The in-memory store, or the Redis one (under its namespace) with --redis-url."""
    options = {"lease_ttl_s": settings.quota_lease_seconds}
    if settings.redis_url is not None:
        options["namespace"] = settings.redis_namespace
    return make_registry_store(settings.redis_url, **options)


# How route handlers ask Litestar for the service (injected by name from app state).
Service = NamedDependency[GatewayService]
