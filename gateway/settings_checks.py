"""The checks behind GatewaySettings: every bad value is a ValueError naming its field."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from loragate.engine import EngineConfig
from loragate.gateway.openai.chat_template import load_chat_template
from loragate.gateway.openai.reasoning import REASONING_PARSERS
from loragate.gateway.openai.tool_parsers import TOOL_PARSERS
from loragate.registry import check_namespace

MIN_ADMIN_KEY_LENGTH = 16


def check_settings(s) -> None:
    """Raise for the first bad field of a GatewaySettings (`s`)."""
    if not isinstance(s.engine, EngineConfig):
        raise ValueError(f"engine must be an EngineConfig, got {type(s.engine).__name__}")
    if _not_int(s.port) or not 0 <= s.port <= 65535:
        raise ValueError(f"port must be an integer in [0, 65535], got {s.port!r}")
    if _not_int(s.max_queue) or s.max_queue < 0:
        raise ValueError(f"max_queue must be an integer >= 0, got {s.max_queue!r}")
    if _not_int(s.max_body_bytes) or s.max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes must be an integer >= 1024, got {s.max_body_bytes!r}")
    if not isinstance(s.shutdown_timeout, int | float) or s.shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout must be >= 0 seconds, got {s.shutdown_timeout!r}")
    if _not_int(s.retry_after_seconds) or s.retry_after_seconds < 1:
        raise ValueError(
            f"retry_after_seconds must be an integer >= 1, got {s.retry_after_seconds!r}"
        )
    if s.redis_url is not None and (
        not isinstance(s.redis_url, str)
        or urlsplit(s.redis_url).scheme not in ("redis", "rediss", "unix")
    ):
        raise ValueError("redis_url must start with redis://, rediss:// or unix://")
    check_namespace(s.redis_namespace, "redis_namespace")
    _check_registry_care(s)
    _check_adapter_store(s)
    _check_key("admin_key", s.admin_key)
    if s.api_key is not None:
        if not isinstance(s.api_key, str) or not s.api_key or not s.api_key.isprintable():
            raise ValueError("api_key must be a non-empty printable string")
        if s.admin_key is not None:
            raise ValueError(
                "api_key is vLLM's single shared key, for a server without tenancy; with "
                "admin_key (tenancy) clients use their tenant keys"
            )
    lora_modules(s.lora_modules)  # a bad entry fails here, before the model loads
    _check_tool_choice(s)
    if s.metrics_port is not None and (
        _not_int(s.metrics_port) or not 0 <= s.metrics_port <= 65535
    ):
        raise ValueError(f"metrics_port must be an integer in [0, 65535], got {s.metrics_port!r}")
    if s.metrics_port is not None and s.metrics_port == s.port != 0:
        raise ValueError(f"metrics_port must differ from port ({s.port})")
    _check_key("metrics_key", s.metrics_key)
    if s.metrics_key is not None and s.metrics_key == s.admin_key:
        raise ValueError("metrics_key must differ from admin_key")
    if _not_int(s.metrics_label_limit) or s.metrics_label_limit < 0:
        raise ValueError(
            f"metrics_label_limit must be an integer >= 0, got {s.metrics_label_limit!r}"
        )
    if _not_int(s.max_connections) or s.max_connections < 1:
        raise ValueError(f"max_connections must be an integer >= 1, got {s.max_connections!r}")
    for name in (
        "registry_resync_seconds",
        "auth_cache_seconds",
        "quota_lease_seconds",
        "header_timeout_seconds",
        "body_timeout_seconds",
        "keep_alive_seconds",
        "adapter_load_timeout_seconds",
    ):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    _check_replicas(s)


def _check_key(name: str, value) -> None:
    """A bearer key the operator sets: long enough to guess at, and one token of text."""
    if value is not None and (
        not isinstance(value, str)
        or len(value) < MIN_ADMIN_KEY_LENGTH
        or not value.isprintable()
        or any(c.isspace() for c in value)
    ):
        raise ValueError(
            f"{name} must be at least {MIN_ADMIN_KEY_LENGTH} printable characters without spaces"
        )


def _check_tool_choice(s) -> None:
    load_chat_template(s.chat_template)  # a missing or broken file fails at start
    if s.tool_call_parser is not None and s.tool_call_parser not in TOOL_PARSERS:
        raise ValueError(
            f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, got {s.tool_call_parser!r}"
        )
    if s.enable_auto_tool_choice and s.tool_call_parser is None:
        raise ValueError("enable_auto_tool_choice needs tool_call_parser")
    if s.reasoning_parser is not None and s.reasoning_parser not in REASONING_PARSERS:
        raise ValueError(
            f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, "
            f"got {s.reasoning_parser!r}"
        )


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


def _check_replicas(s) -> None:
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
    if s.spill_at is not None and (_not_int(s.spill_at) or s.spill_at < 0):
        raise ValueError(f"spill_at must be an integer >= 0 (0: off), got {s.spill_at!r}")
    if s.spill_idle_at is not None and (_not_int(s.spill_idle_at) or s.spill_idle_at < 0):
        raise ValueError(f"spill_idle_at must be an integer >= 0, got {s.spill_idle_at!r}")
    for name in ("upscale_delay_seconds", "downscale_delay_seconds", "autoscaling_window_seconds"):
        value = getattr(s, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
        ):
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    value = s.replica_cpus
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"replica_cpus must be a number >= 0, got {value!r}")
    if s.ray_address is not None and (not isinstance(s.ray_address, str) or not s.ray_address):
        raise ValueError("ray_address must be a non-empty string")


def _check_adapter_store(s) -> None:
    if s.max_adapter_bytes is not None and (
        _not_int(s.max_adapter_bytes) or s.max_adapter_bytes < 1
    ):
        raise ValueError(f"max_adapter_bytes must be an integer >= 1, got {s.max_adapter_bytes!r}")
    store = s.adapter_store
    if store is None:
        return
    if not isinstance(store, str) or not store:
        raise ValueError(f"adapter_store must be a directory or s3:// URI, got {store!r}")
    scheme = urlsplit(store).scheme
    if scheme == "s3" and not urlsplit(store).netloc:
        raise ValueError(f"adapter_store needs a bucket: s3://bucket[/prefix], got {store!r}")
    if scheme not in ("", "file", "s3"):
        raise ValueError(
            f"adapter_store must be a directory, file:///dir or s3://bucket/prefix, got {store!r}"
        )


def _not_int(value) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _check_registry_care(s) -> None:
    """--require-durable-registry and the scheduled backups."""
    if not isinstance(s.require_durable_registry, bool):
        raise ValueError("require_durable_registry must be a bool")
    if s.require_durable_registry and s.redis_url is None:
        raise ValueError(
            "require_durable_registry needs redis_url: an in-memory registry never outlives "
            "its process"
        )
    every = s.registry_backup_every
    if isinstance(every, bool) or not isinstance(every, int | float) or not 0 < every < 1e9:
        raise ValueError(f"registry_backup_every must be > 0 seconds, got {every!r}")
    if _not_int(s.registry_backup_keep) or s.registry_backup_keep < 1:
        raise ValueError(
            f"registry_backup_keep must be an integer >= 1, got {s.registry_backup_keep!r}"
        )
