"""Two gateway replicas on one Redis: a registration or deletion on one is served (or refused)
by the other within a second, re-registration never serves stale weights, a missed change
event is caught by the resync, and usage adds up exactly across replicas."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import msgspec
import redis
from gateway_testlib import sse_payloads, wait_until
from tenancy_testlib import ADMIN_KEY, VISIBILITY_S, Api

from loragate.registry import AdapterMetadata


def text_of(response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_register_on_one_replica_use_on_the_other_within_a_second(replicas):
    # A long resync interval: only the change events can make the other replica see it.
    a, b = (Api(s.url, ADMIN_KEY) for s in replicas(2, registry_resync_seconds=60))
    reference = {}
    for path in ("acme/sql", "acme/tone"):
        assert a.register("probe", path).status_code == 201
        reference[path] = text_of(a.complete("probe"))
    assert reference["acme/sql"] != reference["acme/tone"], "the test adapters must differ"

    created = a.register("shared", "acme/sql")
    assert created.status_code == 201, created.text
    seen = wait_until(
        lambda: b.get("/v1/adapters/shared").status_code == 200, "b sees it", VISIBILITY_S, 0.01
    )
    assert seen
    assert b.get("/v1/adapters/shared").json()["id"] == created.json()["id"]
    assert text_of(b.complete("shared")) == reference["acme/sql"]
    assert "shared" in [m["id"] for m in b.get("/v1/models").json()["data"]]

    # Re-registered on b with other weights: a serves the new weights, never the old ones.
    again = b.register("shared", "acme/tone")
    assert again.status_code == 201 and again.json()["id"] != created.json()["id"]
    wait_until(
        lambda: a.get("/v1/adapters/shared").json()["id"] == again.json()["id"],
        "a sees the new registration",
        VISIBILITY_S,
        0.01,
    )
    assert text_of(a.complete("shared")) == reference["acme/tone"]

    assert a.delete("/v1/adapters/shared").status_code == 200
    wait_until(lambda: b.complete("shared").status_code == 404, "b refuses it", VISIBILITY_S, 0.01)
    assert b.get("/v1/adapters/shared").status_code == 404
    assert "shared" not in [m["id"] for m in b.get("/v1/models").json()["data"]]


def test_a_starting_replica_adopts_the_preloaded_adapters(replicas):
    a, b = (Api(s.url, ADMIN_KEY) for s in replicas(2))
    first, second = a.get("/v1/adapters/house").json(), b.get("/v1/adapters/house").json()
    assert first["id"] == second["id"], "the second replica re-registered instead of adopting"


def test_the_resync_catches_a_change_whose_event_was_lost(replicas, redis_url, redis_namespace):
    (server,) = replicas(1, registry_resync_seconds=0.2)
    api = Api(server.url, ADMIN_KEY)
    house = api.get("/v1/adapters/house").json()
    record = AdapterMetadata(
        name="sneaked-in",
        base_model=house["parent"],
        rank=house["rank"],
        alpha=house["alpha"],
        target_modules=tuple(house["target_modules"]),
        sha256=house["sha256"],
        size_bytes=house["size_bytes"],
        path="house",
        lora_int_id=7,
        created_at=time.time(),
    )
    # Written straight into Redis, with the version bumped but no event published.
    client = redis.Redis.from_url(redis_url)
    client.hset(f"{redis_namespace}:adapters", "sneaked-in", msgspec.json.encode(record))
    client.incr(f"{redis_namespace}:version")
    wait_until(lambda: api.complete("sneaked-in").status_code == 200, "resync adds it", 30)
    assert text_of(api.complete("sneaked-in")) == text_of(api.complete("house"))
    client.hdel(f"{redis_namespace}:adapters", "sneaked-in")
    client.incr(f"{redis_namespace}:version")
    wait_until(lambda: api.complete("sneaked-in").status_code == 404, "resync drops it", 30)
    client.close()


def _one_request(api: Api, kind: str, model: str, i: int) -> tuple[int, int]:
    """Send one request; return the (prompt, completion) tokens its response reports."""
    prompt = "Count with me: " + " ".join(str(n) for n in range(i % 7 + 1))
    if kind == "completion":
        got = api.complete(model, prompt, max_tokens=3 + i % 5)
        assert got.status_code == 200, got.text
        usage = got.json()["usage"]
        return usage["prompt_tokens"], usage["completion_tokens"]
    if kind == "chat":
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 2 + i % 4,
            "temperature": 0,
        }
        got = api.post("/v1/chat/completions", body)
        assert got.status_code == 200, got.text
        usage = got.json()["usage"]
        return usage["prompt_tokens"], usage["completion_tokens"]
    if kind == "stream":
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with streamed(api, "/v1/completions", body) as lines:
            usage = sse_payloads(lines)[-1]["usage"]
        return usage["prompt_tokens"], usage["completion_tokens"]
    body = {
        "inputs": prompt,
        "parameters": {"adapter_id": model, "max_new_tokens": 3, "details": True},
    }
    got = api.post("/generate", body)
    assert got.status_code == 200, got.text
    details = got.json()["details"]
    return details["prompt_tokens"], details["generated_tokens"]


@contextmanager
def streamed(api: Api, path: str, body: dict):
    with httpx.stream(
        "POST", f"{api.url}{path}", json=body, headers=api.headers, timeout=60
    ) as response:
        assert response.status_code == 200, response.read()
        yield response.iter_lines()


def test_usage_is_exact_after_a_concurrent_burst_across_two_replicas(replicas):
    servers = replicas(2)
    a, b = (Api(s.url, ADMIN_KEY) for s in servers)
    key = a.create_tenant("acme")
    tenant_a, tenant_b = a.as_key(key), b.as_key(key)
    assert tenant_a.register("acme-sql", "sql").status_code == 201
    wait_until(lambda: tenant_b.get("/v1/adapters/acme-sql").status_code == 200, "b sees it", 5)
    base = a.base_model()
    kinds = ("completion", "chat", "stream", "tgi")
    jobs = []
    for i in range(32):
        api = tenant_a if i % 2 == 0 else tenant_b
        model = base if i % 4 == 3 else "acme-sql"
        jobs.append((api, kinds[i % len(kinds)], model, i))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: (job[2], _one_request(*job)), jobs))

    def summed(rows):
        prompt = sum(p for _, (p, _c) in rows)
        completion = sum(c for _, (_p, c) in rows)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "requests": len(rows)}

    expected_total = summed(results)
    expected_adapter = summed([r for r in results if r[0] == "acme-sql"])

    def counts(report):
        return {k: report[k] for k in ("prompt_tokens", "completion_tokens", "requests")}

    # Streams are counted as their cleanup ends, just after the client saw [DONE].
    wait_until(
        lambda: counts(tenant_b.usage()["acme"]["total"]) == expected_total, "usage adds up", 10
    )
    report = tenant_a.usage()
    assert list(report) == ["acme"], "a tenant sees only its own usage"
    assert counts(report["acme"]["total"]) == expected_total
    assert counts(report["acme"]["by_adapter"]["acme-sql"]) == expected_adapter
    assert set(report["acme"]["by_adapter"]) == {"acme-sql"}
    admin_view = a.usage()
    assert counts(admin_view["acme"]["total"]) == expected_total
    assert json.dumps(admin_view["acme"], sort_keys=True) == json.dumps(
        report["acme"], sort_keys=True
    )

    # The counts live in Redis: a gateway started afresh on it reports the same.
    for server in servers:
        server.stop()
    (restarted,) = replicas(1)
    again = Api(restarted.url, ADMIN_KEY).usage()
    assert json.dumps(again["acme"], sort_keys=True) == json.dumps(report["acme"], sort_keys=True)
