"""Quota windows of the in-memory store: sliding one-minute counters per second, and the
leases of requests in flight (a part of MemoryRegistryStore)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

from loragate.registry.names import check_tenant_name
from loragate.registry.records import Admission, TenantQuota, check_count, check_quota

WINDOW_SECONDS = 60
_RPM = "requests_per_minute"
_TPM = "tokens_per_minute"


@dataclass
class _SecondBuckets:
    """Counts per whole second; the window is the last 60 seconds (this one included)."""

    counts: dict[int, int] = field(default_factory=dict)

    def total(self, now: float) -> int:
        oldest = math.floor(now) - WINDOW_SECONDS + 1
        for second in [s for s in self.counts if s < oldest]:
            del self.counts[second]
        return sum(self.counts.values())

    def add(self, now: float, amount: int) -> None:
        self.total(now)  # drops seconds that left the window
        second = math.floor(now)
        self.counts[second] = self.counts.get(second, 0) + amount

    def seconds_until_below(self, now: float, limit: int) -> int:
        """Whole seconds until the window total drops under `limit` (at least 1)."""
        excess = self.total(now) - limit + 1
        for second in sorted(self.counts):
            excess -= self.counts[second]
            if excess <= 0:
                return max(1, math.ceil(second + WINDOW_SECONDS - now))
        return WINDOW_SECONDS


@dataclass
class TenantLoad:
    leases: dict[str, float] = field(default_factory=dict)  # lease -> expiry
    reserved: dict[str, int] = field(default_factory=dict)  # lease -> tokens it reserved
    requests: _SecondBuckets = field(default_factory=_SecondBuckets)
    tokens: _SecondBuckets = field(default_factory=_SecondBuckets)

    def live_leases(self, now: float) -> dict[str, float]:
        for lease in [lease for lease, expiry in self.leases.items() if expiry <= now]:
            del self.leases[lease]
            self.reserved.pop(lease, None)
        return self.leases

    def end(self, lease: str) -> bool:
        self.reserved.pop(lease, None)
        return self.leases.pop(lease, None) is not None


class MemoryQuotas:
    """Mixed into MemoryRegistryStore: needs its `_load`, `_clock` and `_lease_ttl`."""

    def _tenant_load(self, tenant: str) -> TenantLoad:
        return self._load.setdefault(check_tenant_name(tenant), TenantLoad())

    async def try_acquire_request(
        self, tenant: str, quota: TenantQuota, *, tokens: int = 0, requests: int = 1
    ) -> Admission:
        check_quota(quota)
        check_count("tokens", tokens)
        check_count("requests", requests, minimum=1)
        load, now = self._tenant_load(tenant), self._clock()
        leases = load.live_leases(now)
        limit = quota.max_concurrent_requests
        if limit is not None and len(leases) >= limit:
            return Admission(False, 1, "max_concurrent_requests")
        limit = quota.requests_per_minute
        if limit is not None and load.requests.total(now) + requests > limit:
            wait = load.requests.seconds_until_below(now, limit - requests + 1)
            return Admission(False, wait, _RPM)
        limit = quota.tokens_per_minute
        room = None if limit is None else limit - sum(load.reserved.values()) - max(tokens, 1)
        if room is not None and load.tokens.total(now) > room:
            # Reservations end only when their requests do: past the window, try each second.
            wait = 1 if room < 0 else load.tokens.seconds_until_below(now, room + 1)
            return Admission(False, wait, _TPM)
        lease = uuid.uuid4().hex
        leases[lease] = now + self._lease_ttl
        load.reserved[lease] = tokens
        load.requests.add(now, requests)
        return Admission(True, lease=lease)

    async def release_request(self, tenant: str, lease: str, *, used_tokens: int = 0) -> bool:
        check_count("used_tokens", used_tokens)
        load, now = self._tenant_load(tenant), self._clock()
        load.live_leases(now)
        if used_tokens:
            load.tokens.add(now, used_tokens)
        return load.end(lease)

    async def refresh_request(self, tenant: str, lease: str) -> bool:
        now = self._clock()
        leases = self._tenant_load(tenant).live_leases(now)
        if lease not in leases:
            return False
        leases[lease] = now + self._lease_ttl
        return True

    async def in_flight(self, tenant: str) -> int:
        return len(self._tenant_load(tenant).live_leases(self._clock()))

    async def add_tokens(self, tenant: str, tokens: int) -> None:
        check_count("tokens", tokens)
        self._tenant_load(tenant).tokens.add(self._clock(), tokens)
