"""A restore on Redis (registry/redis_restore.py), step by step: its batches are written where
no reader looks, then switched in at once under a version fence with one announcement; a
restore fenced out, or whose staging expired, leaves the old registry and no staging keys.
A snapshot (what an export reads) goes a page a round trip too, so a Redis slowed past
one socket timeout for the whole registry still gives it whole. (At 100,000 records,
through a slowed Redis, with a reader polling: the gateway's test_registry_at_scale.py.)"""

from __future__ import annotations

import msgspec
import pytest
import redis
from registry_testlib import next_event, spec
from services_testlib import REDIS_URL
from slow_proxy_testlib import SlowProxy

from loragate.registry import AdapterMetadata, ChangeKind, TenantQuota, TenantRecord
from loragate.registry.adapter_index import AdapterCounts
from loragate.registry.api_keys import issue_api_key
from loragate.registry.errors import RegistryChanged
from loragate.registry.records import UsageCounts, UsageReport
from loragate.registry.redis_restore import StagingExpired
from loragate.registry.redis_store import RedisRegistryStore
from loragate.registry.snapshot import RegistrySnapshot

OBJECT = "ab" * 32 + "-" + "cd" * 32


@pytest.fixture
async def stores(redis_namespace):
    """A store writing restores three records at a time, and a reader (another replica)."""
    store = RedisRegistryStore(REDIS_URL, redis_namespace, batch_records=3)
    peer = RedisRegistryStore(REDIS_URL, redis_namespace)
    assert await store.open()
    yield store, peer
    await store.close()
    await peer.close()


def staging_keys(namespace: str) -> dict[str, int]:
    """Each staging key left in Redis, with its time to live in ms."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        keys = client.scan_iter(match=f"{namespace}:staging:*")
        return {key: client.pttl(key) for key in keys}
    finally:
        client.close()


async def old_registry(store) -> str:
    """acme with two adapters (one public), usage; returns acme's key."""
    issued = await store.create_tenant("acme")
    await store.register_adapter(spec("old", "acme", size_bytes=10, store_object=OBJECT))
    await store.register_adapter(spec("house", public=True))
    await store.record_usage("acme", "old", prompt_tokens=5, completion_tokens=1)
    return issued.api_key


def backup(first_id: int) -> tuple[RegistrySnapshot, str]:
    """beta (a new tenant, its key), ten more adapters of acme, five of beta (one public,
    some stored by hash), usage of both; and beta's key."""
    beta_key, stored = issue_api_key("beta")
    beta = TenantRecord(
        name="beta", quota=TenantQuota(max_adapters=9), created_at=1.0, key_ids=(stored.key_id,)
    )
    adapters = []
    owners = [("acme", f"n{i}") for i in range(10)] + [("beta", f"b{i}") for i in range(5)]
    for n, (tenant, name) in enumerate(owners):
        made = spec(
            name,
            tenant,
            size_bytes=100 + n,
            public=name == "b4",
            store_object=OBJECT if n % 3 == 0 else None,
        )
        adapters.append(
            AdapterMetadata(
                **msgspec.structs.asdict(made), lora_int_id=first_id + n, created_at=2.0
            )
        )
    usage = (
        UsageReport("acme", UsageCounts(100, 10, 1), {"n0": UsageCounts(100, 10, 1)}),
        UsageReport("beta", UsageCounts(7, 3, 2), {}),
    )
    snapshot = RegistrySnapshot(
        tenants=(beta,), keys=(stored,), adapters=tuple(adapters), usage=usage
    )
    return snapshot, beta_key


def records_of(snapshot: RegistrySnapshot):
    return snapshot.tenants, snapshot.keys, snapshot.adapters


async def test_staged_records_are_invisible_until_one_switch_shows_them_all(
    stores, redis_namespace
):
    store, peer = stores
    acme_key = await old_registry(store)
    before = await peer.snapshot()
    snapshot, beta_key = backup(first_id=await store.new_lora_int_id() + 100)
    staged = store.stage_restore(snapshot)
    await staged.begin(expect_version=before.version)
    await staged.write()

    left = staging_keys(redis_namespace)
    assert len(left) > 5 and all(0 < ttl <= 3600_000 for ttl in left.values()), left
    assert records_of(await peer.snapshot()) == records_of(before)  # the old registry
    assert await peer.adapter_counts("acme") == AdapterCounts(1, 10)
    assert await peer.verify_api_key(beta_key) is None

    async with peer.watch() as events:
        version = await staged.switch()
        event = await next_event(events)
    assert version == before.version + 1
    assert (event.kind, event.name) == (ChangeKind.REGISTRY_RESTORED, "*")
    log = await peer.changes_since(before.version)
    assert [c.kind for c in log.changes] == [ChangeKind.REGISTRY_RESTORED] and log.complete

    after = await peer.snapshot()
    assert {a.key for a in after.adapters} == {a.key for a in before.adapters} | {
        a.key for a in snapshot.adapters
    }
    assert await peer.adapter_counts("acme") == AdapterCounts(11, 10 + sum(range(100, 110)))
    assert await peer.adapter_counts("beta") == AdapterCounts(5, sum(range(110, 115)))
    assert [a.key for a in (await peer.page_visible_adapters("beta", limit=3)).data] == [
        "beta/b0",
        "beta/b1",
        "beta/b2",
    ]
    assert (await peer.public_adapter("b4")).key == "beta/b4"
    assert (await peer.public_adapter("house")).key == "house"
    assert await peer.object_references(OBJECT) == 1 + 5
    assert await peer.verify_api_key(beta_key) == "beta"
    assert await peer.verify_api_key(acme_key) == "acme"
    acme = await peer.get_usage("acme")
    assert acme.total.prompt_tokens == 105 and acme.by_adapter["n0"].prompt_tokens == 100
    assert (await peer.get_usage("beta")).total.requests == 2
    assert await peer.new_lora_int_id() > snapshot.highest_lora_int_id
    assert staging_keys(redis_namespace) == {}
    client = redis.Redis.from_url(REDIS_URL)
    assert client.ttl(f"{redis_namespace}:adapters") == -1  # switched in: kept for good
    assert client.ttl(f"{redis_namespace}:owned:beta") == -1
    client.close()


