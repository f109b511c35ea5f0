"""Every name the registry keeps, checked in one place: adapter names, tenant names, adapter
keys and store namespaces. Each appears in URLs, the `model` field or storage keys, so each is
short and plain, with no separators or wildcards."""

from __future__ import annotations

import re

_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_ADAPTER_RULE = "1-128 characters of letters, digits, '.', '_', ':' or '-'"


def _plain(value: object, pattern: re.Pattern, field_name: str, rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(
            f"{field_name} must be {rule}, starting with a letter or digit; got {value!r}"
        )
    return value


def check_adapter_name(name: object, field_name: str = "adapter name") -> str:
    """Adapter names appear in URLs and in the `model` field: short and plain."""
    return _plain(name, _ADAPTER_NAME, field_name, _ADAPTER_RULE)


def adapter_key(tenant: str | None, name: str) -> str:
    """Where an adapter lives: `<tenant>/<name>` in a tenant's namespace, `<name>` in the
    operator's. Neither a tenant nor an adapter name holds a '/', so keys never clash."""
    return name if tenant is None else f"{tenant}/{name}"


def split_adapter_key(key: object) -> tuple[str | None, str]:
    """(tenant or None, name) of a key; ValueError naming what is wrong with it."""
    if not isinstance(key, str):
        raise ValueError(f"adapter key must be a string, got {key!r}")
    tenant, sep, name = key.rpartition("/")
    if not sep:
        return None, check_adapter_name(key)
    return check_tenant_name(tenant), check_adapter_name(name)


def check_adapter_key(key: object) -> str:
    split_adapter_key(key)
    return key


def check_tenant_name(name: object) -> str:
    """Tenant names become part of storage keys: no separators, no wildcards."""
    rule = "1-64 characters of letters, digits, '.', '_' or '-'"
    return _plain(name, _TENANT_NAME, "tenant name", rule)


def check_served_name(name: object, base_model: str) -> str:
    """An adapter name a server will answer to: a valid adapter name that is never the base
    model's in any case (a client that mistyped the case must not get an adapter)."""
    check_adapter_name(name, "name")
    if name.casefold() == base_model.casefold():
        raise ValueError(f"name {name!r} is the base model's name")
    return name


def check_namespace(namespace: object, field_name: str = "namespace") -> str:
    """A Redis namespace prefixes every key of one deployment (a random one isolates a test)."""
    rule = "1-64 letters, digits, '.', '_', ':' or '-'"
    return _plain(namespace, _NAMESPACE, field_name, rule)
