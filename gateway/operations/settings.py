"""Everything the HTTP server needs besides the engine's own settings, checked where built."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from loragate.engine import EngineConfig
from loragate.gateway.openai.chat_template import load_chat_template
from loragate.gateway.openai.tool_parsers import TOOL_PARSERS
from loragate.registry import check_namespace

MIN_ADMIN_KEY_LENGTH = 16


def _help(text: str) -> dict:
    """A field's `loragate serve --help` text (operations/serve_options.py makes the flag)."""
    return {"help": text}


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
    host: str = field(
        default="127.0.0.1",
        metadata=_help("Interface to listen on."),
    )
    port: int = field(
        default=8000,
        metadata=_help("Port to listen on (0 picks a free one)."),
    )
    adapter_root: Path | None = field(
        default=None,
        metadata=_help(
            "Directory adapters may be registered from; paths resolving outside it are refused."
        ),
    )
    preload_adapters: bool = field(
        default=True,
        metadata=_help(
            "At start, register each adapter folder under --adapter-root, named after it."
        ),
    )
    max_queue: int = field(
        default=256,
        metadata=_help(
            "Sequences that may wait beyond --max-num-seqs; past it: 429 with Retry-After."
        ),
    )
    max_body_bytes: int = field(
        default=2 * 1024 * 1024,
        metadata=_help("Largest request body accepted; larger bodies get 413."),
    )
    shutdown_timeout: float = field(
        default=30.0,
        metadata=_help(
            "On SIGTERM, seconds running requests get to finish before they are cancelled."
        ),
    )
    retry_after_seconds: int = field(
        default=1,
        metadata=_help("Retry-After, in seconds, of a 429 for a full queue."),
    )
    redis_url: str | None = field(
        default=None,
        repr=False,
        metadata=_help(
            "Share adapters, tenants, quotas and usage with every replica on this Redis "
            "(redis://host:port/db). Default: kept in this process."
        ),
    )
    redis_namespace: str = field(
        default="loragate",
        metadata=_help("Prefix of every Redis key: replicas of one deployment share it."),
    )
    admin_key: str | None = field(
        default=None,
        repr=False,
        metadata=_help(
            "Turn on tenancy: every request needs `Authorization: Bearer <key>` (this admin "
            "key or a tenant's). Prefer the environment variable, which `ps` does not show. "
            "Default: open, single-tenant."
        ),
    )
    api_key: str | None = field(
        default=None,
        repr=False,
        metadata=_help(
            "vLLM's single shared key: every API request needs `Authorization: Bearer <key>`. "
            "For a server without tenancy; with --admin-key, clients use tenant keys."
        ),
    )
    lora_modules: tuple[str, ...] = field(
        default=(),
        metadata=_help(
            "vLLM's --lora-modules: adapters to register at start, as name=DIR or "
            '\'{"name": ..., "path": ...}\' (repeatable, or several after one flag). The '
            "operator's own: DIR need not be under --adapter-root."
        ),
    )
    model_aliases: tuple[str, ...] = field(
        default=(),
        metadata=_help(
            "More names clients may use for the base model (vLLM's --served-model-name "
            "with several names sets these after the first)."
        ),
    )
    chat_template: str | None = field(
        default=None,
        metadata=_help(
            "vLLM's --chat-template: a Jinja chat template file (or the template itself) used "
            "instead of the model's, e.g. one that lays out tools."
        ),
    )
    enable_auto_tool_choice: bool = field(
        default=False,
        metadata=_help(
            "vLLM's flag: let the model decide to call tools (tool_choice 'auto'), read from "
            "its answer by --tool-call-parser. Needs a chat template that lays out tools."
        ),
    )
    tool_call_parser: str | None = field(
        default=None,
        metadata=_help(
            "How tool calls read in the model's answer, for tool_choice 'auto': 'hermes' "
            "(<tool_call>{json}</tool_call>) or 'llama3_json'."
        ),
    )
    registry_resync_seconds: float = field(
        default=2.0,
        metadata=_help(
            "How often the registry store is re-read in full when it changed (the safety net "
            "under its change events), and probed while it is down."
        ),
    )
    auth_cache_seconds: float = field(
        default=30.0,
        metadata=_help(
            "How long a verified tenant key is trusted before it is checked again (while the "
            "registry store is down, known keys keep working)."
        ),
    )
    quota_lease_seconds: float = field(
        default=300.0,
        metadata=_help(
            "A running request's hold on its tenant's concurrency quota expires after this "
            "unless renewed (it is, while the request runs): a crashed replica leaks nothing."
        ),
    )
    # Slow clients (operations/http_limits.py): headers and body must arrive in time, idle
    # kept-alive connections close, and open connections are capped.
    header_timeout_seconds: float = field(
        default=10.0,
        metadata=_help(
            "A client must send its request line and headers within this many seconds of "
            "connecting (or of the request's first byte on a kept-alive connection)."
        ),
    )
    body_timeout_seconds: float = field(
        default=30.0,
        metadata=_help(
            "A client must send its whole request body within this many seconds of its headers."
        ),
    )
    keep_alive_seconds: float = field(
        default=30.0,
        metadata=_help("An idle kept-alive connection is closed after this many seconds."),
    )
    max_connections: int = field(
        default=1024,
        metadata=_help("Open connections beyond this many are closed at once."),
    )
    adapter_load_timeout_seconds: float = field(
        default=60.0,
        metadata=_help(
            "Reading and validating one adapter's files must finish within this many seconds."
        ),
    )

    # Observability (operations/metrics.py, operations/metrics_server.py).
    metrics_port: int | None = field(
        default=None,
        metadata=_help(
            "Also serve GET /metrics on this port, with no tenant key (vLLM-style; 0 picks a "
            "free one). Keep it on the operators' network: it names every tenant's adapters. "
            "Default: /metrics only on --port, with the admin key under tenancy."
        ),
    )
    metrics_key: str | None = field(
        default=None,
        repr=False,
        metadata=_help(
            "Bearer key that --metrics-port requires (not a tenant's or the admin's: a "
            "scraper holding it can read metrics and nothing else). Default: open."
        ),
    )
    metrics_label_limit: int = field(
        default=50,
        metadata=_help(
            "Adapters, and tenants, that get their own label in per-adapter and per-tenant "
            "metrics: the first N to serve traffic; later ones are summed under `__other__`."
        ),
    )

    # Replicas on Ray Serve (gateway/replicas/, the `loragate[ray]` extra).
    replicas: int | None = field(
        default=None,
        metadata=_help(
            "Serve with N engine replicas on Ray Serve behind this one HTTP ingress (needs "
            "`pip install 'loragate[ray]'`); adapters route to a replica that holds them. "
            "Default: one engine in this process."
        ),
    )
    min_replicas: int | None = field(
        default=None,
        metadata=_help(
            "Autoscale down to this many replicas (Ray Serve autoscaling; implies replicas)."
        ),
    )
    max_replicas: int | None = field(
        default=None,
        metadata=_help(
            "Autoscale up to this many replicas (Ray Serve autoscaling; implies replicas)."
        ),
    )
    target_ongoing_requests: float = field(
        default=8.0,
        metadata=_help("Autoscaling aims at this many requests in flight on each replica."),
    )
    ray_address: str | None = field(
        default=None,
        metadata=_help(
            "Join this Ray cluster (e.g. ray://head:10001 or auto) for the replicas. "
            "Default: start a local one with the command and stop it with it."
        ),
    )
    replica_cpus: float = field(
        default=1.0,
        metadata=_help("CPUs Ray reserves for each engine replica (fractions allowed)."),
    )

    @property
    def replicated(self) -> bool:
        """Whether the engines run as replicas on Ray Serve rather than in this process."""
        return any(v is not None for v in (self.replicas, self.min_replicas, self.max_replicas))

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
        check_namespace(self.redis_namespace, "redis_namespace")
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
        if self.api_key is not None:
            if (
                not isinstance(self.api_key, str)
                or not self.api_key
                or not self.api_key.isprintable()
            ):
                raise ValueError("api_key must be a non-empty printable string")
            if self.admin_key is not None:
                raise ValueError(
                    "api_key is vLLM's single shared key, for a server without tenancy; with "
                    "admin_key (tenancy) clients use their tenant keys"
                )
        object.__setattr__(self, "lora_modules", tuple(self.lora_modules))
        lora_modules(self.lora_modules)  # a bad entry fails here, before the model loads
        object.__setattr__(self, "model_aliases", tuple(self.model_aliases))
        self._check_tool_choice()
        if self.metrics_port is not None and (
            _not_int(self.metrics_port) or not 0 <= self.metrics_port <= 65535
        ):
            raise ValueError(
                f"metrics_port must be an integer in [0, 65535], got {self.metrics_port!r}"
            )
        if self.metrics_port is not None and self.metrics_port == self.port != 0:
            raise ValueError(f"metrics_port must differ from port ({self.port})")
        if self.metrics_key is not None and (
            not isinstance(self.metrics_key, str)
            or len(self.metrics_key) < MIN_ADMIN_KEY_LENGTH
            or not self.metrics_key.isprintable()
            or any(c.isspace() for c in self.metrics_key)
        ):
            raise ValueError(
                f"metrics_key must be at least {MIN_ADMIN_KEY_LENGTH} printable characters "
                "without spaces"
            )
        if self.metrics_key is not None and self.metrics_key == self.admin_key:
            raise ValueError("metrics_key must differ from admin_key")
        if _not_int(self.metrics_label_limit) or self.metrics_label_limit < 0:
            raise ValueError(
                f"metrics_label_limit must be an integer >= 0, got {self.metrics_label_limit!r}"
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
        _check_replicas(self)
        if self.adapter_root is not None:
            root = Path(self.adapter_root).expanduser()
            if not root.is_dir():
                raise FileNotFoundError(f"adapter_root is not a directory: {self.adapter_root}")
            object.__setattr__(self, "adapter_root", root.resolve())

    def _check_tool_choice(self) -> None:
        load_chat_template(self.chat_template)  # a missing or broken file fails at start
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, "
                f"got {self.tool_call_parser!r}"
            )
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser")


