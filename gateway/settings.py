"""Everything the HTTP server needs besides the engine's own settings, checked where built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loragate.engine import EngineConfig
from loragate.gateway.settings_checks import check_settings


def _help(text: str) -> dict:
    """A field's `loragate serve --help` text (assembly/serve_options.py makes the flag)."""
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
    adapter_store: str | None = field(
        default=None,
        metadata=_help(
            "Where uploaded adapters are kept, once each under their content hash: a "
            "directory (or file:///dir), or s3://bucket/prefix (the `s3` extra; credentials "
            "and endpoint from the environment as boto3 reads them). Default: "
            "<adapter-cache-dir>/store."
        ),
    )
    adapter_cache_dir: Path = field(
        default=Path("~/.cache/loragate/adapters"),
        metadata=_help(
            "This engine's copies of adapters fetched from the store, each checked against "
            "its hash; `{replica}` in it becomes the Ray Serve replica's id."
        ),
    )
    max_adapter_bytes: int | None = field(
        default=None,
        metadata=_help(
            "Largest adapter_model.safetensors an upload or source may have; reading stops "
            "there (413). Default: a float32 adapter of rank --max-lora-rank on every "
            "LoRA-targetable module of every layer, plus 1 MiB."
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
    require_durable_registry: bool = field(
        default=False,
        metadata=_help(
            "Refuse to start unless the Redis of --redis-url keeps the registry over its own "
            "restart (appendonly yes, as CONFIG GET says). Without it, a Redis that would "
            "lose tenants, keys and usage on restart is a warning in the log and /health."
        ),
    )
    registry_backup_dir: Path | None = field(
        default=None,
        metadata=_help(
            "Export the registry (tenants, key digests, adapters, usage) into this directory "
            "every --registry-backup-every seconds, as files `loragate registry import` "
            "reads. Default: no scheduled backups."
        ),
    )
    registry_backup_every: float = field(
        default=3600.0,
        metadata=_help("Seconds between scheduled registry backups (with --registry-backup-dir)."),
    )
    registry_backup_keep: int = field(
        default=48,
        metadata=_help("Scheduled registry backups kept in --registry-backup-dir (the newest)."),
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
    reasoning_parser: str | None = field(
        default=None,
        metadata=_help(
            "vLLM's --reasoning-parser: split a thinking model's answer into "
            "reasoning_content and content ('qwen3': <think>...</think>)."
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
    # Slow clients (assembly/http_limits.py): headers and body must arrive in time, idle
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

    # Observability (observation/metrics.py, observation/metrics_server.py).
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
    upscale_delay_seconds: float | None = field(
        default=None,
        metadata=_help(
            "Autoscaling adds replicas once more are wanted for this long (Ray Serve's "
            "upscale_delay_s; default its own, 30 s)."
        ),
    )
    downscale_delay_seconds: float | None = field(
        default=None,
        metadata=_help(
            "Autoscaling removes replicas once fewer are wanted for this long (Ray Serve's "
            "downscale_delay_s; default its own, 600 s). A replica removed finishes its "
            "requests first (up to --shutdown-timeout)."
        ),
    )
    autoscaling_window_seconds: float | None = field(
        default=None,
        metadata=_help(
            "Autoscaling averages the requests in flight over this window (Ray Serve's "
            "look_back_period_s; default its own, 30 s)."
        ),
    )
    spill_at: int | None = field(
        default=None,
        metadata=_help(
            "Spill rule of the replicas' adapter routing: when every replica holding a "
            "request's adapter has this many requests in flight and another has at most "
            "--spill-idle-at, the request goes there (which loads the adapter too), so a "
            "flooding tenant's requests spread instead of filling one replica's batch. "
            "Default: a replica's --max-num-seqs (its batch full); 0 turns it off (Ray "
            "Serve's multiplexed routing alone)."
        ),
    )
    spill_idle_at: int | None = field(
        default=None,
        metadata=_help(
            "A replica with at most this many requests in flight takes spills. Default: 1 "
            "with --spill-at given, else half a replica's --max-num-seqs."
        ),
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
        object.__setattr__(self, "lora_modules", tuple(self.lora_modules))
        object.__setattr__(self, "model_aliases", tuple(self.model_aliases))
        check_settings(self)
        if self.adapter_root is not None:
            root = Path(self.adapter_root).expanduser()
            if not root.is_dir():
                raise FileNotFoundError(f"adapter_root is not a directory: {self.adapter_root}")
            object.__setattr__(self, "adapter_root", root.resolve())
        if self.registry_backup_dir is not None:
            folder = Path(self.registry_backup_dir).expanduser()
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"registry_backup_dir is not a directory: {self.registry_backup_dir}"
                )
            object.__setattr__(self, "registry_backup_dir", folder.resolve())
