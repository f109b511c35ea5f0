"""The registry at 100,000 adapters (issue 46, must-show 4; issue 60, must-show 5), on a
Redis of the test's own.

100,000 adapter records (metadata only, over 100 tenants, sharing four weight folders) are
imported the way an operator restores a backup, `loragate registry import --merge`, into a
registry that holds the 100 tenants, through a proxy that slows every byte to and from
Redis so much that the import's traffic takes several times the store's socket timeout
(the old single MULTI failed this way: "unreachable: Timeout writing to socket"). It
succeeds as one change (the version moves by one), and a reader polling meanwhile, as
another replica would, sees the old registry or the new one on every read (by a tenant's
counters, a page, a tenant's view, the last record), never a mix, and never the old after
the new. Then:
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
import inspect
import threading
import time
from pathlib import Path

import httpx
import redis
from click.testing import CliRunner
from servers_testlib import start_tiny_server
from services_testlib import PrivateRedis
from slow_proxy_testlib import SlowProxy
from tenancy_testlib import ADMIN_KEY

from loragate.gateway.assembly.cli import main
from loragate.registry import AdapterMetadata
from loragate.registry.adapter_index import AdapterCounts
from loragate.registry.backup_file import backup_lines
from loragate.registry.redis_store import RedisRegistryStore
from loragate.registry.snapshot import RegistrySnapshot

TENANTS = 100
PER_TENANT = 1000
NAMESPACE = "scale"
# The store's socket timeout, which one MULTI of the whole import had to fit in.
SOCKET_TIMEOUT_S = inspect.signature(RedisRegistryStore).parameters["socket_timeout_s"].default
SLOWED_PAST = 3  # the slowed import's traffic takes this many socket timeouts, at least
SLOW_RATE = 6_000_000  # bytes a second through the proxy (the import sends about 43 MB)
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


def test_a_hundred_thousand_adapters(tiny_dir, tenant_root, tmp_path):
    private = PrivateRedis().start()
    admin = redis.Redis.from_url(private.url, decode_responses=True)
    try:
        backup = asyncio.run(old_registry_and_backup(private.url, tmp_path / "backup.jsonl"))
        version = int(admin.get(f"{NAMESPACE}:version"))
        import_while_a_reader_polls(private, backup)
        # One announcement for the whole import, not one per record.
        assert int(admin.get(f"{NAMESPACE}:version")) == version + 1
        assert admin.zcard(f"{NAMESPACE}:changes") == version + 1
        assert admin.hlen(f"{NAMESPACE}:adapters") == TENANTS * PER_TENANT
        assert not list(admin.scan_iter(match=f"{NAMESPACE}:staging:*"))
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


async def old_registry_and_backup(url: str, path: Path) -> Path:
    """The registry before the import: the 100 tenants (and their keys). The backup file:
    the same tenants and the 100,000 adapters."""
    store = RedisRegistryStore(url, NAMESPACE)
    await store.open()
    for t in range(TENANTS):
        await store.create_tenant(f"t{t:03d}")
    held = await store.snapshot()
    await store.close()
    every = tuple(records(time.time()))
    snapshot = RegistrySnapshot(
        tenants=held.tenants, keys=held.keys, adapters=every, last_lora_int_id=len(every)
    )
    with open(path, "w", encoding="utf-8") as out:
        for line in backup_lines(snapshot, source="test", exported_at=time.time()):
            out.write(line + "\n")
    return path


# What another replica reads while the import runs: (what, read, the old registry's answer,
# the new one's). Each is one atomic read.
LAST = f"t{TENANTS - 1:03d}"
READS = (
    (
        "the last tenant's counters",
        lambda store: store.adapter_counts(LAST),
        AdapterCounts(0, 0),
        AdapterCounts(PER_TENANT, sum(100 + i for i in range(PER_TENANT))),
    ),
    (
        "a page in the middle",
        lambda store: _keys(store.page_adapters(after="t049/a0999", limit=2)),
        [],
        ["t050/a0000", "t050/a0001"],
    ),
    (
        "the first tenant's view",
        lambda store: _keys(store.page_visible_adapters("t000", limit=2)),
        [],
        ["t000/a0000", "t000/a0001"],
    ),
    (
        "the last record",
        lambda store: _key(store.get_adapter(f"{LAST}/a{PER_TENANT - 1:04d}")),
        None,
        f"{LAST}/a{PER_TENANT - 1:04d}",
    ),
)


async def _keys(page) -> list[str]:
    return [a.key for a in (await page).data]


async def _key(record) -> str | None:
    found = await record
    return None if found is None else found.key


class Reader:
    """Polls READS on a connection of its own (not slowed) until stopped, noting for each
    read whether it gave the old registry's answer or the new one's, and how many bytes of
    the import the proxy had forwarded by then."""

    def __init__(self, url: str, proxy: SlowProxy):
        self.url = url
        self.proxy = proxy
        self.seen: list[tuple[str, str, int]] = []
        self.polled_old = threading.Event()  # a whole poll saw the old registry
        self.polled_new = threading.Event()  # a whole poll saw the new one
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._poll()), daemon=True)

    async def _poll(self) -> None:
        store = RedisRegistryStore(self.url, NAMESPACE)
        try:
            while not self.stop.is_set():
                states = set()
                for what, read, old, new in READS:
                    forwarded = self.proxy.bytes_up
                    answer = await read(store)
                    state = "old" if answer == old else "new" if answer == new else repr(answer)
                    self.seen.append((what, state, forwarded))
                    states.add(state)
                if states == {"old"}:
                    self.polled_old.set()
                if states == {"new"}:
                    self.polled_new.set()
        finally:
            await store.close()


def import_while_a_reader_polls(private: PrivateRedis, backup: Path) -> None:
    proxy = SlowProxy(private.port, rate=SLOW_RATE).start()
    reader = Reader(private.url, proxy)
    reader.thread.start()
    try:
        assert reader.polled_old.wait(60), "the reader never read the old registry"
        result = CliRunner().invoke(
            main,
            ["registry", "import", str(backup), "--merge", "--redis-url", proxy.url]
            + ["--redis-namespace", NAMESPACE],
        )
        assert result.exit_code == 0, result.output
        assert result.output.startswith("imported 0 tenants (0 keys), 100000 adapters")
        assert "t000/a0049 and 99950 more" in result.output
        assert reader.polled_new.wait(60), "the reader never read the new registry"
    finally:
        reader.stop.set()
        reader.thread.join(60)
        proxy.stop()
    # Slowed well past the timeout one MULTI of the whole import had to fit in.
    assert proxy.added_s >= SLOWED_PAST * SOCKET_TIMEOUT_S, proxy.added_s
    states = [state for _, state, _ in reader.seen]
    assert set(states) == {"old", "new"}, [s for s in reader.seen if s[1] not in ("old", "new")]
    first_new = states.index("new")
    assert "old" not in states[first_new:], "the old registry came back after the new one"
    # Some of the old registry's answers came while most of the import had been written.
    midway = [up for _, state, up in reader.seen if state == "old" and up > proxy.bytes_up // 2]
    assert midway, "no read happened while the import was being written"


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
