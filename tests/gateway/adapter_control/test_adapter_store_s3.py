"""The adapter store on S3 (issue 37, must-show 3): against moto's S3 HTTP server, started
by the fixture (tests/s3_testlib.py). Upload, serve, delete; a source by s3:// URI; and an
object corrupted or truncated in the bucket refused with a clear error by a replica that
has to fetch it, never served.

Two gateways share one Redis namespace and one bucket, each with its own cache directory:
the second has never seen the files and fetches them by hash.
"""

from __future__ import annotations

import uuid

import pytest
from gateway_testlib import TARGETS, wait_until
from s3_testlib import environment, s3_server
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from tiny_llama import make_adapters, peft_greedy, peft_model_with
from uploads_testlib import CONFIG, WEIGHTS, generated, parts_of, upload


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server, environment(server.env):
        yield server


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("s3-uploads")
    specs = {
        "one": (4, TARGETS, False),
        "two": (2, ["v_proj"], False),
        "three": (2, ["o_proj"], False),
    }
    return make_adapters(tiny_dir, root, specs)


@pytest.fixture(scope="module")
def bucket(s3):
    return s3.new_bucket()


@pytest.fixture(scope="module")
def gateways(s3, bucket, tiny_dir, redis_url, tmp_path_factory):
    """Two gateways on one registry and one bucket, each with its own cache directory."""
    namespace = f"test-s3-{uuid.uuid4().hex}"
    root = tmp_path_factory.mktemp("s3-root")
    servers = [
        start_tiny_server(
            tiny_dir,
            {},
            adapter_root=root,
            admin_key=ADMIN_KEY,
            redis_url=redis_url,
            redis_namespace=namespace,
            adapter_store=f"s3://{bucket}/objects",
            adapter_cache_dir=tmp_path_factory.mktemp(f"s3-cache-{i}"),
        )
        for i in range(2)
    ]
    try:
        yield [Api(s.url, ADMIN_KEY) for s in servers]
    finally:
        for server in servers:
            server.stop()
        flush_namespace(namespace, redis_url)


def sees(api: Api, name: str) -> None:
    """Wait for a gateway to hear of a registration made on the other (within a second)."""
    wait_until(lambda: api.get(f"/v1/adapters/{name}").status_code == 200, f"{name} seen", 5)


def tenant_on(gateways, name: str) -> list[Api]:
    key = gateways[0].create_tenant(name)
    return [g.as_key(key) for g in gateways]


def test_upload_serve_delete_through_s3(gateways, s3, bucket, files, tiny_dir):
    first, second = tenant_on(gateways, f"t{uuid.uuid4().hex[:8]}")
    got = upload(first, "one", parts_of(files["one"]))
    assert got.status_code == 201, got.text
    keys = s3.keys(bucket, "objects/")
    assert len(keys) == 2 and {k.rsplit("/", 1)[1] for k in keys} == {CONFIG, WEIGHTS}
    assert keys[0].split("/")[1].startswith(got.json()["sha256"])

    reference = peft_model_with(tiny_dir, {"one": files["one"]})
    prompt, tokens = generated(first, "one")
    sees(second, "one")
    assert tokens == peft_greedy(reference, "one", prompt, 8)
    # The other gateway has no copy: it fetches by hash, checks it, and serves the same.
    assert generated(second, "one") == (prompt, tokens)
    assert generated(second, "one") == (prompt, tokens)
    fetched = [g.get("/v1/replicas").json()["data"][0]["adapter_loads"]["store"] for g in gateways]
    assert fetched == [0, 1], "the uploader keeps its own copy; the other fetches once"

    assert second.delete("/v1/adapters/one").status_code == 200
    # Both gateways try to delete the unused bytes; the one holding the claim does.
    wait_until(lambda: s3.keys(bucket, "objects/") == [], "the object deleted", 10)
    wait_until(lambda: first.complete("one").status_code == 404, "the name gone on A", 5)


def test_a_source_by_uri(gateways, s3, bucket, files):
    (api, _) = tenant_on(gateways, f"t{uuid.uuid4().hex[:8]}")
    client = s3.client()
    for name in (CONFIG, WEIGHTS):
        client.upload_file(str(files["two"] / name), bucket, f"incoming/two/{name}")
    got = api.post("/v1/adapters", {"name": "two", "source": f"s3://{bucket}/incoming/two/"})
    assert got.status_code == 201, got.text
    assert got.json()["source"] == "source"
    assert api.complete("two").status_code == 200
    missing = api.post("/v1/adapters", {"name": "x", "source": f"s3://{bucket}/nothing/"})
    assert missing.status_code == 400 and "does not exist" in missing.json()["error"]["message"]
    hub = api.post("/v1/adapters", {"name": "x", "source": "hf://org/adapter"})
    assert hub.status_code == 400 and "hf://" in hub.json()["error"]["message"], hub.text
    alias = api.post(
        "/v1/load_lora_adapter",
        {"lora_name": "alias", "lora_path": f"s3://{bucket}/incoming/two/"},
    )
    assert alias.status_code == 200, alias.text
    assert api.complete("alias").json()["choices"] == api.complete("two").json()["choices"]
    for name in ("two", "alias"):
        assert api.delete(f"/v1/adapters/{name}").status_code == 200


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_a_damaged_object_is_refused_never_served(gateways, s3, bucket, files, damage):
    first, second = tenant_on(gateways, f"t{uuid.uuid4().hex[:8]}")
    name = "three"
    got = upload(first, name, parts_of(files[name]))
    assert got.status_code == 201, got.text
    sees(second, name)
    weights_key = next(k for k in s3.keys(bucket, "objects/") if k.endswith(WEIGHTS))
    data = (files[name] / WEIGHTS).read_bytes()
    damaged = data[:-64] + bytes(64) if damage == "corrupt" else data[: len(data) // 2]
    s3.client().put_object(Bucket=bucket, Key=weights_key, Body=damaged)

    for _ in range(2):  # refused every time, never cached
        got = second.complete(name)
        assert got.status_code == 502, got.text
        error = got.json()["error"]
        assert error["code"] == "corrupt_adapter_object"
        assert "sha256" in error["message"] and "not served" in error["message"]
    assert first.complete(name).status_code == 200, "the gateway with a good copy still serves"
    assert first.delete(f"/v1/adapters/{name}").status_code == 200
