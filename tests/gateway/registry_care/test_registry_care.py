"""The parts of issue 38 that need no server: the settings' checks, the persistence check's
verdicts, scheduled backups (written, pruned, held back while the store lost its data), and
what /health says of a loss. The servers themselves: test_registry_durability.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from async_waits_testlib import wait_until
from click.testing import CliRunner

from loragate.gateway.assembly.cli import main
from loragate.gateway.registry_care.care import (
    RegistryCare,
    RegistryNotDurable,
    newest_backup,
)
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.settings import GatewaySettings
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import TenantQuota, UsageCounts
from loragate.registry.backup import read_backup
from loragate.registry.memory import MemoryRegistryStore
from loragate.registry.persistence import from_redis_config


def test_settings_refuse_what_cannot_work(tmp_path):
    with pytest.raises(ValueError, match="require_durable_registry needs redis_url"):
        GatewaySettings(require_durable_registry=True)
    with pytest.raises(ValueError, match="registry_backup_every must be > 0 seconds"):
        GatewaySettings(registry_backup_every=0)
    with pytest.raises(ValueError, match="registry_backup_keep must be an integer >= 1"):
        GatewaySettings(registry_backup_keep=0)
    with pytest.raises(FileNotFoundError, match="registry_backup_dir is not a directory"):
        GatewaySettings(registry_backup_dir=tmp_path / "missing")
    assert GatewaySettings(registry_backup_dir=tmp_path).registry_backup_dir == tmp_path


def test_what_redis_says_of_its_persistence():
    where = "redis://db:6379"
    aof = from_redis_config(where, {"appendonly": "yes", "appendfsync": "everysec", "save": ""})
    assert aof.durable and aof.mode == "aof" and aof.fsync == "everysec"
    assert "durable: AOF with appendfsync everysec" in aof.summary
    assert "the last second" in aof.summary
    always = from_redis_config(where, {"appendonly": "yes", "appendfsync": "always"})
    assert always.durable and "losing no acknowledged write" in always.summary
    rdb = from_redis_config(where, {"appendonly": "no", "save": "3600 1 300 100"})
    assert not rdb.durable and rdb.mode == "snapshots" and "since the last snapshot" in rdb.summary
    none = from_redis_config(where, {"appendonly": "no", "save": ""})
    assert not none.durable and "NOT durable: no AOF and no snapshots" in none.summary


def care_of(store, tmp_path, orphans=False, **settings) -> RegistryCare:
    options = dict(registry_backup_dir=tmp_path, registry_backup_every=3600, **settings)
    return RegistryCare(RegistrySeam(store), GatewaySettings(**options), lambda: orphans)


async def test_a_required_durable_registry_refuses_a_volatile_store(tmp_path, caplog):
    settings = dict(redis_url="redis://unused:6379", require_durable_registry=True)
    care = care_of(MemoryRegistryStore(), tmp_path, **settings)
    with pytest.raises(RegistryNotDurable, match="refusing to start: in-memory registry"):
        await care.check_persistence()
    relaxed = care_of(MemoryRegistryStore(), tmp_path)
    with caplog.at_level(logging.INFO, logger="loragate.registry_care"):
        assert (await relaxed.check_persistence()).mode == "memory"
    assert [r.message for r in caplog.records if "registry persistence" in r.message] == [
        "registry persistence: in-memory registry: tenants, keys, adapters and usage end "
        "with this process"
    ]


async def test_scheduled_backups_are_written_pruned_and_found_again(tmp_path):
    store = MemoryRegistryStore()
    await store.create_tenant("acme", TenantQuota(tokens_per_minute=10))
    care = care_of(store, tmp_path, registry_backup_keep=3)
    written = [await care.back_up() for _ in range(5)]
    files = sorted(tmp_path.glob("registry-*.jsonl"))
    assert [f.name for f in files] == sorted(w.path.name for w in written[-3:])
    assert care.newest_backup == written[-1] and written[-1].tenants == 1
    assert [t.name for t in read_backup(files[-1]).snapshot.tenants] == ["acme"]
    found = newest_backup(tmp_path)  # what a restarted gateway knows from the folder
    assert found.path == written[-1].path and found.exported_at == written[-1].exported_at
    (tmp_path / "registry-not-a-backup.jsonl").write_text("{}\n")
    assert newest_backup(tmp_path).path == written[-1].path


async def test_backups_wait_while_the_store_lost_its_data(tmp_path):
    store = MemoryRegistryStore()
    await store.create_tenant("acme")
    good = await care_of(store, tmp_path).back_up()

    orphaned = care_of(store, tmp_path, orphans=True)
    assert await orphaned.back_up() is None
    assert "lost its data" in orphaned.backup_error

    emptied = care_of(MemoryRegistryStore(), tmp_path)
    emptied.newest_backup = newest_backup(tmp_path)
    assert await emptied.back_up() is None
    assert f"the newest backup, {good.path}, holds 1 tenants" in emptied.backup_error
    assert list(tmp_path.glob("registry-*.jsonl")) == [good.path]

    note = emptied.lost_data_note(good.exported_at + 42)
    assert f"the newest backup, {good.path}, was written at" in note
    assert "42 s before the loss was noticed" in note
    assert f"`loragate registry import {good.path} --merge`" in note
    assert care_of(store, tmp_path).lost_data_note(None) is None


def test_a_backup_header_says_what_it_holds(tmp_path):
    path = tmp_path / "registry-1.jsonl"
    header = {"format": "loragate-registry", "version": 1, "exported_at": time.time()}
    path.write_text(json.dumps({**header, "tenants": 2}) + "\n")
    assert newest_backup(tmp_path).tenants == 2


async def test_a_starting_replica_backs_up_at_once_only_if_the_newest_backup_is_due(tmp_path):
    store = MemoryRegistryStore()
    await store.create_tenant("acme")
    care = care_of(store, tmp_path)  # every hour
    care.start()
    try:
        # "At once" against the hour's period: the bound only guards against a hang.
        await wait_until(
            lambda: list(tmp_path.glob("registry-*.jsonl")), "the first backup", every=0.01
        )
        assert len(list(tmp_path.glob("registry-*.jsonl"))) == 1  # none was there: at once
    finally:
        await care.stop()
    again = care_of(store, tmp_path)  # a restart within the hour writes none
    again.start()
    try:
        await asyncio.sleep(0.3)
        assert len(list(tmp_path.glob("registry-*.jsonl"))) == 1
        assert again.newest_backup is not None and again.newest_backup.tenants == 1
    finally:
        await again.stop()


def test_the_registry_commands_say_what_went_wrong(tmp_path):
    unreachable = ["--redis-url", "redis://127.0.0.1:1"]
    got = CliRunner().invoke(main, ["registry", "export", str(tmp_path / "x.jsonl"), *unreachable])
    assert got.exit_code == 1 and "registry store at redis://127.0.0.1:1 is unreachable" in (
        got.output
    )
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    got = CliRunner().invoke(main, ["registry", "import", str(garbage), *unreachable])
    assert got.exit_code == 1 and f"{garbage} is refused: line 1: is not JSON" in got.output
    got = CliRunner().invoke(main, ["registry", "import", str(tmp_path / "none"), *unreachable])
    assert got.exit_code == 2 and "does not exist" in got.output
    got = CliRunner().invoke(main, ["registry", "export", "x", "--redis-url", "http://db"])
    assert got.exit_code == 2 and "redis url must start with redis://" in got.output


class CountingStore(MemoryRegistryStore):
    """Counts the writes of usage, and holds each one a moment (a round trip)."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    async def record_usages(self, records):
        self.writes += 1
        await asyncio.sleep(0.01)
        await super().record_usages(records)


async def test_usage_recorded_together_goes_in_one_write_and_none_is_lost():
    store = CountingStore()
    meter = UsageMeter(RegistrySeam(store))
    calls = [
        meter.record(tenant, adapter, UsageCounts(i, 2 * i, 1))
        for i in range(1, 33)
        for tenant, adapter in (("acme", "sql"), ("globex", None))
    ]
    await asyncio.gather(*calls)  # each returns once its write is done
    assert store.writes <= 2  # the first alone, the rest while it was in flight
    acme, globex = await store.get_usage("acme"), await store.get_usage("globex")
    assert acme.total == globex.total == UsageCounts(528, 1056, 32)
    assert acme.by_adapter == {"sql": UsageCounts(528, 1056, 32)}
    with pytest.raises(ValueError, match="completion_tokens must be an int >= 0"):
        await meter.record("acme", None, UsageCounts(1, -1, 0))
