"""Tenant quotas, counted in the registry store so that they hold across replicas.

A tenant's request takes a lease (its place among `max_concurrent_requests`, its
sequences in the requests/minute window, and its worst case in tokens reserved against
tokens/minute: see request_cost) before it reaches the engine, and gives it back when it
ends, whichever way (finished, refused by the engine, aborted, client gone): then only the
tokens it used stay counted. So no burst can be served more tokens than the quota allows.
A request whose worst case alone exceeds a quota could never be admitted: it is a 400
naming the field to lower, not a 429 to retry forever. The store expires a lease that is
never given back (a replica that crashed), so a long stream has its lease refreshed here
while it runs.

Fail open: while the store is unreachable, requests are admitted without a lease, so the
tenants and adapters already known keep being served; the replica's own queue bound still
holds. Their tokens are not counted against tokens/minute; their usage is (see usage_meter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from loragate.gateway.errors import InvalidRequestError, QuotaExceededError, RegistryDownError
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.principal import Principal
from loragate.gateway.tenancy.request_cost import RequestCost

log = logging.getLogger(__name__)

_WHAT = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "tokens per minute",
    "max_concurrent_requests": "concurrent requests",
}


class QuotaKeeper:
    def __init__(
        self,
        store: RegistrySeam,
        lease_seconds: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self._store = store
        self._health = store.health
        self.refresh_every = lease_seconds / 3
        self._sleep = sleep  # between refreshes; tests pass one driven by a fake clock
        self._leases: dict[str, str] = {}  # lease -> tenant, while its request runs
        self._stopped = False

    async def admit(self, caller: Principal, cost: RequestCost) -> str | None:
        """A lease for the caller's request, None when none is needed (or the store is down);
        QuotaExceededError (429 with Retry-After) when a quota refuses it now, and
        InvalidRequestError (400) when it would refuse it always."""
        if caller.tenant is None or caller.quota is None:
            return None
        _refuse_what_never_fits(caller.quota, cost)
        if self._health.down:
            return None
        try:
            admission = await self._store.try_acquire_request(
                caller.tenant, caller.quota, tokens=cost.tokens, requests=cost.sequences
            )
        except RegistryDownError:
            return None
        if not admission.ok:
            what = _WHAT.get(admission.reason, admission.reason)
            raise QuotaExceededError(
                f"quota exceeded: this tenant's limit of {what} is reached; retry after "
                f"{admission.retry_after} s",
                code=admission.reason,
                headers={"Retry-After": str(admission.retry_after)},
            )
        self._leases[admission.lease] = caller.tenant
        return admission.lease

    async def finish(self, caller: Principal, lease: str | None, tokens: int) -> None:
        """Give the lease back: its reservation ends and the tokens it used count against
        tokens/minute."""
        if lease is not None:
            self._leases.pop(lease, None)
        if caller.tenant is None or self._health.down:
            return
        try:
            if lease is not None:
                await self._store.release_request(caller.tenant, lease, used_tokens=tokens)
            elif tokens:
                await self._store.add_tokens(caller.tenant, tokens)
        except RegistryDownError:
            pass  # the lease expires by itself; the tokens go uncounted (fail open)

    async def keep_leases_alive(self) -> None:
        """Runs for the server's life: restart the TTL of every running request's lease."""
        while not self._stopped:
            await self._sleep(self.refresh_every)
            for lease, tenant in list(self._leases.items()):
                if self._health.down:
                    break
                try:
                    await self._store.refresh_request(tenant, lease)
                except RegistryDownError:
                    break

    def stop(self) -> None:
        """Ends keep_leases_alive at its next turn, even if a cancellation got lost."""
        self._stopped = True

    @property
    def running(self) -> int:
        return len(self._leases)


def _refuse_what_never_fits(quota, cost: RequestCost) -> None:
    limit = quota.tokens_per_minute
    if limit is not None and cost.tokens > limit:
        room = limit - cost.prompt_tokens
        hint = (
            f"lower {cost.max_tokens_param} (with this prompt, at most {room} tokens fit "
            "across its sequences)"
            if room > 0
            else "shorten the prompt"
        )
        raise InvalidRequestError(
            f"this request may use up to {cost.tokens} tokens (its prompt, plus "
            f"{cost.max_tokens_param} for each sequence; without it, the rest of the "
            f"context), more than this tenant's quota of {limit} tokens per minute: {hint}",
            param=cost.max_tokens_param,
            code="exceeds_tokens_per_minute",
        )
    limit = quota.requests_per_minute
    if limit is not None and cost.sequences > limit:
        raise InvalidRequestError(
            f"this request counts as {cost.sequences} requests (one per prompt and "
            f"sequence), more than this tenant's quota of {limit} requests per minute",
            param=cost.sequences_param,
            code="exceeds_requests_per_minute",
        )
