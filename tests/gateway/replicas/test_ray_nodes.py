"""The gateway over several Ray nodes, and a node lost under load (issue 46, must-shows 1-2).

A real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head with no
CPUs and two worker nodes with one CPU each, each its own raylet and object store); the
ingress joins it with `ray_address` and asks for two replicas of one CPU each, so Ray puts
one on each worker. Nothing is shared but Redis and the adapter store (a bucket on moto's
S3 server): no adapter root, and each replica caches under its own folder.

One deployment serves the module, in file order:
1. six uploaded adapters answer every route of the route matrix exactly as the
   single-process server does, and each replica fetched each adapter it serves once;
2. the node of one replica is removed while 16 streams run: no request sent after the
   removal gets a 5xx, the removed node's streams end with an error event (none hangs),
   usage equals the tokens clients received, no quota lease stays held, and when a node
   joins again Ray Serve puts the second replica back on it, which fetches only what it
   is routed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import httpx
import pytest
import ray  # the `ray` extra, in `dev`
from gateway_testlib import TARGETS, wait_until
from ray.cluster_utils import Cluster
from route_matrix_testlib import route_matrix
from s3_testlib import environment, s3_server
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from tiny_llama import make_adapters
from uploads_testlib import parts_of, upload

from loragate.registry.redis_store import RedisRegistryStore

pytestmark = pytest.mark.ray

ADAPTERS = [f"n{i}" for i in range(6)]
ENGINE = {"max_loras": 2, "max_cpu_loras": 6}
OBJECT_STORE = 80 * 1024 * 1024


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server, environment(server.env):
        yield server  # the env reaches every raylet started below, hence each replica


@pytest.fixture(scope="module")
def cluster(s3):
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": OBJECT_STORE},
    )
    workers = [cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE) for _ in range(2)]
    cluster.wait_for_nodes()
    try:
        yield cluster, workers
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir):
    specs = {name: (4 + 4 * (i % 2), TARGETS, False) for i, name in enumerate(ADAPTERS)}
    return make_adapters(tiny_dir, tmp_path_factory.mktemp("node-uploads"), specs)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("node-caches")


@pytest.fixture(scope="module")
def deployment(cluster, s3, tiny_dir, redis_url, cache):
    head, _ = cluster
    namespace = f"test-ray-nodes-{uuid.uuid4().hex}"
    bucket = s3.new_bucket()
    server = start_tiny_server(
        tiny_dir,
        ENGINE,
        redis_url=redis_url,
        redis_namespace=namespace,
        admin_key=ADMIN_KEY,
        replicas=2,
        replica_cpus=1,
        ray_address=head.address,
        adapter_store=f"s3://{bucket}/adapters",
        adapter_cache_dir=cache / "{replica}",
    )
    try:
        yield server, namespace
    finally:
        server.stop()
        flush_namespace(namespace, redis_url)


@pytest.fixture(scope="module")
def single(s3, tiny_dir):
    """The single-process server, the reference: the same model, engine and uploads."""
    server = start_tiny_server(
        tiny_dir, ENGINE, admin_key=ADMIN_KEY, adapter_store=f"s3://{s3.new_bucket()}/a"
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def admin(deployment):
    return Api(deployment[0].url, ADMIN_KEY)


def replicas_of(admin: Api) -> list[dict]:
    got = admin.get("/v1/replicas")
    assert got.status_code == 200, got.text
    return got.json()["data"]


def cached_objects(cache, replica: str) -> set[str]:
    folder = cache / replica
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def check_each_replica_fetched_what_it_serves_once(admin: Api, cache) -> list[dict]:
    """Every replica's store fetches equal the objects in its own cache, one per adapter
    it serves (each adapter is its own object)."""
    views = replicas_of(admin)
    for view in views:
        routed = set(view["adapters"]["routed"])
        assert routed <= {f"acme/{n}" for n in ADAPTERS}, view
        objects = cached_objects(cache, view["id"])
        assert view["adapter_loads"]["store"] == len(objects) == len(routed), (view, objects)
    return views


def test_replicas_on_two_nodes_answer_as_one_process(cluster, admin, single, files, cache):
    _, workers = cluster
    views = wait_until(
        lambda: (v := replicas_of(admin)) and len(v) == 2 and v,
        "two replicas reporting",
        120,
        0.5,
    )
    nodes = {v["node"] for v in views}
    assert nodes == {w.node_id for w in workers}, "one replica on each worker node"

    reference = Api(single.url, ADMIN_KEY)
    key, single_key = admin.create_tenant("acme"), reference.create_tenant("acme")
    acme, single_acme = admin.as_key(key), reference.as_key(single_key)
    for name in ADAPTERS:
        for api in (acme, single_acme):
            got = upload(api, name, parts_of(files[name]))
            assert got.status_code == 201, got.text
    base = admin.base_model()
    assert reference.base_model() == base
    for name in ADAPTERS:
        through_nodes = route_matrix(acme, base, name)
        in_one_process = route_matrix(single_acme, base, name)
        assert through_nodes.keys() == in_one_process.keys()
        for route, answer in in_one_process.items():
            assert through_nodes[route] == answer, (name, route)

    wait_until(
        lambda: sum(len(v["adapters"]["routed"]) for v in replicas_of(admin)) >= len(ADAPTERS),
        "every adapter routed to a replica",
        30,
    )
    views = check_each_replica_fetched_what_it_serves_once(admin, cache)
    served = set().union(*(set(v["adapters"]["routed"]) for v in views))
    assert served == {f"acme/{n}" for n in ADAPTERS}
    # However many more requests, no replica fetches anything again.
    for name in ADAPTERS:
        assert acme.complete(name).status_code == 200
    check_each_replica_fetched_what_it_serves_once(admin, cache)


def _stream(api: Api, model: str, outcome: dict) -> None:
    """One streamed completion: outcome gets its status, tokens seen and how it ended."""
    body = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": 160,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "logprobs": 0,
        "stream_options": {"include_usage": True},
    }
    tokens, ended = 0, None
    with httpx.stream(
        "POST", f"{api.url}/v1/completions", json=body, headers=api.headers, timeout=180
    ) as response:
        outcome["status"] = response.status_code
        if response.status_code != 200:
            outcome["error"] = json.loads(response.read())["error"]
            return
        for line in response.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data:") :])
            if "error" in event:
                ended = event["error"]
                continue
            for choice in event["choices"]:
                tokens += len(choice["logprobs"]["tokens"])
                if choice["finish_reason"] is not None:
                    ended = choice["finish_reason"]
            if event.get("usage"):
                outcome["usage"] = event["usage"]
    outcome["tokens"], outcome["ended"] = tokens, ended


def test_a_node_lost_under_load(cluster, deployment, admin, cache, redis_url):
    head, workers = cluster
    _, namespace = deployment
    caller = admin.as_key(
        admin.create_tenant("streamer", tokens_per_minute=10_000_000, max_concurrent_requests=64)
    )
    for name in ADAPTERS:
        got = admin.patch(f"/v1/adapters/acme/{name}", {"public": True})
        assert got.status_code == 200, got.text
    models = [admin.base_model(), *ADAPTERS]
    outcomes = [{} for _ in range(16)]
    threads = [
        threading.Thread(
            target=_stream, args=(caller, models[i % len(models)], outcomes[i]), daemon=True
        )
        for i in range(16)
    ]
    for t in threads:
        t.start()
    busy = wait_until(
        lambda: [v for v in replicas_of(admin) if v["running"] > 0],
        "streams running on a replica",
        120,
    )
    victim = max(busy, key=lambda v: v["running"])
    node = next(w for w in workers if w.node_id == victim["node"])
    head.remove_node(node, allow_graceful=False)

    # Sent after the removal: every one answered, none a 5xx.
    after = [caller.complete(models[i % len(models)]) for i in range(12)]
    refused = [(i, r.status_code, r.text) for i, r in enumerate(after) if r.status_code != 200]
    assert not refused, refused
    # The ingress still sees the surviving replica: the board it reads outlives worker nodes.
    wait_until(
        lambda: (v := replicas_of(admin)) and all(x["node"] != victim["node"] for x in v),
        "the surviving replica, and only it, reporting",
        60,
        0.5,
    )

    for t in threads:
        t.join(180)
        assert not t.is_alive(), "a stream hung after its node was removed"
    completed = [o for o in outcomes if o["status"] == 200 and o["ended"] == "length"]
    failed = [o for o in outcomes if o not in completed]
    assert failed, "the removal ended no stream: it came too late to test anything"
    for o in failed:
        assert o["status"] == 200, o  # the stream had begun: its end is an error event
        assert isinstance(o["ended"], dict) and o["ended"]["code"] == "engine_unavailable", o
    for o in completed:
        assert o["tokens"] == 160 == o["usage"]["completion_tokens"], o

    # Usage counts exactly what clients received; no quota lease stays held.
    served = sum(o.get("tokens", 0) for o in outcomes) + sum(
        r.json()["usage"]["completion_tokens"] for r in after
    )
    wait_until(
        lambda: admin.usage()["streamer"]["total"]["completion_tokens"] == served,
        f"usage to count the {served} tokens served",
        30,
    )
    assert asyncio.run(leases_held(redis_url, namespace, "streamer")) == 0

    # A node joins again: Ray Serve puts the second replica back, on it. Should it not, the
    # wait's message says which nodes live and which replicas the ingress sees.
    joined = head.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
    seen: list[list[dict]] = []

    def back_to_two():
        views = replicas_of(admin)
        seen[:] = [views]
        return len(views) == 2 and {v["node"] for v in views} >= {joined.node_id} and views

    try:
        views = wait_until(back_to_two, "the second replica back, on the new node", 300, 0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {cluster_state(head, joined, seen)}") from None
    newcomer = next(v for v in views if v["node"] == joined.node_id)
    assert newcomer["adapter_loads"]["store"] == 0, "a replacement fetches nothing unasked"
    for _ in range(3):
        for name in ADAPTERS:
            got = caller.complete(name)
            assert got.status_code == 200, got.text
    check_each_replica_fetched_what_it_serves_once(admin, cache)


def cluster_state(head: Cluster, joined, seen: list[list[dict]]) -> str:
    """What the cluster looked like when a wait gave up: each node's raylet alive or not,
    and the replicas the ingress last saw."""
    nodes = [
        f"{node.node_id[:8]}{' (joined)' if node is joined else ''}: "
        f"{'alive' if node.remaining_processes_alive() else 'dead'}"
        for node in head.list_all_nodes()
    ]
    replicas = [(v["id"], v["node"][:8], v["running"]) for v in (seen[0] if seen else [])]
    return f"nodes {nodes}, replicas {replicas}"


async def leases_held(redis_url: str, namespace: str, tenant: str) -> int:
    store = RedisRegistryStore(redis_url, namespace)
    try:
        return await store.in_flight(tenant)
    finally:
        await store.close()