def lora_modules(specs: tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, directory) of each --lora-modules entry: `name=DIR` or vLLM's JSON form."""
    modules = []
    for spec in specs:
        if not isinstance(spec, str):
            raise ValueError(f"lora_modules entries must be strings, got {spec!r}")
        if spec.lstrip().startswith("{"):
            try:
                entry = json.loads(spec)
            except ValueError:
                entry = None
            if not isinstance(entry, dict) or not {"name", "path"} <= set(entry):
                raise ValueError(f"lora_modules entry {spec!r} must be JSON with name and path")
            name, path = entry["name"], entry["path"]
        else:
            name, sep, path = spec.partition("=")
            if not sep:
                raise ValueError(f"lora_modules entry {spec!r} must be name=DIR")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError(f"lora_modules entry {spec!r} needs a name and a directory")
        modules.append((name, path))
    return modules


def _check_replicas(s: GatewaySettings) -> None:
    for name in ("replicas", "min_replicas", "max_replicas"):
        value = getattr(s, name)
        if value is not None and (_not_int(value) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    low = s.min_replicas if s.min_replicas is not None else 1
    high = s.max_replicas if s.max_replicas is not None else max(low, s.replicas or 1)
    if low > high:
        raise ValueError(f"min_replicas ({low}) must not exceed max_replicas ({high})")
    autoscaled = s.min_replicas is not None or s.max_replicas is not None
    if autoscaled and s.replicas is not None and not low <= s.replicas <= high:
        raise ValueError(
            f"replicas ({s.replicas}) must lie within min_replicas..max_replicas ({low}..{high})"
        )
    value = s.target_ongoing_requests
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"target_ongoing_requests must be a number > 0, got {value!r}")
    value = s.replica_cpus
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"replica_cpus must be a number >= 0, got {value!r}")
    if s.ray_address is not None and (not isinstance(s.ray_address, str) or not s.ray_address):
        raise ValueError("ray_address must be a non-empty string")


def _not_int(value) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)
