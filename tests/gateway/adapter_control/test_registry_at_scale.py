"""The registry at 100,000 adapters (issue 46, must-show 4), on a Redis of the test's own.

100,000 adapter records (metadata only, over 100 tenants, sharing four weight folders) are
written in one restore. Then:
- a name lookup, a public name, a tenant's counters and a page of 100 each take one round
  trip (the test counts the commands the store sends), and none runs a command that reads
  a whole hash or index (Redis's own command counts, scripts' inner calls included);
- a gateway starts on it without reading the records (Redis's bytes sent stay far below
  the table's size), answers a completion on the last tenant's last adapter, and lists
  adapters a page at a time;
- one change made elsewhere reaches the gateway as one record read (its sync reads the
  change log, then the one record it holds).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import redis
from servers_testlib import start_tiny_server
from services_testlib import PrivateRedis
from tenancy_testlib import ADMIN_KEY

from loragate.registry import AdapterMetadata
from loragate.registry.adapter_index import AdapterCounts
from loragate.registry.redis_store import RedisRegistryStore
from loragate.registry.snapshot import RegistrySnapshot

TENANTS = 100
PER_TENANT = 1000
NAMESPACE = "scale"
SCANS = ("hgetall", "hvals", "hkeys", "scan", "hscan", "zscan", "sscan", "smembers", "keys")


def records(created: float) -> list[AdapterMetadata]:
    """Tenant t owns a0000..a0999, each pointing at one of the tenant-root folders."""
    folders = ["acme/sql", "acme/tone", "globex/sql", "house"]
    out = []
    for t in range(TENANTS):
        for i in range(PER_TENANT):
            n = t * PER_TENANT + i
            out.append(
                AdapterMetadata(
                    name=f"a{i:04d}",
                    tenant=f"t{t:03d}",
                    public=n == 0,
                    base_model="tiny-llama",
                    rank=4,
                    alpha=8.0,
                    target_modules=("q_proj", "v_proj"),
                    sha256="ab" * 32,
                    size_bytes=100 + i,
                    path=folders[n % 4],
                    lora_int_id=n + 1,
                    created_at=created,
                )
            )
    return out


class CountingRedis:
    """Counts the round trips a store's client makes (a script call is one)."""

    def __init__(self, client):
        self.calls: list[str] = []
        inner = client.execute_command

        async def counted(*args, **options):
            self.calls.append(str(args[0]).lower())
            return await inner(*args, **options)

        client.execute_command = counted


