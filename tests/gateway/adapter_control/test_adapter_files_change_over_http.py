"""A registered adapter's files overwritten in place (issue 21): the next request is served
with the new weights, and the registry's record (GET /v1/adapters/{name}, on every replica)
shows the sha256 it serves. The registration (its id) stays the same."""

from __future__ import annotations

import hashlib

import pytest
from gateway_testlib import TARGETS, wait_until
from tenancy_testlib import ADMIN_KEY, VISIBILITY_S, Api

from loragate.tools import make_random_adapter

# Long enough to fill several KV blocks, so the prefix cache holds the old weights' KV.
PROMPT = "The quick brown fox jumps over the lazy dog. " * 12
FILES = ("adapter_config.json", "adapter_model.safetensors")


@pytest.fixture
def changing_root(tmp_path, tiny_hf):
    """<root>/live starts as v1; <root>/v2 holds other weights of the same rank and sizes."""
    root = tmp_path / "root"
    for seed, name in ((31, "v1"), (32, "v2")):
        make_random_adapter(
            tiny_hf, root / name, rank=4, targets=TARGETS, seed=seed, init_scale=0.5
        )
    (root / "live").mkdir()
    overwrite(root / "live", root / "v1")
    return root


def overwrite(directory, source) -> None:
    """Rewrite ``directory``'s files in place (same inodes) with ``source``'s."""
    for name in FILES:
        data = (source / name).read_bytes()
        with open(directory / name, "wb") as f:
            f.write(data)


def sha256_of(directory) -> str:
    return hashlib.sha256((directory / "adapter_model.safetensors").read_bytes()).hexdigest()


def text(api: Api, model: str) -> str:
    got = api.complete(model, PROMPT, max_tokens=8)
    assert got.status_code == 200, got.text
    return got.json()["choices"][0]["text"]


def test_overwritten_files_serve_new_weights_and_update_the_record(start_server, changing_root):
    server = start_server(gateway={"adapter_root": changing_root, "preload_adapters": False})
    api = Api(server.url)
    for name in ("live", "v1", "v2"):
        assert api.register(name, name).status_code == 201
    registered = api.get("/v1/adapters/live").json()
    assert registered["sha256"] == sha256_of(changing_root / "v1")
    assert text(api, "live") == text(api, "v1") != text(api, "v2")

    overwrite(changing_root / "live", changing_root / "v2")
    assert text(api, "live") == text(api, "v2")
    record = api.get("/v1/adapters/live").json()
    assert record["sha256"] == sha256_of(changing_root / "v2")
    assert record["id"] == registered["id"] and record["created"] == registered["created"]
    assert text(api, "live") == text(api, "v2")  # and again, from the caches

    overwrite(changing_root / "live", changing_root / "v1")
    assert text(api, "live") == text(api, "v1")
    assert api.get("/v1/adapters/live").json()["sha256"] == sha256_of(changing_root / "v1")


def test_every_replica_shows_the_sha256_served(replicas, changing_root):
    a, b = (Api(s.url, ADMIN_KEY) for s in replicas(2, adapter_root=changing_root))
    assert a.get("/v1/adapters/live").status_code == 200  # preloaded from the root
    before = text(b, "live")
    overwrite(changing_root / "live", changing_root / "v2")
    assert text(a, "live") == text(a, "v2") != before
    new = sha256_of(changing_root / "v2")
    assert a.get("/v1/adapters/live").json()["sha256"] == new
    wait_until(
        lambda: b.get("/v1/adapters/live").json()["sha256"] == new,
        "the other replica shows the new sha256",
        VISIBILITY_S,
        0.01,
    )
    assert text(b, "live") == text(b, "v2")
