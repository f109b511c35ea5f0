"""loragate.registry: the store every gateway replica shares (in memory, or on Redis).

Adapter metadata, tenants, API keys, quotas and usage, as plain records; `make_registry_store`
picks the backend. The engine never imports this layer; the gateway reaches it through one
seam (`loragate.gateway.adapter_control.store_seam`).
"""

from loragate.registry.adapter_objects import AdapterBytesQuotaExceeded
from loragate.registry.errors import (
    AdapterNameTaken,
    AdapterQuotaExceeded,
    PublicNameTaken,
    RegistryError,
    RegistryUnavailable,
    StaleAdapterId,
    TenantExists,
    TenantNotFound,
)
from loragate.registry.names import (
    adapter_key,
    check_adapter_key,
    check_adapter_name,
    check_namespace,
    check_served_name,
    check_tenant_name,
    split_adapter_key,
)
from loragate.registry.records import (
    AdapterMetadata,
    AdapterSpec,
    AdapterWeights,
    Admission,
    ChangeEvent,
    ChangeKind,
    IssuedKey,
    Registration,
    TenantQuota,
    TenantRecord,
    UsageCounts,
    UsageReport,
)
from loragate.registry.store import RegistryStore, make_registry_store

__all__ = [
    "AdapterBytesQuotaExceeded",
    "AdapterMetadata",
    "AdapterNameTaken",
    "AdapterQuotaExceeded",
    "AdapterSpec",
    "AdapterWeights",
    "Admission",
    "ChangeEvent",
    "ChangeKind",
    "IssuedKey",
    "PublicNameTaken",
    "Registration",
    "RegistryError",
    "RegistryStore",
    "RegistryUnavailable",
    "StaleAdapterId",
    "TenantExists",
    "TenantNotFound",
    "TenantQuota",
    "TenantRecord",
    "UsageCounts",
    "UsageReport",
    "adapter_key",
    "check_adapter_key",
    "check_adapter_name",
    "check_namespace",
    "check_served_name",
    "check_tenant_name",
    "make_registry_store",
    "split_adapter_key",
]
