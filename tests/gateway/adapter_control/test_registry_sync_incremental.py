"""The registry sync reads what changed, never the whole table (issue 46).

A real RegistrySync and catalog over an in-memory store wrapped to count every store call:
a sync that starts reads no adapter; a request reads the adapter it names once (and a
name the store lacks once); a change to an adapter held here costs one record read, to
one not held none; and when the change log was trimmed past the sync's version, it
re-reads only what it holds, in one read. A restored backup of a thousand records is one
change: the same one read of what is held, nothing else.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter

import msgspec

from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.sync import RegistrySync
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.auth import Authenticator
from loragate.gateway.tenancy.principal import OPERATOR, Principal
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import AdapterMetadata, AdapterSpec
from loragate.registry.memory import MemoryRegistryStore
from loragate.registry.snapshot import RegistrySnapshot

READS = (
    "get_adapter",
    "get_adapters",
    "public_adapter",
    "list_adapters",
    "page_adapters",
    "snapshot",
)


class CountingStore:
    """Forwards to `store`, counting each coroutine method called."""

    def __init__(self, store):
        self.store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str):
        method = getattr(self.store, name)
        if not inspect.iscoroutinefunction(method):
            return method

        async def counted(*args, **kwargs):
            self.calls[name] += 1
            return await method(*args, **kwargs)

        return counted

    def reads(self) -> dict[str, int]:
        return {name: self.calls[name] for name in READS if self.calls[name]}


def spec(name: str, tenant: str | None = None, public: bool = False) -> AdapterSpec:
    return AdapterSpec(
        name=name,
        tenant=tenant,
        public=public,
        base_model="tiny-llama",
        rank=4,
        alpha=8,
        target_modules=("q_proj",),
        sha256="ab" * 32,
        size_bytes=10,
        path=name if tenant is None else f"{tenant}/{name}",
    )


async def settled(condition, what: str) -> None:
    for _ in range(500):
        if await condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


def test_the_sync_reads_only_what_changed_and_is_held_here(tmp_path):
    for name in [f"a{i}" for i in range(50)] + ["acme/own"]:
        (tmp_path / name).mkdir(parents=True)

    async def scenario():
        memory = MemoryRegistryStore(change_log_size=4)
        await memory.create_tenant("acme")
        for i in range(50):
            await memory.register_adapter(spec(f"a{i}", public=i == 3))
        store = CountingStore(memory)
        seam = RegistrySeam(store, "memory")

        async def retire(record):
            return None

        catalog = AdapterCatalog(tmp_path, retire, seam)
        auth = Authenticator(None, seam, 60)
        sync = RegistrySync(seam, catalog, auth, UsageMeter(seam), resync_seconds=3600)
        await sync.start()
        try:
            assert store.reads() == {}, "a sync that starts reads no adapter"
            assert await catalog.held() == []

            assert (await catalog.visible(OPERATOR, "a7")).lora_request.lora_int_id == 8
            assert (await catalog.visible(Principal("acme"), "a3")).key == "a3"
            assert await catalog.visible(Principal("acme"), "nope") is None
            assert store.reads() == {"get_adapter": 3, "public_adapter": 2}
            for _ in range(3):  # held, or remembered missing: no more reads
                await catalog.visible(OPERATOR, "a7")
                await catalog.visible(Principal("acme"), "a3")
                await catalog.visible(Principal("acme"), "nope")
            assert store.reads() == {"get_adapter": 3, "public_adapter": 2}

            store.calls.clear()
            await memory.update_adapter("a7", public=True)  # held here: one record read
            await settled(lambda: _public(catalog, "a7"), "the change never arrived")
            assert store.reads() == {"get_adapter": 1}
            store.calls.clear()
            await memory.delete_adapter("a20")  # not held here: nothing to read
            await settled(lambda: _caught_up(sync, memory), "the sync never caught up")
            assert store.reads() == {}
            await memory.register_adapter(spec("nope", "acme"))  # a miss is forgotten
            await settled(lambda: _caught_up(sync, memory), "the sync never caught up")
            (tmp_path / "acme" / "nope").mkdir()
            assert (await catalog.visible(Principal("acme"), "nope")).key == "acme/nope"
            assert store.reads() == {"get_adapter": 1}

            store.calls.clear()
            read_before = sync.records_read
            async with catalog.lock:  # the sync waits while more changes than the log keeps
                for i in range(10, 16):
                    await memory.update_adapter(f"a{i}", public=True)
                await memory.update_adapter("a7", public=False)
            await settled(lambda: _caught_up(sync, memory), "the sync never caught up")
            held = await catalog.held()
            assert sorted(held) == ["a3", "a7", "acme/nope"]
            assert store.reads() == {"get_adapters": 1}, "it re-reads what it holds, at once"
            assert sync.records_read - read_before == len(held)
            assert not (await catalog.get("a7")).public
        finally:
            await sync.stop()

    asyncio.run(scenario())


def test_a_restored_backup_is_one_change_that_rereads_only_what_is_held(tmp_path):
    for name in ["a1", "a2", "acme/late"]:
        (tmp_path / name).mkdir(parents=True)

    async def scenario():
        memory = MemoryRegistryStore()
        await memory.create_tenant("acme")
        for name in ("a1", "a2"):
            await memory.register_adapter(spec(name))
        store = CountingStore(memory)
        seam = RegistrySeam(store, "memory")

        async def retire(record):
            return None

        catalog = AdapterCatalog(tmp_path, retire, seam)
        sync = RegistrySync(
            seam, catalog, Authenticator(None, seam, 60), UsageMeter(seam), resync_seconds=3600
        )
        await sync.start()
        try:
            assert (await catalog.visible(OPERATOR, "a1")) is not None
            assert await catalog.visible(Principal("acme"), "late") is None  # a miss
            held = (await memory.snapshot()).adapters
            a1 = next(a for a in held if a.key == "a1")
            backup = [msgspec.structs.replace(a1, public=True)]  # a1, changed
            ids = iter(range(1000, 3000))
            for i in range(1000):
                made = spec(f"r{i}", "acme" if i % 2 else None)
                backup.append(_metadata(made, next(ids)))
            backup.append(_metadata(spec("late", "acme"), next(ids)))
            store.calls.clear()
            read_before, version = sync.records_read, await memory.version()
            await memory.restore(RegistrySnapshot(adapters=tuple(backup)), expect_version=None)
            assert await memory.version() == version + 1, "one change, however many records"
            await settled(lambda: _caught_up(sync, memory), "the sync never caught up")
            assert sync.restores_seen == 1
            assert store.reads() == {"get_adapters": 1}, "only what is held, in one read"
            assert sync.records_read - read_before == 1
            assert (await catalog.get("a1")).public
            assert (await catalog.visible(Principal("acme"), "late")).key == "acme/late"
        finally:
            await sync.stop()

    asyncio.run(scenario())


def _metadata(made: AdapterSpec, lora_int_id: int):
    return AdapterMetadata(**msgspec.structs.asdict(made), lora_int_id=lora_int_id, created_at=1.0)


async def _public(catalog: AdapterCatalog, key: str) -> bool:
    record = await catalog.get(key)
    return record is not None and record.public


async def _caught_up(sync: RegistrySync, store: MemoryRegistryStore) -> bool:
    return sync.version == await store.version() and not sync.catalog.lock.locked()
