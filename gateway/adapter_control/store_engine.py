"""An engine that finds uploaded adapters by hash: the adapter store in front of an EngineClient.

An adapter kept in the adapter store is registered with the LoRARequest path
`adapter-store:<object id>` (`store_path`): it names which bytes, not where they are. Every
engine (this process's, or each Ray Serve replica's) is wrapped in a `StoreBackedEngine`,
which turns that path into the object's local directory before the engine sees the
request: its own cache directory first, else fetched from the store and checked against
the hash (adapters/store.py). Nothing is shared between an ingress and its replicas but
the store.

A fetch that fails (the store unreachable, the object missing, or its bytes not hashing
to its id) is an `AdapterStoreError` for that request alone; the engine never sees the
files. As a last check, the first output says which weights the engine admitted the
request under; anything but the object's is refused the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Hashable

from loragate.adapters import LoRARequest
from loragate.adapters.store import (
    AdapterFetcher,
    CorruptObjectError,
    open_store,
    parse_object_id,
)

STORE_PATH_PREFIX = "adapter-store:"
# The record path of an uploaded adapter (a source's is its URI; a folder's, its path).
UPLOAD_PATH = "upload"


def store_path(oid: str) -> str:
    """The LoRARequest path of adapter store object `oid`."""
    return STORE_PATH_PREFIX + oid


def object_of(lora: LoRARequest | None) -> str | None:
    """The store object a LoRARequest names, or None for a directory path."""
    if lora is None or not lora.lora_path.startswith(STORE_PATH_PREFIX):
        return None
    return lora.lora_path[len(STORE_PATH_PREFIX) :]


def make_fetcher(adapter_store: str | None, cache_dir, replica: str = "") -> AdapterFetcher:
    """The fetcher of `--adapter-store` into `--adapter-cache-dir` (`{replica}` in it: this
    Ray Serve replica's id, so replicas on one machine keep separate caches)."""
    from pathlib import Path

    cache = Path(str(cache_dir).replace("{replica}", replica or "local")).expanduser()
    return AdapterFetcher(open_store(adapter_store, cache), cache)


class StoreBackedEngine:
    """An EngineClient: `engine`'s, with adapter store paths resolved to local directories."""

    def __init__(self, engine, fetcher: AdapterFetcher):
        self._engine = engine
        self.fetcher = fetcher

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    async def local(self, lora: LoRARequest | None) -> LoRARequest | None:
        """`lora` with its store object's verified local directory as its path."""
        oid = object_of(lora)
        if oid is None:
            return lora
        directory = self.fetcher.ready(oid)  # the hot path: cached and checked already
        if directory is None:
            directory = await asyncio.to_thread(self.fetcher.ensure, oid)
        return LoRARequest(lora.lora_name, lora.lora_int_id, str(directory))

    async def generate(
        self,
        prompt,
        sampling_params,
        request_id: Hashable,
        lora_request: LoRARequest | None = None,
        **options,
    ) -> AsyncIterator:
        oid = object_of(lora_request)
        if oid is None:
            async for out in self._engine.generate(
                prompt, sampling_params, request_id, lora_request=lora_request, **options
            ):
                yield out
            return
        local = await self.local(lora_request)
        expected = parse_object_id(oid).sha256
        checked = False
        async for out in self._engine.generate(
            prompt, sampling_params, request_id, lora_request=local, **options
        ):
            if not checked and out.lora_sha256 is not None:
                checked = True
                if out.lora_sha256 != expected:
                    await self._engine.abort(request_id)
                    self.fetcher.forget(oid)
                    raise CorruptObjectError(
                        f"adapter object {oid[:16]}: the cached weights changed after they were "
                        f"checked (sha256 {out.lora_sha256[:16]}); the request is refused"
                    )
            yield dataclasses.replace(out, lora_request=lora_request)

    async def add_adapter(self, lora_request: LoRARequest, timeout: float | None = None):
        return await self._engine.add_adapter(await self.local(lora_request), timeout=timeout)

    async def remove_adapter(self, lora_request: LoRARequest) -> bool:
        oid = object_of(lora_request)
        if oid is not None:  # no fetch to forget weights: their directory is known
            path = str(self.fetcher.local.path(oid))
            lora_request = LoRARequest(lora_request.lora_name, lora_request.lora_int_id, path)
        return await self._engine.remove_adapter(lora_request)