async def test_a_change_while_it_is_written_fences_the_restore_out(stores, redis_namespace):
    store, peer = stores
    await old_registry(store)
    snapshot, _ = backup(first_id=await store.new_lora_int_id() + 100)
    staged = store.stage_restore(snapshot)
    written = staged.write

    async def write_then_change_elsewhere():
        await written()
        assert staging_keys(redis_namespace)
        await peer.register_adapter(spec("meanwhile", "acme"))

    staged.write = write_then_change_elsewhere
    before = await peer.version()
    with pytest.raises(RegistryChanged, match="nothing was imported"):
        await staged.run(expect_version=None)
    assert staging_keys(redis_namespace) == {}
    assert await peer.version() == before + 1  # the other replica's change, and nothing else
    keys = {a.key for a in await peer.list_adapters()}
    assert keys == {"acme/old", "acme/meanwhile", "house"}
    assert await peer.adapter_counts("acme") == AdapterCounts(2, 10 + 1234)
    assert await peer.get_tenant("beta") is None

    # Planned from an older read: refused before anything is staged.
    with pytest.raises(RegistryChanged):
        await store.restore(snapshot, expect_version=before)
    assert staging_keys(redis_namespace) == {}


async def test_a_staging_area_that_expired_is_never_switched_in(stores, redis_namespace):
    store, peer = stores
    await old_registry(store)
    before = await peer.snapshot()
    snapshot, _ = backup(first_id=await store.new_lora_int_id() + 100)
    staged = store.stage_restore(snapshot)
    await staged.begin(expect_version=None)
    await staged.write()
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(f"{redis_namespace}:staging:{staged.id}:owned:beta")  # as if it expired
    client.close()
    with pytest.raises(StagingExpired):
        await staged.switch()
    assert records_of(await peer.snapshot()) == records_of(before)
    assert await peer.version() == before.version
    await staged.abandon()
    assert staging_keys(redis_namespace) == {}


async def test_a_snapshot_reads_a_page_a_round_trip_so_a_slowed_redis_gives_it_whole(
    redis_namespace,
):
    writer = RedisRegistryStore(REDIS_URL, redis_namespace)
    await writer.open()
    await writer.create_tenant("acme")
    made = [spec(f"n{i:04d}", "acme", size_bytes=i + 1) for i in range(1500)]
    adapters = tuple(
        AdapterMetadata(**msgspec.structs.asdict(m), lora_int_id=i + 1, created_at=1.0)
        for i, m in enumerate(made)
    )
    await writer.restore(RegistrySnapshot(adapters=adapters), expect_version=None)
    expected = await writer.snapshot()
    await writer.close()

    timeout = 1.0
    table = sum(len(msgspec.json.encode(a)) for a in adapters)
    rate = table / (3 * timeout)  # the records alone take three socket timeouts to arrive
    proxy = SlowProxy(int(REDIS_URL.rsplit(":", 1)[1]), rate).start()
    slowed = RedisRegistryStore(
        proxy.url, redis_namespace, socket_timeout_s=timeout, batch_records=50
    )
    try:
        read = await slowed.snapshot()
    finally:
        await slowed.close()
        proxy.stop()
    assert read == expected and len(read.adapters) == 1500
    assert proxy.added_s >= 3 * timeout


async def test_a_snapshot_read_while_the_registry_changed_is_read_again(stores):
    store, peer = stores
    await old_registry(store)
    scan = store._scan_hash
    changes = iter([spec("meanwhile", "acme"), spec("again", "acme")])

    async def scan_while_another_replica_writes(key, page):
        change = next(changes, None) if key.endswith(":tenants") else None  # once a read
        if change is not None:
            await peer.register_adapter(change)
        return await scan(key, page)

    store._scan_hash = scan_while_another_replica_writes
    read = await store.snapshot()  # the first two reads were overtaken; the third holds
    assert read.version == await peer.version()
    assert {a.key for a in read.adapters} == {"acme/old", "acme/meanwhile", "acme/again", "house"}

    changes = iter([spec(f"n{i}", "acme") for i in range(3)])
    with pytest.raises(RegistryChanged, match="during each of 3 reads"):
        await store.snapshot()
