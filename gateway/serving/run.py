"""Running one HTTP request's generations, the same way for completions, chat and TGI.

`run_generations` opens the request's account (serving/accounting.py: the caller's quotas
admit it), starts one engine request per prompt through it, and primes them all (bad input
is a 4xx before any byte is sent); then the route either `collect`s the final outputs or
`stream`s its own events. Either way the account ends exactly once: after collecting, when
the stream closes, or at once if anything before that failed.

A whole answer is sent only once every generation has finished, so one whose engine stopped
mid-request (a replica, or the node under it, lost) is sent again, up to `RESENDS` times,
before anything reaches the client; a stream that had begun ends with an error event
instead (the route's events).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from litestar import Request
from litestar.response import Stream

from loragate.adapters import LoRARequest
from loragate.engine import RequestOutput, SamplingParams
from loragate.gateway.errors import EngineUnavailableError
from loragate.gateway.serving.accounting import Accounting, RequestAccount
from loragate.gateway.serving.disconnect import until_disconnect
from loragate.gateway.serving.generation import Generation, prime_all, results_all
from loragate.gateway.serving.sse import sse_response
from loragate.gateway.tenancy.principal import Principal
from loragate.gateway.tenancy.request_cost import RequestCost

# Times a whole answer's engine request is sent again after its engine stopped mid-request
# (each send itself waits for a live replica: gateway/replicas/replicated_engine.py), after a
# pause doubling from RESEND_BACKOFF_S: a lost node's replica can take a request in the moment
# before it dies, until Ray's router has dropped it.
RESENDS = 2
RESEND_BACKOFF_S = 0.5


class Run:
    """One HTTP request's primed generations, until it is collected or streamed."""

    def __init__(self, account: RequestAccount, request: Request):
        self.account = account
        self._request = request

    @property
    def generations(self) -> list[Generation]:
        return self.account.generations

    async def collect(self) -> list[RequestOutput]:
        """Every generation's final output; the request ends here."""
        try:
            return await until_disconnect(self._request.receive, self._finished())
        finally:
            await self.account.end()

    async def _finished(self) -> list[RequestOutput]:
        for attempt in range(RESENDS + 1):
            try:
                return await results_all(self.generations)
            except EngineUnavailableError:
                lost = [g for g in self.generations if g.engine_lost]
                if not lost:
                    raise
                if attempt == RESENDS or not self.account.engine_running:
                    self.account.undelivered()  # the 503 is all its client gets
                    raise
                await asyncio.sleep(RESEND_BACKOFF_S * 2**attempt)
                for gen in lost:
                    await self.account.resend(gen)
        raise AssertionError("unreachable")

    def stream(self, events: AsyncIterator[bytes]) -> Stream:
        """The route's events as server-sent events, each sent once what it carries is
        counted; the request ends when they do."""
        return sse_response(self.account.counted(events), self.account.end)


async def run_generations(
    accounting: Accounting,
    request: Request,
    caller: Principal,
    lora: LoRARequest | None,
    cost: RequestCost,
    prompts: list[tuple[object, str]],
    params: SamplingParams,
    *,
    field_names: dict[str, str],
    adapter_param: str = "model",
    priority: int = 0,
) -> Run:
    """Begin, start each (prompt, request id), and prime; a 4xx here ends the request.
    `priority` is vLLM's request field (lower first under the `priority` policy)."""
    account = await accounting.open(caller, lora, cost)
    try:
        for prompt, request_id in prompts:
            account.start(
                prompt,
                params,
                request_id=request_id,
                field_names=field_names,
                adapter_param=adapter_param,
                priority=priority,
            )
        await until_disconnect(request.receive, prime_all(account.generations))
    except BaseException:
        await account.end()
        raise
    return Run(account, request)
