"""Issue 38: a registry that survives. Each test starts its own redis-server processes (the
shared one is never touched but for a namespace), kills what it kills with SIGKILL, and
counts tokens on the client side, chunk by chunk (each streamed chunk carries its tokens'
logprobs, so the client knows how many tokens it received).

1. Redis with AOF everysec, killed after 32 streams over 4 tenants and restarted from its
   files: every tenant, key, quota, adapter record and usage count is back.
2. Export, import into an empty Redis, a new server on it: old keys work, same usage; a
   tampered export is refused naming its line.
3. A gateway killed while 16 streams run: another serves at once, the dead one's leases
   (and the tokens they reserved, which hold the tenant at its tokens-per-minute quota)
   expire within the lease time, and usage equals what the clients received, exactly.
4. A Redis without persistence: a warning at start, or with --require-durable-registry a
   refusal (exit 1) with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from click.testing import CliRunner
from gateway_test_plugin import RelayedGate
from gateway_testlib import metrics, wait_until
from servers_testlib import CLI_MODULE, ServeProcess, start_tiny_server
from services_testlib import PrivateRedis
from tenancy_testlib import ADMIN_KEY, Api

from loragate.gateway.assembly.cli import main
from loragate.registry.redis_store import RedisRegistryStore

HERE = Path(__file__).parents[1]  # tests/gateway: its testlibs and test plugin
PROMPT = "Tell me a story about"


@dataclass
class Received:
    """What one streaming client got: tokens (counted from each chunk's logprobs), when."""

    status: int | None = None
    tokens: int = 0
    times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    cut: str | None = None  # how the stream broke off, if it did


def stream(api: Api, body: dict, got: Received) -> Received:
    body = {**body, "stream": True, "logprobs": 0, "stream_options": {"include_usage": True}}
    try:
        with httpx.stream(
            "POST", f"{api.url}/v1/completions", json=body, headers=api.headers, timeout=120
        ) as response:
            got.status = response.status_code
            if response.status_code != 200:
                response.read()
                return got
            for line in response.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data:") :])
                if chunk.get("usage"):
                    got.prompt_tokens = chunk["usage"]["prompt_tokens"]
                tokens = sum(
                    len((choice.get("logprobs") or {}).get("tokens") or [])
                    for choice in chunk.get("choices", [])
                )
                if tokens:
                    got.tokens += tokens
                    got.times.append(time.monotonic())
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        got.cut = repr(exc)
    return got


def store_of(url: str, namespace: str = "loragate") -> RedisRegistryStore:
    return RedisRegistryStore(url, namespace)


def snapshot(url: str, namespace: str = "loragate"):
    async def read():
        store = store_of(url, namespace)
        try:
            return await store.snapshot()
        finally:
            await store.close()

    return asyncio.run(read())


def key_owner(url: str, key: str, namespace: str = "loragate") -> str | None:
    async def verify():
        store = store_of(url, namespace)
        try:
            return await store.verify_api_key(key)
        finally:
            await store.close()

    return asyncio.run(verify())


def usage_by_tenant(snap) -> dict[str, tuple[int, int, int]]:
    return {
        u.tenant: (u.total.prompt_tokens, u.total.completion_tokens, u.total.requests)
        for u in snap.usage
    }


# ---- 1. Redis killed and restarted from its AOF ------------------------------------------


def test_redis_killed_with_sigkill_comes_back_with_the_whole_registry(
    tiny_dir, tenant_root, tmp_path
):
    redis_server = PrivateRedis(tmp_path, appendfsync="everysec").start()
    gateway = start_tiny_server(
        tiny_dir, adapter_root=tenant_root, redis_url=redis_server.url, admin_key=ADMIN_KEY
    )
    try:
        admin = Api(gateway.url, ADMIN_KEY)
        keys = {
            "acme": admin.create_tenant("acme", requests_per_minute=1000),
            "globex": admin.create_tenant("globex", tokens_per_minute=100_000),
            "initech": admin.create_tenant("initech", max_concurrent_requests=8),
            "umbrella": admin.create_tenant("umbrella"),
        }
        assert admin.patch("/v1/tenants/acme", {"weight": 2.5}).status_code == 200
        assert admin.patch("/v1/adapters/house", {"public": True}).status_code == 200
        for tenant in ("acme", "globex"):
            got = admin.as_key(keys[tenant]).register("sql", "sql")
            assert got.status_code in (200, 201), got.text
        models = {
            "acme": "sql",
            "globex": "sql",
            "initech": "house",
            "umbrella": admin.base_model(),
        }
        before = snapshot(redis_server.url)
        assert len(before.tenants) == 4 and len(before.adapters) == 3

        def one(job):
            tenant, i = job
            body = {"model": models[tenant], "prompt": PROMPT, "max_tokens": 4 + i % 5}
            return tenant, stream(admin.as_key(keys[tenant]), body, Received())

        # Two waves of 16 streams: the first well over a second before the kill, so its
        # counts must all be back; the second right before it (at most it may be missing).
        results = []
        for wave in (range(4), range(4, 8)):
            with ThreadPoolExecutor(16) as pool:
                results += pool.map(one, [(tenant, i) for tenant in keys for i in wave])
            if wave.start == 0:
                time.sleep(1.5)
        redis_server.kill()  # SIGKILL, at once after the last stream ended
        killed_at = time.monotonic()
        received: dict[str, list[int]] = {t: [0, 0, 0] for t in keys}
        last_second = 0
        for tenant, got in results:
            assert got.status == 200 and got.cut is None and got.prompt_tokens, got
            received[tenant][0] += got.prompt_tokens
            received[tenant][1] += got.tokens
            received[tenant][2] += 1
            last_second += sum(1 for t in got.times if t > killed_at - 1.0)

        redis_server.start()  # the same port and directory: it replays its AOF
        after = snapshot(redis_server.url)
        assert after.tenants == before.tenants  # quotas, weights, key ids
        assert after.keys == before.keys and after.adapters == before.adapters
        for tenant, key in keys.items():
            assert key_owner(redis_server.url, key) == tenant
        counted = usage_by_tenant(after)
        missing = sum(received[t][1] - counted[t][1] for t in keys)
        total = sum(r[1] for r in received.values())
        print(
            f"\nAOF everysec, Redis SIGKILLed: {total} completion tokens received over 32 "
            f"streams, {total - missing} counted after the restart, {missing} missing "
            f"(the last second before the kill held {last_second})"
        )
        assert 0 <= missing <= last_second
        for tenant in keys:
            prompt, completion, requests = counted[tenant]
            assert requests == 8 and prompt == received[tenant][0]
            assert completion <= received[tenant][1]
        # The gateway goes on with the restarted Redis: every old key is served.
        wait_until(lambda: admin.health()["status"] == "ok", "the gateway to see Redis again")
        for tenant, key in keys.items():
            got = admin.as_key(key).complete(models[tenant], max_tokens=2)
            assert got.status_code == 200, got.text
    finally:
        gateway.stop()
        redis_server.kill()


# ---- 2. export, import into an empty Redis, a new server ---------------------------------


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_an_export_imported_into_an_empty_redis_serves_every_old_key(
    tiny_dir, tenant_root, tmp_path
):
    for name in ("source", "target", "empty"):
        (tmp_path / name).mkdir()
    source = PrivateRedis(tmp_path / "source").start()
    target = PrivateRedis(tmp_path / "target").start()
    options = dict(adapter_root=tenant_root, admin_key=ADMIN_KEY)
    try:
        first = start_tiny_server(tiny_dir, redis_url=source.url, **options)
        try:
            admin = Api(first.url, ADMIN_KEY)
            keys = {
                "acme": admin.create_tenant("acme", tokens_per_minute=50_000),
                "globex": admin.create_tenant("globex", max_concurrent_requests=4),
                "initech": admin.create_tenant("initech"),
            }
            assert admin.as_key(keys["acme"]).register("sql", "sql").status_code in (200, 201)
            for tenant, key in keys.items():
                model = "sql" if tenant == "acme" else admin.base_model()
                for n in range(tenant_index(tenant) + 1):
                    got = admin.as_key(key).complete(model, max_tokens=2 + n)
                    assert got.status_code == 200, got.text
            usage = admin.usage()
        finally:
            first.stop()

        backup = tmp_path / "registry.jsonl"
        code, out = cli("registry", "export", backup, "--redis-url", source.url)
        assert code == 0 and "exported 3 tenants (3 keys), 2 adapters" in out, out
        code, out = cli("registry", "import", backup, "--redis-url", target.url)
        assert code == 0 and "imported 3 tenants (3 keys), 2 adapters" in out, out
        code, out = cli("registry", "import", backup, "--redis-url", target.url)
        assert code == 1 and "not empty" in out and "--merge" in out, out

        second = start_tiny_server(tiny_dir, redis_url=target.url, **options)
        try:
            admin = Api(second.url, ADMIN_KEY)
            assert admin.usage() == usage
            for tenant, key in keys.items():
                models = admin.as_key(key).get("/v1/models")
                assert models.status_code == 200, (tenant, models.text)
            assert admin.as_key(keys["acme"]).complete("sql").status_code == 200
            assert admin.get("/v1/tenants/globex").json()["quota"]["max_concurrent_requests"] == 4
        finally:
            second.stop()

        # Tampered exports: refused, naming the line, and nothing written.
        lines = backup.read_text().splitlines()
        tampered = {
            "bad version": (0, lambda d: d.update(version=7), "line 1: format version 7"),
            "duplicate tenant": (1, None, "line 3: tenant 'acme' appears twice (first on line 2)"),
            "short digest": (
                1,
                lambda d: d["keys"][0].update(digest="ab" * 31),
                "line 2: key digest of tenant 'acme' must be 64 hex digits, got 62",
            ),
        }
        empty = PrivateRedis(tmp_path / "empty").start()
        try:
            for name, (index, change, says) in tampered.items():
                edited = [json.loads(line) for line in lines]
                if change is None:  # the tenant's line twice
                    edited.insert(index + 1, edited[index])
                    edited[-1]["end"]["lines"] += 1
                else:
                    change(edited[index])
                path = tmp_path / f"{name}.jsonl"
                path.write_text("".join(json.dumps(e) + "\n" for e in edited))
                code, out = cli("registry", "import", path, "--redis-url", empty.url)
                assert code == 1 and says in out, (name, out)
            assert snapshot(empty.url).empty
        finally:
            empty.kill()
    finally:
        source.kill()
        target.kill()


def tenant_index(tenant: str) -> int:
    return ("acme", "globex", "initech").index(tenant)


# ---- 3. a gateway killed mid-stream -------------------------------------------------------

LEASE_S = 3.0
MAX_TOKENS = 400  # each stream's worst case; none gets near it before the kill


def test_a_gateway_killed_mid_stream_has_counted_exactly_what_its_clients_received(
    tiny_dir, redis_url, redis_namespace
):
    survivor = start_tiny_server(
        tiny_dir, redis_url=redis_url, redis_namespace=redis_namespace, admin_key=ADMIN_KEY
    )
    doomed = None
    try:
        admin = Api(survivor.url, ADMIN_KEY)
        base = admin.base_model()
        prompt_tokens = admin.complete(base, PROMPT, max_tokens=1).json()["usage"]["prompt_tokens"]
        # Room for the 16 streams' worst cases (reserved while they run), and 5 tokens more.
        quota = 16 * (prompt_tokens + MAX_TOKENS) + 5
        acme = admin.as_key(admin.create_tenant("acme", tokens_per_minute=quota))
        globex = admin.as_key(admin.create_tenant("globex"))
        pythonpath = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        options = {
            "--model": tiny_dir,
            "--redis-url": redis_url,
            "--redis-namespace": redis_namespace,
            "--plugin": "gateway_test_plugin:RelayedGatePlugin",
            "--quota-lease-seconds": LEASE_S,
            "--max-model-len": 512,
            "--num-kv-blocks": 256,
        }
        # Each engine step of the doomed gateway waits for a permit the test gives.
        gate = RelayedGate(redis_url, f"{redis_namespace}:gate")
        doomed = ServeProcess(
            *(str(x) for pair in options.items() for x in pair),
            env={"LORAGATE_ADMIN_KEY": ADMIN_KEY, "PYTHONPATH": pythonpath, **gate.env},
        )
        on_doomed = Api(doomed.url, acme.key)
        body = {
            "model": base,
            "prompt": PROMPT,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "sampler": "relayed_greedy",
        }
        received = [Received() for _ in range(16)]
        threads = [
            threading.Thread(
                target=stream,
                args=(on_doomed, {**body, "sampler_args": {"stream": i}}, got),
                daemon=True,
            )
            for i, got in enumerate(received)
        ]
        for thread in threads:
            thread.start()
        # One step at a time until a held step runs every stream, each with 3 tokens or
        # more: the engine waits there, before the step's tokens exist, until the kill.
        while not (len(held := gate.held()) == 16 and min(held.values()) >= 3):
            assert gate.given < MAX_TOKENS // 2, ("the 16 streams never ran together", held)
            gate.allow(1)
        # Every token the engine produced reaches its client (each event is counted before
        # it is sent, so every count is written too); no other can come.
        wait_until(
            lambda: [got.tokens for got in received] == [held[i] for i in range(16)],
            "every token produced to reach its client",
        )
        doomed.proc.kill()  # SIGKILL
        # The dead gateway's leases end within the lease time: each one's expiry (the score
        # of its entry in the tenant's lease set, on the gateways' clock) is at most the lease
        # time away, read from Redis rather than timed; and until they end they hold acme's
        # reservations.
        leases = redis.Redis.from_url(redis_url).zrange(
            f"{redis_namespace}:leases:acme", 0, -1, withscores=True
        )
        now = time.time()
        assert leases and all(expiry <= now + LEASE_S for _, expiry in leases), (leases, now)
        held = acme.complete(base)  # the dead gateway's reservations still hold the quota
        assert held.status_code == 429 and held.json()["error"]["code"] == "tokens_per_minute"
        for thread in threads:
            thread.join(30)
        assert all(got.status == 200 and got.cut for got in received), received

        # Another gateway serves the other tenants, the dead one's leases notwithstanding.
        assert globex.complete(base).status_code == 200
        usage = admin.usage().get("acme", {"total": {"completion_tokens": 0}})["total"]
        tokens = sum(got.tokens for got in received)
        print(
            f"\n16 streams cut by SIGKILL: clients received {tokens} tokens; usage says "
            f"{usage['completion_tokens']}"
        )
        assert usage["completion_tokens"] == tokens
        assert usage["requests"] == 16 and usage["prompt_tokens"] == 16 * prompt_tokens
        wait_until(
            lambda: acme.complete(base).status_code == 200,
            "the dead gateway's leases to expire",
            timeout=LEASE_S + 30,
        )
    finally:
        if doomed is not None:
            doomed.stop()
        survivor.stop()


# ---- 4. a Redis that would lose the registry ----------------------------------------------


def serve_exit(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", CLI_MODULE, "serve", "--port", "0", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_volatile_redis_is_a_warning_and_a_refusal_when_durability_is_required(
    tiny_dir, tmp_path
):
    (tmp_path / "volatile").mkdir()
    (tmp_path / "durable").mkdir()
    (tmp_path / "closed").mkdir()
    volatile = PrivateRedis(tmp_path / "volatile").start()
    durable = PrivateRedis(tmp_path / "durable", appendfsync="always").start()
    closed = PrivateRedis(tmp_path / "closed", options=("--rename-command", "CONFIG", "")).start()
    try:
        refused = serve_exit(
            "--model", tiny_dir, "--redis-url", volatile.url, "--require-durable-registry"
        )
        assert refused.returncode == 1
        assert (
            f"--require-durable-registry: refusing to start: the Redis at {volatile.url} is "
            "NOT durable: no AOF and no snapshots"
        ) in refused.stderr
        # CONFIG renamed away (as managed Redis does): unknown is refused too (in process;
        # on a port that is taken, so that a start past the check fails at once).
        code, out = cli(
            "serve",
            "--model",
            tiny_dir,
            "--redis-url",
            closed.url,
            "--port",
            closed.port,
            "--require-durable-registry",
        )
        assert code == 1 and f"the persistence of the Redis at {closed.url} could not be " in out

        server = ServeProcess("--model", tiny_dir, "--redis-url", volatile.url)
        try:
            warnings = [x for x in server.stderr if "registry persistence" in x]
            assert len(warnings) == 1 and "WARNING" in warnings[0]
            assert "NOT durable" in warnings[0] and "appendonly yes" in warnings[0]
            health = httpx.get(f"{server.url}/health", timeout=30).json()["registry"]
            assert health["durable"] is False and "NOT durable" in health["persistence"]
        finally:
            server.stop()

        gateway = start_tiny_server(tiny_dir, redis_url=durable.url, require_durable_registry=True)
        try:
            health = httpx.get(f"{gateway.url}/health", timeout=30).json()["registry"]
            assert health["durable"] is True
            assert metrics(gateway.url)["loragate_registry_durable"] == 1
            assert "AOF with appendfsync always" in health["persistence"]
        finally:
            gateway.stop()
    finally:
        for server in (volatile, durable, closed):
            server.kill()


# ---- Redis restarted empty: /health names the backup, an import restores it ---------------


def test_a_redis_restarted_empty_is_restored_from_the_scheduled_backup(
    tiny_dir, tenant_root, tmp_path
):
    (tmp_path / "backups").mkdir()
    redis_server = PrivateRedis(tmp_path).start()
    gateway = start_tiny_server(
        tiny_dir,
        adapter_root=tenant_root,
        redis_url=redis_server.url,
        admin_key=ADMIN_KEY,
        registry_backup_dir=tmp_path / "backups",
        registry_backup_every=0.3,
    )
    try:
        admin = Api(gateway.url, ADMIN_KEY)
        key = admin.create_tenant("acme", requests_per_minute=100)
        assert admin.as_key(key).complete(admin.base_model()).status_code == 200
        registry = wait_until(
            lambda: (r := admin.health()["registry"]).get("newest_backup") and r,
            "a scheduled backup",
        )
        time.sleep(0.7)  # one that holds the usage, too
        newest = admin.health()["registry"]
        usage = admin.usage()["acme"]
        scraped = metrics(gateway.url, admin.headers)
        assert scraped["loragate_registry_last_backup_timestamp_seconds"] >= int(
            registry["newest_backup_at"]
        )
        assert scraped["loragate_registry_durable"] == 0

        redis_server.kill()
        redis_server.start()  # empty: no AOF, no snapshot
        # Noticed, and subscribed again: until its subscription is back, /health names that
        # first ("not yet subscribed ...", seen once in a full make test on a 2-core EPYC).
        lost = wait_until(
            lambda: (
                (h := admin.health())["registry"].get("data_lost_at")
                and h["registry"]["watching"]
                and h
            ),
            "the gateway to notice the loss",
        )
        registry = lost["registry"]
        assert lost["status"] == "degraded" and "lost its data" in lost["detail"]
        assert registry["newest_backup"] in lost["detail"]
        assert registry["newest_backup_at"] < registry["data_lost_at"]
        assert registry["newest_backup_at"] >= newest["newest_backup_at"]
        assert f"loragate registry import {registry['newest_backup']} --merge" in lost["detail"]
        time.sleep(0.7)  # no backup of the emptied store replaces the good one meanwhile
        assert admin.health()["registry"]["newest_backup"] == registry["newest_backup"]

        code, out = cli(
            "registry",
            "import",
            registry["newest_backup"],
            "--merge",
            "--redis-url",
            redis_server.url,
        )
        assert code == 0 and "imported 1 tenants (1 keys)" in out, out
        assert key_owner(redis_server.url, key) == "acme"
        wait_until(lambda: admin.health()["status"] == "ok", "the orphans to be restored")
        assert admin.usage()["acme"] == usage
    finally:
        gateway.stop()
        redis_server.kill()
