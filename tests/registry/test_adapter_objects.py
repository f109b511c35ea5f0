"""Adapter store objects in the registry (issue 37), on both stores: the tenant's byte quota,
reference counts read from the records, and the pin/claim pair that lets exactly one
replica delete an object's bytes, and never while an upload or a name still needs them."""

from __future__ import annotations

import asyncio

import pytest
from registry_testlib import spec

from loragate.registry import (
    AdapterBytesQuotaExceeded,
    AdapterQuotaExceeded,
    TenantQuota,
)

OID = "a" * 64 + "-" + "b" * 64
OTHER = "c" * 64 + "-" + "d" * 64


async def test_max_adapter_bytes_counts_every_name_and_a_replacement_once(store):
    await store.create_tenant("acme", TenantQuota(max_adapter_bytes=1000))
    await store.register_adapter(spec("a", "acme", size_bytes=600, store_object=OID))
    with pytest.raises(AdapterBytesQuotaExceeded) as caught:
        await store.register_adapter(spec("b", "acme", size_bytes=600, store_object=OID))
    assert (caught.value.used, caught.value.limit) == (600, 1000)
    # Replacing "a" by a bigger one counts the new size instead of the old one.
    await store.register_adapter(spec("a", "acme", size_bytes=1000, store_object=OID))
    await store.register_adapter(spec("c", "acme", size_bytes=0))
    assert [a.name for a in await store.list_adapters()] == ["a", "c"]


async def test_concurrent_registrations_pass_max_adapters_exactly(store, peer):
    await store.create_tenant("acme", TenantQuota(max_adapters=5))
    stores = [store, peer] * 10

    async def register(i: int):
        try:
            await stores[i].register_adapter(spec(f"a{i}", "acme", store_object=OID))
            return True
        except AdapterQuotaExceeded:
            return False

    landed = await asyncio.gather(*(register(i) for i in range(20)))
    assert sum(landed) == 5
    assert len(await store.list_adapters()) == 5
    assert await store.object_references(OID) == 5


async def test_an_object_is_claimed_only_when_nothing_needs_it(store, peer):
    await store.register_adapter(spec("a", store_object=OID))
    assert await store.object_references(OID) == 1
    assert not await peer.claim_unreferenced_object(OID), "a name still points at it"
    await store.delete_adapter("a")
    pin = await store.pin_object(OID)
    assert pin is not None
    assert not await peer.claim_unreferenced_object(OID), "an upload holds a pin"
    await store.unpin_object(OID, pin)
    assert await peer.claim_unreferenced_object(OID)
    assert not await store.claim_unreferenced_object(OID), "one claim at a time"
    assert await store.pin_object(OID) is None, "no upload pins what is being deleted"
    assert await store.pin_object(OTHER) is not None
    await peer.release_object_claim(OID)
    assert await store.pin_object(OID) is not None


async def test_a_pin_expires(store, peer, clock):
    pin = await store.pin_object(OID, ttl_s=5)
    assert pin is not None and not await peer.claim_unreferenced_object(OID)
    clock.advance(6)
    assert await peer.claim_unreferenced_object(OID), "a crashed upload's pin expires"


def test_bad_object_ids_are_refused():
    with pytest.raises(ValueError, match="store_object"):
        spec("a", store_object="not-a-hash")
