"""An adapter named by its adapter store object is fetched by hash behind the engine, by its
adapter residency (issue 44: no wrapper around the engine). A request for it is in flight from
`generate` on, while its object is fetched too, so deleting the adapter waits for it (issue
35: no moment where a request is counted by nobody), and its outputs name the store path it
was asked under while the engine runs the verified local copy. A fetched object whose bytes
do not hash to its id is refused, and so is one an engine without a store is asked for."""

from __future__ import annotations

import asyncio
import threading

import pytest
from tiny_llama import ALL_MODULES, make_adapters

from loragate.adapters import LoRARequest
from loragate.adapters.store import (
    AdapterFetcher,
    AdapterStoreError,
    CorruptObjectError,
    LocalStore,
    identity_of,
    object_id,
)
from loragate.engine import AsyncLLMEngine, EngineConfig, LLMEngine, SamplingParams, store_path

PROMPT = {"prompt_token_ids": [1, 523, 9123, 77, 4051, 300, 12, 881]}
PARAMS = SamplingParams(temperature=0, max_tokens=4, min_tokens=4)
WAIT_S = 60


class RemoteStore:
    """A store that is not this engine's cache (as S3 is): objects are copied on fetch. With
    `gate`, each fetch waits until the test sets it."""

    def __init__(self, root):
        self.inner = LocalStore(root)
        self.where = "remote"
        self.gate: threading.Event | None = None

    def has(self, oid):
        return self.inner.has(oid)

    def put(self, oid, directory):
        self.inner.put(oid, directory)

    def fetch(self, oid, into):
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        self.inner.fetch(oid, into)

    def delete(self, oid):
        self.inner.delete(oid)

    def list(self):
        return self.inner.list()


@pytest.fixture(scope="module")
def model_and_adapter(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    specs = {"A": (8, ALL_MODULES, False), "B": (8, ALL_MODULES, False)}
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("stored"), specs)
    return model_dir, paths["A"], paths["B"]


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


def test_a_request_fetching_its_object_is_in_flight_and_runs_the_verified_copy(
    model_and_adapter, tmp_path
):
    model_dir, folder, _ = model_and_adapter
    oid = object_id(identity_of(folder))
    store = RemoteStore(tmp_path / "store")
    store.put(oid, folder)
    store.gate = threading.Event()
    engine = start(model_dir, AdapterFetcher(store, tmp_path / "cache"))
    stored = LoRARequest("kept", 1, store_path(oid))
    by_folder = LoRARequest("folder", 2, str(folder))

    async def scenario():
        run = asyncio.create_task(drain(engine.generate(PROMPT, PARAMS, "r", stored)))
        await asyncio.sleep(0.2)  # its object is being fetched: nothing reached the engine
        assert engine.adapter_in_flight(stored) == 1
        assert not engine.engine.requests
        waiter = asyncio.create_task(engine.wait_adapter_idle(stored))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        store.gate.set()
        outs = await asyncio.wait_for(run, WAIT_S)
        await asyncio.wait_for(waiter, WAIT_S)
        assert engine.adapter_in_flight(stored) == 0
        assert outs[-1].finished and outs[-1].lora_request == stored
        assert outs[-1].lora_sha256 == identity_of(folder).sha256
        again = await drain(engine.generate(PROMPT, PARAMS, "f", by_folder))
        assert again[-1].outputs[0].token_ids == outs[-1].outputs[0].token_ids
        assert (tmp_path / "cache" / oid).is_dir()  # fetched into this engine's own cache

    try:
        asyncio.run(scenario())
        assert engine.engine.residency.counts()["held_weights"] == 0
    finally:
        engine.shutdown()


def test_an_object_that_does_not_hash_to_its_id_is_refused(model_and_adapter, tmp_path):
    model_dir, folder, _ = model_and_adapter
    right = identity_of(folder)
    wrong = object_id(type(right)("f" * 64, right.config_sha256))
    store = RemoteStore(tmp_path / "store")
    store.inner.root.mkdir(parents=True)
    store.put(object_id(right), folder)
    (store.inner.root / object_id(right)).rename(store.inner.root / wrong)
    engine = start(model_dir, AdapterFetcher(store, tmp_path / "cache"))
    lora = LoRARequest("bad", 1, store_path(wrong))

    async def scenario():
        with pytest.raises(CorruptObjectError):
            await drain(engine.generate(PROMPT, PARAMS, "r", lora))
        assert engine.adapter_in_flight(lora) == 0
        assert not (tmp_path / "cache" / wrong).exists()

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()


def test_an_engine_without_a_store_refuses_a_store_path(model_and_adapter):
    model_dir, folder, _ = model_and_adapter
    engine = start(model_dir, None)
    lora = LoRARequest("kept", 1, store_path(object_id(identity_of(folder))))

    async def scenario():
        with pytest.raises(AdapterStoreError, match="without an adapter store"):
            await drain(engine.generate(PROMPT, PARAMS, "r", lora))
        assert engine.adapter_in_flight(lora) == 0

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()


def test_cached_files_changed_after_the_check_are_refused_and_dropped(model_and_adapter, tmp_path):
    """The last check: the weights a request is admitted under must be its object's."""
    model_dir, folder, other = model_and_adapter
    oid = object_id(identity_of(folder))
    store = RemoteStore(tmp_path / "store")
    store.put(oid, folder)
    engine = start(model_dir, AdapterFetcher(store, tmp_path / "cache"))
    lora = LoRARequest("kept", 1, store_path(oid))

    async def scenario():
        assert (await drain(engine.generate(PROMPT, PARAMS, "r1", lora)))[-1].finished
        cached = tmp_path / "cache" / oid
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            (cached / name).write_bytes((other / name).read_bytes())
        with pytest.raises(CorruptObjectError, match="changed after they were checked"):
            await drain(engine.generate(PROMPT, PARAMS, "r2", lora))
        assert not cached.exists()  # dropped: the next request fetches it again
        assert (await drain(engine.generate(PROMPT, PARAMS, "r3", lora)))[-1].finished
        assert engine.adapter_in_flight(lora) == 0

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()


def test_what_the_gateway_tells_of_the_store_reaches_the_engines_cache(model_and_adapter, tmp_path):
    """Through its EngineClient alone (issue 58: no gateway code holds the fetcher): an
    object just written to the store is adopted into the engine's cache, so its request
    downloads nothing; the stats count the objects downloaded; a deleted object is
    forgotten; pruning drops the copies of objects the store no longer holds."""
    model_dir, folder, other = model_and_adapter
    oids = [object_id(identity_of(path)) for path in (folder, other)]
    store = RemoteStore(tmp_path / "store")
    store.put(oids[0], folder)
    store.put(oids[1], other)
    cache = tmp_path / "cache"
    engine = start(model_dir, AdapterFetcher(store, cache))

    async def scenario():
        await engine.adopt_adapter_object(oids[0], folder)  # an upload written here
        assert (cache / oids[0]).is_dir() and not (cache / oids[1]).exists()
        for i, oid in enumerate(oids):
            lora = LoRARequest(f"n{i}", i + 1, store_path(oid))
            assert (await drain(engine.generate(PROMPT, PARAMS, f"r{i}", lora)))[-1].finished
        assert (await engine.stats()).adapter_store_fetches == 1  # the one not adopted
        await engine.forget_adapter_object(oids[0])
        assert not (cache / oids[0]).exists()
        store.delete(oids[1])
        assert await engine.prune_adapter_objects() == [oids[1]]
        assert not (cache / oids[1]).exists()

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()
