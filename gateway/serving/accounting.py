"""One HTTP request's accounting, in one object: `RequestAccount`.

A route opens one with `await accounting.open(caller, lora, cost)`: the caller's quotas admit
the request against its worst case in tokens (a lease; 429 if not now, 400 if never). Its
engine requests start through it (`start`: each is admitted to the bounded queue, 429 when
full, then handed to the engine), a stream is metered as it goes (`counted`), and `end()`,
called exactly once where the request ends (a route's `finally`, a stream's cleanup; later
calls do nothing), releases everything in one place: each engine request closed (aborted if
unfinished) and its queue place given back, the metrics told of each that reached the
engine, the lease given back keeping only the tokens used, and the usage not yet recorded
recorded. The account calls each collaborator itself; nothing is handed back and forth.

Usage is what the engine reported (the same numbers as the response's `usage`): prompt and
completion tokens, and one request if any engine request reached the engine. A stream is
counted before each event leaves for the client (the write is awaited), so a gateway killed
mid-stream (SIGKILL, a lost machine) has counted every token its client received, and `end()`
counts only what is left: nothing is counted twice. What it may count and the client never
got is the last event, if the process dies between the write and the send. While the store
is unreachable the counts wait in this process (usage_meter), and die with it.

An engine request of a whole answer whose engine stopped mid-request (a replica lost) is
sent again by `resend` (serving/run.py decides when): the lost one's tokens reached no
client, so they are neither counted nor observed, and the lease and queue place stay as they
were. A whole answer that still ends in that error is `undelivered`: nothing of it counted.

`records` says what the account did: sequences admitted and released, the reservation and
lease, the usage recorded, the tokens the lease was given back with, and what the metrics
were told (tests/gateway/serving/test_request_account.py checks each against what was sent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Protocol
from uuid import uuid4

from loragate.adapters import LoRARequest
from loragate.engine import EngineClient, EngineRequest, SamplingParams
from loragate.gateway.adapter_control.paths import hide_root
from loragate.gateway.errors import EngineUnavailableError, QuotaExceededError
from loragate.gateway.serving.admission import Admission
from loragate.gateway.serving.generation import Generation, deltas_of
from loragate.gateway.tenancy.principal import Principal
from loragate.gateway.tenancy.quotas import QuotaKeeper
from loragate.gateway.tenancy.request_cost import NO_COST, RequestCost
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import UsageCounts, split_adapter_key


class RequestObserver(Protocol):
    """Where the gateway's metrics hear of each engine request (operations' GatewayMetrics)."""

    def count_rejected(self, reason: str) -> None: ...

    def count_rate_limited(self, tenant: str, reason: str) -> None:
        """A tenant's quota refused one of its requests now (429), for `reason` (the quota's
        name, as the error's code says)."""

    def observe_generation(
        self, gen: Generation, lora: LoRARequest | None, tenant: str | None
    ) -> None: ...


