"""Adapter store objects as the registry sees them: who may add an adapter, and when an
object's bytes may go.

An object (the adapter store's `<sha256>-<config sha256>`) is referenced by every adapter
record whose `store_object` names it: its reference count is kept beside the records and
written in the same atomic step as each of them (`loragate.registry.adapter_index`). Its
bytes may be deleted once nothing references it, which two more marks make safe across replicas:
- a pin: an upload in progress holds one (with an expiry, so a crashed replica leaks
  nothing) from before it writes the object until its record is registered;
- a claim: the one replica deleting the object holds it (also with an expiry) while it
  deletes; a pin cannot be taken meanwhile (the upload waits and writes the object again).
`claim_unreferenced_object` takes the claim only if no record references the object and
no live pin holds it, in one atomic step (a Lua script on Redis).

`check_adapter_room` is the tenant's adapter quota (`max_adapters`, `max_adapter_bytes`),
checked inside each store's atomic registration.
"""

from __future__ import annotations

import uuid

from loragate.registry.adapter_index import AdapterCounts, MemoryAdapterIndex
from loragate.registry.errors import AdapterQuotaExceeded, RegistryError
from loragate.registry.records import (
    AdapterMetadata,
    AdapterSpec,
    TenantRecord,
    check_lease_ttl,
    check_store_object,
)


class AdapterBytesQuotaExceeded(RegistryError):
    """The tenant's adapters would hold more than max_adapter_bytes."""

    def __init__(self, tenant: str, limit: int, used: int, wanted: int):
        super().__init__(
            f"tenant {tenant!r} holds {used} bytes of adapters; {wanted} more would pass its "
            f"max_adapter_bytes of {limit}"
        )
        self.tenant, self.limit, self.used, self.wanted = tenant, limit, used, wanted


def check_adapter_room(
    tenant: TenantRecord,
    counts: AdapterCounts,
    old: AdapterMetadata | None,
    spec: AdapterSpec,
) -> None:
    """AdapterQuotaExceeded / AdapterBytesQuotaExceeded unless `spec` fits the tenant's
    quota; `counts` are the tenant's adapter counters now, `old` the one `spec` replaces."""
    count_limit = tenant.quota.max_adapters
    if old is None and count_limit is not None and counts.adapters >= count_limit:
        raise AdapterQuotaExceeded(tenant.name, count_limit)
    bytes_limit = tenant.quota.max_adapter_bytes
    if bytes_limit is not None:
        used = counts.size_bytes - (old.size_bytes if old is not None else 0)
        if used + spec.size_bytes > bytes_limit:
            raise AdapterBytesQuotaExceeded(tenant.name, bytes_limit, used, spec.size_bytes)


class MemoryObjects:
    """Pins and claims of the in-memory store (a part of MemoryRegistryStore, which makes
    `_pins` and `_claims`)."""

    _index: MemoryAdapterIndex
    _pins: dict[str, dict[str, float]]  # object -> pin -> expiry
    _claims: dict[str, float]  # object -> the claim's expiry

    def _object_marks(self) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        return self._pins, self._claims

    async def pin_object(self, oid: str, ttl_s: float = 600.0) -> str | None:
        """A pin on `oid` for an upload; None while a deletion of it holds the claim."""
        check_store_object(oid)
        pins, claims = self._object_marks()
        now = self._clock()
        if claims.get(oid, 0) > now:
            return None
        token = uuid.uuid4().hex
        pins.setdefault(oid, {})[token] = now + check_lease_ttl(ttl_s)
        return token

    async def unpin_object(self, oid: str, token: str) -> None:
        pins, _ = self._object_marks()
        pins.get(check_store_object(oid), {}).pop(token, None)

    async def claim_unreferenced_object(self, oid: str, ttl_s: float = 60.0) -> bool:
        """The right to delete `oid`'s bytes: only if no record references it, no live pin
        holds it and no other claim does."""
        check_store_object(oid)
        pins, claims = self._object_marks()
        now = self._clock()
        live = {t: e for t, e in pins.get(oid, {}).items() if e > now}
        pins[oid] = live
        if live or claims.get(oid, 0) > now or self._index.object_references(oid):
            return False
        claims[oid] = now + check_lease_ttl(ttl_s)
        return True

    async def release_object_claim(self, oid: str) -> None:
        _, claims = self._object_marks()
        claims.pop(check_store_object(oid), None)

    async def object_references(self, oid: str) -> int:
        return self._index.object_references(check_store_object(oid))
