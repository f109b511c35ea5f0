"""A store object's files are hashed once (issue 47): the fetch that checks them against the
object's id vouches for them (their stamp then, and the id's identity) in the engine's one
IdentityBook (issue 58), so the engine's first read of them does not hash them again. Files
changed in the cache directory after that check have another stamp and are hashed as before,
then refused unless they are still the object's; files written too recently for their stamp
to be trusted (adapters/identity.py, RACY_NS) are hashed again too."""

from __future__ import annotations

import asyncio
import hashlib
from contextlib import contextmanager

import pytest
from stamp_clock_testlib import AheadClock
from test_stored_adapter_fetch import PARAMS, PROMPT, drain, start
from tiny_llama import ALL_MODULES, make_adapters

from loragate.adapters import LoRARequest
from loragate.adapters.identity import SYSTEM_CLOCK, WEIGHTS_FILE, IdentityBook
from loragate.adapters.store import (
    AdapterFetcher,
    CorruptObjectError,
    LocalStore,
    identity_of,
    object_id,
    parse_object_id,
)
from loragate.engine import store_path
from loragate.engine.lora.adapter_residency import identity_book

STORES = ("served", "rewritten", "same_bytes")


@pytest.fixture(scope="module")
def aged(tiny_model_dir, tmp_path_factory):
    """The model, adapters A and B with their identities, and one local store per test
    holding A's object, put there longer ago than RACY_NS by the stamp clock the fetchers
    take (as an upload is, before its first request): the stamps they take are trusted."""
    model_dir = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("vouch")
    specs = {"A": (8, ALL_MODULES, False), "B": (8, ALL_MODULES, False)}
    paths = make_adapters(model_dir, root / "adapters", specs)
    identities = {name: identity_of(path) for name, path in paths.items()}
    oid = object_id(identities["A"])
    for name in STORES:
        LocalStore(root / name).put(oid, paths["A"])
    clock = AheadClock()
    clock.settle()
    return model_dir, paths, identities, root, clock


class _Recorded:
    """A sha256 that notes its hex digest when asked for it."""

    def __init__(self, digest, digests: list[str]):
        self._digest, self._digests = digest, digests

    def hexdigest(self) -> str:
        self._digests.append(self._digest.hexdigest())
        return self._digests[-1]

    def __getattr__(self, name):
        return getattr(self._digest, name)


@pytest.fixture
def digests(monkeypatch) -> list[str]:
    """Every sha256 this process computes from here on (the fetch's check and the reads
    alike, however they hash: in line, in chunks, on a thread of their own)."""
    found: list[str] = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a, **k: _Recorded(real(*a, **k), found))
    return found


@contextmanager
def running(model_dir, fetcher):
    """An engine (test_stored_adapter_fetch's) with ``fetcher``, shut down after."""
    engine = start(model_dir, fetcher)
    try:
        yield engine
    finally:
        engine.shutdown()


def ask(engine, lora: LoRARequest) -> list:
    """One request for ``lora``, to its end: its outputs."""
    return asyncio.run(drain(engine.generate(PROMPT, PARAMS, "r", lora)))


def test_a_fetched_object_is_read_without_hashing_it_again(aged, digests):
    model_dir, paths, identities, root, clock = aged
    oid = object_id(identities["A"])
    fetcher = AdapterFetcher(LocalStore(root / "served"), root / "cache", IdentityBook(clock))
    with running(model_dir, fetcher) as engine:
        outs = ask(engine, LoRARequest("kept", 1, store_path(oid)))
        stats = engine.engine.residency.counts()
    assert outs[-1].finished and outs[-1].lora_sha256 == parse_object_id(oid).sha256
    stamp, identity = fetcher.book.entry(str(root / "served" / oid))
    assert stamp.trusted and identity == parse_object_id(oid)
    assert digests.count(identity.sha256) == 1  # the fetch's check; the read took its word
    assert digests.count(identity.config_sha256) == 1
    assert stats["file_reads"] == stats["vouched_reads"] == 1


