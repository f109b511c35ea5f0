"""Which weights the adapter tiers hold, as the residency reports them
(`AdapterResidency.tiers()`: the engine's `adapter_tiers`, in its stats and /metrics), read
by the adapters' files."""

from __future__ import annotations

import hashlib
from pathlib import Path

from loragate.adapters.identity import WEIGHTS_FILE


def weights_sha256(adapter_dir) -> str:
    """The sha256 of the weights file in ``adapter_dir`` now: the key the tiers report."""
    return hashlib.sha256((Path(adapter_dir) / WEIGHTS_FILE).read_bytes()).hexdigest()


def in_slots(residency) -> set[str]:
    """The sha256 of every weights set in a device slot now."""
    return {sha for sha, tier in residency.tiers().items() if tier == "device"}


def names_in_slots(residency, loras) -> set[str]:
    """The names of those of ``loras`` whose files' weights are in a device slot now."""
    device = in_slots(residency)
    return {lora.lora_name for lora in loras if weights_sha256(lora.lora_path) in device}
