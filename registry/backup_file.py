"""The registry backup file: JSON lines, format version 1, written and checked line by line.

    {"format": "loragate-registry", "version": 1, "exported_at": ..., "source": ..., "epoch": ...}
    {"tenant": {<TenantRecord>}, "keys": [{<StoredKey>}, ...]}     one per tenant
    {"adapter": {<AdapterMetadata>}}                              one per adapter
    {"usage": {<UsageReport>}}                                    one per tenant with counts
    {"lora_int_id": <the last id handed out>}
    {"end": {"lines": <lines before this one>}}

Records are written as the stores keep them (every field of the Struct, whatever fields it
has), so a field added to a record is backed up without a change here; a field this version
does not know is refused on import rather than dropped. Keys appear only as their salt and
HMAC digest (api_keys.StoredKey): an imported key keeps working, and the file never holds
one. The end line makes a file cut short fail to import instead of restoring part. Every
refusal names its line.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from loragate.registry.api_keys import StoredKey
from loragate.registry.records import (
    AdapterMetadata,
    TenantRecord,
    UsageCounts,
    UsageReport,
    check_count,
)
from loragate.registry.snapshot import RegistrySnapshot
from loragate.registry.store import RegistryStore

FORMAT = "loragate-registry"
FORMAT_VERSION = 1
_KINDS = ("tenant", "adapter", "usage", "lora_int_id", "end")
_HEX = {"key_id": 16, "salt": 32, "digest": 64}


class BackupFileError(ValueError):
    """The file is not a backup this version can import; `line` is 1-based (None: the file
    as a whole)."""

    def __init__(self, line: int | None, message: str):
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


@dataclass(frozen=True)
class Backup:
    """A checked backup file: its records, and when and where it was written."""

    snapshot: RegistrySnapshot
    exported_at: float
    source: str


# ---- writing ----------------------------------------------------------------------------


def backup_lines(snapshot: RegistrySnapshot, *, source: str, exported_at: float) -> Iterator[str]:
    """The file's lines (without newlines)."""
    encode = msgspec.json.encode
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": exported_at,
        "source": source,
        "epoch": snapshot.epoch,
        "tenants": len(snapshot.tenants),
        "adapters": len(snapshot.adapters),
    }
    lines = [encode(header)]
    keys_of: dict[str, list[StoredKey]] = {}
    for stored in snapshot.keys:
        keys_of.setdefault(stored.tenant, []).append(stored)
    for tenant in snapshot.tenants:
        lines.append(encode({"tenant": tenant, "keys": keys_of.get(tenant.name, [])}))
    lines += [encode({"adapter": adapter}) for adapter in snapshot.adapters]
    lines += [encode({"usage": report}) for report in snapshot.usage]
    lines.append(encode({"lora_int_id": snapshot.last_lora_int_id}))
    lines.append(encode({"end": {"lines": len(lines)}}))
    return (line.decode() for line in lines)


async def export_registry(store: RegistryStore, path: Path, *, source: str) -> Backup:
    """Write the store's snapshot to `path` atomically (a temporary file, flushed to disk,
    then renamed over it): a reader never sees half a backup. The file is mode 0600."""
    snapshot = await store.snapshot()
    exported_at = time.time()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:  # readable by its owner only: tenants, usage and key digests are the operator's
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(descriptor, "w", encoding="utf-8") as out:
            for line in backup_lines(snapshot, source=source, exported_at=exported_at):
                out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return Backup(snapshot, exported_at, source)


# ---- reading ----------------------------------------------------------------------------


def read_backup(path: Path) -> Backup:
    """The checked backup in `path`; BackupFileError naming the line that is wrong."""
    try:
        with open(path, encoding="utf-8") as lines:
            return parse_backup(lines)
    except UnicodeDecodeError as exc:
        raise BackupFileError(None, f"{path} is not UTF-8 text: {exc}") from exc


def read_header(path: Path) -> dict | None:
    """The first line of a backup file if it is a header, else None (cheap: one line)."""
    try:
        with open(path, encoding="utf-8") as lines:
            header = msgspec.json.decode(lines.readline())
    except (OSError, UnicodeDecodeError, msgspec.DecodeError):
        return None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return None
    return header


