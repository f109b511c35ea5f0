"""Every adapter kind uploaded over HTTP and served in one concurrent mixed batch (issue 45,
must-show 2): plain LoRA, DoRA, a lora_B bias, LoRA on embed_tokens and lm_head, whole
copies of both (modules_to_save) and trainable tokens go through `POST /v1/adapters` into a
server on the tiny model; then requests for each, and for the base, sent at once, each
greedy answer equal to PEFT's for the files uploaded (that adapter alone)."""

from __future__ import annotations

import uuid

import pytest
from adapter_kinds_testlib import KIND_OF
from gateway_testlib import metrics
from kinds_over_http_testlib import (
    MAX_ADAPTER_BYTES,
    assert_mixed_batch_matches_peft,
    every_kind_with_references,
)
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from uploads_testlib import parts_of, upload


@pytest.fixture(scope="module")
def kinds(tmp_path_factory, tiny_dir):
    return every_kind_with_references(tiny_dir, tmp_path_factory.mktemp("every-kind"))


@pytest.fixture(scope="module")
def server(tiny_dir, redis_url, tmp_path_factory):
    namespace = f"test-upload-kinds-{uuid.uuid4().hex}"
    running = start_tiny_server(
        tiny_dir,
        {},
        admin_key=ADMIN_KEY,
        redis_url=redis_url,
        redis_namespace=namespace,
        adapter_cache_dir=tmp_path_factory.mktemp("kinds-cache"),
        max_adapter_bytes=MAX_ADAPTER_BYTES,
    )
    try:
        yield running
    finally:
        running.stop()
        flush_namespace(namespace, redis_url)


@pytest.fixture(scope="module")
def uploaded(server, kinds):
    """A tenant that uploaded every kind: (its Api, name -> the upload's answer)."""
    admin = Api(server.url, ADMIN_KEY)
    tenant = admin.as_key(admin.create_tenant(f"t{uuid.uuid4().hex[:10]}"))
    answers = {}
    for name, path in kinds[0].items():
        got = upload(tenant, name, parts_of(path))
        assert got.status_code == 201, f"{name}: {got.text}"
        answers[name] = got.json()
    return tenant, answers


def test_every_kind_uploaded_serves_peft_output_in_one_concurrent_batch(uploaded, kinds):
    tenant, _ = uploaded
    assert_mixed_batch_matches_peft(tenant, kinds[1])


def test_the_adapter_list_and_the_metrics_say_each_kind_and_its_size(uploaded, kinds, server):
    tenant, answers = uploaded
    assert {n: a["kind"] for n, a in answers.items()} == KIND_OF
    listed = tenant.get("/v1/adapters")
    assert listed.status_code == 200, listed.text
    assert {a["name"]: a["kind"] for a in listed.json()["data"]} == KIND_OF
    sizes = {a["name"]: a["size_bytes"] for a in listed.json()["data"]}
    # Whole copies of embed_tokens and lm_head: 2 x 49152 x 64 float32 at least.
    assert sizes["saved"] > 2 * 49152 * 64 * 4 > 50 * sizes["plain"]
    for name, kind in KIND_OF.items():
        one = tenant.get(f"/v1/adapters/{name}")
        assert one.status_code == 200, one.text
        assert (one.json()["kind"], one.json()["size_bytes"]) == (kind, sizes[name])
    assert_mixed_batch_matches_peft(tenant, {None: kinds[1][None], "saved": kinds[1]["saved"]})
    scraped = metrics(server.url, Api(server.url, ADMIN_KEY).headers)
    for kind in KIND_OF.values():
        assert scraped[f'loragate_adapters_by_kind{{kind="{kind}"}}'] >= 1, kind
    assert scraped['loragate_adapter_bytes_by_kind{kind="lora+saved-modules"}'] >= sizes["saved"]
    labelled = [k for k in scraped if k.startswith("loragate_adapter_size_bytes{")]
    assert any('kind="lora+saved-modules"' in k for k in labelled), labelled
