"""The Redis store's tenants and API keys (a part of RedisRegistryStore)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from loragate.registry.api_keys import StoredKey, issue_api_key, parse_api_key, secret_matches
from loragate.registry.errors import TenantExists, TenantNotFound
from loragate.registry.names import adapter_key, check_tenant_name
from loragate.registry.records import (
    ChangeKind,
    IssuedKey,
    TenantQuota,
    TenantRecord,
    check_quota,
    check_weight,
)
from loragate.registry.redis_index import queue_remove
from loragate.registry.redis_wire import decode_adapter, decode_tenant, translated


class RedisTenants:
    """Mixed into RedisRegistryStore: needs its `_redis`, `_keys`, `_clock`, `_transact` and
    `_announce`."""

    # tenants

    @translated
    async def create_tenant(
        self, name: str, quota: TenantQuota | None = None, weight: float = 1.0
    ) -> IssuedKey:
        check_tenant_name(name)
        quota = check_quota(quota if quota is not None else TenantQuota())
        weight = check_weight(weight)
        api_key, stored = issue_api_key(name)
        tenant = TenantRecord(
            name=name,
            quota=quota,
            created_at=self._clock(),
            key_ids=(stored.key_id,),
            weight=weight,
        )

        async def body(pipe) -> IssuedKey:
            if await pipe.hexists(self._keys.tenants, name):
                raise TenantExists(name)
            pipe.multi()
            pipe.hset(self._keys.tenants, name, msgspec.json.encode(tenant))
            pipe.hset(self._keys.api_keys, stored.key_id, msgspec.json.encode(stored))
            self._announce(pipe, ChangeKind.TENANT_CREATED, name)
            return IssuedKey(tenant, api_key)

        return await self._transact([self._keys.tenants], body)

    @translated
    async def get_tenant(self, name: str) -> TenantRecord | None:
        return decode_tenant(await self._redis.hget(self._keys.tenants, check_tenant_name(name)))

    @translated
    async def list_tenants(self) -> list[TenantRecord]:
        raw = await self._redis.hgetall(self._keys.tenants)
        return sorted((decode_tenant(v) for v in raw.values()), key=lambda t: t.name)

    async def _replace_tenant(self, name: str, change: Callable[[TenantRecord], tuple]):
        """Apply change(old) -> (new record, key_ids to drop, StoredKey to add | None)."""
        check_tenant_name(name)

        async def body(pipe) -> TenantRecord:
            old = decode_tenant(await pipe.hget(self._keys.tenants, name))
            if old is None:
                raise TenantNotFound(name)
            new, dropped, added = change(old)
            pipe.multi()
            pipe.hset(self._keys.tenants, name, msgspec.json.encode(new))
            if dropped:
                pipe.hdel(self._keys.api_keys, *dropped)
            if added is not None:
                pipe.hset(self._keys.api_keys, added.key_id, msgspec.json.encode(added))
            self._announce(pipe, ChangeKind.TENANT_UPDATED, name)
            return new

        return await self._transact([self._keys.tenants], body)

    @translated
    async def set_tenant_quota(self, name: str, quota: TenantQuota) -> TenantRecord:
        check_quota(quota)
        return await self._replace_tenant(
            name, lambda old: (msgspec.structs.replace(old, quota=quota), (), None)
        )

    @translated
    async def set_tenant_weight(self, name: str, weight: float) -> TenantRecord:
        weight = check_weight(weight)
        return await self._replace_tenant(
            name, lambda old: (msgspec.structs.replace(old, weight=weight), (), None)
        )

    @translated
    async def rotate_tenant_key(self, name: str) -> IssuedKey:
        api_key, stored = issue_api_key(name)
        new = await self._replace_tenant(
            name,
            lambda old: (
                msgspec.structs.replace(old, key_ids=(stored.key_id,)),
                old.key_ids,
                stored,
            ),
        )
        return IssuedKey(new, api_key)

    @translated
    async def delete_tenant(self, name: str) -> TenantRecord | None:
        keys = self._keys
        check_tenant_name(name)

        async def body(pipe) -> TenantRecord | None:
            tenant = decode_tenant(await pipe.hget(keys.tenants, name))
            if tenant is None:
                return None
            owned = [adapter_key(name, a) for a in await pipe.zrange(keys.owned(name), 0, -1)]
            records = await pipe.hmget(keys.adapters, owned) if owned else []
            pipe.multi()
            pipe.hdel(keys.tenants, name)
            if tenant.key_ids:
                pipe.hdel(keys.api_keys, *tenant.key_ids)
            for adapter, raw in zip(owned, records, strict=True):
                record = decode_adapter(raw)
                if record is not None and record.tenant == name:
                    queue_remove(pipe, keys, record)
                    self._announce(pipe, ChangeKind.ADAPTER_DELETED, adapter)
            pipe.delete(keys.owned(name), keys.adapter_totals(name))
            self._announce(pipe, ChangeKind.TENANT_DELETED, name)
            return tenant

        watched = [keys.tenants, keys.adapters, keys.owned(name), keys.public_names]
        return await self._transact(watched, body)

    @translated
    async def verify_api_key(self, api_key: str) -> str | None:
        parsed = parse_api_key(api_key)
        if parsed is None:
            return None
        key_id, secret = parsed
        raw = await self._redis.hget(self._keys.api_keys, key_id)
        stored = None if raw is None else msgspec.json.decode(raw, type=StoredKey)
        return stored.tenant if secret_matches(stored, secret) else None
