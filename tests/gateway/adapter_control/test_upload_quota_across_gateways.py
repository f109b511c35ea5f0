"""A tenant's adapter quota is checked on the registry's counters (issue 46): a gateway
that never read the tenant's adapters (they were uploaded through another gateway, and a
gateway reads an adapter only when a request names it) still refuses an upload over
max_adapters or max_adapter_bytes before its bytes reach the adapter store."""

from __future__ import annotations

import uuid

import pytest
from gateway_testlib import TARGETS
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from tiny_llama import make_adapters
from uploads_testlib import parts_of, upload


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir):
    specs = {name: (4, TARGETS, False) for name in ("first", "second")}
    return make_adapters(tiny_dir, tmp_path_factory.mktemp("quota-uploads"), specs)


@pytest.fixture(scope="module")
def gateways(tiny_dir, redis_url, tmp_path_factory):
    """Two gateways on one registry and one adapter store (a shared local folder)."""
    namespace = f"test-upload-quota-{uuid.uuid4().hex}"
    cache = tmp_path_factory.mktemp("quota-cache")
    options = dict(
        admin_key=ADMIN_KEY,
        redis_url=redis_url,
        redis_namespace=namespace,
        adapter_cache_dir=cache,
    )
    started = [start_tiny_server(tiny_dir, {}, **options) for _ in range(2)]
    try:
        yield [Api(s.url, ADMIN_KEY) for s in started], cache / "store"
    finally:
        for server in started:
            server.stop()
        flush_namespace(namespace, redis_url)


def objects(store) -> set[str]:
    return {p.name for p in store.iterdir() if not p.name.startswith(".")}


@pytest.mark.parametrize(
    "quota, code", [({"max_adapters": 1}, "max_adapters"), ({}, "max_adapter_bytes")]
)
def test_an_upload_over_quota_is_refused_by_a_gateway_that_never_read_the_others(
    gateways, files, quota, code
):
    (a, b), store = gateways
    size = sum(len(v) for v in parts_of(files["first"]).values())
    if code == "max_adapter_bytes":
        quota = {"max_adapter_bytes": size + size // 2}
    tenant = f"t{uuid.uuid4().hex[:8]}"
    key = a.create_tenant(tenant, **quota)
    through_a, through_b = a.as_key(key), b.as_key(key)
    got = upload(through_a, "first", parts_of(files["first"]))
    assert got.status_code == 201, got.text
    before = objects(store)

    refused = upload(through_b, "second", parts_of(files["second"]))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == code, refused.text
    assert objects(store) == before, "refused before its bytes reached the adapter store"
    # A replacement of the adapter it has is within the quota, through either gateway.
    again = upload(through_b, "first", parts_of(files["first"]), replace=True)
    assert again.status_code == 201, again.text
