"""Who is calling: the operator (the admin key, or anyone on an open server) or one tenant.

Every route receives a `Caller`; what it may see and do follows from it alone, so the
rules (a tenant sees its own adapters plus public ones, and nothing else) live here once.

Names: each tenant names its adapters in its own namespace. A tenant calls an adapter by
its bare name (its own first, then a public one); the operator calls its own adapters by
bare name and a tenant's as `<tenant>/<name>` (the adapter's key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from litestar.connection import ASGIConnection

# Usage of requests made without a tenant key (open server, or the admin key) is counted
# under this name, so it is reserved: no tenant may take it.
UNTENANTED = "default"

# Where the auth middleware leaves the caller in the ASGI scope.
CALLER_SCOPE_KEY = "loragate.caller"


@dataclass(frozen=True)
class Principal:
    """tenant None: the operator, who sees and may change everything."""

    tenant: str | None = None
    quota: object | None = None  # the tenant's TenantQuota when it was authenticated
    weight: float = 1.0  # the tenant's share under the `fair` scheduling policy
    cache_salt: str | None = None

    @property
    def is_operator(self) -> bool:
        return self.tenant is None

    @property
    def usage_name(self) -> str:
        return self.tenant if self.tenant is not None else UNTENANTED

    def name_of(self, record: Owned) -> str:
        """What this caller calls `record`: a tenant never sees another owner's name."""
        return record.key if self.tenant is None else record.name

    def owns(self, record: Owned) -> bool:
        return self.tenant is None or record.tenant == self.tenant


OPERATOR = Principal()


class Owned(Protocol):
    """What the naming rules read of an adapter record (adapter_control's AdapterRecord)."""

    @property
    def key(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def tenant(self) -> str | None: ...


def caller_of(request: ASGIConnection) -> Principal:
    """Set by the auth middleware on every route (the operator on an open server).

    Missing means the middleware did not run: refuse rather than assume the operator.
    """
    caller = request.scope.get(CALLER_SCOPE_KEY)
    if not isinstance(caller, Principal):
        raise RuntimeError("request reached a route without passing the auth middleware")
    return caller


# How route handlers ask Litestar for the caller (provided as `caller`, typed).
Caller = Principal
