"""Adapters named by their object in the adapter store, found by hash behind the engine.

An adapter kept in the adapter store (adapters/store.py: uploads, sources by URI, folders
copied there) is registered with the LoRARequest path `adapter-store:<object id>`
(`store_path`): it names which bytes, not where they are. The engine's adapter residency
turns that path into the object's verified local directory before anything reads it: the
engine's own cache directory first, else fetched from the store and checked against the
hash (`AdapterFetcher`). So an in-process engine and every Ray Serve replica fetch for
themselves, and nothing is shared between an ingress and its replicas but the store. That
check vouches for the files it hashed in the IdentityBook the engine's adapter tiers read
with (the fetcher's `book`), so the engine's first read of a fetched object does not hash
them again unless they changed since (adapters/loader.py).

The gateway writes and deletes objects in the store; it tells the engine (through its
EngineClient) of an object it just wrote (`adopt`: cached here, not downloaded again) and of
objects deleted (`forget`, `prune`: the cached copies dropped), and reads how many objects
the engine downloaded (`fetches`), so no gateway code holds the fetcher.

A fetch that fails (the store unreachable, the object missing, or its bytes not hashing to
its id) is an `AdapterStoreError` for that request alone. As a last check, the weights a
request is admitted under must be the object's: anything else is refused the same way
(`CorruptObjectError`) and the cached copy dropped.
"""

from __future__ import annotations

from pathlib import Path

from loragate.adapters import LoRARequest, WeightsIdentity
from loragate.adapters.store import (
    AdapterFetcher,
    AdapterStoreError,
    CorruptObjectError,
    parse_object_id,
)

STORE_PATH_PREFIX = "adapter-store:"


def store_path(oid: str) -> str:
    """The LoRARequest path of adapter store object `oid`."""
    return STORE_PATH_PREFIX + oid


def object_of(lora: LoRARequest | None) -> str | None:
    """The store object a LoRARequest names, or None for a directory path."""
    if lora is None or not lora.lora_path.startswith(STORE_PATH_PREFIX):
        return None
    return lora.lora_path[len(STORE_PATH_PREFIX) :]


class StoredAdapters:
    """The engine's way from `adapter-store:` paths to verified local directories. Without a
    fetcher (an engine given no adapter store) such a path is an error for its request."""

    def __init__(self, fetcher: AdapterFetcher | None):
        self.fetcher = fetcher

    def ready(self, lora: LoRARequest) -> LoRARequest | None:
        """``lora`` as the engine reads it, when that needs no fetch (a folder's path, or an
        object cached and checked already: two stats); None when it must be fetched."""
        oid = object_of(lora)
        if oid is None:
            return lora
        directory = self.fetcher.ready(oid) if self.fetcher is not None else None
        return None if directory is None else _at(lora, directory)

    def fetch(self, lora: LoRARequest) -> LoRARequest:
        """``lora`` with its object's verified local directory as its path, fetched from
        the store if need be. Blocking: call it on a worker thread."""
        oid = object_of(lora)
        if oid is None:
            return lora
        if self.fetcher is None:
            raise AdapterStoreError(
                f"adapter object {oid[:16]}: this engine was started without an adapter store"
            )
        return _at(lora, self.fetcher.ensure(oid))

    def as_fetched(self, lora: LoRARequest) -> LoRARequest:
        """``lora`` as the engine sees it once fetched, without fetching anything."""
        oid = object_of(lora)
        if oid is None or self.fetcher is None:
            return lora
        return _at(lora, self.fetcher.local.path(oid))

    def check(self, lora: LoRARequest, identity: WeightsIdentity) -> None:
        """CorruptObjectError (and the cached copy dropped) unless ``identity``, the weights
        a request for ``lora`` is admitted under, are its store object's."""
        oid = object_of(lora)
        if oid is None or identity.sha256 == parse_object_id(oid).sha256:
            return
        self.forget(oid)
        raise CorruptObjectError(
            f"adapter object {oid[:16]}: the cached weights changed after they were checked "
            f"(sha256 {identity.sha256[:16]}); the request is refused"
        )

    # ---- what the gateway tells of the store's objects (blocking: a worker thread) --------
    def adopt(self, oid: str, directory: Path) -> None:
        """Cache ``directory``'s files, just written to the store as ``oid``, so they are not
        downloaded again (still checked on first use); nothing without a fetcher."""
        if self.fetcher is not None:
            self.fetcher.adopt(oid, directory)

    def forget(self, oid: str) -> None:
        """Drop the cached copy of ``oid`` and what was checked of it (the store deleted it)."""
        if self.fetcher is not None:
            self.fetcher.forget(oid)

    def prune(self) -> list[str]:
        """Drop the cached copies of objects the store no longer holds; their ids."""
        return self.fetcher.prune() if self.fetcher is not None else []

    @property
    def fetches(self) -> int:
        """Objects downloaded from a remote store into the cache (0 without a fetcher)."""
        return self.fetcher.fetches if self.fetcher is not None else 0


def _at(lora: LoRARequest, directory: Path) -> LoRARequest:
    return LoRARequest(lora.lora_name, lora.lora_int_id, str(directory))
