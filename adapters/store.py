"""The content-addressed adapter store: each adapter's two files, kept once under their hashes.

An object's id is the adapter's ``WeightsIdentity`` written as ``<sha256>-<config_sha256>``
(the weights file's sha256, then the config file's): the very key every cache tier and the
prefix cache use, so the store, the engine and the registry name one adapter one way. The
object holds ``adapter_config.json`` and ``adapter_model.safetensors`` as PEFT writes them.

Backends, behind one small protocol (``AdapterStore``):
- ``LocalStore``: a directory (``<root>/<id>/``), the default, under the cache directory.
  An object appears by one rename, so a reader sees all of it or none.
- ``S3Store`` (``s3://bucket/prefix``): any S3-compatible service through boto3, with
  credentials and endpoint as boto3 reads them from the environment (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``...).

``AdapterFetcher`` is what an engine uses: an object's local, verified directory, from its
own cache directory first, else fetched from the store. A fetched file is hashed and
compared with the id before it is renamed into the cache; a file that does not hash to it
(corrupt or truncated in the store) is an ``CorruptObjectError`` for the request that asked,
and nothing is cached. That check vouches for the files it hashed in the engine's one
``IdentityBook`` (adapters/identity.py): their ``FilesStamp``, taken before they were hashed
and unchanged after, and the id's identity, so the engine's first read of them
(adapters/loader.py) hashes them again only if they changed since, or if the stamp is too
recent to be trusted (files written within ``RACY_NS`` of the check, as a download just made
is: those are hashed again).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from loragate.adapters.identity import (
    CONFIG_FILE,
    SYSTEM_CLOCK,
    WEIGHTS_FILE,
    FilesStamp,
    IdentityBook,
    StampClock,
    WeightsIdentity,
    stamp_files,
)

FILES = (CONFIG_FILE, WEIGHTS_FILE)
HASH_CHUNK = 1 << 20
_OBJECT_ID = re.compile(r"([0-9a-f]{64})-([0-9a-f]{64})")


class AdapterStoreError(Exception):
    """The store cannot give an object's bytes (unreachable, missing, or not what the id
    says). One message argument, so it crosses a process boundary (Ray) as itself."""


class ObjectNotFoundError(AdapterStoreError):
    """No object of that id is in the store."""


class CorruptObjectError(AdapterStoreError):
    """An object's bytes do not hash to its id: never served."""


def object_id(identity: WeightsIdentity) -> str:
    return f"{identity.sha256}-{identity.config_sha256}"


def parse_object_id(text: str) -> WeightsIdentity:
    match = _OBJECT_ID.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not an adapter object id (<sha256>-<config sha256>): {text!r}")
    return WeightsIdentity(match.group(1), match.group(2))


def hash_file(path: Path) -> tuple[str, int]:
    """A file's sha256 (as adapters/identity.py hashes adapter files) and its size."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as file:
        while chunk := file.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def identity_of(directory: Path) -> WeightsIdentity:
    """The identity of the adapter files in ``directory``, hashed now."""
    weights, _ = hash_file(directory / WEIGHTS_FILE)
    config, _ = hash_file(directory / CONFIG_FILE)
    return WeightsIdentity(weights, config)


def verify(directory: Path, oid: str) -> None:
    """CorruptObjectError unless ``directory``'s files hash to ``oid``."""
    expected = parse_object_id(oid)
    for name, want in ((WEIGHTS_FILE, expected.sha256), (CONFIG_FILE, expected.config_sha256)):
        try:
            got, size = hash_file(directory / name)
        except FileNotFoundError as exc:
            raise CorruptObjectError(f"adapter object {oid[:16]}: {name} is missing") from exc
        if got != want:
            raise CorruptObjectError(
                f"adapter object {oid[:16]}: {name} ({size} bytes) has sha256 {got[:16]}, "
                f"not the {want[:16]} its id names (corrupt or truncated in the store); "
                "it is not served"
            )


def verify_stamped(
    directory: Path, oid: str, clock: StampClock = SYSTEM_CLOCK
) -> FilesStamp | None:
    """``verify``, and the stamp of the files it hashed: taken (at ``clock``'s time) before
    they were read and the same after (None where they changed meanwhile)."""
    before = stamp_files(directory, clock)
    verify(directory, oid)
    after = stamp_files(directory, clock)
    unchanged = before is not None and after is not None and before.same_files(after)
    return before if unchanged else None


