"""Backups of the registry (loragate.registry.backup), on both stores: export, import into an
empty store (exactly what was there), into a non-empty one (refused, or merged), and files
that are wrong in some way (refused, naming the line). Also what each store says of its own
persistence."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from registry_testlib import spec
from services_testlib import REDIS_URL, flush_namespace

from loragate.registry import TenantQuota, UsageCounts
from loragate.registry.backup import (
    BackupFileError,
    ImportRefused,
    export_registry,
    import_backup,
    read_backup,
)
from loragate.registry.memory import MemoryRegistryStore
from loragate.registry.redis_store import RedisRegistryStore


@pytest.fixture
def new_store(backend):
    """new_store() -> an empty, opened store of the backend's kind (its own namespace)."""
    made, namespaces = [], []

    async def make():
        if backend.kind == "memory":
            store = MemoryRegistryStore()
        else:
            namespaces.append(f"test-backup-{uuid.uuid4().hex}")
            store = RedisRegistryStore(REDIS_URL, namespaces[-1])
        await store.open()
        made.append(store)
        return store

    yield make
    for namespace in namespaces:
        flush_namespace(namespace)


async def populate(store) -> dict[str, str]:
    """Three tenants (quotas, weights, a rotated key), adapters of each kind, usage."""
    keys = {}
    acme = await store.create_tenant(
        "acme", TenantQuota(requests_per_minute=60, tokens_per_minute=5000), weight=2.5
    )
    keys["acme"] = acme.api_key
    keys["globex"] = (await store.create_tenant("globex", TenantQuota(max_adapters=3))).api_key
    await store.create_tenant("initech")
    keys["initech"] = (await store.rotate_tenant_key("initech")).api_key
    await store.register_adapter(spec("sql", tenant="acme", sha256="1" * 64))
    await store.register_adapter(spec("sql", tenant="globex", sha256="2" * 64))
    await store.register_adapter(spec("house", public=True, sha256="3" * 64))
    await store.record_usage("acme", "sql", prompt_tokens=10, completion_tokens=7)
    await store.record_usage("acme", None, prompt_tokens=3, completion_tokens=2)
    await store.record_usage("globex", "house", prompt_tokens=5, completion_tokens=1, requests=2)
    return keys


def strip(snapshot):
    """The records a restore must reproduce (not the store's own epoch and version)."""
    return (snapshot.tenants, snapshot.keys, snapshot.adapters, snapshot.usage)


async def test_import_into_an_empty_store_restores_it_exactly(store, new_store, tmp_path):
    keys = await populate(store)
    path = tmp_path / "registry.jsonl"
    written = await export_registry(store, path, source="test")
    text = path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    for key in keys.values():
        secret = key.split("-", 2)[2]  # lg-<key_id>-<secret>; the secret may hold "-" too
        assert key not in text and secret not in text  # digests only
    empty = await new_store()
    planned = await import_backup(empty, read_backup(path), merge=False, dry_run=True)
    assert planned.describe().startswith("would import 3 tenants (3 keys), 3 adapters")
    assert (await empty.snapshot()).empty  # a dry run writes nothing
    summary = await import_backup(empty, read_backup(path), merge=False)
    assert summary.describe().startswith("imported 3 tenants (3 keys), 3 adapters")
    assert (summary.tenants, summary.keys, summary.adapters, summary.usage) == (3, 3, 3, 2)
    assert strip(await empty.snapshot()) == strip(written.snapshot)
    for tenant, key in keys.items():
        assert await empty.verify_api_key(key) == tenant
    assert (await empty.get_tenant("acme")).weight == 2.5
    highest = max(a.lora_int_id for a in written.snapshot.adapters)
    assert await empty.new_lora_int_id() > highest
    # The restored store works as any other: a new tenant, a re-registration.
    await empty.create_tenant("umbrella")
    again = await empty.register_adapter(spec("sql", tenant="acme", sha256="4" * 64))
    assert again.replaced is not None and again.adapter.lora_int_id > highest


async def test_a_non_empty_store_refuses_unless_merge(store, new_store, tmp_path):
    await populate(store)
    path = tmp_path / "registry.jsonl"
    await export_registry(store, path, source="test")
    backup = read_backup(path)
    other = await new_store()
    await other.create_tenant("acme", TenantQuota(requests_per_minute=1))
    await other.record_usage("acme", None, prompt_tokens=100, completion_tokens=0)
    with pytest.raises(ImportRefused) as refused:
        await import_backup(other, backup, merge=False)
    assert "not empty" in str(refused.value)
    assert refused.value.conflicts == [
        "tenant 'acme' exists with another quota, created_at, key_ids, weight"
    ]
    assert len(await other.list_tenants()) == 1  # nothing written

    summary = await import_backup(other, backup, merge=True)
    assert summary.tenants == 2 and summary.skipped == refused.value.conflicts
    assert summary.names == ["globex", "initech", "acme/sql", "globex/sql", "house"]
    assert "globex, initech, acme/sql, globex/sql, house" in summary.describe()
    assert (await other.get_tenant("acme")).quota.requests_per_minute == 1  # the store's wins
    assert {t.name for t in await other.list_tenants()} == {"acme", "globex", "initech"}
    assert (await other.get_adapter("acme/sql")) is not None  # its tenant exists in the store
    usage = await other.get_usage("acme")  # another epoch: the file's counts are added
    assert usage.total.prompt_tokens == 100 + 13 and usage.by_adapter["sql"].prompt_tokens == 10


