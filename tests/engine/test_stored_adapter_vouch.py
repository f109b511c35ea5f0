"""A store object's files are hashed once (issue 47): the fetch that checks them against the
object's id vouches for them (their stamp then, and the id's identity), so the engine's first
read of them does not hash them again. Files changed in the cache directory after that check
have another stamp and are hashed as before, then refused unless they are still the object's;
files written too recently for their stamp to be trusted (adapters/identity.py, RACY_NS) are
hashed again too."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest
from tiny_llama import ALL_MODULES, make_adapters

from loragate.adapters import LoRARequest
from loragate.adapters.identity import RACY_NS, WEIGHTS_FILE
from loragate.adapters.store import (
    AdapterFetcher,
    CorruptObjectError,
    LocalStore,
    identity_of,
    object_id,
    parse_object_id,
)
from loragate.engine import AsyncLLMEngine, EngineConfig, LLMEngine, SamplingParams, store_path

PROMPT = {"prompt_token_ids": [1, 523, 9123, 77, 4051, 300, 12, 881]}
PARAMS = SamplingParams(temperature=0, max_tokens=4, min_tokens=4)
STORES = ("served", "rewritten", "same_bytes")


@pytest.fixture(scope="module")
def aged(tiny_model_dir, tmp_path_factory):
    """The model, adapters A and B with their identities, and one local store per test
    holding A's object, put there longer ago than RACY_NS (as an upload is, before its
    first request): the stamps the fetch takes of them are trusted."""
    model_dir = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("vouch")
    specs = {"A": (8, ALL_MODULES, False), "B": (8, ALL_MODULES, False)}
    paths = make_adapters(model_dir, root / "adapters", specs)
    identities = {name: identity_of(path) for name, path in paths.items()}
    oid = object_id(identities["A"])
    for name in STORES:
        LocalStore(root / name).put(oid, paths["A"])
    time.sleep(RACY_NS / 1e9 + 0.1)
    return model_dir, paths, identities, root


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


def start(model_dir, fetcher) -> AsyncLLMEngine:
    config = EngineConfig(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=64,
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=2,
        max_lora_rank=8,
    )
    return AsyncLLMEngine(LLMEngine(config, adapter_fetcher=fetcher))


async def drain(stream) -> list:
    return [out async for out in stream]


def test_a_fetched_object_is_read_without_hashing_it_again(aged, digests):
    model_dir, paths, identities, root = aged
    oid = object_id(identities["A"])
    fetcher = AdapterFetcher(LocalStore(root / "served"), root / "cache")
    engine = start(model_dir, fetcher)
    lora = LoRARequest("kept", 1, store_path(oid))
    try:
        outs = asyncio.run(drain(engine.generate(PROMPT, PARAMS, "r", lora)))
        stats = engine.engine.residency.cache.stats()
    finally:
        engine.shutdown()
    assert outs[-1].finished and outs[-1].lora_sha256 == parse_object_id(oid).sha256
    stamp, identity = fetcher.vouched(root / "served" / oid)
    assert stamp.trusted and identity == parse_object_id(oid)
    assert digests.count(identity.sha256) == 1  # the fetch's check; the read took its word
    assert digests.count(identity.config_sha256) == 1
    assert stats["file_reads"] == stats["vouched_reads"] == 1


def test_an_object_rewritten_after_its_fetch_is_hashed_and_refused(aged, digests):
    model_dir, paths, identities, root = aged
    oid = object_id(identities["A"])
    fetcher = AdapterFetcher(LocalStore(root / "rewritten"), root / "cache")
    checked = fetcher.ensure(oid)  # the fetch checks it and vouches for it...
    other = (paths["B"] / WEIGHTS_FILE).read_bytes()
    assert len(other) == (checked / WEIGHTS_FILE).stat().st_size
    (checked / WEIGHTS_FILE).write_bytes(other)  # ...then its weights change in place
    engine = start(model_dir, fetcher)
    lora = LoRARequest("kept", 1, store_path(oid))
    try:
        with pytest.raises(CorruptObjectError, match="changed after they were checked"):
            asyncio.run(drain(engine.generate(PROMPT, PARAMS, "r", lora)))
        stats = engine.engine.residency.cache.stats()
    finally:
        engine.shutdown()
    assert digests.count(identities["B"].sha256) == 1  # the read hashed them
    assert stats["file_reads"] == 1 and stats["vouched_reads"] == 0
    assert fetcher.vouched(checked) is None  # the cached copy was dropped with its word


def test_an_object_rewritten_with_the_same_bytes_is_hashed_and_served(aged, digests):
    model_dir, paths, identities, root = aged
    oid = object_id(identities["A"])
    fetcher = AdapterFetcher(LocalStore(root / "same_bytes"), root / "cache")
    checked = fetcher.ensure(oid)
    (checked / WEIGHTS_FILE).write_bytes((checked / WEIGHTS_FILE).read_bytes())
    engine = start(model_dir, fetcher)
    lora = LoRARequest("kept", 1, store_path(oid))
    try:
        outs = asyncio.run(drain(engine.generate(PROMPT, PARAMS, "r", lora)))
    finally:
        engine.shutdown()
    assert outs[-1].finished and outs[-1].lora_sha256 == parse_object_id(oid).sha256
    assert digests.count(parse_object_id(oid).sha256) == 2  # the fetch's check and the read


def test_an_object_written_too_recently_to_trust_its_stamp_is_hashed_again(aged, digests, tmp_path):
    model_dir, paths, identities, _ = aged
    oid = object_id(identities["B"])
    store = LocalStore(tmp_path / "store")
    store.put(oid, paths["B"])  # just now: a write in the same clock tick could hide
    fetcher = AdapterFetcher(store, tmp_path / "cache")
    engine = start(model_dir, fetcher)
    lora = LoRARequest("fresh", 1, store_path(oid))
    try:
        outs = asyncio.run(drain(engine.generate(PROMPT, PARAMS, "r", lora)))
    finally:
        engine.shutdown()
    assert outs[-1].finished
    assert not fetcher.vouched(store.path(oid))[0].trusted
    assert digests.count(parse_object_id(oid).sha256) == 2  # the fetch's check and the read
