"""Gateway fixtures: a tiny random Llama on disk, four real PEFT adapters, and real servers
(uvicorn on 127.0.0.1, a free port, in a background thread) that the tests reach over HTTP.
Replicas: several such servers, each with its own app and engine, on one Redis namespace."""

from __future__ import annotations

import uuid

import pytest
from gateway_testlib import ADAPTER_NAMES, ENGINE, TARGETS, make_tiny_model_dir
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace, require_redis
from tenancy_testlib import ADMIN_KEY
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import LLM
from loragate.engine.loading.model_loader import resolve_model
from loragate.gateway.assembly.server import BackgroundServer
from loragate.tools import make_random_adapter


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), resolve_model(None).hf_dir)


@pytest.fixture(scope="session")
def tiny_hf(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval()


@pytest.fixture(scope="session")
def adapter_root(tmp_path_factory, tiny_hf):
    """An --adapter-root with four adapters named after their folders, and one non-adapter."""
    root = tmp_path_factory.mktemp("adapter-root")
    for seed, name in enumerate(ADAPTER_NAMES):
        make_random_adapter(
            tiny_hf,
            root / name,
            rank=4 * (1 + seed % 2),
            targets=TARGETS,
            seed=seed,
            init_scale=0.5,
        )
    (root / "notes").mkdir()
    (root / "notes" / "README.txt").write_text("not an adapter")
    return root


@pytest.fixture(scope="session")
def lora_of(adapter_root):
    """The offline engine's LoRARequest for a named test adapter."""
    ids = {name: i + 1 for i, name in enumerate(ADAPTER_NAMES)}
    return lambda name: LoRARequest(name, ids[name], str(adapter_root / name))


@pytest.fixture(scope="session")
def start_server(tiny_dir, adapter_root):
    """start_server(engine overrides..., gateway=dict(...)) -> a running BackgroundServer."""
    servers = []

    def start(gateway: dict | None = None, **engine_overrides) -> BackgroundServer:
        options = {"adapter_root": adapter_root, **(gateway or {})}
        server = start_tiny_server(tiny_dir, engine_overrides, **options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def server(start_server):
    """The shared server: tiny model, the four adapters preloaded, a generous queue."""
    return start_server(gateway={"max_queue": 1024})


@pytest.fixture(scope="session")
def url(server):
    return server.url


@pytest.fixture(scope="session")
def offline(tiny_dir):
    """The offline engine on the same model and settings: the reference for served tokens."""
    return LLM(str(tiny_dir), **ENGINE)


# Adapters of the tenancy tests: the operator's at the top of the root (preloaded), and each
# tenant's under <root>/<tenant>/, the only place that tenant may register from.
TENANT_ADAPTERS = {"house": 21, "acme/sql": 22, "acme/tone": 23, "globex/sql": 24}


@pytest.fixture(scope="session")
def tenant_root(tmp_path_factory, tiny_hf):
    root = tmp_path_factory.mktemp("tenant-root")
    for path, seed in TENANT_ADAPTERS.items():
        make_random_adapter(
            tiny_hf, root / path, rank=4, targets=TARGETS, seed=seed, init_scale=0.5
        )
    return root


@pytest.fixture(scope="session")
def redis_url():
    return require_redis(who="The gateway's replica and tenancy tests")


@pytest.fixture
def redis_namespace(redis_url):
    namespace = f"test-gateway-{uuid.uuid4().hex}"
    yield namespace
    flush_namespace(namespace, redis_url)


@pytest.fixture
def replicas(tiny_dir, tenant_root, redis_url, redis_namespace):
    """replicas(n, engine=dict(...), **gateway) -> n servers with the admin key, on one Redis
    namespace (this test's own). Each has its own app, engine and registry store. A request
    that must stay in flight takes its steps from a GatedPlugin the test passes in
    `engine={"plugins": (gate,)}`."""
    started: list[BackgroundServer] = []

    def start(n: int = 2, engine: dict | None = None, **gateway) -> list[BackgroundServer]:
        options = {
            "adapter_root": tenant_root,
            "redis_url": redis_url,
            "redis_namespace": redis_namespace,
            "admin_key": ADMIN_KEY,
            **gateway,
        }
        servers = []
        for _ in range(n):
            server = start_tiny_server(tiny_dir, engine, **options)
            started.append(server)
            servers.append(server)
        return servers

    yield start
    for server in started:
        server.stop()
