"""What the adapter cache reports: counters, each weights' tier, loads and residents.

A mixin of AdapterCache: it reads the cache's own state under the cache's lock.
"""

from __future__ import annotations

from loragate.adapters.identity import WeightsIdentity
from loragate.adapters.request import LoRARequest


class CacheReports:
    def stats(self) -> dict[str, float]:
        with self._lock:
            return {
                **self._counters,
                **self._seconds,
                "resident_adapters": len(self._slot_of),
                "cpu_adapters": len(self._cpu),
                "resident_bytes": self._device.used_bytes,
                "cpu_bytes": sum(self._cpu_bytes.values()),
                "held_weights": len(self._holds),
            }

    def tiers(self) -> dict[str, str]:
        """Each weights sha256 in memory: "device" (in a slot) or "cpu"."""
        with self._lock:
            found = {identity.sha256: "cpu" for identity in self._cpu}
            found.update({identity.sha256: "device" for identity in self._slot_of})
            return found

    def loads(self) -> dict[str, tuple]:
        """Each weights sha256 ever loaded: (disk loads, seconds, slot loads, seconds)."""
        with self._lock:
            return {sha: tuple(row) for sha, row in self._loads_of.items()}

    def _count_load(self, identity: WeightsIdentity, column: int, seconds: float) -> None:
        row = self._loads_of.setdefault(identity.sha256, [0, 0.0, 0, 0.0])
        row[column] += 1
        row[column + 1] += seconds

    def cpu_resident(self) -> list[LoRARequest]:
        """The request that last used each CPU-tier entry, least recently used first."""
        with self._lock:
            ordered = sorted(self._cpu, key=lambda i: self._usage.entries[i].last_used)
            return [self._usage.request_of(i) for i in ordered]
