"""The gateway on Ray Serve: one ingress, two engine replicas of the tiny model on a local Ray
cluster, one Redis registry.

One deployment serves the whole module (starting Ray and two replicas takes ~30 s on two
cores); the tests run in file order, the replica kill last. Each replica holds 2 adapters
(2 device slots, 2 in its CPU tier, so Ray Serve's multiplexed LRU of 2 ids) and the root
holds 4: affinity keeps each on one replica and loads nothing twice.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid

import httpx
import pytest
import ray  # the `ray` extra, in `dev`: CI fails here rather than skip without it
from gateway_testlib import ADAPTER_NAMES, ENGINE, TARGETS, metrics, wait_until
from route_matrix_testlib import merged_stream, route_matrix
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api, requests_naming_an_adapter

from loragate.gateway.replicas.cluster import RayReplicas
from loragate.gateway.settings import GatewaySettings
from loragate.tools import make_random_adapter

pytestmark = pytest.mark.ray

PROMPTS = ("Hello world", "The quick brown fox")
TENANT_ADAPTERS = {"acme/sql": 31, "globex/sql": 32}


@pytest.fixture(scope="module")
def ray_root(tmp_path_factory, adapter_root, tiny_hf):
    """The four adapters of the single-process server (same files, so the same outputs),
    and two tenants' own folders."""
    root = tmp_path_factory.mktemp("ray-root")
    for name in ADAPTER_NAMES:
        shutil.copytree(adapter_root / name, root / name)
    for path, seed in TENANT_ADAPTERS.items():
        make_random_adapter(
            tiny_hf, root / path, rank=4, targets=TARGETS, seed=seed, init_scale=0.5
        )
    return root


@pytest.fixture(scope="module")
def deployment(tiny_dir, ray_root, redis_url):
    # The replicas speculate (issue 61), with the tiny model as its own draft (the plain
    # draft for adapter rows), and the single-process server they are compared with does
    # not: every equality of answers below also checks that speculation changes none.
    speculation = {"method": "draft_model", "model": str(tiny_dir), "num_speculative_tokens": 3}
    namespace = f"test-ray-{uuid.uuid4().hex}"
    server = start_tiny_server(
        tiny_dir,
        {"max_loras": 2, "max_cpu_loras": 2, "speculative_config": speculation},
        adapter_root=ray_root,
        redis_url=redis_url,
        redis_namespace=namespace,
        admin_key=ADMIN_KEY,
        replicas=2,
        replica_cpus=0.5,
    )
    try:
        yield server
    finally:
        server.stop()  # drains the replicas and stops the local Ray cluster
        flush_namespace(namespace, redis_url)
    assert not ray.is_initialized(), "the local Ray cluster outlived the server"


@pytest.fixture(scope="module")
def admin(deployment):
    return Api(deployment.url, ADMIN_KEY)


def replicas_of(api: Api) -> list[dict]:
    got = api.get("/v1/replicas")
    assert got.status_code == 200, got.text
    assert got.json()["mode"] == "ray"
    return got.json()["data"]


def holders(replicas: list[dict], name: str, tier: str) -> list[str]:
    return [r["id"] for r in replicas if name in r["adapters"][tier]]


def tokens_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def one_round(api: Api, names) -> dict:
    return {(n, p): tokens_of(api.complete(n, p, max_tokens=8)) for n in names for p in PROMPTS}


def test_each_adapter_is_served_by_one_replica_and_loaded_once(admin, url):
    replicas = replicas_of(admin)
    assert len(replicas) == 2
    # Half a CPU each: one torch thread each, not one per core of the machine.
    assert [r["torch_threads"] for r in replicas] == [1, 1], replicas
    base = admin.base_model()
    # Warm-up: every adapter once (registration at start-up already placed each).
    warm = one_round(admin, ADAPTER_NAMES)
    wait_until(
        lambda: all(len(holders(replicas_of(admin), n, "device")) == 1 for n in ADAPTER_NAMES),
        "every adapter in a device slot",
        30,
    )
    before = {r["id"]: r["adapter_loads"] for r in replicas_of(admin)}

    for _ in range(2):
        assert one_round(admin, ADAPTER_NAMES) == warm
        one_round(admin, [base])

    after = replicas_of(admin)
    assert {r["id"]: r["adapter_loads"] for r in after} == before, "an adapter was loaded again"
    for name in ADAPTER_NAMES:
        for tier in ("device", "routed"):
            assert len(holders(after, name, tier)) == 1, (name, tier, after)
        assert holders(after, name, "cpu") in ([], holders(after, name, "device")), after
    assert sorted(len(r["adapters"]["routed"]) for r in after) == [2, 2], after

    # Greedy outputs equal the single-process server's, adapters and base model alike.
    single = Api(url)
    assert one_round(single, ADAPTER_NAMES) == warm
    assert one_round(single, [single.base_model()]) == one_round(admin, [base])


