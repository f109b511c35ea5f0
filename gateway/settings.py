"""Everything the HTTP server needs besides the engine's own settings, checked where built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loragate.engine import EngineConfig


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway serves one engine. Every bad value is a ValueError naming the field.

    `max_queue` bounds the requests admitted beyond the engine's `max_num_seqs`: past it
    the gateway answers 429 instead of letting latency grow without bound.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    adapter_root: Path | None = None
    preload_adapters: bool = True
    max_queue: int = 256
    max_body_bytes: int = 2 * 1024 * 1024
    shutdown_timeout: float = 30.0
    retry_after_seconds: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"engine must be an EngineConfig, got {type(self.engine).__name__}")
        if _not_int(self.port) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {self.port!r}")
        if _not_int(self.max_queue) or self.max_queue < 0:
            raise ValueError(f"max_queue must be an integer >= 0, got {self.max_queue!r}")
        if _not_int(self.max_body_bytes) or self.max_body_bytes < 1024:
            raise ValueError(
                f"max_body_bytes must be an integer >= 1024, got {self.max_body_bytes!r}"
            )
        if not isinstance(self.shutdown_timeout, int | float) or self.shutdown_timeout < 0:
            raise ValueError(
                f"shutdown_timeout must be >= 0 seconds, got {self.shutdown_timeout!r}"
            )
        if _not_int(self.retry_after_seconds) or self.retry_after_seconds < 1:
            raise ValueError(
                f"retry_after_seconds must be an integer >= 1, got {self.retry_after_seconds!r}"
            )
        if self.adapter_root is not None:
            root = Path(self.adapter_root).expanduser()
            if not root.is_dir():
                raise FileNotFoundError(f"adapter_root is not a directory: {self.adapter_root}")
            object.__setattr__(self, "adapter_root", root.resolve())


def _not_int(value) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)