class AdapterStore(Protocol):
    """Where adapter objects live; every method blocks (call it on a worker thread)."""

    where: str

    def has(self, oid: str) -> bool: ...

    def put(self, oid: str, directory: Path) -> None:
        """Store ``directory``'s two files as ``oid`` (they hash to it); no-op if present."""

    def fetch(self, oid: str, into: Path) -> None:
        """Write the object's two files into the existing directory ``into`` (unverified);
        ObjectNotFoundError if there is none."""

    def delete(self, oid: str) -> None:
        """Remove the object if present."""

    def list(self) -> list[str]:
        """The ids of the objects in the store (for the sweep of unused ones)."""


class LocalStore:
    """Objects as directories under ``root``; doubles as the cache of the engines beside it."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()  # made on the first write
        self.where = str(self.root)

    def path(self, oid: str) -> Path:
        parse_object_id(oid)
        return self.root / oid

    def has(self, oid: str) -> bool:
        return all((self.path(oid) / name).is_file() for name in FILES)

    def put(self, oid: str, directory: Path) -> None:
        if self.has(oid):
            return
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".put-", dir=self.root))
        try:
            for name in FILES:
                shutil.copyfile(directory / name, staging / name)
            _publish(staging, self.path(oid))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def fetch(self, oid: str, into: Path) -> None:
        if not self.has(oid):
            raise ObjectNotFoundError(f"adapter object {oid[:16]} is not in the store {self.where}")
        for name in FILES:
            shutil.copyfile(self.path(oid) / name, into / name)

    def list(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if _OBJECT_ID.fullmatch(p.name))

    def delete(self, oid: str) -> None:
        target = self.path(oid)
        if target.exists():
            # Renamed aside first: a reader never sees half an object.
            doomed = Path(tempfile.mkdtemp(prefix=".del-", dir=self.root))
            try:
                os.replace(target, doomed / "object")
            except FileNotFoundError:
                pass
            shutil.rmtree(doomed, ignore_errors=True)


class S3Store:
    """Objects as ``<prefix>/<id>/<file>`` keys in one bucket of an S3-compatible service."""

    def __init__(self, uri: str, client=None):
        bucket, prefix = parse_s3_uri(uri)
        self.bucket, self.prefix = bucket, prefix
        self.where = f"s3://{bucket}/{prefix}"
        if client is None:
            import boto3  # the `s3` extra

            client = boto3.client("s3")
        self._s3 = client

    def _key(self, oid: str, name: str) -> str:
        parse_object_id(oid)
        return f"{self.prefix}{oid}/{name}"

    def has(self, oid: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            for name in FILES:
                self._s3.head_object(Bucket=self.bucket, Key=self._key(oid, name))
        except ClientError as exc:
            if _missing(exc):
                return False
            raise AdapterStoreError(f"the adapter store {self.where} failed: {exc}") from exc
        return True

    def put(self, oid: str, directory: Path) -> None:
        if self.has(oid):
            return
        try:  # the config last: has() sees the object only once both are there
            for name in (WEIGHTS_FILE, CONFIG_FILE):
                self._s3.upload_file(str(directory / name), self.bucket, self._key(oid, name))
        except Exception as exc:
            raise AdapterStoreError(
                f"cannot write to the adapter store {self.where}: {exc}"
            ) from exc

    def fetch(self, oid: str, into: Path) -> None:
        from botocore.exceptions import ClientError

        for name in FILES:
            try:
                self._s3.download_file(self.bucket, self._key(oid, name), str(into / name))
            except ClientError as exc:
                if _missing(exc):
                    raise ObjectNotFoundError(
                        f"adapter object {oid[:16]} is not in the store {self.where}"
                    ) from exc
                raise AdapterStoreError(f"the adapter store {self.where} failed: {exc}") from exc

    def delete(self, oid: str) -> None:
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(oid, name))

    def list(self) -> list[str]:
        found = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix, Delimiter="/"
        )
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(self.prefix) :].rstrip("/")
                if _OBJECT_ID.fullmatch(name):
                    found.append(name)
        return sorted(found)

    def read_source(self, uri: str, into: Path, limit: int) -> None:
        """Copy the adapter files under ``s3://bucket/key/`` into ``into`` (for sources by
        URI), refusing files over ``limit`` bytes before reading them."""
        from botocore.exceptions import ClientError

        bucket, prefix = parse_s3_uri(uri)
        for name in FILES:
            try:
                head = self._s3.head_object(Bucket=bucket, Key=prefix + name)
                size = head["ContentLength"]
                if size > limit:
                    raise SourceTooLargeError(
                        f"{uri}{name} is {size} bytes; at most {limit} are accepted"
                    )
                self._s3.download_file(bucket, prefix + name, str(into / name))
            except ClientError as exc:
                if _missing(exc):
                    raise ObjectNotFoundError(f"{uri}{name} does not exist") from exc
                raise AdapterStoreError(f"cannot read {uri}{name}: {exc}") from exc


class SourceTooLargeError(AdapterStoreError):
    """A file named by a source URI is over the size limit (it was not read)."""


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix/"); ValueError otherwise."""
    parts = urlsplit(uri) if isinstance(uri, str) else None
    if parts is None or parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"not an s3://bucket[/prefix] URI: {uri!r}")
    prefix = parts.path.strip("/")
    return parts.netloc, prefix + "/" if prefix else ""