def parse_backup(lines: Iterable[str]) -> Backup:
    reader = _Reader()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            raise BackupFileError(number, "is empty (a backup has no blank lines)")
        try:
            item = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            raise BackupFileError(number, f"is not JSON: {exc}") from exc
        if not isinstance(item, dict):
            raise BackupFileError(number, "is not a JSON object")
        reader.read(number, item)
    return reader.finish()


class _Reader:
    """Checks each line as it comes, remembering where each name first appeared."""

    def __init__(self):
        self.header: dict | None = None
        self.tenants: dict[str, tuple[int, TenantRecord]] = {}
        self.keys: dict[str, tuple[int, StoredKey]] = {}
        self.adapters: dict[str, tuple[int, AdapterMetadata]] = {}
        self.usage: dict[str, tuple[int, UsageReport]] = {}
        self.ids: dict[int, str] = {}
        self.last_id: int | None = None
        self.ended_at: int | None = None
        self.count = 0

    def read(self, number: int, item: dict) -> None:
        self.count = number
        if self.ended_at is not None:
            raise BackupFileError(number, f"follows the end line (line {self.ended_at})")
        if self.header is None:
            self._header(number, item)
            return
        kinds = [k for k in _KINDS if k in item]
        if len(kinds) != 1 or set(item) - {kinds[0], "keys"}:
            raise BackupFileError(
                number, f"must hold one of {', '.join(_KINDS)}; it holds {sorted(item)}"
            )
        getattr(self, "_" + kinds[0])(number, item)

    def _header(self, number: int, item: dict) -> None:
        if item.get("format") != FORMAT:
            raise BackupFileError(number, f"is not a loragate registry backup header ({FORMAT})")
        version = item.get("version")
        if version != FORMAT_VERSION:
            raise BackupFileError(
                number,
                f"format version {version!r} is not one this loragate reads ({FORMAT_VERSION})",
            )
        exported_at = item.get("exported_at")
        if isinstance(exported_at, bool) or not isinstance(exported_at, int | float):
            raise BackupFileError(number, f"exported_at must be a time, got {exported_at!r}")
        epoch = item.get("epoch")
        if epoch is not None and not isinstance(epoch, str):
            raise BackupFileError(number, f"epoch must be a string or null, got {epoch!r}")
        self.header = item

    def _tenant(self, number: int, item: dict) -> None:
        tenant = _record(number, "tenant", item["tenant"], TenantRecord)
        if tenant.name in self.tenants:
            first = self.tenants[tenant.name][0]
            raise BackupFileError(
                number, f"tenant {tenant.name!r} appears twice (first on line {first})"
            )
        raw_keys = item.get("keys", [])
        if not isinstance(raw_keys, list):
            raise BackupFileError(number, f"keys of tenant {tenant.name!r} must be a list")
        for raw in raw_keys:
            stored = _stored_key(number, tenant.name, raw)
            if stored.key_id in self.keys:
                first = self.keys[stored.key_id][0]
                raise BackupFileError(
                    number, f"key id {stored.key_id} appears twice (first on line {first})"
                )
            self.keys[stored.key_id] = (number, stored)
        listed = sorted(tenant.key_ids)
        held = sorted(s["key_id"] for s in raw_keys)
        if listed != held:
            raise BackupFileError(
                number,
                f"tenant {tenant.name!r} names key ids {listed} but the line holds digests "
                f"for {held}",
            )
        self.tenants[tenant.name] = (number, tenant)

    def _adapter(self, number: int, item: dict) -> None:
        adapter = _record(number, "adapter", item["adapter"], AdapterMetadata)
        if adapter.key in self.adapters:
            first = self.adapters[adapter.key][0]
            raise BackupFileError(
                number, f"adapter {adapter.key!r} appears twice (first on line {first})"
            )
        if adapter.lora_int_id in self.ids:
            raise BackupFileError(
                number,
                f"adapter {adapter.key!r} has lora_int_id {adapter.lora_int_id}, which "
                f"adapter {self.ids[adapter.lora_int_id]!r} has too",
            )
        self.ids[adapter.lora_int_id] = adapter.key
        self.adapters[adapter.key] = (number, adapter)

    def _usage(self, number: int, item: dict) -> None:
        report = _record(number, "usage", item["usage"], UsageReport)
        if report.tenant in self.usage:
            first = self.usage[report.tenant][0]
            raise BackupFileError(
                number, f"usage of tenant {report.tenant!r} appears twice (first on line {first})"
            )
        for counts in (report.total, *report.by_adapter.values()):
            for name in UsageCounts.__struct_fields__:
                try:
                    check_count(name, getattr(counts, name))
                except ValueError as exc:
                    raise BackupFileError(number, f"usage of {report.tenant!r}: {exc}") from exc
        for name in UsageCounts.__struct_fields__:
            by_adapters = sum(getattr(c, name) for c in report.by_adapter.values())
            if getattr(report.total, name) < by_adapters:
                raise BackupFileError(
                    number,
                    f"usage of {report.tenant!r}: total {name} is less than its adapters' sum",
                )
        self.usage[report.tenant] = (number, report)

    def _lora_int_id(self, number: int, item: dict) -> None:
        if self.last_id is not None:
            raise BackupFileError(number, "lora_int_id appears twice")
        try:
            self.last_id = check_count("lora_int_id", item["lora_int_id"])
        except ValueError as exc:
            raise BackupFileError(number, str(exc)) from exc

    def _end(self, number: int, item: dict) -> None:
        end = item["end"]
        expected = end.get("lines") if isinstance(end, dict) else None
        if expected != number - 1:
            raise BackupFileError(
                number, f"the end line counts {expected!r} lines before it, the file {number - 1}"
            )
        self.ended_at = number

    def finish(self) -> Backup:
        if self.header is None:
            raise BackupFileError(None, "the file is empty")
        if self.ended_at is None:
            raise BackupFileError(
                self.count, "the file ends here without its end line: it was cut short"
            )
        for key, (number, adapter) in self.adapters.items():
            if adapter.tenant is not None and adapter.tenant not in self.tenants:
                raise BackupFileError(
                    number,
                    f"adapter {key!r} belongs to tenant {adapter.tenant!r}, which the file "
                    "does not hold",
                )
        snapshot = RegistrySnapshot(
            tenants=tuple(t for _, t in sorted(self.tenants.values(), key=_line)),
            keys=tuple(k for _, k in sorted(self.keys.values(), key=_line)),
            adapters=tuple(a for _, a in sorted(self.adapters.values(), key=_line)),
            usage=tuple(u for _, u in sorted(self.usage.values(), key=_line)),
            last_lora_int_id=self.last_id or 0,
            epoch=self.header.get("epoch"),
        )
        return Backup(snapshot, float(self.header["exported_at"]), str(self.header.get("source")))


