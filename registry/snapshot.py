"""Everything a registry store holds that outlives a request, as one value: what a backup
writes and what an import gives back (see backup.py for the file, and the stores'
`snapshot` and `restore`).

Quota windows and leases are left out on purpose: they describe the last minute, expire by
themselves, and a restored lease would hold a quota for a request no process serves.
"""

from __future__ import annotations

import msgspec

from loragate.registry.api_keys import StoredKey
from loragate.registry.records import AdapterMetadata, TenantRecord, UsageReport


class RegistrySnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Tenants (with their keys' salted digests, never keys), adapter records, usage counts,
    and the last lora_int_id handed out.

    `epoch` names the store's life: it changes when a store starts empty (a Redis restarted
    without its data). Usage counts only grow within one epoch, which is how an import
    tells counts it holds already from counts it lost.
    """

    tenants: tuple[TenantRecord, ...] = ()
    keys: tuple[StoredKey, ...] = ()
    adapters: tuple[AdapterMetadata, ...] = ()
    usage: tuple[UsageReport, ...] = ()
    last_lora_int_id: int = 0
    epoch: str | None = None
    version: int = 0  # the store's version() when it was read

    @property
    def empty(self) -> bool:
        """Nothing in it that an import could clash with or add to."""
        return not (self.tenants or self.keys or self.adapters or self.usage)

    @property
    def highest_lora_int_id(self) -> int:
        """The counter a store restoring this must reach, so no id is handed out twice."""
        return max([self.last_lora_int_id, *(a.lora_int_id for a in self.adapters)])
