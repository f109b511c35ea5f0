"""The content-addressed adapter store (adapters/store.py): objects named by the identity the
engine's caches use, written once, fetched into a cache and checked against their hash."""

from __future__ import annotations

import shutil

import pytest
from s3_testlib import s3_server

from loragate.adapters import load_adapter
from loragate.adapters.store import (
    AdapterFetcher,
    CorruptObjectError,
    LocalStore,
    ObjectNotFoundError,
    S3Store,
    identity_of,
    object_id,
    parse_object_id,
)

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


def test_the_object_id_is_the_identity_the_engine_computes(make_adapter, spec):
    directory = make_adapter("a")
    loaded = load_adapter(directory, spec, max_lora_rank=8)
    oid = object_id(identity_of(directory))
    assert parse_object_id(oid) == loaded.identity
    for bad in ("", "a" * 64, "A" * 64 + "-" + "b" * 64, "../" + "a" * 61 + "-" + "b" * 64):
        with pytest.raises(ValueError):
            parse_object_id(bad)


def test_local_store_keeps_each_object_once(make_adapter, tmp_path):
    directory = make_adapter("a")
    oid = object_id(identity_of(directory))
    store = LocalStore(tmp_path / "store")
    assert not store.has(oid)
    store.put(oid, directory)
    first = (store.path(oid) / WEIGHTS).stat().st_ino
    store.put(oid, directory)  # the same bytes again: nothing is written
    assert (store.path(oid) / WEIGHTS).stat().st_ino == first
    assert [p.name for p in (tmp_path / "store").iterdir()] == [oid] == store.list()
    store.delete(oid)
    assert not store.has(oid) and list((tmp_path / "store").iterdir()) == []


def test_a_local_object_changed_on_disk_is_refused(make_adapter, tmp_path):
    directory = make_adapter("a")
    oid = object_id(identity_of(directory))
    store = LocalStore(tmp_path / "store")
    store.put(oid, directory)
    with open(store.path(oid) / WEIGHTS, "r+b") as file:
        file.seek(-8, 2)
        file.write(b"\xff" * 8)
    with pytest.raises(CorruptObjectError, match="not served"):
        AdapterFetcher(store, tmp_path / "store").ensure(oid)


def test_s3_objects_are_fetched_once_and_checked(make_adapter, tmp_path, s3):
    directory = make_adapter("a")
    oid = object_id(identity_of(directory))
    bucket = s3.new_bucket()
    store = S3Store(f"s3://{bucket}/pre/fix", client=s3.client())
    store.put(oid, directory)
    assert s3.keys(bucket) == [f"pre/fix/{oid}/adapter_config.json", f"pre/fix/{oid}/{WEIGHTS}"]
    s3.client().put_object(Bucket=bucket, Key="pre/fix/not-an-object/x", Body=b"x")
    assert store.list() == [oid]

    fetcher = AdapterFetcher(store, tmp_path / "cache")
    local = fetcher.ensure(oid)
    assert fetcher.ensure(oid) == local and fetcher.fetches == 1
    assert identity_of(local) == parse_object_id(oid)

    # Truncated in the bucket: a cache without a copy refuses it and keeps nothing.
    data = (directory / WEIGHTS).read_bytes()
    s3.client().put_object(Bucket=bucket, Key=f"pre/fix/{oid}/{WEIGHTS}", Body=data[:100])
    cold = AdapterFetcher(store, tmp_path / "cold")
    with pytest.raises(CorruptObjectError, match="corrupt or truncated"):
        cold.ensure(oid)
    assert [p for p in (tmp_path / "cold").iterdir()] == []
    assert cold.fetches == 0

    assert fetcher.prune() == [], "the store still holds it"
    store.delete(oid)
    assert s3.keys(bucket) == ["pre/fix/not-an-object/x"]
    assert fetcher.prune() == [oid] and not fetcher.local.has(oid), "a deleted object's copy goes"
    shutil.rmtree(tmp_path / "cold")
    with pytest.raises(ObjectNotFoundError):
        AdapterFetcher(store, tmp_path / "cold").ensure(oid)
