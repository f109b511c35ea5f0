"""Every adapter kind uploaded through a gateway with two Ray Serve replicas and served in
one concurrent mixed batch (issue 45, must-show 2, `--replicas 2`): each answer equal to
PEFT's for that adapter alone, whichever replica served it. The replicas share the local
adapter store under one cache directory."""

from __future__ import annotations

import uuid

import pytest
import ray  # the `ray` extra, in `dev`
from adapter_kinds_testlib import KIND_OF
from gateway_testlib import wait_until
from kinds_over_http_testlib import (
    MAX_ADAPTER_BYTES,
    assert_mixed_batch_matches_peft,
    every_kind_with_references,
)
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from uploads_testlib import parts_of, upload

pytestmark = pytest.mark.ray


def replicas_holding_adapters(admin: Api) -> list[str]:
    got = admin.get("/v1/replicas")
    assert got.status_code == 200, got.text
    return [r["id"] for r in got.json()["data"] if any(r["adapters"].values())]


def test_every_kind_uploaded_to_two_replicas_serves_peft_output(
    tiny_dir, redis_url, tmp_path_factory
):
    paths, references = every_kind_with_references(
        tiny_dir, tmp_path_factory.mktemp("ray-every-kind")
    )
    namespace = f"test-ray-kinds-{uuid.uuid4().hex}"
    server = start_tiny_server(
        tiny_dir,
        {},
        redis_url=redis_url,
        redis_namespace=namespace,
        admin_key=ADMIN_KEY,
        replicas=2,
        replica_cpus=0.5,
        adapter_cache_dir=tmp_path_factory.mktemp("ray-kinds-cache"),
        max_adapter_bytes=MAX_ADAPTER_BYTES,
    )
    try:
        admin = Api(server.url, ADMIN_KEY)
        tenant = admin.as_key(admin.create_tenant(f"t{uuid.uuid4().hex[:10]}"))
        for name, path in paths.items():
            got = upload(tenant, name, parts_of(path))
            assert got.status_code == 201, f"{name}: {got.text}"
            assert got.json()["kind"] == KIND_OF[name], "read by the replica that loaded it"
        assert_mixed_batch_matches_peft(tenant, references, rounds=2)
        # Ray Serve spreads names no replica holds over the replicas holding the fewest.
        wait_until(lambda: len(replicas_holding_adapters(admin)) == 2, "both replicas serve")
    finally:
        server.stop()
        flush_namespace(namespace, redis_url)
    assert not ray.is_initialized(), "the local Ray cluster outlived the server"
