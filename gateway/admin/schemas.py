"""Bodies of the adapter-management and health routes."""

from __future__ import annotations

import msgspec


class RegisterAdapterRequest(msgspec.Struct, kw_only=True):
    """`path` is a directory under the server's --adapter-root (relative or absolute); a
    tenant's paths are under `<adapter-root>/<tenant>/`. Or `source`, a URI the server reads
    the adapter from into its adapter store (`s3://bucket/key/`, or `file:///dir` under the
    same folder a `path` may name); exactly one of the two. `public` (admin only) lets every
    tenant use the adapter; left out, a re-registration keeps the flag it had. A name
    already registered is a 400 (as vLLM's load_lora_adapter) unless `replace` is true.
    (A multipart/form-data body uploads the files instead: gateway/adapter_control/uploads.py.)"""

    name: str
    path: str | None = None
    source: str | None = None
    public: bool | None = None
    replace: bool = False


class PatchAdapterRequest(msgspec.Struct, kw_only=True):
    """Admin only: share an adapter with every tenant (`public: true`), or stop sharing it."""

    public: bool


class LoadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body for POST /v1/load_lora_adapter."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body for POST /v1/unload_lora_adapter."""

    lora_name: str
    lora_int_id: int | None = None


class AdapterInfo(msgspec.Struct, kw_only=True):
    """A registered adapter. `path` is relative to the adapter root, never absolute (for an
    adapter shared with a tenant that does not own it, relative to its owner's folder).

    `name` is the name the caller uses: bare for a tenant (its own namespace, then the
    public one), and `<tenant>/<name>` for a tenant's adapter seen by the admin.
    `owner` is the owning tenant (null: the operator); a tenant sees it only for its own
    adapters, never the owner of a public one."""

    name: str
    id: int
    object: str = "adapter"
    parent: str
    path: str
    rank: int
    alpha: float
    target_modules: list[str]
    sha256: str
    size_bytes: int
    created: int
    source: str
    owner: str | None = None
    public: bool = False
    # "lora", "dora" or "lora+bias", with "+saved-modules", "+vocab-lora" (LoRA on
    # embed_tokens or lm_head) or "+trainable-tokens" when the adapter carries them.
    kind: str = "lora"


class AdapterList(msgspec.Struct, kw_only=True):
    """One page, as OpenAI's lists page: `has_more` says another follows, asked for with
    `?after=<last_id>`."""

    object: str = "list"
    data: list[AdapterInfo]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class DeletedAdapter(msgspec.Struct, kw_only=True):
    name: str
    object: str = "adapter"
    deleted: bool = True


class RegistryHealth(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The registry store as this replica sees it. Anyone sees `reachable`; the rest only
    the operator (`backend` never carries credentials)."""

    reachable: bool
    backend: str | None = None
    watching: bool | None = None
    error: str | None = None
    down_since: float | None = None
    orphaned_adapters: int | None = None
    orphaned_tenants: int | None = None
    pending_usage_records: int | None = None
    # What the store keeps over its own restart, as checked at start (registry_care.py).
    durable: bool | None = None
    persistence: str | None = None
    # When this replica noticed the store had lost its data, and the newest backup known.
    data_lost_at: float | None = None
    newest_backup: str | None = None
    newest_backup_at: float | None = None
    backup_error: str | None = None


class HealthStatus(msgspec.Struct, kw_only=True):
    """status: "ok"; "degraded" (200: serving, but the registry store is unreachable or
    lost its data); "unavailable" (503: the engine stopped)."""

    status: str
    model: str
    detail: str | None = None
    registry: RegistryHealth | None = None
