"""The Redis store when Redis is gone, silent, or restarted empty.

Every method raises RegistryUnavailable (one type the gateway catches), and the same
store object works again once Redis is back. The restart test runs its own
redis-server on a free port, so the shared one on 6379 is never stopped.
"""

from __future__ import annotations

import asyncio

import pytest
from services_testlib import PrivateRedis

from loragate.registry import AdapterSpec, ChangeEvent, ChangeKind, RegistryUnavailable, TenantQuota
from loragate.registry.redis_store import RedisRegistryStore

SPEC = AdapterSpec(
    name="sql",
    base_model="tiny-llama",
    rank=4,
    alpha=8,
    target_modules=("q_proj",),
    sha256="cd" * 32,
    size_bytes=10,
    path="adapters/sql",
)


def every_call(store: RedisRegistryStore):
    """One call of each method that talks to Redis."""
    quota = TenantQuota(requests_per_minute=1)
    return {
        "open": store.open(),
        "check_reset": store.check_reset(),
        "ping": store.ping(),
        "new_lora_int_id": store.new_lora_int_id(),
        "register_adapter": store.register_adapter(SPEC),
        "get_adapter": store.get_adapter("sql"),
        "list_adapters": store.list_adapters(),
        "get_adapters": store.get_adapters(["sql"]),
        "public_adapter": store.public_adapter("sql"),
        "adapter_counts": store.adapter_counts("acme"),
        "page_adapters": store.page_adapters(),
        "page_visible_adapters": store.page_visible_adapters("acme"),
        "changes_since": store.changes_since(0),
        "update_adapter": store.update_adapter("sql", public=True),
        "delete_adapter": store.delete_adapter("sql"),
        "create_tenant": store.create_tenant("acme"),
        "get_tenant": store.get_tenant("acme"),
        "list_tenants": store.list_tenants(),
        "set_tenant_quota": store.set_tenant_quota("acme", quota),
        "set_tenant_weight": store.set_tenant_weight("acme", 2.0),
        "rotate_tenant_key": store.rotate_tenant_key("acme"),
        "delete_tenant": store.delete_tenant("acme"),
        "verify_api_key": store.verify_api_key(f"lg-{'0' * 16}-{'A' * 43}"),
        "record_usage": store.record_usage("acme", "sql", prompt_tokens=1, completion_tokens=1),
        "get_usage": store.get_usage("acme"),
        "list_usage": store.list_usage(),
        "try_acquire_request": store.try_acquire_request("acme", quota),
        "release_request": store.release_request("acme", "lease"),
        "refresh_request": store.refresh_request("acme", "lease"),
        "in_flight": store.in_flight("acme"),
        "add_tokens": store.add_tokens("acme", 5),
        "version": store.version(),
    }


async def assert_all_unavailable(store: RedisRegistryStore) -> None:
    for name, call in every_call(store).items():
        with pytest.raises(RegistryUnavailable, match="unreachable"):
            await call
            pytest.fail(f"{name} did not raise RegistryUnavailable")
    with pytest.raises(RegistryUnavailable):
        async with store.watch():
            pass


async def test_every_method_raises_registry_unavailable_on_a_closed_port():
    store = RedisRegistryStore("redis://user:hunter2@127.0.0.1:1", "faults")
    await assert_all_unavailable(store)
    with pytest.raises(RegistryUnavailable) as raised:
        await store.ping()
    assert "hunter2" not in str(raised.value), "credentials never appear in errors"
    await store.close()


async def test_a_silent_server_times_out_as_unavailable():
    async def never_answer(reader, writer):
        await reader.read()  # accept, then say nothing until the client gives up
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisRegistryStore(f"redis://127.0.0.1:{port}", "faults", socket_timeout_s=0.2)
    with pytest.raises(RegistryUnavailable):
        await store.get_adapter("sql")
    with pytest.raises(RegistryUnavailable):
        await store.record_usage("acme", None, prompt_tokens=1, completion_tokens=1)
    await store.close()
    server.close()


@pytest.fixture
def private_redis():
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()


async def test_redis_stopped_then_restarted_empty(private_redis):
    url = f"redis://127.0.0.1:{private_redis.port}"
    store, peer = RedisRegistryStore(url), RedisRegistryStore(url)
    assert await store.open() is True
    assert await peer.open() is False
    before = await store.register_adapter(SPEC)
    issued = await store.create_tenant("acme")

    async with peer.watch() as events:
        private_redis.stop()
        # A feed that missed the lost connection would poll on forever: the bound only
        # turns that hang into a failure (it is a TimeoutError, not RegistryUnavailable).
        with pytest.raises(RegistryUnavailable):
            await asyncio.wait_for(anext(events), 60)
    await assert_all_unavailable(store)

    private_redis.start()
    # The same objects work again, and both replicas learn that Redis lost its data.
    assert await store.check_reset() is True
    assert await peer.check_reset() is True
    assert await store.list_adapters() == []
    assert await store.verify_api_key(issued.api_key) is None
    async with peer.watch() as events:
        registered = await store.register_adapter(SPEC)
        assert registered.adapter.lora_int_id > before.adapter.lora_int_id, "ids stay new"
        event = await asyncio.wait_for(anext(events), 1.0)
        assert event == ChangeEvent(ChangeKind.ADAPTER_REGISTERED, "sql")
    await store.close()
    await peer.close()
