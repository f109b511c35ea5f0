"""`--metrics-port`: /metrics on a port of its own answers without a key while the API needs
one (and a tenant's key opens nothing there beyond metrics); `--metrics-key` guards it when
set. The ports are bound before the model loads, so a taken one fails at once."""

from __future__ import annotations

import socket

import httpx
import pytest
from tenancy_testlib import ADMIN_KEY, Api

from loragate.engine import EngineConfig
from loragate.gateway.assembly.server import PortInUseError, build_server, serve
from loragate.gateway.settings import GatewaySettings

METRICS_KEY = "scraper-" + "k" * 24


@pytest.fixture(scope="module")
def tenanted(start_server):
    """Tenancy on, /metrics also on its own port, open there."""
    return start_server(gateway={"admin_key": ADMIN_KEY, "metrics_port": 0})


def test_metrics_on_its_own_port_answer_without_a_key_while_the_api_needs_one(tenanted):
    got = httpx.get(tenanted.metrics_url, timeout=30)
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/plain")
    assert "vllm:num_requests_running{" in got.text
    assert "vllm:lora_requests_info{" in got.text
    assert httpx.get(f"{tenanted.url}/v1/models", timeout=30).status_code == 401
    assert httpx.get(f"{tenanted.url}/metrics", timeout=30).status_code == 401
    admin = Api(tenanted.url, ADMIN_KEY)
    tenant = admin.as_key(admin.create_tenant("acme"))
    assert tenant.get("/metrics").status_code == 403  # the API port: still the admin's
    assert admin.get("/metrics").status_code == 200


def test_the_metrics_port_serves_metrics_and_nothing_else(tenanted):
    base = tenanted.metrics_url.removesuffix("/metrics")
    assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 404
    assert httpx.get(f"{base}/health", timeout=30).status_code == 404
    assert httpx.post(tenanted.metrics_url, timeout=30).status_code == 405
    assert httpx.head(tenanted.metrics_url, timeout=30).status_code == 200


def test_a_metrics_key_guards_the_metrics_port(start_server):
    server = start_server(
        gateway={"admin_key": ADMIN_KEY, "metrics_port": 0, "metrics_key": METRICS_KEY}
    )
    assert httpx.get(server.metrics_url, timeout=30).status_code == 401
    wrong = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.get(server.metrics_url, headers=wrong, timeout=30).status_code == 401
    right = {"Authorization": f"Bearer {METRICS_KEY}"}
    got = httpx.get(server.metrics_url, headers=right, timeout=30)
    assert got.status_code == 200 and "vllm:kv_cache_usage_perc" in got.text
    # the metrics key opens nothing on the API port
    assert httpx.get(f"{server.url}/v1/models", headers=right, timeout=30).status_code == 401


def test_a_port_in_use_fails_before_the_model_loads(tiny_dir, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # a model path that does not exist: loading it would fail differently
        engine = EngineConfig(model=str(tiny_dir / "missing"))
        settings = GatewaySettings(engine=engine, port=port)
        with pytest.raises(PortInUseError, match=f"127.0.0.1:{port} \\(--port\\)"):
            build_server(settings)
        assert serve(settings, announce=lambda line: None) is False
        assert f"cannot listen on 127.0.0.1:{port} (--port)" in caplog.text
        metrics_taken = GatewaySettings(engine=engine, port=0, metrics_port=port)
        with pytest.raises(PortInUseError, match="--metrics-port"):
            build_server(metrics_taken)


@pytest.mark.parametrize(
    "gateway, problem",
    [
        ({"port": 8123, "metrics_port": 8123}, "metrics_port must differ"),
        ({"metrics_port": 70000}, "metrics_port must be an integer"),
        ({"metrics_key": "short"}, "metrics_key must be at least"),
        ({"admin_key": ADMIN_KEY, "metrics_key": ADMIN_KEY}, "metrics_key must differ"),
        ({"metrics_label_limit": -1}, "metrics_label_limit must be an integer >= 0"),
    ],
)
def test_bad_metrics_settings_are_refused_by_name(tiny_dir, gateway, problem):
    with pytest.raises(ValueError, match=problem):
        GatewaySettings(engine=EngineConfig(model=str(tiny_dir)), **gateway)


def test_per_tenant_series_count_each_tenant_and_the_admin_as_default(tenanted):
    admin = Api(tenanted.url, ADMIN_KEY)
    base = admin.base_model()
    acme = admin.as_key(admin.create_tenant("initech"))
    globex = admin.as_key(admin.create_tenant("globex"))
    for caller in (acme, acme, globex, admin):
        assert caller.complete(base, max_tokens=3).status_code == 200
    text = httpx.get(tenanted.metrics_url, timeout=30).text
    model = f'model_name="{base}"'
    assert f'loragate_tenant_requests_total{{{model},tenant="initech"}} 2.0' in text
    assert f'loragate_tenant_requests_total{{{model},tenant="globex"}} 1.0' in text
    assert f'loragate_tenant_generation_tokens_total{{{model},tenant="globex"}} 3.0' in text
    assert f'loragate_tenant_requests_total{{{model},tenant="default"}}' in text