def test_an_object_rewritten_after_its_fetch_is_hashed_and_refused(aged, digests):
    model_dir, paths, identities, root, clock = aged
    oid = object_id(identities["A"])
    fetcher = AdapterFetcher(LocalStore(root / "rewritten"), root / "cache", IdentityBook(clock))
    checked = fetcher.ensure(oid)  # the fetch checks it and vouches for it...
    other = (paths["B"] / WEIGHTS_FILE).read_bytes()
    assert len(other) == (checked / WEIGHTS_FILE).stat().st_size
    (checked / WEIGHTS_FILE).write_bytes(other)  # ...then its weights change in place
    with running(model_dir, fetcher) as engine:
        with pytest.raises(CorruptObjectError, match="changed after they were checked"):
            ask(engine, LoRARequest("kept", 1, store_path(oid)))
        stats = engine.engine.residency.counts()
    assert digests.count(identities["B"].sha256) == 1  # the read hashed them
    assert stats["file_reads"] == 1 and stats["vouched_reads"] == 0
    assert fetcher.book.entry(str(checked)) is None  # the cached copy was dropped with its word


def test_an_object_rewritten_with_the_same_bytes_is_hashed_and_served(aged, digests):
    model_dir, paths, identities, root, clock = aged
    oid = object_id(identities["A"])
    fetcher = AdapterFetcher(LocalStore(root / "same_bytes"), root / "cache", IdentityBook(clock))
    checked = fetcher.ensure(oid)
    (checked / WEIGHTS_FILE).write_bytes((checked / WEIGHTS_FILE).read_bytes())
    with running(model_dir, fetcher) as engine:
        outs = ask(engine, LoRARequest("kept", 1, store_path(oid)))
    assert outs[-1].finished and outs[-1].lora_sha256 == parse_object_id(oid).sha256
    assert digests.count(parse_object_id(oid).sha256) == 2  # the fetch's check and the read


def test_an_object_written_too_recently_to_trust_its_stamp_is_hashed_again(aged, digests, tmp_path):
    model_dir, paths, identities, _, _ = aged
    oid = object_id(identities["B"])
    store = LocalStore(tmp_path / "store")
    store.put(oid, paths["B"])  # just now: a write in the same clock tick could hide
    fetcher = AdapterFetcher(store, tmp_path / "cache")
    with running(model_dir, fetcher) as engine:
        outs = ask(engine, LoRARequest("fresh", 1, store_path(oid)))
    assert outs[-1].finished
    assert not fetcher.book.entry(str(store.path(oid)))[0].trusted
    assert digests.count(parse_object_id(oid).sha256) == 2  # the fetch's check and the read


def test_the_check_and_the_engine_read_write_one_book(aged, digests, tmp_path):
    """The fetcher's check lands in the IdentityBook it was given, which the engine's cache
    reads with: after the check (one hash of each file) the engine's load hashes nothing,
    and what it read is recorded in the same book, so the next admission is a stat."""
    model_dir, paths, identities, _, clock = aged
    oid = object_id(identities["A"])
    store = LocalStore(tmp_path / "store")
    store.put(oid, paths["A"])
    clock.settle()  # the object was put longer ago than the racy window
    book = IdentityBook(clock)
    fetcher = AdapterFetcher(store, tmp_path / "cache", book)
    before = len(digests)
    directory = str(fetcher.ensure(oid))
    stamp, identity = book.entry(directory)
    assert stamp.trusted and identity == parse_object_id(oid)
    assert book.known(directory) is None  # checked against its id, not yet read as an adapter
    assert digests[before:] == [identity.sha256, identity.config_sha256]  # the check's
    with running(model_dir, fetcher) as engine:
        for _ in range(2):  # the second is admitted by a stat
            outs = ask(engine, LoRARequest("one", 1, store_path(oid)))
            assert outs[-1].finished and outs[-1].lora_sha256 == identity.sha256
        stats = engine.engine.residency.counts()
    # the engine's load hashed nothing of them (the engine hashes other things of its own)
    assert digests.count(identity.sha256) == digests.count(identity.config_sha256) == 1
    assert stats["file_reads"] == stats["vouched_reads"] == 1
    assert book.known(directory) == identity  # the engine's read, in the same book


def test_the_engine_keeps_the_fetchers_book_or_one_of_its_own(tmp_path):
    """The engine's one IdentityBook: its fetcher's (whose clock then stamps every read), or,
    without a fetcher, a new one at the engine's stamp clock; a stamp clock other than the
    fetcher book's is refused rather than silently ignored."""
    clock = AheadClock()
    assert identity_book(None, clock).clock is clock
    fetcher = AdapterFetcher(
        LocalStore(tmp_path / "store"), tmp_path / "cache", IdentityBook(clock)
    )
    assert identity_book(fetcher, SYSTEM_CLOCK) is fetcher.book
    assert identity_book(fetcher, clock) is fetcher.book
    with pytest.raises(ValueError, match="stamp_clock"):
        identity_book(fetcher, AheadClock())