def test_every_route_answers_as_in_one_process(admin, url):
    """Chat (plain, streamed, with tools named and required), completions (plain, streamed
    with logprobs, n > 1 seeded), structured output, /tokenize with messages and tools, and
    the TGI routes, on the base model and an adapter: the replicas answer exactly what the
    single-process server answers (issue 35: chat failed through replicas). The replicas
    speculate and the single process does not (issue 61): OpenAI streams are compared by what
    they say (`merged_stream`), not where their chunks break; TGI's stream is one event per
    token either way."""
    single = Api(url)
    base = admin.base_model()
    assert single.base_model() == base
    through_replicas = route_matrix(admin, base, ADAPTER_NAMES[0])
    in_one_process = route_matrix(single, base, ADAPTER_NAMES[0])
    assert through_replicas.keys() == in_one_process.keys()
    for route, answer in in_one_process.items():
        got = through_replicas[route]
        if route.startswith(("chat stream", "completion stream")):
            if route.endswith(base):  # the draft is the base model: its rows accept all
                assert len(got) < len(answer), route  # verified tokens, several to a chunk
            got, answer = merged_stream(got), merged_stream(answer)
        assert got == answer, route


def test_every_replica_speculates_and_its_counts_reach_the_metrics(admin, url):
    """The draft model on both replicas (one adapter held by each, and the base model),
    greedy answers equal to the single process's without speculation, and both replicas'
    spec-decode counters in the deployment's /metrics under each adapter's label."""
    replicas = replicas_of(admin)
    by_replica = {}
    for name in ADAPTER_NAMES:
        for holder in holders(replicas, name, "device"):
            by_replica.setdefault(holder, name)
    assert len(by_replica) == 2, replicas
    single = Api(url)
    base = admin.base_model()
    for name in [*by_replica.values(), base]:
        asked = {"max_tokens": 16, "ignore_eos": True}
        assert tokens_of(admin.complete(name, **asked)) == tokens_of(single.complete(name, **asked))

    def counted(kind: str) -> dict:
        found = metrics(admin.url, admin.headers)
        return {
            name: found.get(
                f"vllm:spec_decode_num_{kind}_tokens_total"
                f'{{lora_name="{name}",method="draft_model",model_name="{base}"}}',
                0,
            )
            for name in [*by_replica.values(), "__base__"]
        }

    wait_until(lambda: all(counted("draft").values()), "both replicas' spec-decode counts")
    # The base rows' draft is the model itself: their greedy proposals are accepted (the
    # counts also hold the sampled and grammar-masked rows of the tests before, some rejected).
    assert 0 < counted("accepted")["__base__"] <= counted("draft")["__base__"]


def test_bad_input_is_refused_as_in_one_process(admin):
    """Errors raised on a replica come back as themselves: 400s naming the problem, and
    nothing else changes (no adapter is evicted to make room for a bad one)."""
    before = {r["id"]: r["adapters"] for r in replicas_of(admin)}
    got = admin.register("not-an-adapter", "acme")  # a folder, but no adapter in it
    assert got.status_code == 400, got.text
    assert "adapter_config.json" in got.json()["error"]["message"], got.text
    got = admin.complete(admin.base_model(), [10**8])  # a token id outside the vocabulary
    assert got.status_code == 400 and got.json()["error"]["param"] == "prompt", got.text
    time.sleep(0.6)  # two report periods: the board holds the replicas' state after this
    assert {r["id"]: r["adapters"] for r in replicas_of(admin)} == before


def test_replica_counts_become_ray_serve_options():
    fixed = RayReplicas(GatewaySettings(replicas=3))
    assert fixed.scaling_options() == {"num_replicas": 3} and fixed.most_replicas() == 3
    scaled = RayReplicas(GatewaySettings(min_replicas=1, max_replicas=4, target_ongoing_requests=5))
    assert scaled.scaling_options() == {
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 4,
            "initial_replicas": 1,
            "target_ongoing_requests": 5,
        }
    }
    assert scaled.most_replicas() == 4


def test_the_ingress_admits_what_every_replica_runs(admin):
    # Two replicas of max_num_seqs 64: 128 sequences run at once before any queueing.
    got = metrics(admin.url, admin.headers)
    assert got["loragate_gateway_queue_capacity"] == 2 * ENGINE["max_num_seqs"] + 256


def test_metrics_cover_every_replica_by_label(admin):
    found = metrics(admin.url, admin.headers)
    ids = [r["id"] for r in replicas_of(admin)]
    assert len(ids) == 2
    for replica in ids:
        assert found[f'loragate_replica_up{{replica="{replica}"}}'] == 1
        assert (
            found[f'loragate_replica_adapters_resident{{replica="{replica}",tier="device"}}'] == 2
        )
    # The deployment-wide series add the replicas up: two caches of 512 blocks.
    assert found["loragate_kv_cache_total_blocks"] == 2 * ENGINE["num_kv_blocks"]


