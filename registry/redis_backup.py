"""The Redis store's whole-registry read and write, for backups (a part of RedisRegistryStore),
and the check of Redis's own persistence settings."""

from __future__ import annotations

import msgspec
from redis.exceptions import ResponseError

from loragate.registry.api_keys import StoredKey
from loragate.registry.errors import RegistryChanged
from loragate.registry.persistence import Persistence, from_redis_config, unchecked
from loragate.registry.records import ChangeKind
from loragate.registry.redis_index import queue_put
from loragate.registry.redis_wire import decode_adapter, decode_tenant, translated, usage_report
from loragate.registry.snapshot import RegistrySnapshot

# KEYS: lora-int-id. ARGV: the lowest value it may have. Never lowers it.
_RAISE_ID_LUA = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


class RedisBackup:
    """Mixed into RedisRegistryStore: needs its `_redis`, `_keys`, `where`, `_transact` and
    `_announce`."""

    @translated
    async def persistence(self) -> Persistence:
        try:
            config = await self._redis.config_get("appendonly", "appendfsync", "save")
        except ResponseError as exc:  # CONFIG renamed away, or not allowed to this user
            return unchecked(self.where, f"CONFIG GET refused: {exc}")
        return from_redis_config(self.where, config)

    @translated
    async def snapshot(self) -> RegistrySnapshot:
        keys = self._keys
        tenants = sorted(await self._redis.smembers(keys.usage_tenants))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.tenants).hgetall(keys.api_keys).hgetall(keys.adapters)
            pipe.get(keys.lora_int_id).get(keys.epoch).get(keys.version)
            for tenant in tenants:
                pipe.hgetall(keys.usage(tenant))
            (
                raw_tenants,
                raw_keys,
                raw_adapters,
                last_id,
                epoch,
                version,
                *usage,
            ) = await pipe.execute()
        return RegistrySnapshot(
            tenants=tuple(sorted((decode_tenant(v) for v in raw_tenants.values()), key=_name)),
            keys=tuple(msgspec.json.decode(raw_keys[k], type=StoredKey) for k in sorted(raw_keys)),
            adapters=tuple(
                sorted((decode_adapter(v) for v in raw_adapters.values()), key=lambda a: a.key)
            ),
            usage=tuple(
                usage_report(tenant, raw) for tenant, raw in zip(tenants, usage, strict=True) if raw
            ),
            last_lora_int_id=int(last_id or 0),
            epoch=epoch,
            version=int(version or 0),
        )

    @translated
    async def restore(self, snapshot: RegistrySnapshot, *, expect_version: int | None) -> None:
        keys = self._keys

        async def body(pipe) -> None:
            version = int(await pipe.get(keys.version) or 0)
            if expect_version is not None and version != expect_version:
                raise RegistryChanged(
                    f"the registry changed while the import was planned (version "
                    f"{expect_version} -> {version}); run it again"
                )
            existing = set(await pipe.hkeys(keys.tenants))
            adapter_keys = [a.key for a in snapshot.adapters]
            replaced = await pipe.hmget(keys.adapters, adapter_keys) if adapter_keys else []
            pipe.multi()
            for tenant in snapshot.tenants:
                pipe.hset(keys.tenants, tenant.name, msgspec.json.encode(tenant))
                kind = ChangeKind.TENANT_UPDATED if tenant.name in existing else None
                self._announce(pipe, kind or ChangeKind.TENANT_CREATED, tenant.name)
            for stored in snapshot.keys:
                pipe.hset(keys.api_keys, stored.key_id, msgspec.json.encode(stored))
            for adapter, old in zip(snapshot.adapters, replaced, strict=True):
                queue_put(pipe, keys, decode_adapter(old), adapter)
                self._announce(pipe, ChangeKind.ADAPTER_REGISTERED, adapter.key)
            for report in snapshot.usage:
                counters = [("", report.total)]
                counters += [(f"@{name}", c) for name, c in report.by_adapter.items()]
                for suffix, counts in counters:
                    for counter, amount in msgspec.structs.asdict(counts).items():
                        if amount:
                            pipe.hincrby(keys.usage(report.tenant), counter + suffix, amount)
                pipe.sadd(keys.usage_tenants, report.tenant)
            pipe.eval(_RAISE_ID_LUA, 1, keys.lora_int_id, snapshot.highest_lora_int_id)

        await self._transact([keys.version, keys.tenants, keys.adapters], body)


def _name(tenant) -> str:
    return tenant.name
