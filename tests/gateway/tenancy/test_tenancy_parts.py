"""The tenancy parts on their own, on the in-memory store (with a switch that makes it
unreachable): key checks and their cache, quota admission, usage buffering, the local
adapter catalog, and the settings that turn tenancy on."""

from __future__ import annotations

import asyncio
import time

import pytest

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, SamplingParams
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.served_adapters import AdapterRecord
from loragate.gateway.errors import (
    AuthenticationError,
    InvalidRequestError,
    QuotaExceededError,
    RegistryDownError,
)
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.settings import GatewaySettings
from loragate.gateway.tenancy.auth import Authenticator, bearer_token
from loragate.gateway.tenancy.principal import OPERATOR, Principal
from loragate.gateway.tenancy.quotas import QuotaKeeper
from loragate.gateway.tenancy.request_cost import NO_COST, request_cost
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import AdapterMetadata, RegistryUnavailable, TenantQuota, UsageCounts
from loragate.registry.memory import MemoryRegistryStore

ADMIN = "the-admin-key-for-tests"


class Switchable:
    """A store that raises RegistryUnavailable from every call while `down`."""

    def __init__(self, inner: MemoryRegistryStore):
        self.inner = inner
        self.down = False
        self.calls = 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def call(*args, **kwargs):
            self.calls += 1
            if self.down:
                raise RegistryUnavailable("registry store at test is unreachable: switched off")
            return await attr(*args, **kwargs)

        return call


def other_key(key: str) -> str:
    """`key` with its last character changed: well-formed, but not the key."""
    return key[:-1] + ("B" if key[-1] == "A" else "A")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bearer_tokens_are_parsed_strictly():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    for bad in (None, "", "Bearer", "Bearer ", "Basic abc", "abc", "Token abc"):
        assert bearer_token(bad) is None, bad


def test_admin_key_tenant_keys_and_one_refusal_for_everything():
    async def scenario():
        store = MemoryRegistryStore()
        auth = Authenticator(ADMIN, RegistrySeam(store), cache_seconds=30)
        issued = await store.create_tenant("acme", TenantQuota(requests_per_minute=5))
        assert await auth.authenticate(f"Bearer {ADMIN}") is OPERATOR
        caller = await auth.authenticate(f"Bearer {issued.api_key}")
        assert caller.tenant == "acme" and caller.quota.requests_per_minute == 5
        assert caller.cache_salt.startswith("acme@")
        messages = set()
        for header in (None, "Bearer x", f"Bearer {ADMIN}!", f"Bearer {other_key(issued.api_key)}"):
            with pytest.raises(AuthenticationError) as refused:
                await auth.authenticate(header)
            messages.add(refused.value.message)
        assert len(messages) == 1
        open_server = Authenticator(None, RegistrySeam(store), cache_seconds=30)
        assert await open_server.authenticate(None) is OPERATOR

    asyncio.run(scenario())


def test_verified_keys_are_remembered_for_a_while_and_forgotten_on_change():
    async def scenario():
        store, clock = Switchable(MemoryRegistryStore()), Clock()
        auth = Authenticator(ADMIN, RegistrySeam(store), 30, clock=clock)
        issued = await store.inner.create_tenant("acme")
        header = f"Bearer {issued.api_key}"
        await auth.authenticate(header)
        calls = store.calls
        await auth.authenticate(header)
        assert store.calls == calls, "a remembered key costs no store call"
        await store.inner.rotate_tenant_key("acme")  # without telling `auth`
        assert (await auth.authenticate(header)).tenant == "acme"  # still within the TTL
        clock.now += 31
        with pytest.raises(AuthenticationError):
            await auth.authenticate(header)
        fresh = await store.inner.rotate_tenant_key("acme")
        await auth.authenticate(f"Bearer {fresh.api_key}")
        await store.inner.delete_tenant("acme")
        auth.forget_tenant("acme")  # what the change event does
        with pytest.raises(AuthenticationError):
            await auth.authenticate(f"Bearer {fresh.api_key}")

    asyncio.run(scenario())


