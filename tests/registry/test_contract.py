"""One contract for every registry store: the in-memory one and Redis (a real server).

Each test gets `store` and `peer`: two handles on one registry. For Redis they are two
store objects with their own connections (two gateway replicas); in memory, one object.
Redis runs in a random namespace, deleted afterwards. If Redis is not reachable on
127.0.0.1:6379 the Redis tests fail: CI starts one (.ci/run).
"""

from __future__ import annotations

import asyncio
import hmac
import uuid
from dataclasses import dataclass

import msgspec
import pytest
import redis

from loragate.registry import (
    AdapterMetadata,
    AdapterNameTaken,
    AdapterQuotaExceeded,
    AdapterSpec,
    AdapterWeights,
    ChangeEvent,
    ChangeKind,
    PublicNameTaken,
    RegistryStore,
    StaleAdapterId,
    TenantExists,
    TenantNotFound,
    TenantQuota,
    UsageCounts,
)
from loragate.registry.memory import MemoryRegistryStore
from loragate.registry.redis_store import RedisRegistryStore

REDIS_URL = "redis://127.0.0.1:6379"
EVENT_DEADLINE_S = 1.0  # the bound for a replica to see a change


class FakeClock:
    """Time the quota windows see; tests move it instead of sleeping."""

    def __init__(self, now: float = 1_700_000_000.25):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Backend:
    kind: str
    store: RegistryStore
    peer: RegistryStore
    namespace: str | None = None

    def raw_dump(self) -> str:
        """Everything the store keeps, as text, to search for secrets."""
        if self.kind == "redis":
            return redis_dump(self.namespace)
        return "\n".join(_strings_in(self.store, set()))


def redis_dump(namespace: str) -> str:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    parts = []
    for key in client.scan_iter(match=f"{namespace}:*"):
        parts.append(key)
        kind = client.type(key)
        if kind == "hash":
            parts += [f"{k}={v}" for k, v in client.hgetall(key).items()]
        elif kind == "set":
            parts += client.smembers(key)
        elif kind == "zset":
            parts += client.zrange(key, 0, -1)
        elif kind == "string":
            parts.append(client.get(key))
    client.close()
    return "\n".join(parts)


