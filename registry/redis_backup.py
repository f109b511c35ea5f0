"""The Redis store's whole-registry read and write, for backups (a part of RedisRegistryStore),
and the check of Redis's own persistence settings."""

from __future__ import annotations

import msgspec
from redis.exceptions import ResponseError

from loragate.registry.api_keys import StoredKey
from loragate.registry.persistence import Persistence, from_redis_config, unchecked
from loragate.registry.redis_restore import StagedRestore
from loragate.registry.redis_wire import decode_adapter, decode_tenant, translated, usage_report
from loragate.registry.snapshot import RegistrySnapshot


class RedisBackup:
    """Mixed into RedisRegistryStore: needs its `_redis`, `_keys`, `where`,
    `_change_log_size` and `_restore_batch`."""

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
        await self.stage_restore(snapshot).run(expect_version)

    def stage_restore(self, snapshot: RegistrySnapshot) -> StagedRestore:
        """The restore of `snapshot` as its steps: written in bounded batches under a
        version fence, then switched in at once (see redis_restore)."""
        return StagedRestore(
            self._redis,
            self._keys,
            snapshot,
            change_log_size=self._change_log_size,
            batch=self._restore_batch,
        )


def _name(tenant) -> str:
    return tenant.name
