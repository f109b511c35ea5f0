"""How the Redis store talks to Redis: its key layout, the one translation of "cannot reach
Redis" into RegistryUnavailable, the change feed, and decoding what it reads back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from functools import wraps
from urllib.parse import urlsplit

import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from loragate.registry.adapter_index import AdapterCounts
from loragate.registry.errors import RegistryUnavailable
from loragate.registry.records import (
    AdapterMetadata,
    ChangeEvent,
    TenantRecord,
    UsageCounts,
    UsageReport,
)

UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_COUNTERS = UsageCounts.__struct_fields__


def redacted(url: str) -> str:
    """The URL without credentials (user, password, query options), for error messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc, query="", fragment="").geturl()


@contextmanager
def reachable(where: str):
    """Turn every way of not reaching Redis into RegistryUnavailable."""
    try:
        yield
    except UNREACHABLE as exc:
        raise RegistryUnavailable(f"registry store at {where} is unreachable: {exc}") from exc


def translated(method: Callable[..., Awaitable]):
    @wraps(method)
    async def wrapper(self, *args, **kwargs):
        with reachable(self.where):
            return await method(self, *args, **kwargs)

    return wrapper


def limit(value: int | None) -> int:
    return -1 if value is None else value


class Keys:
    def __init__(self, namespace: str):
        ns = namespace
        self.adapters = f"{ns}:adapters"
        self.lora_int_id = f"{ns}:lora-int-id"
        self.tenants = f"{ns}:tenants"
        self.api_keys = f"{ns}:api-keys"
        self.usage_tenants = f"{ns}:usage-tenants"
        self.version = f"{ns}:version"
        self.epoch = f"{ns}:epoch"
        self.events = f"{ns}:events"
        self.adapter_index = f"{ns}:adapter-index"
        self.public_names = f"{ns}:public-names"
        self.public_index = f"{ns}:public-index"
        self.object_refs = f"{ns}:object-refs"
        self.changes = f"{ns}:changes"
        self.namespace = self._ns = ns

    def owned(self, tenant: str) -> str:
        return f"{self._ns}:owned:{tenant}"

    def adapter_totals(self, tenant: str) -> str:
        return f"{self._ns}:adapter-totals:{tenant}"

    def usage(self, tenant: str) -> str:
        return f"{self._ns}:usage:{tenant}"

    def leases(self, tenant: str) -> str:
        return f"{self._ns}:leases:{tenant}"

    def reserved(self, tenant: str) -> str:
        return f"{self._ns}:reserved:{tenant}"

    def rpm(self, tenant: str) -> str:
        return f"{self._ns}:rpm:{tenant}"

    def tpm(self, tenant: str) -> str:
        return f"{self._ns}:tpm:{tenant}"

    def object_pins(self, oid: str) -> str:
        return f"{self._ns}:object-pins:{oid}"

    def object_claim(self, oid: str) -> str:
        return f"{self._ns}:object-claim:{oid}"


class EventFeed:
    """The change events of one subscription, as an async iterator."""

    def __init__(self, pubsub, where: str):
        self._pubsub = pubsub
        self._where = where

    def __aiter__(self) -> EventFeed:
        return self

    async def __anext__(self) -> ChangeEvent:
        while True:
            with reachable(self._where):
                message = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=1.0
                )
            if message is not None and message["type"] == "message":
                return msgspec.json.decode(message["data"], type=ChangeEvent)


def decode_adapter(raw: str | None) -> AdapterMetadata | None:
    return None if raw is None else msgspec.json.decode(raw, type=AdapterMetadata)


def decode_counts(raw: list[str | None]) -> AdapterCounts:
    """An `adapter-totals:<tenant>` hash's (adapters, size_bytes), read with HMGET."""
    adapters, size_bytes = raw
    return AdapterCounts(int(adapters or 0), int(size_bytes or 0))


def decode_tenant(raw: str | None) -> TenantRecord | None:
    return None if raw is None else msgspec.json.decode(raw, type=TenantRecord)


def usage_report(tenant: str, raw: dict[str, str]) -> UsageReport:
    total = {c: int(raw.get(c, 0)) for c in _COUNTERS}
    per_adapter: dict[str, dict[str, int]] = {}
    for field, value in raw.items():
        counter, sep, adapter = field.partition("@")
        if sep and counter in _COUNTERS:
            per_adapter.setdefault(adapter, {})[counter] = int(value)
    by_adapter = {name: UsageCounts(**per_adapter[name]) for name in sorted(per_adapter)}
    return UsageReport(tenant, UsageCounts(**total), by_adapter)