def _strings_in(obj, seen: set[int]) -> list[str]:
    """Every str/bytes reachable from a loragate object through containers and fields."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, bytes):
        return [obj.hex(), obj.decode("latin-1")]
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset):
        items = list(obj)
    elif isinstance(obj, msgspec.Struct):
        items = [getattr(obj, f) for f in obj.__struct_fields__]
    elif type(obj).__module__.startswith("loragate") and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [s for item in items for s in _strings_in(item, seen)]


def flush_namespace(namespace: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def redis_namespace():
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, OSError) as exc:
        pytest.fail(
            f"Redis is not reachable at {REDIS_URL} ({exc}). The registry contract tests run "
            "against a real redis-server: start one (.ci/run does) and run them again."
        )
    finally:
        client.close()
    namespace = f"test-registry-{uuid.uuid4().hex}"
    yield namespace
    flush_namespace(namespace)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def backend(request, clock):
    if request.param == "memory":
        store = MemoryRegistryStore(clock=clock, lease_ttl_s=30)
        backend = Backend("memory", store, store)
    else:
        namespace = request.getfixturevalue("redis_namespace")
        store, peer = (
            RedisRegistryStore(REDIS_URL, namespace, clock=clock, lease_ttl_s=30) for _ in range(2)
        )
        backend = Backend("redis", store, peer, namespace)
    assert await backend.store.open() is True
    yield backend
    await backend.store.close()
    await backend.peer.close()


@pytest.fixture
def store(backend):
    return backend.store


@pytest.fixture
def peer(backend):
    return backend.peer


def spec(name: str = "sql", tenant: str | None = None, **overrides) -> AdapterSpec:
    fields = dict(
        name=name,
        tenant=tenant,
        base_model="tiny-llama",
        rank=8,
        alpha=16,
        target_modules=("q_proj", "v_proj"),
        sha256="ab" * 32,
        size_bytes=1234,
        path=f"adapters/{name}",
    )
    fields.update(overrides)
    return AdapterSpec(**fields)


async def next_event(events) -> ChangeEvent:
    return await asyncio.wait_for(anext(events), EVENT_DEADLINE_S)


# lifecycle


async def test_open_says_fresh_once_and_nothing_was_reset(store, peer, backend):
    if backend.kind == "redis":
        assert await peer.open() is False, "a second replica finds the marker the first wrote"
    assert await store.open() is False
    assert await store.check_reset() is False
    await store.ping()


# adapters


async def test_register_get_list_delete(store, peer, clock):
    registered = await store.register_adapter(spec("sql"))
    adapter = registered.adapter
    assert registered.replaced is None
    assert adapter.name == "sql" and adapter.tenant is None and adapter.status == "ready"
    assert (adapter.rank, adapter.alpha, adapter.target_modules) == (8, 16.0, ("q_proj", "v_proj"))
    assert (adapter.sha256, adapter.size_bytes, adapter.path) == ("ab" * 32, 1234, "adapters/sql")
    assert adapter.created_at == clock.now and adapter.lora_int_id >= 1
    assert await peer.get_adapter("sql") == adapter
    await store.register_adapter(spec("chat"))
    assert [a.name for a in await peer.list_adapters()] == ["chat", "sql"]

    assert await peer.delete_adapter("sql") == adapter
    assert await store.get_adapter("sql") is None
    assert await store.delete_adapter("sql") is None
    assert [a.name for a in await store.list_adapters()] == ["chat"]


async def test_reregistering_a_name_gets_a_new_lora_int_id(store, peer):
    first = (await store.register_adapter(spec("sql"))).adapter
    second = await peer.register_adapter(spec("sql", path="adapters/sql-v2"))
    assert second.replaced == first
    assert second.adapter.lora_int_id > first.lora_int_id
    await store.delete_adapter("sql")
    third = (await store.register_adapter(spec("sql"))).adapter
    assert third.lora_int_id > second.adapter.lora_int_id, "ids are never reused, even after delete"


async def test_concurrent_registrations_get_distinct_ids(store, peer):
    stores = [store, peer]
    results = await asyncio.gather(
        *(stores[i % 2].register_adapter(spec(f"a{i}")) for i in range(20))
    )
    ids = [r.adapter.lora_int_id for r in results]
    assert len(set(ids)) == 20
    assert len(await store.list_adapters()) == 20


async def test_each_owner_names_its_adapters_in_its_own_namespace(store, peer):
    await store.create_tenant("acme")
    await store.create_tenant("globex")
    acme = (await store.register_adapter(spec("sql", "acme"))).adapter
    globex = await peer.register_adapter(spec("sql", "globex", path="globex/sql"))
    operator = await peer.register_adapter(spec("sql", None))
    assert globex.replaced is None and operator.replaced is None, "three different adapters"
    assert (acme.key, globex.adapter.key, operator.adapter.key) == ("acme/sql", "globex/sql", "sql")
    assert len({acme.lora_int_id, globex.adapter.lora_int_id, operator.adapter.lora_int_id}) == 3
    assert (await store.get_adapter("globex/sql")).path == "globex/sql"
    assert (await store.get_adapter("acme/sql")).tenant == "acme"
    assert [a.key for a in await peer.list_adapters()] == ["acme/sql", "globex/sql", "sql"]

    with pytest.raises(AdapterNameTaken) as same:
        await peer.register_adapter(spec("sql", "acme"), replace=False)
    assert same.value.key == "acme/sql"
    again = await peer.register_adapter(spec("sql", "acme"))
    assert again.replaced == acme, "the owner may replace its own adapter"
    assert await store.delete_adapter("globex/sql") is not None
    assert (await store.get_adapter("acme/sql")) == again.adapter, "another's delete is not mine"
    for bad in ("acme/", "/sql", "a/b/sql", "acme sql/x"):
        with pytest.raises(ValueError):
            await store.get_adapter(bad)


async def test_two_tenants_racing_for_one_name_both_get_it(store, peer):
    await store.create_tenant("acme")
    await store.create_tenant("globex")
    results = await asyncio.gather(
        store.register_adapter(spec("sql", "acme")),
        peer.register_adapter(spec("sql", "globex")),
    )
    assert {r.adapter.key for r in results} == {"acme/sql", "globex/sql"}
    assert all(r.replaced is None for r in results)


async def test_public_names_are_unique_among_public_adapters(store, peer):
    await store.create_tenant("acme")
    await store.create_tenant("globex")
    await store.register_adapter(spec("sql", "acme"))
    await store.register_adapter(spec("sql", "globex"))
    assert (await peer.update_adapter("acme/sql", public=True)).public
    with pytest.raises(PublicNameTaken) as taken:
        await store.update_adapter("globex/sql", public=True)
    assert (taken.value.name, taken.value.holder) == ("sql", "acme/sql")
    with pytest.raises(PublicNameTaken):
        await peer.register_adapter(spec("sql", None, public=True))
    assert not (await store.get_adapter("globex/sql")).public
    assert await store.get_adapter("sql") is None
    assert (await store.update_adapter("acme/sql", public=True)).public, "itself is no clash"
    await peer.register_adapter(spec("sql", "acme", public=True))  # re-registering it neither
    await store.update_adapter("acme/sql", public=False)
    assert (await peer.update_adapter("globex/sql", public=True)).public


async def test_tenant_adapters_need_the_tenant_and_respect_max_adapters(store, peer):
    with pytest.raises(TenantNotFound):
        await store.register_adapter(spec("sql", "nobody"))
    await store.create_tenant("acme", TenantQuota(max_adapters=2))
    await store.register_adapter(spec("a", "acme"))
    await peer.register_adapter(spec("b", "acme"))
    with pytest.raises(AdapterQuotaExceeded) as exceeded:
        await store.register_adapter(spec("c", "acme"))
    assert (exceeded.value.tenant, exceeded.value.limit) == ("acme", 2)
    await store.register_adapter(spec("b", "acme", rank=4))  # replacing one is not a new one
    await peer.register_adapter(spec("admin-owned"))  # the admin has no adapter quota
    await peer.register_adapter(spec("a"))  # the operator's "a" is not acme's
    await store.delete_adapter("acme/a")
    await peer.register_adapter(spec("c", "acme"))
    owned = [a.name for a in await store.list_adapters() if a.tenant == "acme"]
    assert owned == ["b", "c"]


async def test_concurrent_registrations_never_exceed_max_adapters(store, peer):
    await store.create_tenant("acme", TenantQuota(max_adapters=3))
    stores = [store, peer]
    results = await asyncio.gather(
        *(stores[i % 2].register_adapter(spec(f"a{i}", "acme")) for i in range(10)),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, Exception) for r in results) == 3
    assert all(isinstance(r, AdapterQuotaExceeded) for r in results if isinstance(r, Exception))
    assert len(await store.list_adapters()) == 3


async def test_preallocated_lora_int_id(store, peer):
    lora_int_id = await store.new_lora_int_id()
    registered = await peer.register_adapter(spec("sql"), lora_int_id=lora_int_id)
    assert registered.adapter.lora_int_id == lora_int_id
    with pytest.raises(StaleAdapterId):
        await store.register_adapter(spec("sql"), lora_int_id=lora_int_id)
    with pytest.raises(StaleAdapterId):
        await store.register_adapter(spec("chat"), lora_int_id=lora_int_id + 1000)
    with pytest.raises(ValueError, match="lora_int_id"):
        await store.register_adapter(spec("chat"), lora_int_id=0)
    assert await peer.new_lora_int_id() > lora_int_id


async def test_update_weights_of_a_registration(store, peer):
    """Files changed in place (issue 21): the same registration takes the new description."""
    adapter = (await store.register_adapter(spec("sql"))).adapter
    weights = AdapterWeights(
        rank=16, alpha=32.0, target_modules=("q_proj",), sha256="cd" * 32, size_bytes=99
    )
    updated = await peer.update_adapter("sql", lora_int_id=adapter.lora_int_id, weights=weights)
    assert (updated.sha256, updated.size_bytes, updated.rank) == ("cd" * 32, 99, 16)
    assert (updated.alpha, updated.target_modules) == (32.0, ("q_proj",))
    assert (updated.lora_int_id, updated.created_at) == (adapter.lora_int_id, adapter.created_at)
    assert await store.get_adapter("sql") == updated
    with pytest.raises(ValueError, match="sha256"):
        await store.update_adapter("sql", weights=msgspec.structs.replace(weights, sha256="x"))
    assert await store.get_adapter("sql") == updated
    assert (
        await store.update_adapter("sql", lora_int_id=adapter.lora_int_id + 1, weights=weights)
        is None
    )


async def test_update_and_delete_guarded_by_lora_int_id(store, peer):
    await store.create_tenant("acme")
    adapter = (await store.register_adapter(spec("sql", "acme"))).adapter
    assert not adapter.public and adapter.visible_to("acme") and adapter.visible_to(None)
    assert not adapter.visible_to("globex")

    key = "acme/sql"
    public = await peer.update_adapter(key, public=True)
    assert public.public and public.visible_to("globex")
    assert public.lora_int_id == adapter.lora_int_id and public.created_at == adapter.created_at
    deleting = await store.update_adapter(key, status="deleting", lora_int_id=adapter.lora_int_id)
    assert deleting.status == "deleting" and deleting.public
    assert await store.get_adapter(key) == deleting
    with pytest.raises(ValueError, match="status"):
        await store.update_adapter(key, status="gone")
    assert await store.update_adapter("nope", public=True) is None
    assert await store.update_adapter("sql", public=True) is None, "the operator has no sql"

    newer = (await peer.register_adapter(spec("sql", "acme"))).adapter
    assert await store.update_adapter(key, public=False, lora_int_id=adapter.lora_int_id) is None
    assert await store.delete_adapter(key, lora_int_id=adapter.lora_int_id) is None
    assert await store.get_adapter(key) == newer
    assert await store.delete_adapter(key, lora_int_id=newer.lora_int_id) == newer


async def test_bad_names_are_refused(store):
    with pytest.raises(ValueError, match="adapter name"):
        await store.get_adapter("has space")
    with pytest.raises(ValueError, match="tenant name"):
        await store.create_tenant("a:b")
    with pytest.raises(ValueError, match="spec must be an AdapterSpec"):
        await store.register_adapter({"name": "sql"})


# tenants and keys


async def test_tenant_create_verify_rotate_delete(store, peer):
    issued = await store.create_tenant("acme", TenantQuota(requests_per_minute=5))
    assert issued.api_key.startswith("lg-") and issued.api_key not in repr(issued)
    assert issued.tenant.quota.requests_per_minute == 5
    assert await peer.verify_api_key(issued.api_key) == "acme"
    assert await peer.get_tenant("acme") == issued.tenant
    with pytest.raises(TenantExists):
        await peer.create_tenant("acme")
    other = await peer.create_tenant("globex")
    assert [t.name for t in await store.list_tenants()] == ["acme", "globex"]

    rotated = await peer.rotate_tenant_key("acme")
    assert rotated.api_key != issued.api_key
    assert rotated.tenant.key_ids != issued.tenant.key_ids
    assert await store.verify_api_key(issued.api_key) is None, "the old key stops working"
    assert await store.verify_api_key(rotated.api_key) == "acme"

    updated = await store.set_tenant_quota("acme", TenantQuota(max_concurrent_requests=2))
    assert updated.quota == TenantQuota(max_concurrent_requests=2)
    assert (await peer.get_tenant("acme")).quota == updated.quota

    assert await peer.delete_tenant("acme") is not None
    assert await store.verify_api_key(rotated.api_key) is None, "a deleted tenant's key fails"
    assert await store.get_tenant("acme") is None
    assert await store.delete_tenant("acme") is None
    assert await store.verify_api_key(other.api_key) == "globex"
    for missing in (store.rotate_tenant_key("acme"), store.set_tenant_quota("acme", TenantQuota())):
        with pytest.raises(TenantNotFound):
            await missing


async def test_deleting_a_tenant_removes_only_its_adapters(store, peer):
    await store.create_tenant("acme")
    await store.create_tenant("globex")
    await store.register_adapter(spec("a1", "acme"))
    await store.register_adapter(spec("a2", "acme"))
    await store.register_adapter(spec("g1", "globex"))
    await store.register_adapter(spec("shared"))
    await store.register_adapter(spec("a1"))  # the operator's a1 is not acme's
    await peer.delete_tenant("acme")
    assert [a.key for a in await store.list_adapters()] == ["a1", "globex/g1", "shared"]
    await store.create_tenant("acme", TenantQuota(max_adapters=1))
    await store.register_adapter(spec("a3", "acme"))  # nothing of the old acme counts


async def test_forged_and_malformed_keys_are_refused(store):
    acme = (await store.create_tenant("acme")).api_key
    globex = (await store.create_tenant("globex")).api_key
    acme_id, acme_secret = acme[3:19], acme[20:]
    globex_id = globex[3:19]
    forged = [
        f"lg-{acme_id}-{'A' * 43}",
        f"lg-{globex_id}-{acme_secret}",
        f"lg-{'0' * 16}-{acme_secret}",
        acme + "x",
        acme[:-1],
        acme.upper(),
        "",
        "Bearer " + acme,
        None,
    ]
    for key in forged:
        assert await store.verify_api_key(key) is None, key
    assert await store.verify_api_key(acme) == "acme"


async def test_keys_are_never_stored_in_clear(backend, store):
    issued = await store.create_tenant("acme")
    rotated = await store.rotate_tenant_key("acme")
    dump = backend.raw_dump()
    assert rotated.tenant.key_ids[0] in dump, "the dump must show the stored key records"
    for api_key in (issued.api_key, rotated.api_key):
        secret = api_key.split("-", 2)[2]
        assert api_key not in dump and secret not in dump


async def test_key_checks_use_a_constant_time_compare(store, monkeypatch):
    api_key = (await store.create_tenant("acme")).api_key
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert await store.verify_api_key(api_key) == "acme"
    assert len(calls) == 1
    secret = api_key.split("-", 2)[2]
    assert secret.encode() not in calls[0], "digests are compared, not the secret"
    assert await store.verify_api_key(api_key[:-1] + ("A" if api_key[-1] != "A" else "B")) is None
    assert await store.verify_api_key(f"lg-{'0' * 16}-{secret}") is None
    assert len(calls) == 3, "a wrong secret and an unknown key id are compared alike"


# usage


async def test_usage_counts_are_exact_under_a_concurrent_burst(store, peer):
    stores = [store, peer]
    adapters = ["sql", "chat", None]

    async def one(i: int):
        await stores[i % 2].record_usage(
            "acme", adapters[i % 3], prompt_tokens=i, completion_tokens=2 * i + 1
        )

    await asyncio.gather(*(one(i) for i in range(150)))
    report = await peer.get_usage("acme")

    def expected(indices) -> UsageCounts:
        indices = list(indices)
        return UsageCounts(sum(indices), sum(2 * i + 1 for i in indices), len(indices))

    assert report.total == expected(range(150))
    assert report.by_adapter == {
        "chat": expected(range(1, 150, 3)),
        "sql": expected(range(0, 150, 3)),
    }


async def test_usage_for_one_tenant_or_all(store, peer):
    nobody = await store.get_usage("nobody")
    assert (nobody.tenant, nobody.total, nobody.by_adapter) == ("nobody", UsageCounts(), {})
    await store.record_usage("globex", "g", prompt_tokens=1, completion_tokens=2)
    await peer.record_usage("acme", "a", prompt_tokens=3, completion_tokens=4, requests=2)
    reports = await store.list_usage()
    assert [r.tenant for r in reports] == ["acme", "globex"]
    assert reports[0].total == UsageCounts(3, 4, 2)
    assert reports[1].by_adapter == {"g": UsageCounts(1, 2, 1)}
    with pytest.raises(ValueError, match="prompt_tokens"):
        await store.record_usage("acme", "a", prompt_tokens=-1, completion_tokens=0)


# quotas


async def test_requests_per_minute_window_and_retry_after(store, peer, clock):
    quota = TenantQuota(requests_per_minute=3)
    for _ in range(3):
        admitted = await store.try_acquire_request("acme", quota)
        assert admitted.ok and admitted.lease
        await store.release_request("acme", admitted.lease)
        clock.advance(10)
    refused = await peer.try_acquire_request("acme", quota)
    assert (refused.ok, refused.reason, refused.lease) == (False, "requests_per_minute", None)
    # The first request was at second 1_700_000_000; it leaves the window at +60 s.
    assert refused.retry_after == 30
    clock.advance(refused.retry_after - 1)
    assert (await store.try_acquire_request("acme", quota)).retry_after == 1
    clock.advance(1)
    assert (await peer.try_acquire_request("acme", quota)).ok
    assert not (await store.try_acquire_request("acme", quota)).ok
    assert (await store.try_acquire_request("globex", quota)).ok, "windows are per tenant"


async def test_a_full_window_in_one_second_waits_a_whole_minute(store, clock):
    quota = TenantQuota(requests_per_minute=2)
    assert (await store.try_acquire_request("acme", quota)).ok
    assert (await store.try_acquire_request("acme", quota)).ok
    refused = await store.try_acquire_request("acme", quota)
    assert refused.retry_after == 60
    clock.advance(59.75)
    assert (await store.try_acquire_request("acme", quota)).ok


async def test_concurrent_requests_release_expire_and_refresh(store, peer, clock):
    quota = TenantQuota(max_concurrent_requests=2)
    first = await store.try_acquire_request("acme", quota)
    second = await peer.try_acquire_request("acme", quota)
    assert first.ok and second.ok and first.lease != second.lease
    refused = await store.try_acquire_request("acme", quota)
    assert (refused.ok, refused.reason, refused.retry_after) == (
        False,
        "max_concurrent_requests",
        1,
    )
    assert await peer.in_flight("acme") == 2
    assert await peer.release_request("acme", first.lease) is True
    assert await store.release_request("acme", first.lease) is False, "released once only"
    third = await store.try_acquire_request("acme", quota)
    assert third.ok

    # A replica that died holding leases cannot block the tenant past the lease TTL (30 s).
    clock.advance(20)
    assert await store.refresh_request("acme", third.lease) is True
    clock.advance(15)
    assert await peer.in_flight("acme") == 1, "second expired, third was refreshed"
    assert await store.release_request("acme", second.lease) is False
    assert await store.refresh_request("acme", second.lease) is False
    assert (await store.try_acquire_request("acme", quota)).ok


async def test_tokens_per_minute(store, peer, clock):
    quota = TenantQuota(tokens_per_minute=100)
    assert (await store.try_acquire_request("acme", quota)).ok
    await store.add_tokens("acme", 60)
    clock.advance(20)
    assert (await peer.try_acquire_request("acme", quota)).ok, "60 < 100 tokens"
    await peer.add_tokens("acme", 50)
    refused = await store.try_acquire_request("acme", quota)
    assert (refused.ok, refused.reason) == (False, "tokens_per_minute")
    # 110 used; the 60 from second 1_700_000_000 leave at +60 s, i.e. 39.75 s from now.
    assert refused.retry_after == 40
    clock.advance(39)
    assert not (await peer.try_acquire_request("acme", quota)).ok
    clock.advance(1)
    assert (await peer.try_acquire_request("acme", quota)).ok
    with pytest.raises(ValueError, match="tokens"):
        await store.add_tokens("acme", -5)


async def test_unlimited_quota_admits_everything(store):
    quota = TenantQuota()
    await store.add_tokens("acme", 10**9)
    admissions = [await store.try_acquire_request("acme", quota) for _ in range(50)]
    assert all(a.ok for a in admissions)
    assert await store.in_flight("acme") == 50


async def test_quotas_hold_across_replicas_under_a_burst(store, peer):
    stores = [store, peer]
    concurrent = TenantQuota(max_concurrent_requests=7)
    results = await asyncio.gather(
        *(stores[i % 2].try_acquire_request("acme", concurrent) for i in range(30))
    )
    assert sum(r.ok for r in results) == 7
    per_minute = TenantQuota(requests_per_minute=10)
    results = await asyncio.gather(
        *(stores[i % 2].try_acquire_request("globex", per_minute) for i in range(30))
    )
    assert sum(r.ok for r in results) == 10
    assert all(r.retry_after >= 1 for r in results if not r.ok)


async def test_a_burst_of_reservations_never_overruns_tokens_per_minute(store, peer):
    quota = TenantQuota(tokens_per_minute=100)
    stores = [store, peer]
    results = await asyncio.gather(
        *(stores[i % 2].try_acquire_request("acme", quota, tokens=25) for i in range(16))
    )
    assert sum(r.ok for r in results) == 4, "4 worst cases of 25 fill 100 tokens"
    refused = [r for r in results if not r.ok]
    assert all((r.reason, r.retry_after) == ("tokens_per_minute", 1) for r in refused)


async def test_a_reservation_is_refunded_down_to_what_was_used(store, peer):
    quota = TenantQuota(tokens_per_minute=100)
    first = await store.try_acquire_request("acme", quota, tokens=40)
    second = await peer.try_acquire_request("acme", quota, tokens=40)
    assert first.ok and second.ok
    refused = await store.try_acquire_request("acme", quota, tokens=40)
    assert (refused.ok, refused.reason, refused.retry_after) == (False, "tokens_per_minute", 1)
    assert await peer.release_request("acme", first.lease, used_tokens=10) is True
    third = await store.try_acquire_request("acme", quota, tokens=40)
    assert third.ok, "10 used + 40 + 40 reserved fit in 100"
    # 10 used this second, 80 reserved: 15 more do not fit until the 10 leave the window.
    refused = await peer.try_acquire_request("acme", quota, tokens=15)
    assert (refused.ok, refused.retry_after) == (False, 60)
    assert (await peer.try_acquire_request("acme", quota, tokens=10)).ok
    assert await store.release_request("acme", third.lease, used_tokens=40) is True
    assert await store.release_request("acme", third.lease, used_tokens=0) is False
    # 50 used in the window and 50 still reserved (40 + 10): not one token more.
    refused = await store.try_acquire_request("acme", quota)
    assert (refused.ok, refused.reason) == (False, "tokens_per_minute")


async def test_a_reservation_too_big_for_the_quota_is_never_admitted(store):
    quota = TenantQuota(tokens_per_minute=100)
    too_big = await store.try_acquire_request("globex", quota, tokens=101)
    assert (too_big.ok, too_big.reason) == (False, "tokens_per_minute")
    assert (await store.try_acquire_request("globex", quota, tokens=100)).ok


async def test_an_expired_lease_frees_its_reservation_but_counts_what_it_used(store, peer, clock):
    quota = TenantQuota(tokens_per_minute=100)
    crashed = await store.try_acquire_request("acme", quota, tokens=90)
    assert crashed.ok
    assert not (await peer.try_acquire_request("acme", quota, tokens=20)).ok
    clock.advance(31)  # past the 30 s lease TTL: its replica died holding it
    assert await peer.in_flight("acme") == 0
    late = await peer.try_acquire_request("acme", quota, tokens=60)
    assert late.ok, "the dead request's reservation is gone"
    assert await store.release_request("acme", crashed.lease, used_tokens=30) is False
    assert not (await store.try_acquire_request("acme", quota, tokens=20)).ok, "30 + 60 + 20"
    assert (await store.try_acquire_request("acme", quota, tokens=10)).ok


async def test_requests_per_minute_counts_every_sequence(store, peer):
    quota = TenantQuota(requests_per_minute=10)
    assert (await store.try_acquire_request("acme", quota, requests=4)).ok
    assert (await peer.try_acquire_request("acme", quota, requests=4)).ok
    refused = await store.try_acquire_request("acme", quota, requests=4)
    assert (refused.ok, refused.reason, refused.retry_after) == (False, "requests_per_minute", 60)
    assert (await store.try_acquire_request("acme", quota, requests=2)).ok
    with pytest.raises(ValueError, match="requests"):
        await store.try_acquire_request("acme", quota, requests=0)
    with pytest.raises(ValueError, match="tokens"):
        await store.try_acquire_request("acme", quota, tokens=-1)


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