class Accounting:
    """What every request's account uses, shared: the engine, the queue, quotas, the usage
    meter and the metrics. Routes open one `RequestAccount` per HTTP request here."""

    def __init__(
        self,
        engine: EngineClient,
        admission: Admission,
        quotas: QuotaKeeper,
        usage_meter: UsageMeter,
        observer: RequestObserver,
        adapter_root: Path | None = None,
    ):
        self.engine = engine
        self.admission = admission
        self.quotas = quotas
        self.usage_meter = usage_meter
        self.observer = observer
        self.adapter_root = adapter_root  # hidden from error texts
        self._ids = count()
        self._prefix = uuid4().hex[:8]
        self._background: set[asyncio.Task] = set()

    def new_request_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}{next(self._ids):06d}"

    async def open(
        self, caller: Principal, lora: LoRARequest | None, cost: RequestCost = NO_COST
    ) -> RequestAccount:
        """The caller's quotas admit one HTTP request of this worst-case `cost` (429 if not
        now, 400 if never): its account."""
        try:
            lease = await self.quotas.admit(caller, cost)
        except QuotaExceededError as refused:
            self.observer.count_rate_limited(caller.tenant, refused.code)
            raise
        return RequestAccount(self, caller, lora, cost, lease)

    def in_background(self, work) -> asyncio.Task:
        """A task that shutdown waits for (briefly), whoever awaits it."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def under_way(self) -> set[asyncio.Task]:
        """The accounting under way (leases given back, usage recorded)."""
        return set(self._background)


@dataclass
class AccountRecords:
    """What one account did, as it did it."""

    reserved: RequestCost  # the worst case the quotas admitted
    lease: str | None  # the quota lease (None: no quota applies, or the store was down)
    admitted_seqs: int = 0  # sequences let into the queue
    released_seqs: int = 0  # and given back
    recorded: UsageCounts = field(default_factory=UsageCounts)  # usage written, in all
    quota_tokens: int | None = None  # tokens the lease was given back with (None: not yet)
    observed: list[tuple[str, int]] = field(default_factory=list)  # (request id, tokens)
    resent: int = 0  # engine requests sent again after their engine stopped mid-request
    delivered: bool = True  # False: the client got nothing of it (a whole answer lost)
    ended: bool = False


@dataclass(frozen=True)
class _Started:
    """One engine request as it was sent (to send it again as it was), and the names its
    errors give the client's fields."""

    request: EngineRequest
    field_names: dict[str, str]
    adapter_param: str

    @property
    def num_seqs(self) -> int:
        """The sequences it takes in the queue."""
        params = self.request.sampling_params
        return max(params.n, params.best_of or 1)