def command_counts(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def scans_in(counts: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in counts.items() if name in SCANS}


async def one_round_trip_each(url: str, admin: redis.Redis) -> None:
    store = RedisRegistryStore(url, NAMESPACE)
    await store.open()
    counter = CountingRedis(store._redis)
    last = f"t{TENANTS - 1:03d}"
    checks = {
        "name lookup": (lambda: store.get_adapter(f"{last}/a0999"), lambda a: a.size_bytes == 1099),
        "public name": (lambda: store.public_adapter("a0000"), lambda a: a.key == "t000/a0000"),
        "tenant count": (
            lambda: store.adapter_counts(last),
            lambda c: c == AdapterCounts(PER_TENANT, sum(100 + i for i in range(PER_TENANT))),
        ),
        "page of 100": (
            lambda: store.page_adapters(after="t050/a0499", limit=100),
            lambda p: [a.key for a in p.data][::99] == ["t050/a0500", "t050/a0599"] and p.has_more,
        ),
        "tenant page of 100": (
            lambda: store.page_visible_adapters("t007", after="a0899", limit=100),
            lambda p: len(p.data) == 100 and p.data[-1].key == "t007/a0999" and not p.has_more,
        ),
    }
    for what, (call, check) in checks.items():
        await call()  # a script's first call in a process loads it (once)
        admin.config_resetstat()
        counter.calls.clear()
        assert check(await call()), what
        assert len(counter.calls) == 1, (what, counter.calls)
        counts = command_counts(admin)
        assert not scans_in(counts), (what, counts)
        assert sum(counts.values()) <= 5, (what, counts)  # the script's own few calls
    await store.close()


def test_a_hundred_thousand_adapters(tiny_dir, tenant_root):
    private = PrivateRedis().start()
    admin = redis.Redis.from_url(private.url, decode_responses=True)
    try:
        asyncio.run(load(private.url))
        assert admin.hlen(f"{NAMESPACE}:adapters") == TENANTS * PER_TENANT
        table_bytes = admin.memory_usage(f"{NAMESPACE}:adapters")
        asyncio.run(one_round_trip_each(private.url, admin))
        baseline = asyncio.run(writer_reads(private.url, admin, "t098/a0001"))

        sent_before = admin.info("stats")["total_net_output_bytes"]
        server = start_tiny_server(
            tiny_dir,
            adapter_root=tenant_root,
            redis_url=private.url,
            redis_namespace=NAMESPACE,
            admin_key=ADMIN_KEY,
            registry_resync_seconds=3600,
        )
        try:
            sent = admin.info("stats")["total_net_output_bytes"] - sent_before
            assert sent < table_bytes / 50, f"the gateway read {sent} bytes to start"
            check_gateway(server.url, admin, table_bytes, private.url, baseline)
        finally:
            server.stop()
    finally:
        admin.close()
        private.stop()


async def load(url: str) -> None:
    store = RedisRegistryStore(url, NAMESPACE)
    await store.open()
    for t in range(TENANTS):
        await store.create_tenant(f"t{t:03d}")
    every = records(time.time())
    for start in range(0, len(every), 20_000):  # a few transactions, not one huge one
        chunk = tuple(every[start : start + 20_000])
        await store.restore(
            RegistrySnapshot(adapters=chunk, last_lora_int_id=len(every)), expect_version=None
        )
    await store.close()


def check_gateway(
    url: str, admin: redis.Redis, table_bytes: int, redis_url: str, baseline: dict[str, int]
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    last = f"t{TENANTS - 1:03d}/a0999"
    body = {"model": last, "prompt": "hello there", "max_tokens": 4, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == last

    sent_before = admin.info("stats")["total_net_output_bytes"]
    first = httpx.get(f"{url}/v1/adapters", headers=headers, timeout=30).json()
    assert len(first["data"]) == 100 and first["has_more"]
    # "house", the operator's folder in the adapter root the gateway preloads, sorts first
    assert first["first_id"] == "house" and first["last_id"] == "t000/a0098"
    after = httpx.get(
        f"{url}/v1/adapters", params={"after": "t099/a0989"}, headers=headers, timeout=30
    ).json()
    assert [a["name"] for a in after["data"]] == [f"t099/a{i:04d}" for i in range(990, 1000)]
    assert not after["has_more"]
    models = httpx.get(f"{url}/v1/models", params={"limit": 5}, headers=headers).json()
    expected = ["house"] + [f"t000/a{i:04d}" for i in range(4)]
    assert [m["id"] for m in models["data"][1:]] == expected
    assert models["has_more"] and models["last_id"] == "t000/a0003"
    sent = admin.info("stats")["total_net_output_bytes"] - sent_before
    assert sent < table_bytes / 50, f"three pages read {sent} bytes"

    # One change made elsewhere: the gateway reads the change log and that one record.
    asyncio.run(change_and_count(redis_url, admin, url, last, baseline))


async def writer_reads(url: str, admin: redis.Redis, key: str) -> dict[str, int]:
    """The commands another replica's store runs to make `key` public (measured on a key
    the gateway does not hold, before it starts), so that what the gateway adds shows."""
    writer = RedisRegistryStore(url, NAMESPACE)
    await writer.open()
    admin.config_resetstat()
    await writer.update_adapter(key, public=True)
    counts = command_counts(admin)
    await writer.close()
    return counts


async def change_and_count(
    url: str, admin: redis.Redis, gateway: str, key: str, baseline: dict[str, int]
) -> None:
    writer = RedisRegistryStore(url, NAMESPACE)
    await writer.open()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    admin.config_resetstat()
    await writer.update_adapter(key, public=True)
    async with httpx.AsyncClient(base_url=gateway, headers=headers) as client:
        for _ in range(600):
            shown = (await client.get(f"/v1/adapters/{key}")).json()
            if shown["public"]:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the change never reached the gateway")
    counts = command_counts(admin)
    await writer.close()
    assert not scans_in(counts), counts
    assert counts.get("hmget", 0) == baseline.get("hmget", 0), counts
    assert counts.get("hget", 0) == baseline.get("hget", 0) + 1, (counts, baseline)
