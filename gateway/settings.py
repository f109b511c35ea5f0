"""Everything the HTTP server needs besides the engine's own settings, checked where built."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from loragate.engine import EngineConfig

MIN_ADMIN_KEY_LENGTH = 16
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway serves one engine. Every bad value is a ValueError naming the field.

    `max_queue` bounds the requests admitted beyond the engine's `max_num_seqs`: past it
    the gateway answers 429 instead of letting latency grow without bound.

    `redis_url` shares adapters, tenants, quotas and usage with every replica on that Redis
    (under `redis_namespace`); without it they live in this process. `admin_key` turns on
    tenancy: every request then needs a bearer key (the admin's or a tenant's). It is kept
    out of the repr so that it never reaches a log.
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
    redis_url: str | None = field(default=None, repr=False)
    redis_namespace: str = "loragate"
    admin_key: str | None = field(default=None, repr=False)
    registry_resync_seconds: float = 2.0
    auth_cache_seconds: float = 30.0
    quota_lease_seconds: float = 300.0
    # Slow clients (gateway/http_limits.py): headers and body must arrive in time, idle
    # kept-alive connections close, and open connections are capped.
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    keep_alive_seconds: float = 30.0
    max_connections: int = 1024
    adapter_load_timeout_seconds: float = 60.0

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
        if self.redis_url is not None and (
            not isinstance(self.redis_url, str)
            or urlsplit(self.redis_url).scheme not in ("redis", "rediss", "unix")
        ):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        if not isinstance(self.redis_namespace, str) or not _NAMESPACE.fullmatch(
            self.redis_namespace
        ):
            raise ValueError(
                "redis_namespace must be 1-64 letters, digits, '.', '_', ':' or '-', starting "
                f"with a letter or digit; got {self.redis_namespace!r}"
            )
        if self.admin_key is not None and (
            not isinstance(self.admin_key, str)
            or len(self.admin_key) < MIN_ADMIN_KEY_LENGTH
            or not self.admin_key.isprintable()
            or any(c.isspace() for c in self.admin_key)
        ):
            raise ValueError(
                f"admin_key must be at least {MIN_ADMIN_KEY_LENGTH} printable characters "
                "without spaces"
            )
        if _not_int(self.max_connections) or self.max_connections < 1:
            raise ValueError(
                f"max_connections must be an integer >= 1, got {self.max_connections!r}"
            )
        for name in (
            "registry_resync_seconds",
            "auth_cache_seconds",
            "quota_lease_seconds",
            "header_timeout_seconds",
            "body_timeout_seconds",
            "keep_alive_seconds",
            "adapter_load_timeout_seconds",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.adapter_root is not None:
            root = Path(self.adapter_root).expanduser()
            if not root.is_dir():
                raise FileNotFoundError(f"adapter_root is not a directory: {self.adapter_root}")
            object.__setattr__(self, "adapter_root", root.resolve())


def _not_int(value) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)