def test_known_keys_work_while_the_store_is_down_and_unknown_ones_get_503():
    async def scenario():
        store, clock = Switchable(MemoryRegistryStore()), Clock()
        seam = RegistrySeam(store, "test")
        health = seam.health
        auth = Authenticator(ADMIN, seam, 30, clock=clock)
        known = await store.inner.create_tenant("acme")
        unknown = await store.inner.create_tenant("globex")
        await auth.authenticate(f"Bearer {known.api_key}")
        store.down = True
        clock.now += 3600  # long past the TTL: re-checking fails, so the known key stands
        assert (await auth.authenticate(f"Bearer {known.api_key}")).tenant == "acme"
        assert health.down
        with pytest.raises(RegistryDownError):
            await auth.authenticate(f"Bearer {unknown.api_key}")
        assert await auth.authenticate(f"Bearer {ADMIN}") is OPERATOR  # needs no store

    asyncio.run(scenario())


def test_after_the_store_lost_its_data_known_tenants_stay_until_recreated():
    async def scenario():
        store, clock = MemoryRegistryStore(), Clock()
        auth = Authenticator(ADMIN, RegistrySeam(store), 30, clock=clock)
        issued = await store.create_tenant("acme")
        await auth.authenticate(f"Bearer {issued.api_key}")
        await store.delete_tenant("acme")  # as if the store had been wiped
        assert auth.orphan_everything() == 1
        clock.now += 60
        assert (await auth.authenticate(f"Bearer {issued.api_key}")).tenant == "acme"
        auth.forget_tenant("acme")  # the tenant is created again (with a new key)
        with pytest.raises(AuthenticationError):
            await auth.authenticate(f"Bearer {issued.api_key}")

    asyncio.run(scenario())


def test_quotas_refuse_with_the_reason_and_fail_open_when_the_store_is_down():
    async def scenario():
        store = Switchable(MemoryRegistryStore())
        seam = RegistrySeam(store, "test")
        health = seam.health
        keeper = QuotaKeeper(seam, lease_seconds=30)
        caller = Principal("acme", TenantQuota(max_concurrent_requests=1))
        assert await keeper.admit(OPERATOR, NO_COST) is None, "the operator has no quota"
        lease = await keeper.admit(caller, NO_COST)
        assert lease is not None and keeper.running == 1
        with pytest.raises(QuotaExceededError) as refused:
            await keeper.admit(caller, NO_COST)
        assert refused.value.code == "max_concurrent_requests"
        assert refused.value.headers == {"Retry-After": "1"}
        await keeper.finish(caller, lease, tokens=12)
        assert keeper.running == 0 and await store.inner.in_flight("acme") == 0
        store.down = True
        assert await keeper.admit(caller, NO_COST) is None  # admitted without a lease
        assert health.down
        await keeper.finish(caller, None, tokens=5)  # nothing to give back; no error

    asyncio.run(scenario())


