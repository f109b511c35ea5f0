"""The registry store contract, tenants, keys and usage (both stores; see conftest.py)."""

from __future__ import annotations

import asyncio
import hmac

import pytest
from registry_testlib import (
    spec,
)

from loragate.registry import (
    TenantExists,
    TenantNotFound,
    TenantQuota,
    UsageCounts,
)

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


async def test_a_tenants_weight_is_kept_changed_and_checked(store, peer):
    """The fair-share weight sits next to the quota: 1.0 unless given, changed alone (the
    quota stays), refused unless a finite number > 0, and seen by every replica."""
    assert (await store.create_tenant("acme")).tenant.weight == 1.0
    heavy = await store.create_tenant("globex", TenantQuota(requests_per_minute=5), weight=3)
    assert heavy.tenant.weight == 3.0
    assert (await peer.get_tenant("globex")).weight == 3.0
    changed = await peer.set_tenant_weight("acme", 0.5)
    assert changed.weight == 0.5 and changed.quota == TenantQuota()
    assert (await store.get_tenant("acme")).weight == 0.5
    await store.set_tenant_quota("globex", TenantQuota(max_adapters=2))
    assert (await peer.get_tenant("globex")).weight == 3.0, "a quota change keeps the weight"
    for bad in (0, -1.0, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ValueError, match="weight must be a finite number > 0"):
            await store.set_tenant_weight("acme", bad)
        with pytest.raises(ValueError, match="weight must be a finite number > 0"):
            await store.create_tenant("initech", weight=bad)
    assert await store.get_tenant("initech") is None
    assert (await store.get_tenant("acme")).weight == 0.5
    with pytest.raises(TenantNotFound):
        await store.set_tenant_weight("nobody", 2.0)


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
