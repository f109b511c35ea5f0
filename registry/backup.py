"""Backups of the registry: export from any store to a file (backup_file.py), and import
a checked file into any store.

Importing into an empty store restores it exactly. Into a non-empty one it is refused,
naming what would conflict, unless `merge`: then the store's records win wherever both hold
a different record under one name, the file's fill in the rest (tenants and adapters
deleted since the backup come back too: that is how a deletion is undone, and what a dry
run lists before anything is written), and usage counts are added
(unless the file comes from the store's own current epoch, whose counts already include
them: counts only grow within an epoch, and a store restarted empty starts a new one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from loragate.registry.backup_file import (
    Backup,
    BackupFileError,
    export_registry,
    parse_backup,
    read_backup,
    read_header,
)
from loragate.registry.errors import RegistryError
from loragate.registry.snapshot import RegistrySnapshot
from loragate.registry.store import RegistryStore

__all__ = [
    "Backup",
    "BackupFileError",
    "ImportRefused",
    "ImportSummary",
    "export_registry",
    "import_backup",
    "parse_backup",
    "read_backup",
    "read_header",
]


class ImportRefused(RegistryError):
    """Importing would change records the store already holds (or the store is not empty
    and merge was not asked); `conflicts` names each."""

    def __init__(self, message: str, conflicts: list[str]):
        super().__init__(message + "".join(f"\n  - {c}" for c in conflicts))
        self.conflicts = conflicts


NAMES_SHOWN = 50  # names an import's summary lists (then: "and N more")


@dataclass
class ImportSummary:
    tenants: int = 0
    keys: int = 0
    adapters: int = 0
    usage: int = 0
    skipped: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # the tenants, then the adapters, added
    dry_run: bool = False

    def describe(self) -> str:
        verb = "would import" if self.dry_run else "imported"
        added = (
            f"{verb} {self.tenants} tenants ({self.keys} keys), {self.adapters} adapters "
            f"and the usage counts of {self.usage} tenants"
        )
        if self.names:
            shown = self.names[:NAMES_SHOWN]
            more = len(self.names) - len(shown)
            added += ": " + ", ".join(shown) + (f" and {more} more" if more else "")
        return added + "".join(f"\n  kept the store's: {s}" for s in self.skipped)


# ---- importing --------------------------------------------------------------------------


async def import_backup(
    store: RegistryStore, backup: Backup, *, merge: bool, dry_run: bool = False
) -> ImportSummary:
    """Write the backup into `store` (see the module's docstring for what merge means);
    with `dry_run`, only say what it would write (or raise what it would refuse)."""
    current = await store.snapshot()
    incoming = backup.snapshot
    conflicts = [message for _, message in _conflicts(current, incoming)]
    if not current.empty and not merge:
        held = (
            f"{len(current.tenants)} tenants, {len(current.adapters)} adapters, usage of "
            f"{len(current.usage)} tenants"
        )
        what = ", and these records differ:" if conflicts else "; no record differs."
        raise ImportRefused(
            f"the registry store is not empty ({held}): import refused (--merge adds the "
            f"file's records to it, keeping the store's where they differ){what}",
            conflicts,
        )
    plan, summary = _plan(current, incoming)
    summary.dry_run = dry_run
    if not dry_run:
        await store.restore(plan, expect_version=current.version)
    return summary


def _conflicts(current: RegistrySnapshot, incoming: RegistrySnapshot) -> list[tuple[str, str]]:
    """(tenant name or adapter key, what differs) for each incoming record the store holds
    otherwise."""
    tenants = {t.name: t for t in current.tenants}
    adapters = {a.key: a for a in current.adapters}
    keys = {k.key_id: k for k in current.keys}
    ids = {a.lora_int_id: a.key for a in current.adapters}
    public = {a.name: a.key for a in current.adapters if a.public}
    found = []
    for tenant in incoming.tenants:
        held = tenants.get(tenant.name)
        if held is not None and held != tenant:
            found.append(
                (tenant.name, f"tenant {tenant.name!r} exists with {_differs(held, tenant)}")
            )
    for stored in incoming.keys:
        held = keys.get(stored.key_id)
        if held is not None and held.tenant != stored.tenant:
            found.append(
                (stored.tenant, f"key id {stored.key_id} is held by tenant {held.tenant!r}")
            )
    for adapter in incoming.adapters:
        key, held = adapter.key, adapters.get(adapter.key)
        if held is not None and held != adapter:
            found.append((key, f"adapter {key!r} is registered with {_differs(held, adapter)}"))
        elif held is None and ids.get(adapter.lora_int_id, key) != key:
            owner = ids[adapter.lora_int_id]
            found.append(
                (key, f"adapter {key!r}'s lora_int_id {adapter.lora_int_id} belongs to {owner!r}")
            )
        elif held is None and adapter.public and public.get(adapter.name, key) != key:
            taken = public[adapter.name]
            found.append((key, f"public adapter name {adapter.name!r} is taken by {taken!r}"))
    return found


def _differs(held: msgspec.Struct, incoming: msgspec.Struct) -> str:
    names = [
        name for name in held.__struct_fields__ if getattr(held, name) != getattr(incoming, name)
    ]
    return f"another {', '.join(names)}"


def _plan(
    current: RegistrySnapshot, incoming: RegistrySnapshot
) -> tuple[RegistrySnapshot, ImportSummary]:
    """What to write: what the store lacks; usage unless the store already counted it."""
    conflicts = _conflicts(current, incoming)
    summary = ImportSummary(skipped=[message for _, message in conflicts])
    refused = {name for name, _ in conflicts}
    held_tenants = {t.name for t in current.tenants}
    held_adapters = {a.key for a in current.adapters}
    tenants = tuple(
        t for t in incoming.tenants if t.name not in held_tenants and t.name not in refused
    )
    names = {t.name for t in tenants}
    keys = tuple(k for k in incoming.keys if k.tenant in names)
    adapters = tuple(
        a
        for a in incoming.adapters
        if a.key not in held_adapters
        and a.key not in refused
        and (a.tenant is None or a.tenant in names or a.tenant in held_tenants)
    )
    same_epoch = incoming.epoch is not None and incoming.epoch == current.epoch
    usage = () if same_epoch else incoming.usage
    if same_epoch and incoming.usage:
        summary.skipped.append(
            "usage counts: the file comes from the store's current epoch, whose counts "
            "already include it"
        )
    summary.tenants, summary.keys = len(tenants), len(keys)
    summary.adapters, summary.usage = len(adapters), len(usage)
    summary.names = [t.name for t in tenants] + [a.key for a in adapters]
    plan = RegistrySnapshot(
        tenants=tenants,
        keys=keys,
        adapters=adapters,
        usage=usage,
        last_lora_int_id=incoming.highest_lora_int_id,
    )
    return plan, summary
