"""The registry's adapter indexes, so that no request reads more than it answers with.

At 100,000 adapters a store cannot scan its records for a tenant's count, a public name or
a page of a list. Both stores therefore keep, beside the records and written in the same
atomic step as each record (one MULTI on Redis):
- every adapter key in order (pages of every adapter, for the operator);
- each tenant's adapter names in order, with its adapter count and bytes (max_adapters
  and max_adapter_bytes are checked against these counters, never by counting records);
- the public names, each to the one key that has it (a tenant's lookup of a shared name,
  and PublicNameTaken, read one entry);
- how many records reference each adapter store object (deleting its bytes reads one);
- a change log: (version, change) for the last `change_log_size` changes, so a replica
  that saw version v reads the changes after v, never the whole table.

Lists are paged by cursor, the way OpenAI's lists page: a page holds at most `limit`
records after the cursor (`after`, the last id of the page before), and `has_more` says
whether another page follows. Every adapter is listed by key (`<tenant>/<name>`, or
`<name>` for the operator's); what a tenant may name is listed by name: its own adapters,
then the public ones its own names do not hide, merged in name order.

`MemoryAdapterIndex` is the in-memory store's index; the Redis store's lives in
`loragate.registry.redis_index`.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

import msgspec

from loragate.registry.records import AdapterMetadata, ChangeEvent, ChangeKind

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
DEFAULT_CHANGE_LOG_SIZE = 10_000


class AdapterCounts(msgspec.Struct, frozen=True):
    """What a tenant's adapters add up to, kept as counters beside the records."""

    adapters: int = 0
    size_bytes: int = 0


class AdapterPage(msgspec.Struct, frozen=True):
    """One page of a list, in order; `has_more`: a page follows (ask with after=last_id)."""

    data: tuple[AdapterMetadata, ...]
    has_more: bool

    def last_id(self, tenant_view: bool) -> str | None:
        """The cursor of the next page: a key, or a name in a tenant's view."""
        if not self.data:
            return None
        last = self.data[-1]
        return last.name if tenant_view else last.key


class LoggedChange(msgspec.Struct, frozen=True):
    """One entry of the change log: the version the change made, what changed."""

    version: int
    kind: ChangeKind
    name: str


class ChangeLog(msgspec.Struct, frozen=True):
    """The changes after a version, oldest first, up to `version` (the store's `latest`
    when none are left to read). `complete` is False when the log no longer holds every
    change since the version asked about (trimmed, or the store lost its data): a reader
    must then re-read whatever it keeps."""

    version: int
    latest: int
    changes: tuple[ChangeEvent, ...]
    complete: bool


