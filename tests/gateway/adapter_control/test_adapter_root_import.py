"""Folders registered from --adapter-root are imported into the adapter store by hash (issue 37).

Two gateways on one Redis namespace and one store (a directory both can read: a shared
volume); only gateway A has the adapter's folder. B serves it by hash from the store. When
A's folder changes in place, A's first request records the new weights and their new object,
B serves the new weights too, and the old object goes.
"""

from __future__ import annotations

import shutil
import uuid

import pytest
from gateway_testlib import TARGETS, wait_until
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from tiny_llama import make_adapters
from uploads_testlib import generated


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir):
    specs = {"v1": (4, TARGETS, False), "v2": (4, TARGETS, False)}
    return make_adapters(tiny_dir, tmp_path_factory.mktemp("import-files"), specs)


@pytest.fixture(scope="module")
def setup(tiny_dir, redis_url, tmp_path_factory, files):
    namespace = f"test-import-{uuid.uuid4().hex}"
    store = tmp_path_factory.mktemp("shared-store")
    roots = [tmp_path_factory.mktemp(f"root-{i}") for i in range(2)]
    shutil.copytree(files["v1"], roots[0] / "sql")
    servers = [
        start_tiny_server(
            tiny_dir,
            {},
            adapter_root=root,
            preload_adapters=False,
            admin_key=ADMIN_KEY,
            redis_url=redis_url,
            redis_namespace=namespace,
            adapter_store=str(store),
            adapter_cache_dir=tmp_path_factory.mktemp(f"cache-{i}"),
        )
        for i, root in enumerate(roots)
    ]
    try:
        yield [Api(s.url, ADMIN_KEY) for s in servers], roots[0], store
    finally:
        for server in servers:
            server.stop()
        flush_namespace(namespace, redis_url)


def stored(store) -> set[str]:
    return {p.name for p in store.iterdir() if not p.name.startswith(".")}


def test_a_folder_is_served_by_hash_where_it_is_missing(setup, files):
    (a, b), root, store = setup
    got = a.register("sql", "sql")
    assert got.status_code == 201, got.text
    assert got.json()["path"] == "sql"
    (first,) = stored(store)
    assert first.startswith(got.json()["sha256"] + "-")
    wait_until(lambda: b.get("/v1/adapters/sql").status_code == 200, "B sees the adapter", 5)
    before = generated(a, "sql")
    assert generated(b, "sql") == before

    # The folder changes in place (written elsewhere, renamed into place).
    shutil.copytree(files["v2"], root / "sql.new")
    shutil.rmtree(root / "sql")
    (root / "sql.new").rename(root / "sql")
    after = generated(a, "sql")
    assert after != before
    wait_until(lambda: generated(b, "sql") == after, "B serves the new weights", 10)
    wait_until(lambda: first not in stored(store), "the old object deleted", 10)
    assert len(stored(store)) == 1

    assert b.delete("/v1/adapters/sql").status_code == 200
    wait_until(lambda: stored(store) == set(), "the last object deleted", 10)
    assert (root / "sql").is_dir(), "the operator's folder stays"