class RequestAccount:
    """One HTTP request: its lease, its engine requests and their queue places, its usage."""

    def __init__(
        self,
        accounting: Accounting,
        caller: Principal,
        lora: LoRARequest | None,
        cost: RequestCost,
        lease: str | None,
    ):
        self._accounting = accounting
        self.caller = caller
        self.lora = lora
        self.generations: list[Generation] = []
        self.records = AccountRecords(reserved=cost, lease=lease)
        self._started: list[_Started] = []  # what each generation was started with

    def start(
        self,
        prompt,
        params: SamplingParams,
        *,
        request_id: str,
        field_names: dict[str, str],
        adapter_param: str = "model",
        priority: int = 0,
    ) -> Generation:
        """Admit one engine request to the queue (429 if it is full) and hand it to the
        engine; call its `prime()` next. The request is built here, once, with the caller's
        tenancy (cache salt, name, weight) and adapter, and goes to the engine whole."""
        accounting = self._accounting
        engine = accounting.engine
        if not engine.is_running:
            raise EngineUnavailableError(f"the engine is not running: {engine.dead_error}")
        caller = self.caller
        request = EngineRequest(
            prompt,
            deltas_of(params),
            request_id,
            lora_request=self.lora,
            cache_salt=caller.cache_salt,
            tenant=caller.tenant,
            priority=priority,
            tenant_weight=caller.weight,
        )
        started = _Started(request, field_names, adapter_param)
        num_seqs = started.num_seqs
        try:
            accounting.admission.admit(num_seqs)
        except Exception:
            accounting.observer.count_rejected("queue_full")
            raise
        self.records.admitted_seqs += num_seqs
        gen = self._launch(started)
        self.generations.append(gen)
        self._started.append(started)
        return gen

    @property
    def engine_running(self) -> bool:
        return self._accounting.engine.is_running

    async def resend(self, gen: Generation) -> Generation:
        """Send again an engine request whose engine stopped mid-request (a replica or its
        node lost) before anything of this HTTP request left for its client (a whole answer
        not yet sent): the same prompt and parameters, under the same id and in the same
        queue place; primed. What the lost one produced is neither counted nor observed, as
        no client received it. Only where the engine still runs (replicas left): one engine
        in this process that stopped cannot take it again."""
        assert gen.engine_lost, "only an engine request whose engine stopped is sent again"
        assert self.records.recorded == UsageCounts(), "a stream's events were sent already"
        index = self.generations.index(gen)
        await gen.aclose()
        again = self._launch(self._started[index])
        self.generations[index] = again
        self.records.resent += 1
        await again.prime()
        return again

    def _launch(self, started: _Started) -> Generation:
        root = self._accounting.adapter_root
        outputs = self._accounting.engine.generate_request(started.request)
        return Generation(
            outputs,
            started.request.request_id,
            field_names=started.field_names,
            adapter_param=started.adapter_param,
            scrub=lambda text: hide_root(text, root),
        )

    async def counted(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`events`, each sent only once the usage it carries is counted in the store."""
        async for event in events:
            await self.count_so_far()
            yield event

    async def count_so_far(self) -> None:
        """Write what the engine produced and the store was not given yet. The write runs to
        its end even if this task is cancelled (a client gone), so `end()` never counts it
        again."""
        new = _minus(usage_counts(self.generations), self.records.recorded)
        if new == UsageCounts():
            return
        self.records.recorded = _plus(self.records.recorded, new)
        await asyncio.shield(self._accounting.in_background(self._record(new)))

    def undelivered(self) -> None:
        """The client gets none of what the engine produced: a whole answer that ends in an
        error because its engine stopped mid-request. `end()` counts no usage, gives the
        lease back with nothing used and tells the metrics of no generation."""
        assert self.records.recorded == UsageCounts(), "a stream's events were sent already"
        self.records.delivered = False

    async def end(self) -> None:
        """Release everything, once (later calls do nothing). The queue places are given
        back and the metrics told at once, so even while this task is being cancelled; the
        rest runs to its end."""
        if self.records.ended:
            return
        self.records.ended = True
        for gen, started in zip(self.generations, self._started, strict=True):
            self._release(gen, started.num_seqs)
        try:
            for gen in self.generations:
                await gen.aclose()
        finally:
            counts = usage_counts(self.generations) if self.records.delivered else UsageCounts()
            unrecorded = _minus(counts, self.records.recorded)
            self.records.recorded = _plus(self.records.recorded, unrecorded)
            self.records.quota_tokens = counts.prompt_tokens + counts.completion_tokens
            work = self._give_back(self.records.quota_tokens, unrecorded)
            await asyncio.shield(self._accounting.in_background(work))

    def _release(self, gen: Generation, num_seqs: int) -> None:
        accounting = self._accounting
        accounting.admission.release(num_seqs)
        self.records.released_seqs += num_seqs
        if gen.latest is not None and self.records.delivered:
            accounting.observer.observe_generation(gen, self.lora, self.caller.tenant)
            self.records.observed.append((gen.request_id, gen.num_output_tokens))

    async def _give_back(self, tokens: int, unrecorded: UsageCounts) -> None:
        """The lease given back with every token used; the usage not yet recorded as a
        stream went recorded."""
        await self._accounting.quotas.finish(self.caller, self.records.lease, tokens)
        if unrecorded != UsageCounts():
            await self._record(unrecorded)

    async def _record(self, counts: UsageCounts) -> None:
        adapter = None if self.lora is None else usage_adapter_name(self.caller, self.lora)
        await self._accounting.usage_meter.record(self.caller.usage_name, adapter, counts)


def usage_adapter_name(caller: Principal, lora: LoRARequest) -> str:
    """The adapter as the caller names it in its usage: the operator by key; a tenant by the
    bare name, so a public adapter's owner never shows in a tenant's usage."""
    return lora.lora_name if caller.is_operator else split_adapter_key(lora.lora_name)[1]


def usage_counts(gens: list[Generation]) -> UsageCounts:
    reached = [g.latest for g in gens if g.latest is not None]
    return UsageCounts(
        prompt_tokens=sum(len(out.prompt_token_ids) for out in reached),
        completion_tokens=sum(len(c.token_ids) for out in reached for c in out.outputs),
        requests=1 if reached else 0,
    )


def _minus(a: UsageCounts, b: UsageCounts) -> UsageCounts:
    """What `a` counts beyond `b`, never below zero (a count that shrank, as beams may,
    was counted already)."""
    return UsageCounts(
        max(0, a.prompt_tokens - b.prompt_tokens),
        max(0, a.completion_tokens - b.completion_tokens),
        max(0, a.requests - b.requests),
    )


def _plus(a: UsageCounts, b: UsageCounts) -> UsageCounts:
    return UsageCounts(
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        a.requests + b.requests,
    )