def check_page(after: object, limit: object) -> tuple[str | None, int]:
    """ValueError for a cursor that is not a string, or a limit outside 1..MAX_PAGE_SIZE."""
    if after is not None and (not isinstance(after, str) or not after):
        raise ValueError(f"after must be an adapter id, got {after!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
    return after, limit


def merge_visible(
    own: Iterator[str], public: Iterator[str], limit: int
) -> tuple[list[tuple[str, bool]], bool]:
    """Up to `limit` names of a tenant's view, from its own names and the public names
    (both ascending, after the cursor): (name, own?) each, and whether more follow. A
    public name the tenant also owns is its own adapter, listed once."""
    out: list[tuple[str, bool]] = []
    mine, shared = next(own, None), next(public, None)
    while mine is not None or shared is not None:
        if shared is None or (mine is not None and mine <= shared):
            if shared == mine:
                shared = next(public, None)
            entry, mine = (mine, True), next(own, None)
        else:
            entry, shared = (shared, False), next(public, None)
        if len(out) == limit:
            return out, True
        out.append(entry)
    return out, False


class _SortedNames:
    """Strings in ascending order, for pages after a cursor."""

    def __init__(self) -> None:
        self._items: list[str] = []

    def add(self, item: str) -> None:
        i = bisect.bisect_left(self._items, item)
        if i == len(self._items) or self._items[i] != item:
            self._items.insert(i, item)

    def discard(self, item: str) -> None:
        i = bisect.bisect_left(self._items, item)
        if i < len(self._items) and self._items[i] == item:
            del self._items[i]

    def after(self, cursor: str | None) -> Iterator[str]:
        start = 0 if cursor is None else bisect.bisect_right(self._items, cursor)
        yield from self._items[start:]

    def __len__(self) -> int:
        return len(self._items)


class MemoryAdapterIndex:
    """The in-memory store's records and their indexes; every write keeps them together."""

    def __init__(self, change_log_size: int = DEFAULT_CHANGE_LOG_SIZE) -> None:
        self.records: dict[str, AdapterMetadata] = {}
        self._keys = _SortedNames()
        self._names: dict[str, _SortedNames] = {}  # tenant -> its adapters' names
        self._counts: dict[str, AdapterCounts] = {}
        self._public: dict[str, str] = {}  # public name -> key
        self._public_names = _SortedNames()
        self._object_refs: dict[str, int] = {}
        self._log: deque[LoggedChange] = deque(maxlen=change_log_size)

    # reads

    def get(self, key: str) -> AdapterMetadata | None:
        return self.records.get(key)

    def public_key(self, name: str) -> str | None:
        return self._public.get(name)

    def counts(self, tenant: str) -> AdapterCounts:
        return self._counts.get(tenant, AdapterCounts())

    def owned_names(self, tenant: str) -> list[str]:
        return list(self._names.get(tenant, _SortedNames()).after(None))

    def object_references(self, oid: str) -> int:
        return self._object_refs.get(oid, 0)

    def page(self, after: str | None, limit: int) -> AdapterPage:
        keys = self._keys.after(after)
        page = [self.records[k] for _, k in zip(range(limit), keys, strict=False)]
        return AdapterPage(tuple(page), next(keys, None) is not None)

    def visible_page(self, tenant: str, after: str | None, limit: int) -> AdapterPage:
        own = self._names.get(tenant, _SortedNames()).after(after)
        entries, more = merge_visible(own, self._public_names.after(after), limit)
        page = (
            self.records[f"{tenant}/{name}" if mine else self._public[name]]
            for name, mine in entries
        )
        return AdapterPage(tuple(page), more)

    def changes_since(self, since: int, latest: int, limit: int) -> ChangeLog:
        if since >= latest:
            return ChangeLog(latest, latest, (), since == latest)
        entries = [c for c in self._log if c.version > since]
        complete = len(entries) == latest - since
        entries = entries[:limit]
        version = entries[-1].version if entries and complete else latest
        events = tuple(ChangeEvent(c.kind, c.name) for c in entries)
        return ChangeLog(version, latest, events if complete else (), complete)

    # writes

    def log(self, version: int, kind: ChangeKind, name: str) -> None:
        self._log.append(LoggedChange(version, kind, name))

    def put(self, new: AdapterMetadata) -> AdapterMetadata | None:
        old = self.records.get(new.key)
        if old is not None:
            self._unindex(old)
        self.records[new.key] = new
        self._keys.add(new.key)
        if new.tenant is not None:
            self._names.setdefault(new.tenant, _SortedNames()).add(new.name)
            self._count(new.tenant, 1, new.size_bytes)
        if new.public:
            self._public[new.name] = new.key
            self._public_names.add(new.name)
        if new.store_object is not None:
            self._object_refs[new.store_object] = self.object_references(new.store_object) + 1
        return old

    def remove(self, key: str) -> AdapterMetadata | None:
        old = self.records.pop(key, None)
        if old is not None:
            self._unindex(old)
            self._keys.discard(key)
            if old.tenant is not None:
                self._names[old.tenant].discard(old.name)
        return old

    def _unindex(self, old: AdapterMetadata) -> None:
        """Take `old`'s counts and public name out (its key and name stay, for a put)."""
        if old.tenant is not None:
            self._count(old.tenant, -1, -old.size_bytes)
        if old.public and self._public.get(old.name) == old.key:
            del self._public[old.name]
            self._public_names.discard(old.name)
        if old.store_object is not None:
            self._object_refs[old.store_object] -= 1
            if not self._object_refs[old.store_object]:
                del self._object_refs[old.store_object]

    def _count(self, tenant: str, adapters: int, size_bytes: int) -> None:
        c = self.counts(tenant)
        self._counts[tenant] = AdapterCounts(c.adapters + adapters, c.size_bytes + size_bytes)

    def every(self) -> Iterator[AdapterMetadata]:
        """Every record in key order (a backup's snapshot)."""
        return (self.records[k] for k in self._keys.after(None))
