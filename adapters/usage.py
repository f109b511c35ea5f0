"""What both cache tiers remember about one set of weights, and how eviction plugins see it.

Each tier is keyed by the weights' content; the request that used them last gives the name,
int id, path and tenant a plugin sees. ``pinned`` belongs to the adapter's directory: an
operator pins an adapter (not one version of its files), and eviction takes pinned ones last.
"""

from __future__ import annotations

from dataclasses import dataclass

from loragate.adapters.identity import WeightsIdentity
from loragate.adapters.request import LoRARequest


@dataclass
class Usage:
    """One set of weights' recency, how often requests used it, and the request (and its
    tenant) that used it last."""

    last_used: int
    request: LoRARequest
    tenant: str | None = None
    uses: int = 0
    size_bytes: int = 0


class UsageBook:
    """Usage per set of weights, a logical clock, and the pinned adapter directories.

    Not locked: the engine's AdapterResidency, which owns it, calls it under its lock;
    the tiers read it to describe eviction candidates.
    """

    def __init__(self) -> None:
        self.entries: dict[WeightsIdentity, Usage] = {}
        self.pinned_paths: set[str] = set()
        self._clock = 0

    def touch(
        self, identity: WeightsIdentity, request: LoRARequest, *, used: bool, tenant=None
    ) -> None:
        usage = self.entries.setdefault(identity, Usage(last_used=0, request=request))
        self._clock += 1
        usage.last_used = self._clock
        usage.uses += int(used)
        usage.request = request
        if tenant is not None or used:
            usage.tenant = tenant

    def sized(self, identity: WeightsIdentity, request: LoRARequest, size_bytes: int) -> None:
        usage = self.entries.setdefault(identity, Usage(last_used=0, request=request))
        usage.size_bytes = size_bytes

    def pin(self, path: str, pinned: bool = True) -> None:
        """Mark the adapter directory ``path`` pinned (or not)."""
        if pinned:
            self.pinned_paths.add(path)
        else:
            self.pinned_paths.discard(path)

    def forget_unless(self, identity: WeightsIdentity, kept: bool) -> None:
        """Drop ``identity``'s usage unless ``kept`` (a tier still holds its weights)."""
        if not kept:
            self.entries.pop(identity, None)

    def request_of(self, identity: WeightsIdentity) -> LoRARequest:
        return self.entries[identity].request

    def key(self, identity: WeightsIdentity) -> tuple[str, int, str, str]:
        request = self.entries[identity].request
        return (request.lora_name, request.lora_int_id, request.lora_path, identity.key)

    def candidate(self, identity: WeightsIdentity, slot: int | None) -> dict:
        """The plain data an eviction plugin gets (adapters/eviction.py lists the fields)."""
        usage = self.entries[identity]
        request = usage.request
        return {
            "key": self.key(identity),
            "name": request.lora_name,
            "lora_int_id": request.lora_int_id,
            "path": request.lora_path,
            "sha256": identity.sha256,
            "tenant": usage.tenant,
            "last_used": usage.last_used,
            "uses": usage.uses,
            "size_bytes": usage.size_bytes,
            "pinned": request.lora_path in self.pinned_paths,
            "slot": slot,
        }
