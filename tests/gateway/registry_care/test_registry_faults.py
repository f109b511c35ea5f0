"""Redis goes away under two replicas, and comes back: with its data, or empty.

Each test runs its own redis-server on a free port (the shared one is never stopped).
While it is down: every request for a known adapter (by a known tenant) is still served,
every write is a 503 saying why, /health says degraded; usage waits and is written when
Redis returns, so the counts stay exact. When it returns empty, the replicas say so in
their logs and keep serving what they knew until it is registered again.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from gateway_testlib import metrics, wait_until
from services_testlib import PrivateRedis
from tenancy_testlib import ADMIN_KEY, VISIBILITY_S, Api

WRITE_STATUS_WHILE_DOWN = 503


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.kill()


def degraded(api: Api) -> bool:
    health = api.health()
    return health["status"] == "degraded" and health["registry"]["reachable"] is False


def healthy(api: Api) -> bool:
    """ok: reachable, watching, nothing orphaned, no usage waiting to be written."""
    health = api.health()
    return health["status"] == "ok" and health["registry"]["watching"] is True


def assert_registry_down(response) -> None:
    assert response.status_code == WRITE_STATUS_WHILE_DOWN, response.text
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert error["code"] == "registry_unavailable" and "unreachable" in error["message"]


def burst(jobs) -> list[tuple[int, int, int]]:
    """Run (api, model) jobs concurrently: (status, prompt tokens, completion tokens) each."""

    def one(job):
        api, model, i = job
        got = api.complete(model, "Tell me " + "more " * (i % 5), max_tokens=2 + i % 3)
        if got.status_code != 200:
            return got.status_code, 0, 0
        usage = got.json()["usage"]
        return got.status_code, usage["prompt_tokens"], usage["completion_tokens"]

    with ThreadPoolExecutor(6) as pool:
        return list(pool.map(one, jobs))


def test_a_quiet_outage_is_served_through_and_counted_exactly(replicas, private_redis):
    a, b = (
        Api(s.url, ADMIN_KEY)
        for s in replicas(2, redis_url=private_redis.url, registry_resync_seconds=0.5)
    )
    key = a.create_tenant("acme")
    acme_a, acme_b = a.as_key(key), b.as_key(key)
    assert acme_a.register("acme-sql", "sql").status_code == 201
    wait_until(lambda: acme_b.get("/v1/adapters/acme-sql").status_code == 200, "b has it", 5)
    before = burst([(acme_a if i % 2 else acme_b, "acme-sql", i) for i in range(8)])

    private_redis.save()  # comes back with its data
    private_redis.kill()
    wait_until(lambda: degraded(a) and degraded(b), "both replicas degraded", 30)
    detail = a.health()["detail"]
    assert "unreachable" in detail and "503" in detail

    during = burst([(acme_a if i % 2 else acme_b, "acme-sql", i) for i in range(10)])
    house = burst([(a, "house", 0), (b, "house", 1)])  # the operator's own, too
    statuses = [status for status, *_ in before + during + house]
    assert statuses == [200] * len(statuses), "a request for a known adapter failed"
    for write in (
        acme_a.register("acme-tone", "tone"),
        b.post("/v1/load_lora_adapter", {"lora_name": "more", "lora_path": "house"}),
        a.post("/v1/tenants", {"name": "newco"}),
        b.post("/v1/tenants/acme/keys"),
        acme_b.delete("/v1/adapters/acme-sql"),
        a.patch("/v1/adapters/house", {"public": True}),
        acme_a.get("/v1/usage"),
    ):
        assert_registry_down(write)
    stranger = a.as_key(f"lg-{'1' * 16}-{'B' * 43}").get("/v1/models")
    assert stranger.status_code == 503, "an unknown key cannot be checked, so not refused"
    scraped = metrics(b.url, headers=b.headers)
    assert scraped["loragate_registry_reachable"] == 0
    assert scraped["loragate_usage_records_pending"] >= 1

    private_redis.start()
    wait_until(lambda: healthy(a) and healthy(b), "both replicas recovered", 30)
    served = before + during
    expected = {
        "prompt_tokens": sum(p for _, p, _ in served),
        "completion_tokens": sum(c for _, _, c in served),
        "requests": len(served),
    }
    total = acme_b.usage()["acme"]["total"]
    assert {k: total[k] for k in expected} == expected, "usage must be exact across the outage"

    # Writes work again, and the replicas watch again: a change shows on the other at once.
    assert acme_a.register("acme-tone", "tone").status_code == 201
    wait_until(lambda: acme_b.complete("acme-tone").status_code == 200, "b serves it", VISIBILITY_S)


def test_redis_killed_mid_traffic_and_restarted_empty(replicas, private_redis, caplog):
    caplog.set_level(logging.INFO)
    a, b = (
        Api(s.url, ADMIN_KEY)
        for s in replicas(2, redis_url=private_redis.url, registry_resync_seconds=0.5)
    )
    key = a.create_tenant("acme")
    assert a.as_key(key).register("acme-sql", "sql").status_code == 201
    wait_until(lambda: b.as_key(key).complete("acme-sql").status_code == 200, "b serves it", 5)

    statuses: list[tuple[str, int]] = []
    stop = threading.Event()

    def traffic(api: Api) -> None:
        tenant = api.as_key(key)
        while not stop.is_set():
            statuses.append(("acme-sql", tenant.complete("acme-sql", max_tokens=2).status_code))
            statuses.append(("house", api.complete("house", max_tokens=2).status_code))

    workers = [threading.Thread(target=traffic, args=(api,)) for api in (a, b)]
    for worker in workers:
        worker.start()
    try:
        wait_until(lambda: len(statuses) >= 20, "traffic flows", 30)
        private_redis.kill()
        private_redis.forget_snapshot()
        wait_until(lambda: degraded(a) and degraded(b), "both replicas degraded", 30)
        assert_registry_down(a.register("during", "house"))
        assert_registry_down(b.post("/v1/tenants", {"name": "newco"}))
        seen = len(statuses)
        wait_until(lambda: len(statuses) >= seen + 20, "traffic while Redis is down", 30)

        private_redis.start()  # empty
        for api in (a, b):
            wait_until(lambda api=api: api.health()["registry"]["orphaned_tenants"] == 1, "", 30)
        seen = len(statuses)
        wait_until(lambda: len(statuses) >= seen + 20, "traffic after the restart", 30)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    failed = [s for s in statuses if s[1] != 200]
    assert not failed, f"{len(failed)} of {len(statuses)} requests failed: {failed[:5]}"

    lost = [r.getMessage() for r in caplog.records if "LOST ITS DATA" in r.getMessage()]
    assert len(lost) >= 2, "each replica says clearly that the registry lost its data"
    health = a.health()
    assert health["status"] == "degraded" and "lost its data" in health["detail"]
    assert health["registry"]["orphaned_adapters"] >= 2  # acme-sql and the preloaded house

    # Writes work again at once; the registry is repopulated, and the replicas follow it.
    assert a.post("/v1/tenants", {"name": "newco"}).status_code == 201
    new_key = a.create_tenant("acme")
    assert b.register("house", "house").status_code == 201
    assert a.as_key(new_key).register("acme-sql", "sql").status_code == 201
    wait_until(lambda: healthy(a) and healthy(b), "repopulated", 10)
    for api in (a, b):
        assert api.as_key(new_key).complete("acme-sql").status_code == 200
        assert api.as_key(key).complete("acme-sql").status_code == 401, "the old key is gone"


def test_a_replica_started_while_redis_is_down_catches_up_when_it_comes(replicas, tmp_path_factory):
    later = PrivateRedis(tmp_path_factory.mktemp("later-redis"))  # not started yet
    try:
        (server,) = replicas(1, redis_url=later.url, registry_resync_seconds=0.5)
        admin = Api(server.url, ADMIN_KEY)
        assert degraded(admin)
        assert admin.complete(admin.base_model()).status_code == 200  # the base model serves
        assert admin.complete("house").status_code == 404  # its registration waits
        assert_registry_down(admin.register("early", "house"))
        later.start()
        wait_until(lambda: healthy(admin), "recovered", 30)
        wait_until(lambda: admin.complete("house").status_code == 200, "house registered", 30)
        assert admin.register("early", "house").status_code == 201
    finally:
        later.kill()