async def test_merging_a_backup_of_the_same_epoch_adds_no_usage_twice(store, tmp_path):
    await populate(store)
    path = tmp_path / "registry.jsonl"
    await export_registry(store, path, source="test")
    await store.record_usage("acme", None, prompt_tokens=1, completion_tokens=1)
    summary = await import_backup(store, read_backup(path), merge=True)
    assert summary.usage == 0 and summary.tenants == 0 and summary.adapters == 0
    assert (await store.get_usage("acme")).total.prompt_tokens == 14


def tampered(path, tmp_path, change) -> str:
    """`change(lines)` applied to the backup's JSON lines; the message of the refusal."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    change(lines)
    bad = tmp_path / "tampered.jsonl"
    bad.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(BackupFileError) as refused:
        read_backup(bad)
    return str(refused.value)


async def test_tampered_files_are_refused_naming_the_line(store, tmp_path):
    await populate(store)
    path = tmp_path / "registry.jsonl"
    await export_registry(store, path, source="test")
    read_backup(path)  # the untouched file is fine

    def bad_version(lines):
        lines[0]["version"] = 2

    def duplicate_tenant(lines):
        lines.insert(3, dict(lines[1]))
        lines[-1]["end"]["lines"] += 1

    def short_digest(lines):
        lines[2]["keys"][0]["digest"] = lines[2]["keys"][0]["digest"][:-2]

    def unknown_field(lines):
        lines[1]["tenant"]["quota"]["max_gpus"] = 3

    def cut_short(lines):
        del lines[-1]

    def foreign_key(lines):
        lines[1]["keys"] = lines[2]["keys"]

    assert tampered(path, tmp_path, bad_version).startswith(
        "line 1: format version 2 is not one this loragate reads (1)"
    )
    assert tampered(path, tmp_path, duplicate_tenant) == (
        "line 4: tenant 'acme' appears twice (first on line 2)"
    )
    assert tampered(path, tmp_path, short_digest) == (
        "line 3: key digest of tenant 'globex' must be 64 hex digits, got 62"
    )
    assert tampered(path, tmp_path, unknown_field) == (
        "line 2: tenant field 'quota.max_gpus' is unknown to this loragate version "
        "(a newer export?)"
    )
    lines = len(path.read_text().splitlines())
    assert tampered(path, tmp_path, cut_short) == (
        f"line {lines - 1}: the file ends here without its end line: it was cut short"
    )
    assert tampered(path, tmp_path, foreign_key).startswith("line 2: key ")


async def test_each_store_says_what_it_keeps_over_a_restart(backend):
    persistence = await backend.store.persistence()
    assert persistence.checked
    if backend.kind == "memory":
        assert persistence.mode == "memory" and not persistence.durable
        return
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:  # whatever this Redis runs with (CI's runs with neither AOF nor snapshots)
        config = client.config_get("appendonly", "appendfsync", "save")
    finally:
        client.close()
    expected = "aof" if config["appendonly"] == "yes" else "snapshots" if config["save"] else "none"
    assert persistence.mode == expected
    assert persistence.durable == (expected == "aof")
    assert ("NOT durable" in persistence.summary) == (expected != "aof")


async def test_several_usage_records_in_one_write_add_up_as_one_by_one(store, peer):
    await store.record_usages(
        [
            ("acme", "sql", UsageCounts(3, 4, 1)),
            ("acme", None, UsageCounts(1, 0, 1)),
            ("globex", "house", UsageCounts(0, 2, 0)),
        ]
    )
    await store.record_usages([])
    acme = await peer.get_usage("acme")
    assert acme.total == UsageCounts(4, 4, 2) and acme.by_adapter == {"sql": UsageCounts(3, 4, 1)}
    assert (await peer.get_usage("globex")).by_adapter == {"house": UsageCounts(0, 2, 0)}
    with pytest.raises(ValueError, match="prompt_tokens"):
        await store.record_usages(
            [("acme", None, UsageCounts(1, 0, 0)), ("acme", None, UsageCounts(-1, 0, 0))]
        )
    assert (await peer.get_usage("acme")).total == UsageCounts(4, 4, 2)
