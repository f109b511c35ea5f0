"""The adapter store's objects as the gateway keeps them: written once, deleted when unused.

`keep` writes an adapter's validated files into the store under their object id while
holding a pin in the registry (adapter_objects.py), so no replica deletes the object
between the write and the registration that references it. `collect` deletes an object
once no adapter record references it and no upload holds it: the registry hands one
replica the claim, that replica deletes the bytes (in the store, and its own cached copy).
What the engine caches of the store it is told through its EngineClient (an object written
here, objects deleted), never by the gateway holding its fetcher.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path

from loragate.adapters.store import (
    FILES,
    AdapterStore,
    AdapterStoreError,
    CorruptObjectError,
    identity_of,
    object_id,
)
from loragate.engine import EngineClient
from loragate.gateway.errors import APIError, EngineUnavailableError, RegistryDownError
from loragate.gateway.registry_seam import RegistrySeam

log = logging.getLogger(__name__)

# How long an upload waits for another replica to finish deleting the same object.
CLAIM_WAIT_S = 10.0
PIN_TTL_S = 600.0


class AdapterStoreUnavailableError(EngineUnavailableError):
    """503: the adapter store could not be written or read."""


class CorruptAdapterObjectError(APIError):
    """502: the store gave bytes that do not hash to the object's id; they are not served."""

    status_code = 502
    error_type = "server_error"


def store_error(exc: AdapterStoreError) -> APIError:
    """The HTTP error of a fetch that failed, for the request that needed the adapter."""
    if isinstance(exc, CorruptObjectError):
        return CorruptAdapterObjectError(str(exc), code="corrupt_adapter_object")
    return AdapterStoreUnavailableError(str(exc), code="adapter_store_error")


class AdapterObjects:
    def __init__(
        self,
        store: RegistrySeam,
        objects: AdapterStore,
        engine: EngineClient,
        staging_root: Path,
        import_folders: bool = False,
        sweep_every_s: float | None = None,
    ):
        self.registry = store
        self.objects = objects
        self.engine = engine  # told of objects written and deleted, for its own cache
        self.staging_root = staging_root
        # Folders registered from --adapter-root are also kept in the store (by hash), so
        # replicas without the folder fetch them (on when --adapter-store is given).
        self.import_folders = import_folders
        self.deleted = 0  # objects this replica deleted from the store
        self.sweep_every_s = sweep_every_s  # None: never swept (a store others may share)
        self._sweeper: asyncio.Task | None = None

    def start(self) -> None:
        if self.sweep_every_s is not None and self._sweeper is None:
            self._sweeper = asyncio.create_task(
                self.sweep_every(self.sweep_every_s), name="adapter-store-sweep"
            )

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    def stage_copy(self, folder: Path) -> tuple[Path, str]:
        """A copy of `folder`'s two adapter files in a new staging directory, and its object
        id, hashed from the copy (the folder may change meanwhile). Blocking."""
        self.staging_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=self.staging_root))
        try:
            for name in FILES:
                shutil.copyfile(folder / name, staging / name)
            return staging, object_id(identity_of(staging))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    @asynccontextmanager
    async def imported(self, folder: Path, weights_sha256: str):
        """With `import_folders`: `folder`'s files kept in the store while the block runs;
        yields their object id (None: not imported, or the files changed since they were
        loaded as `weights_sha256`, so the next request that notices imports them)."""
        if not self.import_folders:
            yield None
            return
        try:
            staging, oid = await asyncio.to_thread(self.stage_copy, folder)
        except OSError as exc:
            log.warning("adapter folder %s not copied into the store: %s", folder.name, exc)
            yield None
            return
        try:
            if not oid.startswith(weights_sha256 + "-"):
                yield None
                return
            async with self.kept(oid, staging):
                yield oid
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @asynccontextmanager
    async def kept(self, oid: str, directory: Path):
        """Write `directory`'s files as `oid` and hold them until the block ends (the
        registration inside it references the object, or the block failed and it goes)."""
        pin = await self._pin(oid)
        try:
            try:
                await asyncio.to_thread(self.objects.put, oid, directory)
                await self.engine.adopt_adapter_object(oid, directory)  # no download next
            except AdapterStoreError as exc:
                raise AdapterStoreUnavailableError(str(exc), code="adapter_store_error") from exc
            yield
        finally:
            await self.registry.unpin_object(oid, pin)
            await self.collect(oid)  # nothing if the registration references it

    async def _pin(self, oid: str) -> str:
        waited = 0.0
        while True:
            pin = await self.registry.pin_object(oid, PIN_TTL_S)
            if pin is not None:
                return pin
            if waited >= CLAIM_WAIT_S:
                raise AdapterStoreUnavailableError(
                    "these adapter files are being deleted from the store; try again",
                    code="adapter_store_busy",
                    headers={"Retry-After": "1"},
                )
            await asyncio.sleep(0.05)
            waited += 0.05

    async def sweep(self) -> int:
        """Delete every object of the store that nothing references or pins (left by a
        replica that crashed mid-upload, or a deletion while the registry was down); the
        number deleted. Only for a store this deployment owns (--adapter-store)."""
        try:
            oids = await asyncio.to_thread(self.objects.list)
        except Exception:  # noqa: BLE001 - a sweep that fails is tried again later
            log.warning("adapter store %s could not be listed", self.objects.where, exc_info=True)
            return 0
        deleted = 0
        for oid in oids:
            deleted += await self.collect(oid)
        if deleted:
            log.info("adapter store sweep: %d unused objects deleted", deleted)
        await self.engine.prune_adapter_objects()  # copies of what other replicas deleted
        return deleted

    async def sweep_every(self, seconds: float) -> None:
        """Sweep now, then every `seconds`, until cancelled."""
        while True:
            await self.sweep()
            await asyncio.sleep(seconds)

    async def collect(self, oid: str | None) -> bool:
        """Delete `oid`'s bytes if nothing references or pins them; True if deleted here."""
        if oid is None:
            return False
        try:
            if not await self.registry.claim_unreferenced_object(oid):
                return False
        except RegistryDownError:
            log.warning("adapter object %s kept: the registry store is unreachable", oid[:16])
            return False
        try:
            await asyncio.to_thread(self.objects.delete, oid)
            await self.engine.forget_adapter_object(oid)
            self.deleted += 1
            log.info("adapter object %s deleted: no adapter uses it any more", oid[:16])
            return True
        except Exception:  # noqa: BLE001 - the store failing must not fail the delete
            log.exception("adapter object %s could not be deleted", oid[:16])
            return False
        finally:
            await self.registry.release_object_claim(oid)
