"""One HTTP request's engine work, with the tenant's quota lease and its usage.

A route opens one with `await service.begin(caller, lora, cost)` (which may refuse it with
429, or 400 for a worst case no quota could ever admit), starts its generations through it,
and calls `end()` exactly where the request ends: in its `finally`, or in a stream's
cleanup. `end()` closes every generation, gives the lease back (with its reservation,
keeping only the tokens used) and records the usage: the prompt and completion tokens the
engine reported (the same numbers as the response's `usage`), and one request if any
generation reached the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.gateway.serving.generation import Generation, close_all
from loragate.gateway.tenancy.principal import Principal
from loragate.registry import UsageCounts


class MeteredRequest:
    def __init__(
        self,
        start: Callable[..., Generation],
        account: Callable[[UsageCounts], asyncio.Task],
        caller: Principal,
        lora: LoRARequest | None,
    ):
        self.caller = caller
        self.lora = lora
        self.generations: list[Generation] = []
        self._start = start
        self._account = account
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

    async def end(self) -> None:
        """Idempotent. The accounting runs to the end even if this task is cancelled."""
        if self._ended:
            return
        self._ended = True
        try:
            await close_all(self.generations)
        finally:
            await asyncio.shield(self._account(usage_counts(self.generations)))


def usage_counts(gens: list[Generation]) -> UsageCounts:
    reached = [g.latest for g in gens if g.latest is not None]
    return UsageCounts(
        prompt_tokens=sum(len(out.prompt_token_ids) for out in reached),
        completion_tokens=sum(len(c.token_ids) for out in reached for c in out.outputs),
        requests=1 if reached else 0,
    )
