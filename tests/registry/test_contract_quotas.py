"""The registry store contract, quota windows, leases and reservations (both stores)."""

from __future__ import annotations

import asyncio

import pytest

from loragate.registry import (
    TenantQuota,
)

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
