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

The engine counts a request in flight once it is handed over; a request still fetching its
object is counted here until then (the two overlap, so no request is ever counted by
neither), and waiting for an adapter to be idle waits for both.
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
from loragate.engine import InFlightRequests

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
        self._fetching = InFlightRequests()  # requests not yet handed to the engine

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
        self._fetching.started(lora_request)
        fetching = True
        try:
            local = await self.local(lora_request)
            expected = parse_object_id(oid).sha256
            checked = False
            async for out in self._engine.generate(
                prompt, sampling_params, request_id, lora_request=local, **options
            ):
                if fetching:  # the engine has counted it since it was handed over
                    fetching = False
                    self._fetching.ended(lora_request)
                if not checked and out.lora_sha256 is not None:
                    checked = True
                    if out.lora_sha256 != expected:
                        await self._engine.abort(request_id)
                        self.fetcher.forget(oid)
                        raise CorruptObjectError(
                            f"adapter object {oid[:16]}: the cached weights changed after they "
                            f"were checked (sha256 {out.lora_sha256[:16]}); the request is refused"
                        )
                yield dataclasses.replace(out, lora_request=lora_request)
        finally:
            if fetching:
                self._fetching.ended(lora_request)

    async def add_adapter(self, lora_request: LoRARequest, timeout: float | None = None):
        return await self._engine.add_adapter(await self.local(lora_request), timeout=timeout)

    async def remove_adapter(self, lora_request: LoRARequest) -> bool:
        return await self._engine.remove_adapter(self._as_fetched(lora_request))

    async def wait_adapter_idle(self, lora_request: LoRARequest) -> None:
        await self._fetching.wait_idle(lora_request)
        await self._engine.wait_adapter_idle(self._as_fetched(lora_request))

    def adapter_in_flight(self, lora_request: LoRARequest) -> int:
        """Requests fetching their object, and those the engine counts (one being handed
        over may count in both for a moment)."""
        fetching = self._fetching.count(lora_request)
        return fetching + self._engine.adapter_in_flight(self._as_fetched(lora_request))

    def _as_fetched(self, lora_request: LoRARequest) -> LoRARequest:
        """``lora_request`` as the engine sees it (its object's local directory), without
        fetching anything."""
        oid = object_of(lora_request)
        if oid is None:
            return lora_request
        path = str(self.fetcher.local.path(oid))
        return LoRARequest(lora_request.lora_name, lora_request.lora_int_id, path)
