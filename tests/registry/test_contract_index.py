"""The registry store contract, adapter indexes: a tenant's counters, public names, pages by
cursor and the change log, on both stores (see conftest.py). Every index is checked against
a recount from the records themselves after random writes, so an index that drifts from
the records fails here whichever write path made it drift."""

from __future__ import annotations

import random

import pytest
import redis
from registry_testlib import spec
from services_testlib import REDIS_URL

from loragate.registry import ChangeEvent, ChangeKind, TenantQuota
from loragate.registry.adapter_index import AdapterCounts, AdapterPage
from loragate.registry.memory import MemoryRegistryStore
from loragate.registry.redis_store import RedisRegistryStore
from loragate.registry.snapshot import RegistrySnapshot

TENANTS = ("acme", "beta")
OBJECT = "ab" * 32 + "-" + "cd" * 32
NAMES = ("a", "b", "c", "sql", "sql2", "z", "Zed", "m-1", "m.2", "m:3")


def expected_counts(records, tenant: str) -> AdapterCounts:
    owned = [r for r in records if r.tenant == tenant]
    return AdapterCounts(len(owned), sum(r.size_bytes for r in owned))


def expected_visible(records, tenant: str) -> list[str]:
    """A tenant's view, by name: its own, then the public ones its names do not hide."""
    own = {r.name: r.key for r in records if r.tenant == tenant}
    shared = {r.name: r.key for r in records if r.public and r.name not in own}
    return [key for _, key in sorted({**shared, **own}.items())]


async def all_pages(read, limit: int, tenant_view: bool) -> list[str]:
    keys, after, pages = [], None, 0
    while True:
        page: AdapterPage = await read(after=after, limit=limit)
        pages += 1
        assert len(page.data) <= limit
        keys += [a.key for a in page.data]
        if not page.has_more:
            return keys
        assert len(page.data) == limit, "a page short of its limit is the last one"
        after = page.last_id(tenant_view)
        assert pages < 1000


async def check_every_index(store) -> None:
    records = await store.list_adapters()
    for tenant in TENANTS:
        assert await store.adapter_counts(tenant) == expected_counts(records, tenant), tenant
    for limit in (1, 2, 3, 7, 100):
        assert await all_pages(store.page_adapters, limit, False) == [r.key for r in records]
        for tenant in TENANTS:

            async def visible(tenant=tenant, **page):
                return await store.page_visible_adapters(tenant, **page)

            got = await all_pages(visible, limit, True)
            assert got == expected_visible(records, tenant), (tenant, limit)
    public = {r.name: r for r in records if r.public}
    for name in NAMES:
        assert await store.public_adapter(name) == public.get(name), name
    refs = sum(1 for r in records if r.store_object == OBJECT)
    assert await store.object_references(OBJECT) == refs


async def test_indexes_equal_a_recount_after_random_writes(store, peer):
    rng = random.Random(46)
    for tenant in TENANTS:
        await store.create_tenant(tenant)
    await check_every_index(store)
    for step in range(160):
        owner = rng.choice((*TENANTS, None))
        name = rng.choice(NAMES)
        key = name if owner is None else f"{owner}/{name}"
        writer = rng.choice((store, peer))
        action = rng.random()
        try:
            if action < 0.5:
                await writer.register_adapter(
                    spec(
                        name,
                        owner,
                        public=rng.random() < 0.3,
                        size_bytes=rng.randrange(1, 5000),
                        store_object=rng.choice((None, OBJECT)),
                    )
                )
            elif action < 0.7:
                await writer.update_adapter(key, public=rng.random() < 0.5)
            elif action < 0.95:
                await writer.delete_adapter(key)
            else:
                tenant = rng.choice(TENANTS)
                await writer.delete_tenant(tenant)
                await writer.create_tenant(tenant)
        except Exception as exc:  # PublicNameTaken: the rule the stores enforce
            assert type(exc).__name__ == "PublicNameTaken", exc
        if step % 20 == 19:
            await check_every_index(peer)
    await check_every_index(store)


async def test_counters_enforce_max_adapters_and_follow_deletes(store):
    await store.create_tenant("acme", TenantQuota(max_adapters=2, max_adapter_bytes=3000))
    await store.register_adapter(spec("a", "acme", size_bytes=1000))
    await store.register_adapter(spec("b", "acme", size_bytes=1000))
    assert await store.adapter_counts("acme") == AdapterCounts(2, 2000)
    await store.register_adapter(spec("b", "acme", size_bytes=2000))  # a replacement
    assert await store.adapter_counts("acme") == AdapterCounts(2, 3000)
    with pytest.raises(Exception, match="max_adapters|maximum"):
        await store.register_adapter(spec("c", "acme", size_bytes=1))
    await store.delete_adapter("acme/a")
    assert await store.adapter_counts("acme") == AdapterCounts(1, 2000)
    with pytest.raises(Exception, match="max_adapter_bytes"):
        await store.register_adapter(spec("c", "acme", size_bytes=1001))
    await store.register_adapter(spec("c", "acme", size_bytes=1000))
    await store.delete_tenant("acme")
    assert await store.adapter_counts("acme") == AdapterCounts()
    assert await store.adapter_counts("nobody") == AdapterCounts()