def test_a_running_request_keeps_its_lease_past_many_ttls_and_loses_it_once_unwatched():
    """keep_leases_alive refreshes every running request's lease each third of the TTL: on
    a fake clock (the store's and the keeper's sleep alike), a lease held through ten TTLs
    still counts, a finished one is not refreshed, and one no longer refreshed expires."""

    class Clock:  # the store's time; the keeper's sleep moves it
        now = 1_700_000_000.0

        def __call__(self) -> float:
            return self.now

        def advance(self, seconds: float) -> None:
            self.now += seconds

    async def scenario():
        clock = Clock()
        store = MemoryRegistryStore(clock=clock, lease_ttl_s=3)
        periods: asyncio.Queue[None] = asyncio.Queue()
        slept: list[float] = []

        async def sleep(seconds: float) -> None:  # one refresh period per item the test puts
            await periods.get()
            clock.advance(seconds)
            slept.append(seconds)

        keeper = QuotaKeeper(RegistrySeam(store, "test"), lease_seconds=3, sleep=sleep)
        refreshed: list[str] = []
        refresh = store.refresh_request

        async def counted(tenant: str, lease: str) -> bool:
            refreshed.append(lease)
            return await refresh(tenant, lease)

        store.refresh_request = counted
        quota = TenantQuota(max_concurrent_requests=1)
        long_stream = await keeper.admit(Principal("acme", quota), NO_COST)
        short = await keeper.admit(Principal("globex", quota), NO_COST)
        await keeper.finish(Principal("globex", quota), short, tokens=1)
        alive = asyncio.create_task(keeper.keep_leases_alive())

        async def one_period() -> None:
            before = len(slept)
            periods.put_nowait(None)
            for _ in range(1000):  # bounded: the loop needs a few turns, no time
                if len(slept) > before and len(refreshed) >= len(slept):
                    return
                await asyncio.sleep(0)
            raise AssertionError("keep_leases_alive did not refresh after a period")

        for _ in range(30):  # 30 s of the fake clock: ten lease lifetimes
            await one_period()
        assert slept == [1.0] * 30 and set(refreshed) == {long_stream}
        assert await store.in_flight("acme") == 1, "the running request still holds its place"
        with pytest.raises(QuotaExceededError):
            await keeper.admit(Principal("acme", quota), NO_COST)
        keeper.stop()
        periods.put_nowait(None)
        await alive
        clock.advance(3.5)  # no refresh since: the lease outlives its TTL no more
        assert await store.in_flight("acme") == 0

    asyncio.run(scenario())


def test_quotas_reserve_the_worst_case_and_keep_only_what_was_used():
    async def scenario():
        keeper = QuotaKeeper(RegistrySeam(MemoryRegistryStore(), "test"), lease_seconds=30)
        caller = Principal("acme", TenantQuota(tokens_per_minute=100, requests_per_minute=6))
        params = SamplingParams(max_tokens=20, n=2)
        cost = request_cost([5, 5], params, max_model_len=512, sequences_param="prompt")
        assert (cost.tokens, cost.sequences) == (90, 4), "2 prompts x (5 + 2 x 20)"
        lease = await keeper.admit(caller, request_cost([5], SamplingParams(max_tokens=40), 512))
        with pytest.raises(QuotaExceededError) as refused:  # 45 reserved + 90 > 100
            await keeper.admit(caller, cost)
        assert refused.value.code == "tokens_per_minute"
        await keeper.finish(caller, lease, tokens=8)  # it stopped early: 37 come back
        second = await keeper.admit(caller, cost)
        assert second is not None, "8 used + 90 reserved fit in 100"
        await keeper.finish(caller, second, tokens=90)
        never = request_cost([5], SamplingParams(max_tokens=None), 512)
        assert never.tokens == 512, "no max_tokens: the rest of the context"
        with pytest.raises(InvalidRequestError) as too_big:
            await keeper.admit(caller, never)
        assert (too_big.value.param, too_big.value.code) == (
            "max_tokens",
            "exceeds_tokens_per_minute",
        )
        assert "at most 95" in too_big.value.message
        wide = request_cost([1] * 4, SamplingParams(max_tokens=1, n=2), 512, sequences_param="n")
        with pytest.raises(InvalidRequestError) as too_many:
            await keeper.admit(caller, wide)
        assert (too_many.value.param, too_many.value.code) == ("n", "exceeds_requests_per_minute")

    asyncio.run(scenario())


def test_usage_waits_while_the_store_is_down_and_is_written_exactly_once():
    async def scenario():
        store = Switchable(MemoryRegistryStore())
        seam = RegistrySeam(store, "test")
        health = seam.health
        meter = UsageMeter(seam)
        await meter.record("acme", "sql", UsageCounts(3, 4, 1))
        store.down = True
        await meter.record("acme", "sql", UsageCounts(5, 6, 1))
        await meter.record("acme", "sql", UsageCounts(1, 1, 1))
        await meter.record("acme", None, UsageCounts(2, 2, 1))
        assert meter.pending == 2
        assert await meter.flush() is False  # known to be down: nothing tried
        store.down = False
        health.succeeded()
        assert await meter.flush() is True and meter.pending == 0
        assert await meter.flush() is True
        report = await store.inner.get_usage("acme")
        assert report.total == UsageCounts(11, 13, 4)
        assert report.by_adapter == {"sql": UsageCounts(9, 11, 3)}

    asyncio.run(scenario())


