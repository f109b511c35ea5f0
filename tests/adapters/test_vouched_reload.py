"""Weights read back for a request admitted under them are not hashed again while a stat
vouches for their files (issue 47: a cold load's read, hash and check; SHA-256 is most of a
load's CPU time on CPUs without SHA extensions). The same stat admitted the request without
reading anything; files changed since are hashed, and a change fails the request alone."""

from __future__ import annotations

import time

import pytest
import torch
from stamp_clock_testlib import AheadClock

from loragate.adapters import AdapterChangedError, LoRARequest
from loragate.adapters import identity as identity_module
from loragate.adapters import loader as loader_module
from loragate.adapters.identity import CONFIG_FILE, WEIGHTS_FILE, IdentityBook
from loragate.adapters.store import (
    AdapterFetcher,
    LocalStore,
    identity_of,
    object_id,
    parse_object_id,
)
from loragate.engine.lora.adapter_residency import AdapterResidency

RACY_NS = 50_000_000


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch):
    monkeypatch.setattr(identity_module, "RACY_NS", RACY_NS)


def settle():
    time.sleep(RACY_NS / 1e9 + 0.02)


@pytest.fixture
def hashes(monkeypatch):
    """The paths hashed by adapter reads, in order."""
    seen = []
    real = loader_module.hashed_read

    def counted(path, pacing, hash_it=True, lease=None):
        if hash_it:
            seen.append(path.name)
        return real(path, pacing, hash_it, lease)

    monkeypatch.setattr(loader_module, "hashed_read", counted)
    return seen


@pytest.fixture
def evicted(spec, make_adapter):
    """A cache of one CPU place, adapter A admitted under its settled files and then evicted
    by B's read: A's weights must be read back for its request."""
    paths = [make_adapter(name, rank=4, seed=i + 1) for i, name in enumerate("AB")]
    settle()
    a, b = (LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(zip("AB", paths, strict=True)))
    residency = AdapterResidency(spec, max_loras=1, max_lora_rank=8, max_cpu_loras=1)
    first = residency.preload(a)
    weights = {key: (x.clone(), y.clone()) for key, (x, y) in first.weights.items()}
    residency.preload(b)
    assert not residency.in_memory(first.identity)
    identity = residency.admission_identity(a)  # a stat vouches: no read
    assert identity == first.identity
    return residency, a, paths[0], identity, weights


def test_weights_read_back_under_a_vouching_stat_are_not_hashed_again(evicted, hashes):
    residency, request, _, identity, weights = evicted
    reads = residency.counts()["file_reads"]
    adapter = residency.load(request, identity)
    assert hashes == [], "files a stat vouched for were hashed again"
    assert adapter.identity == identity and residency.in_memory(identity)
    assert residency.counts()["file_reads"] == reads + 1
    assert residency.counts()["vouched_reads"] == 1
    assert adapter.weights.keys() == weights.keys()
    for key, (a, b) in weights.items():
        assert torch.equal(adapter.weights[key][0], a) and torch.equal(adapter.weights[key][1], b)


def test_files_changed_after_admission_are_hashed_and_fail_the_request(
    evicted, hashes, make_adapter
):
    residency, request, path, identity, _ = evicted
    other = make_adapter("C", rank=4, seed=9)  # same sizes, other weights
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        (path / name).write_bytes((other / name).read_bytes())
    settle()
    with pytest.raises(AdapterChangedError):
        residency.load(request, identity)
    assert hashes == [CONFIG_FILE, WEIGHTS_FILE]
    assert residency.counts()["vouched_reads"] == 0
    assert not residency.in_memory(identity)


def test_fresh_files_are_hashed_even_when_unchanged(spec, make_adapter, hashes):
    """A stamp inside the racy window vouches for nothing: a write in the same clock tick
    could hide behind it."""
    path = make_adapter("A", rank=4, seed=1)
    request = LoRARequest("A", 1, str(path))
    residency = AdapterResidency(spec, max_loras=1, max_lora_rank=8, max_cpu_loras=1)
    identity = residency.preload(request).identity
    residency.preload(LoRARequest("B", 2, str(make_adapter("B", rank=4, seed=2))))
    hashes.clear()
    identity_module.RACY_NS = 10**18  # every stamp racy
    residency.load(request, identity)
    assert hashes == [CONFIG_FILE, WEIGHTS_FILE]
    assert residency.counts()["vouched_reads"] == 0


def test_a_store_check_vouches_in_the_book_the_cache_reads_with(
    spec, make_adapter, hashes, tmp_path
):
    """The adapter store's check of an object writes what it hashed in the IdentityBook the
    cache is given (issue 58: one book): the cache's first read of the object takes its word
    and hashes nothing; once the fetcher forgets the object, the book holds nothing of it
    and the next read hashes the files."""
    path = make_adapter("A", rank=4, seed=1)
    oid = object_id(identity_of(path))
    store = LocalStore(tmp_path / "store")
    store.put(oid, path)
    clock = AheadClock()
    clock.settle()  # the object was put longer ago than the racy window
    book = IdentityBook(clock)
    fetcher = AdapterFetcher(store, tmp_path / "cache", book)
    request = LoRARequest("A", 1, str(fetcher.ensure(oid)))
    residency = AdapterResidency(spec, max_loras=1, max_lora_rank=8, max_cpu_loras=1, book=book)
    adapter = residency.preload(request)
    assert hashes == [], "files the store's check vouched for were hashed again"
    assert adapter.identity == parse_object_id(oid)
    assert residency.counts()["file_reads"] == residency.counts()["vouched_reads"] == 1
    assert book.known(request.lora_path) == adapter.identity  # the read, in the same book
    fetcher.forget(oid)
    assert book.entry(request.lora_path) is None
    residency.preload(request)
    assert hashes == [CONFIG_FILE, WEIGHTS_FILE]
