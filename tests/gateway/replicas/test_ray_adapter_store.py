"""Two Ray Serve replicas fetch an uploaded adapter by hash (issue 37, must-show 4).

The ingress and its two replicas share no adapter path: no --adapter-root, and each
replica caches under its own directory (`{replica}` in --adapter-cache-dir); the only thing
they share is the adapter store, a bucket on moto's S3 server started here. Two tenants
upload the same bytes under their own names, so both names are one object.

Which replica serves a name is Ray Serve's choice (its multiplexed routing prefers a replica
that holds the name, else one holding the fewest, and goes elsewhere when that one is busy
or its view is stale), so the test asserts none: it serves both names until both replicas
have served, then serves more, and checks what the gateway controls. Every replica fetched
the object exactly once however many requests it then served, every answer equals PEFT's,
each replica's cache holds the one object, and the ingress fetched nothing.
"""

from __future__ import annotations

import time
import uuid

import pytest
import ray  # the `ray` extra, in `dev`
from gateway_testlib import TARGETS, wait_until
from s3_testlib import environment, s3_server
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from tiny_llama import make_adapters, peft_greedy, peft_model_with
from uploads_testlib import generated, parts_of, upload

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server, environment(server.env):
        yield server


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir):
    return make_adapters(
        tiny_dir, tmp_path_factory.mktemp("ray-uploads"), {"x": (4, TARGETS, False)}
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ray-caches")


@pytest.fixture(scope="module")
def deployment(s3, tiny_dir, redis_url, cache):
    namespace = f"test-ray-store-{uuid.uuid4().hex}"
    bucket = s3.new_bucket()
    server = start_tiny_server(
        tiny_dir,
        {"max_loras": 1, "max_cpu_loras": 1},
        redis_url=redis_url,
        redis_namespace=namespace,
        admin_key=ADMIN_KEY,
        replicas=2,
        replica_cpus=0.5,
        adapter_store=f"s3://{bucket}/adapters",
        adapter_cache_dir=cache / "{replica}",
    )
    try:
        yield server, bucket
    finally:
        server.stop()
        flush_namespace(namespace, redis_url)
    assert not ray.is_initialized(), "the local Ray cluster outlived the server"


def replicas(admin: Api) -> list[dict]:
    got = admin.get("/v1/replicas")
    assert got.status_code == 200, got.text
    return got.json()["data"]


def store_fetches(admin: Api) -> list[int]:
    """Each replica's count of adapter store objects it downloaded, as it last reported."""
    return sorted(r["adapter_loads"]["store"] for r in replicas(admin))


def test_two_replicas_each_fetch_an_uploaded_adapter_once(deployment, s3, files, cache, tiny_dir):
    server, bucket = deployment
    admin = Api(server.url, ADMIN_KEY)
    acme = admin.as_key(admin.create_tenant("acme"))
    globex = admin.as_key(admin.create_tenant("globex"))
    for api in (acme, globex):
        got = upload(api, "x", parts_of(files["x"]))
        assert got.status_code == 201, got.text
    keys = s3.keys(bucket, "adapters/")
    assert len(keys) == 2, "one object (two files) for both names"
    oid = keys[0].split("/")[1]

    reference = peft_model_with(tiny_dir, {"x": files["x"]})
    prompt, tokens = generated(acme, "x")
    assert tokens == peft_greedy(reference, "x", prompt, 8)

    def serve_both() -> None:
        assert generated(acme, "x") == (prompt, tokens)
        assert generated(globex, "x") == (prompt, tokens)

    # Until both replicas have served (and so fetched): a bound on Ray Serve's spreading,
    # which puts a name no replica holds on one holding the fewest (each holds one here).
    for _ in range(20):
        serve_both()
        if store_fetches(admin) == [1, 1]:
            break
    wait_until(
        lambda: all(n >= 1 for n in store_fetches(admin)),
        f"both replicas to serve and fetch (store fetches {store_fetches(admin)})",
        30,
    )
    # However many requests each replica then serves, it never fetches the object again.
    for _ in range(4):
        serve_both()
    deadline = time.monotonic() + 1.0  # four of the replicas' report intervals
    while time.monotonic() < deadline:
        assert store_fetches(admin) == [1, 1], "a replica fetched the object twice"
        time.sleep(0.05)

    # Ray Serve's LRU of one id per replica (max_cpu_loras): which names, not ours to say.
    for view in replicas(admin):
        assert set(view["adapters"]["routed"]) <= {"acme/x", "globex/x"}, view
        assert len(view["adapters"]["routed"]) <= 1, view
    # Each replica's own cache holds the object once; the ingress's holds nothing.
    caches = sorted(p for p in cache.iterdir() if p.name != "local")
    assert len(caches) == 2
    for folder in caches:
        assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == [oid]
    assert not (cache / "local" / "store").exists()