def _meta(name: str, lora_int_id: int, tenant: str | None = None, **kw) -> AdapterMetadata:
    fields = dict(
        name=name,
        tenant=tenant,
        base_model="tiny",
        rank=4,
        alpha=8.0,
        target_modules=("q_proj",),
        sha256="ab" * 32,
        size_bytes=10,
        path=name,
        lora_int_id=lora_int_id,
        created_at=time.time(),
    )
    return AdapterMetadata(**{**fields, **kw})


def test_the_catalog_follows_the_store_and_keeps_orphans(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    retired: list[AdapterRecord] = []

    async def retire(record):
        retired.append(record)

    async def scenario():
        catalog = AdapterCatalog(tmp_path, retire)

        async def reread(store):
            """What the sync does when it re-reads the store: each held key refreshed."""
            for key in await catalog.held():
                await catalog.refresh(key, store.get(key))

        async with catalog.lock:
            await catalog.apply(_meta("a", 1))  # as a request's first lookup reads them
            await catalog.apply(_meta("b", 2, tenant="acme"))
        first = await catalog.get("a")
        assert first.lora_request == LoRARequest("a", 1, str(tmp_path / "a"))
        acme, globex = Principal("acme"), Principal("globex")
        assert [r.name for r in await catalog.list(acme)] == ["b"]
        assert (await catalog.get("acme/b")).lora_request.lora_name == "acme/b"
        assert await catalog.visible(acme, "b") is await catalog.visible(OPERATOR, "acme/b")
        assert await catalog.visible(acme, "acme/b") is None, "tenants name no keys"
        assert await catalog.visible(globex, "b") is None
        async with catalog.lock:
            await catalog.apply(_meta("b", 2, tenant="acme", public=True))
            await catalog.apply(_meta("a", 5))  # re-registered: new id, old one retired
            await catalog.refresh("c", _meta("c", 6, path="../outside"))  # not servable here
        assert (await catalog.visible(globex, "b")).public
        assert (await catalog.get("a")).lora_request.lora_int_id == 5
        assert await catalog.get("c") is None
        await asyncio.sleep(0)
        assert [r.lora_request.lora_int_id for r in retired] == [1]
        async with catalog.lock:
            assert await catalog.orphan_everything() == 2
            await reread({})  # the store came back empty
            assert {r.key for r in await catalog.list(OPERATOR)} == {"a", "acme/b"}
            await reread({"a": _meta("a", 9)})  # registered again: the store wins
            assert (await catalog.get("a")).lora_request.lora_int_id == 9
            assert catalog.orphans == {"acme/b"}
            await catalog.refresh("acme/b", None)  # orphans survive a refresh too
            assert await catalog.get("acme/b") is not None
            await catalog.drop_owned_by("acme")
            assert await catalog.get("acme/b") is None and not catalog.orphans

    asyncio.run(scenario())


def test_tenancy_settings_are_checked_and_the_admin_key_never_printed():
    settings = GatewaySettings(
        engine=EngineConfig(), admin_key=ADMIN, redis_url="redis://user:pw@host:6379/0"
    )
    assert ADMIN not in repr(settings) and "pw" not in repr(settings)
    for bad in (
        {"admin_key": "short"},
        {"admin_key": "has a space in it, long enough"},
        {"redis_url": "http://host:6379"},
        {"redis_namespace": ""},
        {"auth_cache_seconds": 0},
        {"quota_lease_seconds": -1},
        {"registry_resync_seconds": True},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GatewaySettings(**bad)
