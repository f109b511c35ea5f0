"""The Redis store's usage counters and quota windows (a part of RedisRegistryStore)."""

from __future__ import annotations

import uuid

import msgspec

from loragate.registry.names import check_tenant_name
from loragate.registry.records import (
    Admission,
    TenantQuota,
    UsageCounts,
    UsageReport,
    check_count,
    check_quota,
    check_usage,
)
from loragate.registry.redis_wire import limit, translated, usage_report


class RedisUsageAndQuotas:
    """Mixed into RedisRegistryStore: needs its `_redis`, `_keys`, `_clock`, `_lease_ttl` and
    the scripts it registers."""

    # usage

    @translated
    async def record_usage(
        self,
        tenant: str,
        adapter: str | None,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        requests: int = 1,
    ) -> None:
        counts = check_usage(tenant, adapter, prompt_tokens, completion_tokens, requests)
        async with self._redis.pipeline(transaction=True) as pipe:
            self._queue_usage(pipe, tenant, adapter, counts)
            await pipe.execute()

    @translated
    async def record_usages(self, records: list[tuple[str, str | None, UsageCounts]]) -> None:
        checked = [
            (t, a, check_usage(t, a, c.prompt_tokens, c.completion_tokens, c.requests))
            for t, a, c in records
        ]
        if not checked:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for tenant, adapter, counts in checked:
                self._queue_usage(pipe, tenant, adapter, counts)
            await pipe.execute()

    def _queue_usage(self, pipe, tenant: str, adapter: str | None, counts: UsageCounts) -> None:
        key = self._keys.usage(tenant)
        for counter, amount in msgspec.structs.asdict(counts).items():
            pipe.hincrby(key, counter, amount)
            if adapter is not None:
                pipe.hincrby(key, f"{counter}@{adapter}", amount)
        pipe.sadd(self._keys.usage_tenants, tenant)

    @translated
    async def get_usage(self, tenant: str) -> UsageReport:
        raw = await self._redis.hgetall(self._keys.usage(check_tenant_name(tenant)))
        return usage_report(tenant, raw)

    @translated
    async def list_usage(self) -> list[UsageReport]:
        tenants = sorted(await self._redis.smembers(self._keys.usage_tenants))
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.hgetall(self._keys.usage(tenant))
            raws = await pipe.execute()
        return [usage_report(t, raw) for t, raw in zip(tenants, raws, strict=True)]

    # quotas

    def _lease_key_ttl_ms(self) -> int:
        return int((self._lease_ttl + 60) * 1000)

    @translated
    async def try_acquire_request(
        self, tenant: str, quota: TenantQuota, *, tokens: int = 0, requests: int = 1
    ) -> Admission:
        check_tenant_name(tenant)
        check_quota(quota)
        check_count("tokens", tokens)
        check_count("requests", requests, minimum=1)
        now, lease = self._clock(), uuid.uuid4().hex
        keys = [
            self._keys.leases(tenant),
            self._keys.rpm(tenant),
            self._keys.tpm(tenant),
            self._keys.reserved(tenant),
        ]
        args = [
            repr(now),
            lease,
            repr(now + self._lease_ttl),
            limit(quota.max_concurrent_requests),
            limit(quota.requests_per_minute),
            limit(quota.tokens_per_minute),
            self._lease_key_ttl_ms(),
            tokens,
            requests,
        ]
        admitted, retry_after, reason = await self._acquire(keys=keys, args=args)
        if admitted:
            return Admission(True, lease=lease)
        return Admission(False, int(retry_after), reason)

    @staticmethod
    def _check_lease(lease: object) -> None:
        if not isinstance(lease, str) or not lease:
            raise ValueError(f"lease must be the non-empty string an Admission gave, got {lease!r}")

    @translated
    async def release_request(self, tenant: str, lease: str, *, used_tokens: int = 0) -> bool:
        check_tenant_name(tenant)
        self._check_lease(lease)
        check_count("used_tokens", used_tokens)
        keys = [self._keys.leases(tenant), self._keys.reserved(tenant), self._keys.tpm(tenant)]
        args = [repr(self._clock()), lease, used_tokens]
        return bool(await self._release(keys=keys, args=args))

    @translated
    async def refresh_request(self, tenant: str, lease: str) -> bool:
        check_tenant_name(tenant)
        self._check_lease(lease)
        now = self._clock()
        keys = [self._keys.leases(tenant), self._keys.reserved(tenant)]
        args = [repr(now), lease, repr(now + self._lease_ttl), self._lease_key_ttl_ms()]
        return bool(await self._refresh(keys=keys, args=args))

    @translated
    async def in_flight(self, tenant: str) -> int:
        key = self._keys.leases(check_tenant_name(tenant))
        async with self._redis.pipeline(transaction=True) as pipe:
            _, count = await pipe.zremrangebyscore(key, "-inf", self._clock()).zcard(key).execute()
        return int(count)

    @translated
    async def add_tokens(self, tenant: str, tokens: int) -> None:
        check_tenant_name(tenant)
        check_count("tokens", tokens)
        await self._add_tokens(keys=[self._keys.tpm(tenant)], args=[repr(self._clock()), tokens])
