"""One HTTP request's engine work, with the tenant's quota lease and its usage.

A route opens one with `await generations.begin(caller, lora, cost)` (which may refuse it with
429, or 400 for a worst case no quota could ever admit), starts its generations through it,
and calls `end()` exactly where the request ends: in its `finally`, or in a stream's
cleanup. `end()` closes every generation, gives the lease back (with its reservation,
keeping only the tokens used) and records the usage: the prompt and completion tokens the
engine reported (the same numbers as the response's `usage`), and one request if any
generation reached the engine.

A stream is counted as it goes (`counted`): before each event leaves for the client, what
the engine produced so far and was not yet counted is written to the store (the write is
awaited). So a gateway killed mid-stream (SIGKILL, a lost machine) has counted every token
its client received, and `end()` then counts only what is left: nothing is counted twice.
What it may count and the client never got is the last event, if the process dies between
the write and the send. While the store is unreachable the counts wait in this process
(usage_meter), and die with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.gateway.serving.generation import Generation, close_all
from loragate.gateway.tenancy.principal import Principal
from loragate.registry import UsageCounts


class MeteredRequest:
    def __init__(
        self,
        start: Callable[..., Generation],
        account: Callable[[UsageCounts, UsageCounts], asyncio.Task],
        caller: Principal,
        lora: LoRARequest | None,
        record: Callable[[UsageCounts], asyncio.Task],
    ):
        self.caller = caller
        self.lora = lora
        self.generations: list[Generation] = []
        self._start = start
        self._account = account
        self._record = record
        self._counted = UsageCounts()  # what the store was given already, as the stream went
        self._ended = False

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
        """Admit one engine request for this HTTP request (429 if the queue is full)."""
        gen = self._start(
            prompt,
            params,
            self.lora,
            request_id=request_id,
            field_names=field_names,
            adapter_param=adapter_param,
            cache_salt=self.caller.cache_salt,
            tenant=self.caller.tenant,
            tenant_weight=self.caller.weight,
            priority=priority,
        )
        self.generations.append(gen)
        return gen

    async def counted(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`events`, each sent only once the usage it carries is counted in the store."""
        async for event in events:
            await self.count_so_far()
            yield event

    async def count_so_far(self) -> None:
        """Write what the engine produced and the store was not given yet. The write runs to
        its end even if this task is cancelled (a client gone), so `end()` never counts it
        again."""
        counts = usage_counts(self.generations)
        new = _minus(counts, self._counted)
        if new == UsageCounts():
            return
        self._counted = _plus(self._counted, new)
        await asyncio.shield(self._record(new))

    async def end(self) -> None:
        """Idempotent. The accounting runs to the end even if this task is cancelled."""
        if self._ended:
            return
        self._ended = True
        try:
            await close_all(self.generations)
        finally:
            counts = usage_counts(self.generations)
            await asyncio.shield(self._account(counts, _minus(counts, self._counted)))


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
