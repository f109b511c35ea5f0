"""Helpers for the tenancy and replica tests: a key-carrying HTTP client and the requests
that name an adapter. Redis and ports: tests/services_testlib.py."""

from __future__ import annotations

import secrets

import httpx

ADMIN_KEY = "admin-" + secrets.token_urlsafe(24)
VISIBILITY_S = 1.0  # the bound for a replica to see another's change


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