def test_replicas_need_the_admin_key(admin):
    tenant = admin.as_key(admin.create_tenant(f"peek-{uuid.uuid4().hex[:6]}"))
    got = tenant.get("/v1/replicas")
    assert got.status_code == 403 and got.json()["error"]["code"] == "admin_only"


def test_another_tenants_adapter_is_missing_on_every_route(admin):
    acme = admin.as_key(admin.create_tenant("acme"))
    globex = admin.as_key(admin.create_tenant("globex"))
    for api, name in ((acme, "sql"), (globex, "sql"), (acme, "mine")):
        got = api.register(name, "sql")  # from the tenant's own folder
        assert got.status_code == 201, got.text

    others = requests_naming_an_adapter(globex, "mine")
    missing = requests_naming_an_adapter(globex, "no-such-adapter")
    for route, got in others.items():
        assert got.status_code == 404, (route, got.text)
        assert got.status_code == missing[route].status_code, route
        assert "mine" not in got.text.replace("'mine'", ""), (route, got.text)
    # Each tenant's `sql` is its own, wherever it runs.
    assert tokens_of(acme.complete("sql")) == tokens_of(acme.complete("mine"))
    assert tokens_of(globex.complete("sql")) != tokens_of(acme.complete("sql"))


def test_a_quota_holds_across_replicas(admin):
    limited = admin.as_key(admin.create_tenant("limited", requests_per_minute=5))
    names = [admin.base_model(), *ADAPTER_NAMES] * 2  # spread over both replicas
    public = [admin.patch(f"/v1/adapters/{n}", {"public": True}) for n in ADAPTER_NAMES]
    assert all(p.status_code == 200 for p in public), [p.text for p in public]
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(limited.complete(n).status_code))
        for n in names
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [200] * 5 + [429] * (len(names) - 5), results
    assert admin.usage()["limited"]["total"]["requests"] == 5


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
        "POST", f"{api.url}/v1/completions", json=body, headers=api.headers, timeout=120
    ) as response:
        outcome["status"] = response.status_code
        outcome["content_type"] = response.headers.get("content-type", "")
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


def test_a_killed_replica_ends_its_requests_with_503_and_is_replaced(admin):
    caller = admin.as_key(admin.create_tenant("streamer"))
    public = [admin.patch(f"/v1/adapters/{n}", {"public": True}) for n in ADAPTER_NAMES]
    assert all(p.status_code == 200 for p in public)
    assert len(replicas_of(admin)) == 2
    outcomes = [{} for _ in range(16)]
    models = [admin.base_model(), *ADAPTER_NAMES] * 4
    threads = [
        threading.Thread(target=_stream, args=(caller, models[i], outcomes[i]), daemon=True)
        for i in range(16)
    ]
    for t in threads:
        t.start()
    # The victim is whichever replica first reports streams running: the router may place
    # them all on one replica (with a replica fixed in advance, the streams once all went to
    # the other one and ended without the kill finding any).
    seen: list[dict] = []

    def some_replica_running() -> bool:
        seen[:] = [r for r in replicas_of(admin) if r["running"] > 0]
        return bool(seen)

    wait_until(some_replica_running, "requests running on a replica to kill", 60)
    victim = seen[0]
    ray.kill(ray.get_actor(victim["actor"], namespace="serve"), no_restart=True)
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a request hung after its replica died"

    completed = [o for o in outcomes if o["status"] == 200 and o["ended"] == "length"]
    failed = [o for o in outcomes if o not in completed]
    assert failed, "the kill ended no request: it came too late to test anything"
    for o in failed:
        error = o.get("error") if o["status"] != 200 else o["ended"]
        assert o["status"] in (200, 503), o
        assert isinstance(error, dict) and error["type"] == "server_error", o
        assert error["code"] == "engine_unavailable", o
    for o in completed:
        assert o["tokens"] == 160 == o["usage"]["completion_tokens"], o
    for o in outcomes:  # through replicas too, a stream is an event stream
        if o["status"] == 200:
            assert o["content_type"].startswith("text/event-stream"), o

    # Usage counts exactly the tokens served: all of each completed stream, and what a
    # failed stream delivered before its replica died; none twice.
    served = sum(o.get("tokens", 0) for o in outcomes)
    wait_until(
        lambda: admin.usage()["streamer"]["total"]["completion_tokens"] == served,
        f"usage to count the {served} tokens served",
        10,
    )

    # Ray Serve replaces the replica; every adapter and the base model are served again.
    def replaced() -> bool:
        now = {r["id"] for r in replicas_of(admin)}
        return len(now) == 2 and victim["id"] not in now

    wait_until(replaced, "a replacement replica", 120, 0.5)
    for name in [admin.base_model(), *ADAPTER_NAMES]:
        got = caller.complete(name)
        assert got.status_code == 200, (name, got.text)