def _line(pair: tuple[int, object]) -> int:
    return pair[0]


def _record(number: int, kind: str, raw: object, kind_type: type):
    """`raw` as a `kind_type` Struct, checked as the store checks it; fields it does not
    know are refused (a newer export), not dropped."""
    try:
        record = msgspec.convert(raw, kind_type)
    except (msgspec.ValidationError, ValueError, TypeError) as exc:
        raise BackupFileError(number, f"{kind}: {exc}") from exc
    unknown = _unknown_fields(raw, msgspec.to_builtins(record))
    if unknown:
        raise BackupFileError(
            number,
            f"{kind} field {unknown} is unknown to this loragate version (a newer export?)",
        )
    return record


def _unknown_fields(raw: object, known: object, where: str = "") -> str | None:
    if not isinstance(raw, dict) or not isinstance(known, dict):
        return None
    for name, value in raw.items():
        path = f"{where}.{name}" if where else name
        if name not in known:
            return repr(path)
        inner = _unknown_fields(value, known[name], path)
        if inner:
            return inner
    return None


def _stored_key(number: int, tenant: str, raw: object) -> StoredKey:
    if not isinstance(raw, dict):
        raise BackupFileError(number, f"a key of tenant {tenant!r} is not an object")
    for name, length in _HEX.items():
        value = raw.get(name)
        if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]*", value):
            raise BackupFileError(
                number, f"key {name} of tenant {tenant!r} must be lowercase hex, got {value!r}"
            )
        if len(value) != length:
            raise BackupFileError(
                number,
                f"key {name} of tenant {tenant!r} must be {length} hex digits, got {len(value)}",
            )
    if raw.get("tenant") != tenant:
        raise BackupFileError(
            number,
            f"key {raw['key_id']} is filed under tenant {raw.get('tenant')!r}, not {tenant!r}",
        )
    return _record(number, "key", raw, StoredKey)
