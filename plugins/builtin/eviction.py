"""Built-in adapter eviction: least recently used.

Works on the plain candidate dicts the adapter cache builds (key, name, tenant,
last_used (a logical clock: larger is more recent), uses, size_bytes, pinned, ...).
"""

from __future__ import annotations

from loragate.plugins.markers import hookimpl


def lru_victim(candidates: list[dict], tier: str):
    """The key of the least recently used candidate, skipping pinned ones while any other
    is left; among equally old ones the first listed."""
    if not candidates:
        raise ValueError(f"no {tier} candidates to choose an eviction victim from")
    unpinned = [c for c in candidates if not c.get("pinned", False)] or candidates
    return min(unpinned, key=lambda c: c["last_used"])["key"]


class LruEviction:
    """Registered last: any plugin's eviction policy is asked first."""

    @hookimpl(trylast=True)
    def loragate_choose_adapter_victim(self, candidates, tier):
        return lru_victim(candidates, tier)
