"""API key hashing, and the validation every registry value gets where it is built."""

from __future__ import annotations

import pytest

from loragate.registry import AdapterMetadata, AdapterSpec, TenantQuota, make_registry_store
from loragate.registry.api_keys import issue_api_key, parse_api_key, secret_matches
from loragate.registry.memory import MemoryRegistryStore
from loragate.registry.redis_store import RedisRegistryStore


def test_issued_keys_parse_and_match_only_their_own_hash():
    key, stored = issue_api_key("acme")
    key_id, secret = parse_api_key(key)
    assert key == f"lg-{key_id}-{secret}" and stored.key_id == key_id and stored.tenant == "acme"
    assert secret_matches(stored, secret)
    other_key, other = issue_api_key("acme")
    assert not secret_matches(other, secret)
    assert not secret_matches(stored, parse_api_key(other_key)[1])
    assert not secret_matches(None, secret)


def test_stored_keys_hold_no_secret_and_use_a_fresh_salt():
    first_key, first = issue_api_key("acme")
    _, second = issue_api_key("acme")
    secret = parse_api_key(first_key)[1]
    assert secret not in repr(first) and first_key not in repr(first)
    assert first.salt != second.salt and first.digest != second.digest
    assert len(bytes.fromhex(first.salt)) == 16 and len(bytes.fromhex(first.digest)) == 32


@pytest.mark.parametrize(
    "bad",
    [
        None,
        42,
        "",
        "lg-",
        "sk-0123456789abcdef-" + "A" * 43,
        "lg-0123456789ABCDEF-" + "A" * 43,
        "lg-0123456789abcdef-" + "A" * 42,
        "lg-0123456789abcdef-" + "A" * 42 + "!",
    ],
)
def test_malformed_keys_do_not_parse(bad):
    assert parse_api_key(bad) is None


def spec_fields(**overrides):
    fields = dict(
        name="sql",
        base_model="tiny-llama",
        rank=8,
        alpha=16,
        target_modules=["q_proj"],
        sha256="ab" * 32,
        size_bytes=0,
        path="adapters/sql",
    )
    fields.update(overrides)
    return fields


def test_adapter_spec_normalises_lists_and_ints():
    spec = AdapterSpec(**spec_fields())
    assert spec.target_modules == ("q_proj",) and spec.alpha == 16.0 and spec.status == "ready"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "has space"),
        ("name", ""),
        ("tenant", "a:b"),
        ("public", "yes"),
        ("base_model", ""),
        ("rank", 0),
        ("rank", True),
        ("alpha", 0),
        ("alpha", "16"),
        ("target_modules", []),
        ("target_modules", "q_proj"),
        ("target_modules", ["q_proj", ""]),
        ("sha256", "AB" * 32),
        ("sha256", "ab" * 31),
        ("size_bytes", -1),
        ("path", ""),
        ("status", "gone"),
    ],
)
def test_adapter_spec_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        AdapterSpec(**spec_fields(**{field: value}))


def test_adapter_metadata_needs_a_positive_id():
    with pytest.raises(ValueError, match="lora_int_id"):
        AdapterMetadata(**spec_fields(), lora_int_id=0, created_at=0.0)


@pytest.mark.parametrize(
    "field",
    ["requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "max_adapters"],
)
@pytest.mark.parametrize("value", [0, -3, 1.5, True, "10"])
def test_quota_limits_are_positive_ints(field, value):
    with pytest.raises(ValueError, match=field):
        TenantQuota(**{field: value})


def test_factory_picks_the_store():
    assert isinstance(make_registry_store(None), MemoryRegistryStore)
    redis_store = make_registry_store("redis://127.0.0.1:6379", namespace="x")
    assert isinstance(redis_store, RedisRegistryStore)


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "", None])
def test_redis_store_refuses_a_non_redis_url(url):
    with pytest.raises(ValueError, match="redis url"):
        RedisRegistryStore(url)


@pytest.mark.parametrize("namespace", ["", "a*b", "with space", "x" * 65])
def test_redis_store_refuses_a_namespace_that_could_match_others(namespace):
    with pytest.raises(ValueError, match="namespace"):
        RedisRegistryStore("redis://127.0.0.1:6379", namespace)


@pytest.mark.parametrize("ttl", [0, -1, "30", True])
def test_lease_ttl_must_be_positive(ttl):
    with pytest.raises(ValueError, match="lease_ttl_s"):
        MemoryRegistryStore(lease_ttl_s=ttl)
