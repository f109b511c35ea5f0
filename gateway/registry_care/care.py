"""Keeping the registry recoverable from this replica: the store's persistence checked at
start, scheduled backups, and what /health says once the store lost its data.

- At start the store says whether it keeps the registry over its own restart (for Redis,
  `CONFIG GET appendonly appendfsync save`); one log line says so, a warning when it would
  not. With --require-durable-registry anything but a durable store (a volatile one, or
  one whose settings could not be read) stops the start, with the reason: checked by the
  CLI before the model loads, and again by the app for servers started otherwise.
- With --registry-backup-dir, the registry is exported whenever the newest backup in the
  folder (of any replica sharing it) is --registry-backup-every seconds old, so at start
  too if it is (backup.export_registry: a temporary file renamed into place), and the
  newest --registry-backup-keep files are kept. A store that lost its data is never backed up
  over the backups that hold it: while this replica serves orphans, or while the store is
  empty and the newest backup is not, scheduled backups wait (and say why).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from loragate.gateway.errors import RegistryDownError
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.settings import GatewaySettings
from loragate.registry import make_registry_store
from loragate.registry.backup import export_registry, read_header
from loragate.registry.persistence import Persistence, unchecked

log = logging.getLogger("loragate.registry_care")

BACKUP_GLOB = "registry-*.jsonl"
RETRY_S = 30.0  # after a backup that could not be written


class RegistryNotDurable(RuntimeError):
    """--require-durable-registry, and the store would lose the registry on restart."""


def refusal(persistence: Persistence) -> str:
    return f"--require-durable-registry: refusing to start: {persistence.summary}"


async def check_before_start(settings: GatewaySettings) -> Persistence:
    """The persistence of the settings' store, read on a connection of its own (the CLI
    calls this before the model loads); an unreachable Redis reads as unchecked."""
    store = make_registry_store(settings.redis_url, namespace=settings.redis_namespace)
    try:
        return await _persistence_of(store.persistence, getattr(store, "where", "memory"))
    finally:
        await store.close()


async def _persistence_of(read, where: str) -> Persistence:
    try:
        return await read()
    except Exception as exc:  # RegistryUnavailable, or the seam's RegistryDownError
        return unchecked(where, f"it did not answer: {exc or type(exc).__name__}")


@dataclass(frozen=True)
class BackupFile:
    path: Path
    exported_at: float
    tenants: int | None = None


class RegistryCare:
    def __init__(
        self,
        store: RegistrySeam,
        settings: GatewaySettings,
        serving_orphans: Callable[[], bool],
    ):
        self._store = store
        self._settings = settings
        self._serving_orphans = serving_orphans
        self.persistence: Persistence | None = None
        self.newest_backup: BackupFile | None = None
        self.backup_error: str | None = None
        self._task: asyncio.Task | None = None

    # ---- at start -----------------------------------------------------------------------
    async def check_persistence(self) -> Persistence:
        """Log what the store keeps over a restart; RegistryNotDurable if it must and won't."""
        persistence = await _persistence_of(self._store.persistence, self._store.where)
        self.persistence = persistence
        if persistence.durable or persistence.mode == "memory":
            log.info("registry persistence: %s", persistence.summary)
        else:
            log.warning("registry persistence: %s", persistence.summary)
        if self._settings.require_durable_registry and not persistence.durable:
            raise RegistryNotDurable(refusal(persistence))
        return persistence

    # ---- scheduled backups --------------------------------------------------------------
    def start(self) -> None:
        folder = self._settings.registry_backup_dir
        if folder is None:
            return
        self.newest_backup = newest_backup(folder)
        self._task = asyncio.create_task(self._every_interval(), name="registry-backups")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5)

    async def _every_interval(self) -> None:
        """A backup whenever the newest in the folder (this replica's or another's) is
        `every` seconds old, so restarts do not put it off; after an attempt that could not
        write one, the next comes within 30 s."""
        every = self._settings.registry_backup_every
        while True:
            await asyncio.sleep(max(0.0, self._next_due(every) - time.time()))
            if self._next_due(every) > time.time():  # another replica wrote one meanwhile
                continue
            try:
                written = await self.back_up()
            except Exception as exc:  # a full disk must not end the loop
                self.backup_error = f"{type(exc).__name__}: {exc}"
                log.exception("registry backup failed; trying again")
                written = None
            if written is None:
                await asyncio.sleep(min(every, RETRY_S))

    def _next_due(self, every: float) -> float:
        folder = self._settings.registry_backup_dir
        found = newest_backup(folder) if folder is not None else None
        known = self.newest_backup
        if found is not None and (known is None or found.exported_at > known.exported_at):
            self.newest_backup = found
        if self.newest_backup is None:
            return time.time()
        return self.newest_backup.exported_at + every

    async def back_up(self) -> BackupFile | None:
        """One scheduled backup now; None when it waited (store down, or lost its data)."""
        folder = self._settings.registry_backup_dir
        assert folder is not None
        if self._serving_orphans():
            return self._wait(
                "the registry store lost its data and this replica still serves "
                "what it knew: not backing up over the backups that hold it"
            )
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        path = folder / f"registry-{stamp}-{socket.gethostname()}-{os.getpid()}.jsonl"
        try:
            snapshot = await self._store.snapshot()
        except RegistryDownError:
            return self._wait(f"the registry store at {self._store.where} is unreachable")
        newest = self.newest_backup
        if snapshot.empty and newest is not None and newest.tenants:
            return self._wait(
                f"the registry store is empty but the newest backup, {newest.path}, holds "
                f"{newest.tenants} tenants: not backing up over it (import it: loragate "
                f"registry import {newest.path} --merge)"
            )
        written = await export_registry(self._store, path, source=self._store.where)
        tenants = len(written.snapshot.tenants)
        self.newest_backup = BackupFile(path, written.exported_at, tenants)
        self.backup_error = None
        log.info("registry backup written to %s (%d tenants)", path, tenants)
        self._prune(folder)
        return self.newest_backup

    def _wait(self, why: str) -> None:
        self.backup_error = why
        log.warning("registry backup skipped: %s", why)
        return None

    def _prune(self, folder: Path) -> None:
        files = sorted(folder.glob(BACKUP_GLOB))
        for old in files[: max(0, len(files) - self._settings.registry_backup_keep)]:
            old.unlink(missing_ok=True)

    # ---- for /health --------------------------------------------------------------------
    def lost_data_note(self, lost_at: float | None) -> str | None:
        """Which backup is older than the data the store lost, and how to restore it."""
        if lost_at is None:
            return None
        newest = self.newest_backup
        if newest is None:
            return "no registry backup is known here (--registry-backup-dir)"
        age = max(0.0, lost_at - newest.exported_at)
        written = datetime.fromtimestamp(newest.exported_at, UTC).isoformat(timespec="seconds")
        return (
            f"the newest backup, {newest.path}, was written at {written}, {age:.0f} s before "
            "the loss was noticed: what changed after it is not in it; restore it with "
            f"`loragate registry import {newest.path} --merge`"
        )


def newest_backup(folder: Path) -> BackupFile | None:
    """The newest readable backup in `folder` (by the time its header says)."""
    found = None
    for path in folder.glob(BACKUP_GLOB):
        header = read_header(path)
        if header is None or not isinstance(header.get("exported_at"), int | float):
            continue
        if found is None or header["exported_at"] > found.exported_at:
            tenants = header.get("tenants")
            found = BackupFile(path, float(header["exported_at"]), tenants)
    return found