def _missing(exc) -> bool:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound")


def _publish(staging: Path, target: Path) -> bool:
    """Rename ``staging`` to ``target`` in one step; someone else's copy there wins (False)."""
    try:
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
        return False
    return True


def open_store(uri: str | None, cache_dir: str | Path) -> AdapterStore:
    """``--adapter-store``: None or a path/``file://`` URI -> LocalStore (None: under the
    cache directory), ``s3://bucket/prefix`` -> S3Store."""
    if uri is None:
        return LocalStore(Path(cache_dir) / "store")
    if uri.startswith("s3://"):
        return S3Store(uri)
    if uri.startswith("file://"):
        uri = urlsplit(uri).path
    return LocalStore(uri)


class AdapterFetcher:
    """An engine's way to an object's files: its cache directory first, then the store.

    With a LocalStore the store is the cache (nothing is copied); objects are still
    verified once per process before first use. ``fetches`` counts objects brought from a
    remote store (what a replica had to download). What a check hashed is vouched for in
    ``book``, the IdentityBook the engine's adapter tiers read with, so the engine's read
    does not hash the same bytes twice; its clock is the time the check's stamps are taken at
    (adapters/identity.py). Without one the fetcher starts a book of its own, which an engine
    given this fetcher then reads with (engine/lora/adapter_residency.py).
    """

    def __init__(
        self, store: AdapterStore, cache_dir: str | Path, book: IdentityBook | None = None
    ):
        self.store = store
        self.book = book if book is not None else IdentityBook()
        self.local = store if isinstance(store, LocalStore) else LocalStore(cache_dir)
        self.fetches = 0
        self._verified: set[str] = set()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def ready(self, oid: str) -> Path | None:
        """The local directory of ``oid`` if it is cached and was verified (two stats)."""
        if oid in self._verified and self.local.has(oid):
            return self.local.path(oid)
        return None

    def ensure(self, oid: str) -> Path:
        """The verified local directory of ``oid`` (blocking: call on a worker thread)."""
        ready = self.ready(oid)
        if ready is not None:
            return ready
        with self._guard:
            lock = self._locks.setdefault(oid, threading.Lock())
        with lock:  # one fetch of an object at a time, however many requests want it
            if self.local.has(oid):
                if oid not in self._verified:
                    self._vouch(oid, verify_stamped(self.local.path(oid), oid, self.book.clock))
                    self._verified.add(oid)
                return self.local.path(oid)
            if self.local is self.store:
                raise ObjectNotFoundError(
                    f"adapter object {oid[:16]} is not in the store {self.store.where}"
                )
            self.local.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=self.local.root))
            try:
                self.store.fetch(oid, staging)
                stamp = verify_stamped(staging, oid, self.book.clock)
                # the files keep their inodes and times through the rename; another's copy
                # that won it was not checked here, and is vouched for by nothing
                if not _publish(staging, self.local.path(oid)):
                    stamp = None
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            self.fetches += 1
            self._vouch(oid, stamp)
            self._verified.add(oid)
            return self.local.path(oid)

    def _vouch(self, oid: str, stamp: FilesStamp | None) -> None:
        """Write in the book what the check of ``oid``'s local directory vouches for: the
        stamp its files had while they hashed to the object's id, and that identity (nothing,
        and nothing left from before, where the files changed meanwhile)."""
        directory = str(self.local.path(oid))
        if stamp is None:
            self.book.forget(directory)
        else:
            self.book.vouch(directory, stamp, parse_object_id(oid))

    def adopt(self, oid: str, directory: Path) -> None:
        """Cache files this process just wrote to the store (an upload), so its engine does
        not download them again; they are still verified on first use."""
        if self.local is not self.store:
            self.local.put(oid, directory)

    def prune(self) -> list[str]:
        """Drop cached copies of objects the store no longer holds (deleted by the replica
        that collected them); the ids dropped. Blocking (one existence check per object)."""
        if self.local is self.store:
            return []
        gone = [oid for oid in self.local.list() if not self.store.has(oid)]
        for oid in gone:
            self.forget(oid)
        return gone

    def forget(self, oid: str) -> None:
        """Drop the cached copy (the store deleted the object)."""
        self._verified.discard(oid)
        self.book.forget(str(self.local.path(oid)))
        if self.local is not self.store:
            self.local.delete(oid)