async def test_a_tenants_page_merges_its_names_with_the_public_ones(store):
    await store.create_tenant("acme")
    await store.register_adapter(spec("b"))
    await store.register_adapter(spec("sql", public=True))
    await store.register_adapter(spec("a", public=True))
    await store.register_adapter(spec("sql", "acme"))  # hides the public sql
    await store.register_adapter(spec("c", "acme"))
    page = await store.page_visible_adapters("acme", limit=2)
    assert [a.key for a in page.data] == ["a", "acme/c"] and page.has_more
    page = await store.page_visible_adapters("acme", after=page.last_id(True), limit=2)
    assert [a.key for a in page.data] == ["acme/sql"] and not page.has_more
    everything = await store.page_adapters(limit=3)
    assert [a.key for a in everything.data] == ["a", "acme/c", "acme/sql"]
    assert everything.has_more
    rest = await store.page_adapters(after=everything.last_id(False), limit=3)
    assert [a.key for a in rest.data] == ["b", "sql"] and not rest.has_more
    assert (await store.page_adapters(after="zzz")).data == ()
    got = await store.get_adapters(["sql", "nope", "acme/c", "b"])
    assert [a and a.key for a in got] == ["sql", None, "acme/c", "b"]
    assert await store.get_adapters([]) == []
    assert (await store.public_adapter("sql")).key == "sql"
    assert await store.public_adapter("b") is None


@pytest.mark.parametrize("after, limit", [("", 10), (None, 0), (None, 1001), (None, True)])
async def test_bad_pages_are_refused(store, after, limit):
    with pytest.raises(ValueError):
        await store.page_adapters(after=after, limit=limit)


async def test_changes_since_a_version_come_from_the_log_in_order(store, peer):
    start = await store.version()
    await store.create_tenant("acme")
    await peer.register_adapter(spec("a", "acme"))
    await store.update_adapter("acme/a", public=True)
    await peer.delete_adapter("acme/a")
    log = await store.changes_since(start)
    assert log.complete and log.version == log.latest == await store.version()
    assert log.changes == (
        ChangeEvent(ChangeKind.TENANT_CREATED, "acme"),
        ChangeEvent(ChangeKind.ADAPTER_REGISTERED, "acme/a"),
        ChangeEvent(ChangeKind.ADAPTER_UPDATED, "acme/a"),
        ChangeEvent(ChangeKind.ADAPTER_DELETED, "acme/a"),
    )
    first = await peer.changes_since(start, limit=3)
    assert first.complete and first.version == start + 3 and len(first.changes) == 3
    rest = await peer.changes_since(first.version, limit=3)
    assert rest.changes == log.changes[3:] and rest.version == log.latest
    now = await store.changes_since(log.latest)
    assert now.complete and now.changes == () and now.version == log.latest
    ahead = await store.changes_since(log.latest + 5)
    assert not ahead.complete, "a version the store never reached: it lost its data"


async def test_a_trimmed_log_says_it_is_incomplete(backend, clock):
    if backend.kind == "memory":
        store = MemoryRegistryStore(clock=clock, change_log_size=3)
    else:
        store = RedisRegistryStore(REDIS_URL, backend.namespace, clock=clock, change_log_size=3)
    await store.open()
    start = await store.version()
    for name in ("a", "b", "c", "d"):
        await store.register_adapter(spec(name))
    assert not (await store.changes_since(start)).complete
    recent = await store.changes_since(start + 1)
    assert recent.complete and [c.name for c in recent.changes] == ["b", "c", "d"]
    await store.close()


async def test_a_restore_writes_the_indexes_with_the_records(store, peer):
    await store.create_tenant("acme")
    await store.register_adapter(spec("old", "acme", size_bytes=10))
    snapshot = await peer.snapshot()
    records = list(snapshot.adapters)
    for name in ("p", "q"):
        made = await store.register_adapter(spec(name, "acme", size_bytes=7, public=name == "p"))
        records.append(made.adapter)
    await store.delete_adapter("acme/p")
    await store.delete_adapter("acme/q")
    await store.delete_adapter("acme/old")
    await store.restore(
        RegistrySnapshot(adapters=tuple(records), last_lora_int_id=99), expect_version=None
    )
    await check_every_index(peer)
    assert await peer.adapter_counts("acme") == AdapterCounts(3, 24)


async def test_redis_data_without_indexes_gets_them_built_once_at_open(redis_namespace, clock):
    """Records written by a version before the indexes: the first open builds them all."""
    store = RedisRegistryStore(REDIS_URL, redis_namespace, clock=clock)
    await store.open()
    for tenant in TENANTS:
        await store.create_tenant(tenant)
    await store.register_adapter(spec("sql", "acme", public=True, store_object=OBJECT))
    await store.register_adapter(spec("a", "acme", size_bytes=5))
    await store.register_adapter(spec("z", "beta", store_object=OBJECT))
    await store.register_adapter(spec("b", public=True))
    await store.close()
    client = redis.Redis.from_url(REDIS_URL)
    for index in ("adapter-index", "public-names", "public-index", "object-refs"):
        client.delete(f"{redis_namespace}:{index}")
    client.delete(f"{redis_namespace}:adapter-totals:acme")
    client.delete(f"{redis_namespace}:owned:beta")
    client.sadd(f"{redis_namespace}:owned:beta", "z")  # the older layout's set
    client.close()

    upgraded = RedisRegistryStore(REDIS_URL, redis_namespace, clock=clock)
    await upgraded.open()
    await check_every_index(upgraded)
    assert await upgraded.adapter_counts("acme") == AdapterCounts(2, 1239)
    assert await upgraded.object_references(OBJECT) == 2
    await upgraded.delete_tenant("beta")
    await check_every_index(upgraded)
    await upgraded.close()
