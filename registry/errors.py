"""What the registry store raises on purpose: one base class, and `RegistryUnavailable` for an
unreachable backend (the gateway's store seam turns that one into a 503)."""

from __future__ import annotations


class RegistryError(Exception):
    """Base of every error the registry store raises on purpose."""


class RegistryUnavailable(RegistryError):
    """The store's backend (Redis) cannot be reached; nothing was read or written."""


class AdapterNameTaken(RegistryError):
    """The owner registered this name already and replace=False was asked."""

    def __init__(self, key: str):
        super().__init__(f"adapter {key!r} is already registered (replace=False)")
        self.key = key


class PublicNameTaken(RegistryError):
    """Another public adapter has this name: public names must be unique to resolve."""

    def __init__(self, name: str, holder: str):
        super().__init__(f"public adapter name {name!r} is already used by {holder!r}")
        self.name = name
        self.holder = holder


class AdapterQuotaExceeded(RegistryError):
    """The tenant already owns max_adapters adapters."""

    def __init__(self, tenant: str, limit: int):
        super().__init__(f"tenant {tenant!r} already owns its maximum of {limit} adapters")
        self.tenant = tenant
        self.limit = limit


class StaleAdapterId(RegistryError):
    """lora_int_id was not handed out by this store, or is the one being replaced."""


class TenantExists(RegistryError):
    def __init__(self, name: str):
        super().__init__(f"tenant {name!r} already exists")
        self.name = name


class TenantNotFound(RegistryError):
    def __init__(self, name: str):
        super().__init__(f"tenant {name!r} does not exist")
        self.name = name


class RegistryChanged(RegistryError):
    """The store changed between the read an import was planned on and its write (or
    while it was written), or during each of a snapshot's reads: nothing was written."""
