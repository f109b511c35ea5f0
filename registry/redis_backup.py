"""The Redis store's whole-registry read and write, for backups (a part of RedisRegistryStore),
and the check of Redis's own persistence settings. Both go a bounded batch of records a
round trip, so neither depends on the registry's size fitting in one socket timeout: the
read under a version fence (read again if an adapter or tenant changed meanwhile), the
write staged and switched in at once (redis_restore)."""

from __future__ import annotations

import msgspec
from redis.exceptions import ResponseError

from loragate.registry.api_keys import StoredKey
from loragate.registry.errors import RegistryChanged
from loragate.registry.persistence import Persistence, from_redis_config, unchecked
from loragate.registry.redis_restore import StagedRestore
from loragate.registry.redis_wire import decode_adapter, decode_tenant, translated, usage_report
from loragate.registry.snapshot import RegistrySnapshot

SNAPSHOT_READS = 3  # reads of the whole registry a snapshot tries while it keeps changing
USAGE_TENANTS_A_READ = 100


class RedisBackup:
    """Mixed into RedisRegistryStore: needs its `_redis`, `_keys`, `where`,
    `_change_log_size` and `_batch_records`."""

    @translated
    async def persistence(self) -> Persistence:
        try:
            config = await self._redis.config_get("appendonly", "appendfsync", "save")
        except ResponseError as exc:  # CONFIG renamed away, or not allowed to this user
            return unchecked(self.where, f"CONFIG GET refused: {exc}")
        return from_redis_config(self.where, config)

    @translated
    async def snapshot(self) -> RegistrySnapshot:
        # Read in bounded round trips, under a version fence: the records read are a
        # consistent whole only if no adapter or tenant changed meanwhile (each such change
        # bumps the version); if one did, read again.
        for _ in range(SNAPSHOT_READS):
            snapshot = await self._read_under_fence()
            if snapshot is not None:
                return snapshot
        raise RegistryChanged(
            f"the registry changed during each of {SNAPSHOT_READS} reads of it; try again"
        )

    async def _read_under_fence(self) -> RegistrySnapshot | None:
        keys, page = self._keys, self._batch_records
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(keys.lora_int_id).get(keys.epoch).get(keys.version)
            last_id, epoch, version = await pipe.execute()
        raw_tenants = await self._scan_hash(keys.tenants, page)
        raw_keys = await self._scan_hash(keys.api_keys, page)
        raw_adapters = await self._scan_hash(keys.adapters, page)
        if await self._redis.get(keys.version) != version:
            return None
        # Counters only grow (no version fences them): read after, a tenant batch at a time.
        tenants = sorted({t async for t in self._redis.sscan_iter(keys.usage_tenants)})
        usage = []
        for start in range(0, len(tenants), USAGE_TENANTS_A_READ):
            group = tenants[start : start + USAGE_TENANTS_A_READ]
            async with self._redis.pipeline(transaction=False) as pipe:
                for tenant in group:
                    pipe.hgetall(keys.usage(tenant))
                raws = await pipe.execute()
            usage += [usage_report(t, raw) for t, raw in zip(group, raws, strict=True) if raw]
        return RegistrySnapshot(
            tenants=tuple(sorted((decode_tenant(v) for v in raw_tenants.values()), key=_name)),
            keys=tuple(msgspec.json.decode(raw_keys[k], type=StoredKey) for k in sorted(raw_keys)),
            adapters=tuple(
                sorted((decode_adapter(v) for v in raw_adapters.values()), key=lambda a: a.key)
            ),
            usage=tuple(usage),
            last_lora_int_id=int(last_id or 0),
            epoch=epoch,
            version=int(version or 0),
        )

    async def _scan_hash(self, key: str, page: int) -> dict[str, str]:
        """A hash's fields, about `page` a round trip (HSCAN: a field may come twice)."""
        return {field: value async for field, value in self._redis.hscan_iter(key, count=page)}

    @translated
    async def restore(self, snapshot: RegistrySnapshot, *, expect_version: int | None) -> None:
        await self.stage_restore(snapshot).run(expect_version)

    def stage_restore(self, snapshot: RegistrySnapshot) -> StagedRestore:
        """The restore of `snapshot` as its steps: written in bounded batches under a
        version fence, then switched in at once (see redis_restore)."""
        return StagedRestore(
            self._redis,
            self._keys,
            snapshot,
            change_log_size=self._change_log_size,
            batch=self._batch_records,
        )


def _name(tenant) -> str:
    return tenant.name
