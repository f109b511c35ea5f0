"""The registry store contract, adapters: registration, namespaces, public names, ids,
updates. Every test runs on both stores (see conftest.py)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from registry_testlib import (
    spec,
)

from loragate.registry import (
    AdapterNameTaken,
    AdapterQuotaExceeded,
    AdapterWeights,
    PublicNameTaken,
    StaleAdapterId,
    TenantNotFound,
    TenantQuota,
)

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
    assert (adapter.tenant, adapter.public, adapter.key) == ("acme", False, "acme/sql")

    key = "acme/sql"
    public = await peer.update_adapter(key, public=True)
    assert (public.tenant, public.public, public.key) == ("acme", True, "acme/sql")
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
