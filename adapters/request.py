"""The name a request uses to pick its adapter, shaped like vLLM's LoRARequest."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """Which adapter a request runs with: a name, vLLM's int id, and the directory.

    It names where the weights are, not which weights they are: every cache tier and the
    prefix cache are keyed by the files' content hash (``WeightsIdentity``), taken when a
    request is admitted. A request runs with exactly the weights its files held then, so
    files changed in place, or one int id given other files, can never serve stale weights
    or stale KV; as in vLLM, an int id should still name one adapter.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if (
            isinstance(self.lora_int_id, bool)
            or not isinstance(self.lora_int_id, int)
            or self.lora_int_id < 1
        ):
            raise ValueError(f"lora_int_id must be an int >= 1, got {self.lora_int_id!r}")
        if isinstance(self.lora_path, os.PathLike):
            object.__setattr__(self, "lora_path", os.fspath(self.lora_path))
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path must be a non-empty path string, got {self.lora_path!r}")
