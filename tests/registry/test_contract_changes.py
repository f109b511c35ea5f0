"""The registry store contract, change events, and Redis restarted empty or holding
older data."""

from __future__ import annotations

import msgspec
import pytest
import redis
from registry_testlib import (
    next_event,
    spec,
)
from services_testlib import REDIS_URL, flush_namespace

from loragate.registry import (
    AdapterMetadata,
    AdapterNameTaken,
    ChangeEvent,
    ChangeKind,
)
from loragate.registry.redis_store import RedisRegistryStore

# change notification


async def test_changes_reach_a_watcher_of_another_store(store, peer):
    versions = [await peer.version()]
    async with peer.watch() as events:

        async def expect(*changes: tuple[ChangeKind, str]):
            for kind, name in changes:
                assert await next_event(events) == ChangeEvent(kind, name)
            versions.append(await peer.version())

        await store.create_tenant("acme")
        await expect((ChangeKind.TENANT_CREATED, "acme"))
        await store.register_adapter(spec("a1", "acme"))
        await expect((ChangeKind.ADAPTER_REGISTERED, "acme/a1"))
        with pytest.raises(AdapterNameTaken):
            await store.register_adapter(spec("a1", "acme"), replace=False)
        await store.update_adapter("acme/a1", public=True)
        await expect((ChangeKind.ADAPTER_UPDATED, "acme/a1"))
        await store.rotate_tenant_key("acme")
        await expect((ChangeKind.TENANT_UPDATED, "acme"))
        await store.delete_adapter("acme/a1")
        await expect((ChangeKind.ADAPTER_DELETED, "acme/a1"))
        await store.register_adapter(spec("a2", "acme"))
        await expect((ChangeKind.ADAPTER_REGISTERED, "acme/a2"))
        await store.delete_tenant("acme")
        await expect((ChangeKind.ADAPTER_DELETED, "acme/a2"), (ChangeKind.TENANT_DELETED, "acme"))
    assert versions == sorted(set(versions)), "every change bumps the version"


async def test_every_watcher_gets_every_event(store, peer):
    async with store.watch() as mine, peer.watch() as theirs:
        await peer.register_adapter(spec("sql"))
        expected = ChangeEvent(ChangeKind.ADAPTER_REGISTERED, "sql")
        assert await next_event(mine) == expected
        assert await next_event(theirs) == expected


# Redis restarted empty


async def test_redis_emptied_is_detected_by_every_replica(redis_namespace, clock):
    store, peer = (RedisRegistryStore(REDIS_URL, redis_namespace, clock=clock) for _ in range(2))
    assert await store.open() is True
    assert await peer.open() is False
    before = (await store.register_adapter(spec("sql"))).adapter

    flush_namespace(redis_namespace)
    clock.advance(1)

    assert await peer.check_reset() is True
    assert await peer.check_reset() is False, "reported once"
    assert await store.check_reset() is True, "the other replica notices it too"
    assert await store.check_reset() is False
    assert await store.list_adapters() == []
    after = (await peer.register_adapter(spec("sql"))).adapter
    assert after.lora_int_id > before.lora_int_id, "no engine may see an old id reused"
    await store.close()
    await peer.close()


async def test_adapters_stored_with_global_names_move_to_their_tenants_namespace(
    redis_namespace, clock
):
    """Data written before namespaces (tenant adapters under bare names) stays readable."""
    store = RedisRegistryStore(REDIS_URL, redis_namespace, clock=clock)
    await store.open()
    await store.create_tenant("acme")
    await store.close()
    client = redis.Redis.from_url(REDIS_URL)
    old = [spec("sql", "acme"), spec("house")]
    for i, s in enumerate(old, start=1):
        record = AdapterMetadata(**msgspec.structs.asdict(s), lora_int_id=i, created_at=1.0)
        client.hset(f"{redis_namespace}:adapters", s.name, msgspec.json.encode(record))
    client.sadd(f"{redis_namespace}:owned:acme", "sql")
    client.set(f"{redis_namespace}:lora-int-id", 2)
    client.close()

    upgraded = RedisRegistryStore(REDIS_URL, redis_namespace, clock=clock)
    await upgraded.open()
    assert [a.key for a in await upgraded.list_adapters()] == ["acme/sql", "house"]
    assert (await upgraded.get_adapter("acme/sql")).lora_int_id == 1
    assert await upgraded.get_adapter("sql") is None
    await upgraded.open()  # again: nothing left to move
    assert len(await upgraded.list_adapters()) == 2
    await upgraded.delete_tenant("acme")
    assert [a.key for a in await upgraded.list_adapters()] == ["house"]
    await upgraded.close()
