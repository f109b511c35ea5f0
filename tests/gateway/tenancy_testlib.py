"""Helpers for the tenancy and replica tests: a key-carrying HTTP client, Redis checks, and a
private redis-server that a test may stop and restart."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import redis

REDIS_URL = "redis://127.0.0.1:6379"
ADMIN_KEY = "admin-" + secrets.token_urlsafe(24)
VISIBILITY_S = 1.0  # the bound for a replica to see another's change


def require_redis(url: str = REDIS_URL) -> str:
    """Fail (never skip) when Redis is not there: these tests exist to run against it."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, OSError) as exc:
        pytest.fail(
            f"Redis is not reachable at {url} ({exc}). The gateway's replica and tenancy "
            "tests run against a real redis-server: start one (.ci/run does) and run them again."
        )
    finally:
        client.close()
    return url


def flush_namespace(url: str, namespace: str) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


class Api:
    """One caller of one gateway: every request carries its key (if any)."""

    def __init__(self, url: str, key: str | None = None):
        self.url = url
        self.key = key
        self.headers = {"Authorization": f"Bearer {key}"} if key is not None else {}

    def as_key(self, key: str | None) -> Api:
        return Api(self.url, key)

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        headers = {**self.headers, **kw.pop("headers", {})}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=60, **kw)

    def get(self, path: str, **kw) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        return self.request("POST", path, json=body, **kw)

    def patch(self, path: str, body=None, **kw) -> httpx.Response:
        return self.request("PATCH", path, json=body, **kw)

    def delete(self, path: str, **kw) -> httpx.Response:
        return self.request("DELETE", path, **kw)

    # the routes the tests use most
    def complete(self, model: str, prompt: str = "Hello world", **kw) -> httpx.Response:
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, **kw}
        return self.post("/v1/completions", body)

    def register(self, name: str, path: str, **kw) -> httpx.Response:
        """Replaces a registration of the same name (`replace=False` to be refused)."""
        return self.post("/v1/adapters", {"name": name, "path": path, "replace": True, **kw})

    def create_tenant(self, name: str, **quota) -> str:
        got = self.post("/v1/tenants", {"name": name, "quota": quota or None})
        assert got.status_code == 201, got.text
        return got.json()["api_key"]

    def usage(self) -> dict:
        got = self.get("/v1/usage")
        assert got.status_code == 200, got.text
        return {report["tenant"]: report for report in got.json()["data"]}

    def base_model(self) -> str:
        return self.get("/v1/models").json()["data"][0]["id"]

    def health(self) -> dict:
        """/health as this caller sees it (the admin key sees the registry's details)."""
        return httpx.get(f"{self.url}/health", headers=self.headers, timeout=30).json()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """A redis-server of the test's own on a free port, which it may stop and start again.

    No automatic snapshots: a restart comes back empty, unless `save()` wrote a snapshot
    first (then it comes back with the data it had). With `appendfsync` ("always",
    "everysec" or "no") it runs with the AOF on instead, and a restart (even after SIGKILL)
    replays it. `options` are more redis-server arguments (e.g. renaming CONFIG away).
    """

    def __init__(self, workdir: Path, appendfsync: str | None = None, options: tuple = ()):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail("redis-server is not on PATH: install it (.ci/run does) to run this test")
        self.port = free_port()
        self.dir = workdir
        self.process: subprocess.Popen | None = None
        aof = ["--appendonly", "no"]
        if appendfsync is not None:
            aof = ["--appendonly", "yes", "--appendfsync", appendfsync]
        self.persistence = [*aof, *options]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> PrivateRedis:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *self.persistence,
                "--dir",
                str(self.dir),
                "--dbfilename",
                "dump.rdb",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
                client.ping()
                client.close()
                return self
            except (redis.exceptions.ConnectionError, OSError):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise AssertionError("the private redis-server did not start") from None
                time.sleep(0.05)

    def save(self) -> None:
        client = redis.Redis(port=self.port)
        client.save()
        client.close()

    def kill(self) -> None:
        """Stop at once (SIGKILL): no snapshot is written."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def forget_snapshot(self) -> None:
        (self.dir / "dump.rdb").unlink(missing_ok=True)


def requests_naming_an_adapter(api: Api, name: str) -> dict[str, httpx.Response]:
    """Every route that names an adapter, called as `api` for `name`: what an isolation test
    compares between another tenant's adapter and a missing one."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    tgi = {"inputs": "hi", "parameters": {"adapter_id": name, "max_new_tokens": 2}}
    return {
        "completion": api.complete(name),
        "completion stream": api.complete(name, stream=True),
        "chat": api.post("/v1/chat/completions", {"model": name, **chat}),
        "chat stream": api.post("/v1/chat/completions", {"model": name, "stream": True, **chat}),
        "tgi generate": api.post("/generate", tgi),
        "tgi stream": api.post("/generate_stream", tgi),
        "tgi compat": api.post("/", tgi),
        "model card": api.get(f"/v1/models/{name}"),
        "adapter info": api.get(f"/v1/adapters/{name}"),
        "adapter patch": api.patch(f"/v1/adapters/{name}", {"public": True}),
        "adapter delete": api.delete(f"/v1/adapters/{name}"),
        "vllm unload": api.post("/v1/unload_lora_adapter", {"lora_name": name}),
    }
