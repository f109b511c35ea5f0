"""Issue 20, items 1, 2, 5, 6 and 7: each attack a malicious tenant tried, run against a real
server (uvicorn, tenancy, Redis), with what must hold afterwards: no request stops or stalls
the engine for other tenants, every bad input is a 4xx, no error body carries an absolute
path, nothing deployment-wide reaches a tenant or an anonymous caller, and slow clients
are disconnected after the documented timeouts."""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from gateway_test_plugin import EXPLODING_SEED, OVERFLOWING_LENGTH_PENALTY
from gateway_testlib import TARGETS, wait_until
from hardening_testlib import (
    adapter_copy,
    closed_after,
    connect,
    is_closed,
    others_still_served,
)
from regex_watch_testlib import patterns_seen_by_python_re
from servers_testlib import tiny_settings
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api

from loragate.adapters.json_depth import MAX_JSON_DEPTH
from loragate.gateway.assembly.server import BackgroundServer
from loragate.tools import make_random_adapter

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 48
CRAFTED = r"(?=.*layers\.29\.self_attn\.q_proj)(\w*\.?)*Z"
# The same backtracking bomb without the look-ahead: RE2 accepts it and matches in linear
# time, where Python's re takes seconds per module name.
BACKTRACKING = r"(\w*\.?)*Z"
DEEP = 100_000
GENERATION_ROUTES = (
    "/v1/completions",
    "/v1/chat/completions",
    "/generate",
    "/generate_stream",
    "/",
)

error_bodies: list[str] = []  # every error answer of this module, checked for absolute paths


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny_hf):
    """<root>/acme/good and <root>/globex/good: one real adapter per tenant."""
    root = tmp_path_factory.mktemp("hardening-root")
    for seed, tenant in enumerate(("acme", "globex")):
        make_random_adapter(
            tiny_hf, root / tenant / "good", rank=4, targets=TARGETS, seed=seed, init_scale=0.5
        )
    return root


@pytest.fixture(scope="module")
def server(tiny_dir, root, redis_url):
    namespace = f"test-hardening-{uuid.uuid4().hex}"
    plugins = (
        "gateway_test_plugin:ExplodingPlugin",
        "gateway_test_plugin:OverflowingBeamPlugin",
    )
    settings = tiny_settings(
        tiny_dir,
        {"plugins": plugins},
        adapter_root=root,
        redis_url=redis_url,
        redis_namespace=namespace,
        admin_key=ADMIN_KEY,
        header_timeout_seconds=HEADER_TIMEOUT_S,
        body_timeout_seconds=BODY_TIMEOUT_S,
        max_connections=MAX_CONNECTIONS,
    )
    with BackgroundServer(settings) as running:
        yield running
    flush_namespace(namespace, redis_url)


@pytest.fixture(scope="module")
def admin(server) -> Api:
    return Api(server.url, ADMIN_KEY)


@pytest.fixture(scope="module")
def tenants(admin):
    """acme and globex, each with its own adapter `good`-<tenant>."""
    apis = {}
    for tenant in ("acme", "globex"):
        api = admin.as_key(admin.create_tenant(tenant))
        assert api.register(f"{tenant}-good", "good").status_code == 201
        apis[tenant] = api
    return apis


@pytest.fixture(scope="module")
def base(admin) -> str:
    return admin.base_model()


def refused(response: httpx.Response, *words: str, status: int = 400) -> dict:
    """The response is a 4xx (`status`) whose message names every one of `words`."""
    error_bodies.append(response.text)
    assert response.status_code == status, response.text
    body = response.json()
    message = body["error"]["message"] if isinstance(body["error"], dict) else body["error"]
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return body


# ---- item 1: one request must not stop the engine --------------------------------------


def test_length_penalty_overflow_is_refused_and_the_engine_keeps_serving(tenants, admin, base):
    acme = tenants["acme"]
    body = {"use_beam_search": True, "best_of": 2, "length_penalty": 1e308, "temperature": 0}
    got = acme.post("/v1/completions", {"model": base, "prompt": "hi", "max_tokens": 4, **body})
    assert refused(got, "length_penalty")["error"]["param"] == "length_penalty"
    tgi = {"inputs": "hi", "parameters": {"repetition_penalty": 1e308}}
    refused(acme.post("/generate", tgi), "repetition_penalty")
    for field, value in (("temperature", 1e308), ("top_p", 1e308), ("repetition_penalty", 1e-308)):
        got = acme.post("/v1/completions", {"model": base, "prompt": "x", field: value})
        assert refused(got, field)["error"]["param"] == field
    got = acme.post("/v1/completions", {"model": base, "prompt": "x", "logit_bias": {"1": 1e308}})
    assert refused(got, "logit_bias")["error"]["param"] == "logit_bias"
    others_still_served(tenants, admin)


def test_a_beam_search_that_raises_on_the_engine_thread_fails_only_its_request(
    tenants, admin, base
):
    """The engine-side half of item 1: whatever raises while serving one request (here the
    decoding strategy, as beam search did on 1e308) fails that request alone."""
    acme, globex = tenants["acme"], tenants["globex"]
    beam = {"use_beam_search": True, "best_of": 2, "n": 2, "temperature": 0, "max_tokens": 6}
    results: dict = {}

    def doomed():
        body = {"model": "acme-good", "prompt": "hi", "length_penalty": OVERFLOWING_LENGTH_PENALTY}
        results["doomed"] = acme.post("/v1/completions", {**body, **beam})

    def bystander():
        body = {"model": "globex-good", "prompt": "hello", "length_penalty": 1.0, **beam}
        results["bystander"] = globex.post("/v1/completions", body)

    threads = [threading.Thread(target=f) for f in (doomed, bystander)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = results["doomed"]
    error_bodies.append(failed.text)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "plugin_error"
    assert "OverflowError" in failed.json()["error"]["message"]
    assert results["bystander"].status_code == 200, results["bystander"].text
    assert len(results["bystander"].json()["choices"]) == 2
    others_still_served(tenants, admin)


def test_a_plugin_that_raises_on_one_request_fails_only_that_request(tenants, admin):
    got = tenants["acme"].complete("acme-good", seed=EXPLODING_SEED, temperature=1.0)
    error_bodies.append(got.text)
    assert got.status_code == 500 and got.json()["error"]["code"] == "plugin_error"
    stream = tenants["acme"].post(
        "/v1/completions",
        {"model": "acme-good", "prompt": "x", "seed": EXPLODING_SEED, "stream": True},
    )
    assert stream.status_code in (200, 500)
    others_still_served(tenants, admin)


# ---- item 2: regex denial of service through adapter files -----------------------------


def test_crafted_patterns_cannot_stall_another_tenant(tenants, admin, root):
    """A backtracking bomb stalls every thread only if Python's `re` runs it (it holds the
    GIL). Proved without a clock: while acme registers adapters whose patterns are bombs,
    globex is served and /health answers, every bomb is matched (201) or refused by RE2
    (400), and Python's `re` is never given one."""
    acme, globex = tenants["acme"], tenants["globex"]
    crafted = adapter_copy(root, "acme", "crafted", rank_pattern={CRAFTED: 4})
    bomb = adapter_copy(root, "acme", "bomb", rank_pattern={BACKTRACKING: 4})
    alpha_bomb = adapter_copy(root, "acme", "alpha-bomb", alpha_pattern={BACKTRACKING: 16})

    stop = threading.Event()
    outcomes: list[int] = []

    def attack():
        i = 0
        while not stop.is_set():
            got = acme.register(f"attack-{i}", (crafted, bomb, alpha_bomb)[i % 3])
            outcomes.append(got.status_code)
            error_bodies.append(got.text)
            if got.status_code == 201:
                acme.delete(f"/v1/adapters/attack-{i}")
            i += 1

    attacker = threading.Thread(target=attack)
    with patterns_seen_by_python_re(BACKTRACKING) as seen:
        attacker.start()
        try:
            wait_until(lambda: len(outcomes) >= 3, "the attack is under way", 60)
            for _ in range(3):
                got = globex.complete("globex-good", max_tokens=12, ignore_eos=True)
                assert got.status_code == 200, got.text
            assert httpx.get(f"{admin.url}/health", timeout=30).status_code == 200
            assert attacker.is_alive()  # globex was served while the attack went on
        finally:
            stop.set()
            attacker.join()
    assert seen == [], "a tenant's pattern reached Python's backtracking re"
    assert {s for s in outcomes[0::3]} == {400}  # look-ahead: RE2 refuses it
    assert set(outcomes[1::3]) == {201} and set(outcomes[2::3]) == {201}
    got = acme.register("crafted", crafted)
    refused(got, "rank_pattern", "RE2")


# ---- item 5: inputs that used to be a 500 --------------------------------------------


def test_deeply_nested_bodies_are_a_400_on_every_generation_route(tenants, admin, base):
    acme = tenants["acme"]
    deep = "[" * DEEP + "]" * DEEP
    for route in GENERATION_ROUTES:
        for body in (
            f'{{"model": "{base}", "prompt": {deep}, "messages": {deep}, "inputs": {deep}}}',
            f'{{"model": "{base}", "prompt": "x", "sampler_args": {{"a": {deep}}}}}',
            deep,
        ):
            got = acme.request(
                "POST", route, content=body, headers={"Content-Type": "application/json"}
            )
            error_bodies.append(got.text)
            assert got.status_code == 400, (route, got.text)
            assert f"deeper than {MAX_JSON_DEPTH}" in got.text
    for route in ("/v1/adapters", "/v1/load_lora_adapter", "/v1/tenants"):
        got = admin.request(
            "POST", route, content=deep, headers={"Content-Type": "application/json"}
        )
        refused(got, f"deeper than {MAX_JSON_DEPTH}")


def test_hostile_adapter_configs_are_a_400(tenants, root):
    acme = tenants["acme"]
    folder = root / "acme" / "deep-config"
    shutil.copytree(root / "acme" / "good", folder)
    deep = "[" * DEEP + "]" * DEEP
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "x": ' + deep + "}")
    refused(acme.register("deep-config", "deep-config"), "nests deeper")
    cases = {
        "negative-alpha": ({"lora_alpha": -1e6}, "lora_alpha"),
        "zero-alpha": ({"lora_alpha": 0}, "lora_alpha"),
        "huge-alpha-pattern": ({"alpha_pattern": {"q_proj": 1e300}}, "alpha_pattern"),
    }
    for name, (changes, word) in cases.items():
        refused(acme.register(name, adapter_copy(root, "acme", name, **changes)), word)
    for field in ("r", "lora_alpha"):
        for digits in (1000, 5000):
            name = f"huge-{field}-{digits}"
            folder = root / "acme" / name
            shutil.copytree(root / "acme" / "good", folder)
            config = json.loads((folder / "adapter_config.json").read_text())
            config[field] = 1  # placeholder, replaced by the raw digits
            text = json.dumps(config).replace(f'"{field}": 1', f'"{field}": {"9" * digits}')
            (folder / "adapter_config.json").write_text(text)
            body = refused(acme.register(name, name))
            assert len(body["error"]["message"]) < 1000  # the number is not echoed


def test_overlong_adapter_paths_are_a_400_and_stay_out_of_the_log(tenants, caplog):
    acme = tenants["acme"]
    component = "a" * 4000
    total = "/".join(["b" * 200] * 50)
    for path in (component, total, f"good/{component}/x"):
        body = refused(acme.register("long", path), "path")
        assert "aaaaaaaaaa" * 20 not in json.dumps(body) and "b" * 200 not in json.dumps(body)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert component not in logged and total not in logged


# ---- item 6: small leaks -------------------------------------------------------------


def test_symlink_loops_are_shown_relative_to_the_adapter_root(tenants, root):
    acme = tenants["acme"]
    (root / "acme" / "loop-a").symlink_to(root / "acme" / "loop-b")
    (root / "acme" / "loop-b").symlink_to(root / "acme" / "loop-a")
    for path in ("loop-a", "loop-a/x", str(root / "acme" / "loop-a")):
        body = refused(acme.register("loop", path), "path")
        assert str(root) not in json.dumps(body)


def test_health_says_only_whether_the_store_is_reachable(admin, redis_url):
    anonymous = httpx.get(f"{admin.url}/health", timeout=30)
    assert anonymous.status_code == 200
    assert anonymous.json()["registry"] == {"reachable": True}
    assert "redis" not in anonymous.text and "127.0.0.1" not in anonymous.text
    assert admin.health()["registry"]["backend"].startswith("redis://")


def test_metrics_are_for_the_operator_only(tenants, admin):
    for api in tenants.values():
        got = api.get("/metrics")
        refused(got, "/v1/usage", status=403)
        assert "loragate_" not in got.text
    assert admin.get("/metrics").status_code == 200
    assert tenants["acme"].get("/v1/usage").status_code == 200


def test_no_error_body_carries_an_absolute_path(tenants, admin, root):
    acme = tenants["acme"]
    (root / "acme" / "no-weights").mkdir()
    (root / "acme" / "no-weights" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    attempts = [
        acme.register("x", "missing"),
        acme.register("x", "no-weights"),
        acme.register("x", str(root / "acme" / "missing")),
        acme.register("x", "/etc"),
        acme.register("x", "../globex/good"),
        acme.post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "a" * 4000}),
        admin.register("x", str(root / "acme" / "no-weights")),
        acme.complete("acme-good", length_penalty=1e308, use_beam_search=True, best_of=2),
    ]
    for got in attempts:
        assert 400 <= got.status_code < 500, got.text
        error_bodies.append(got.text)
    for text in error_bodies:
        assert str(root) not in text and str(root.resolve()) not in text
        assert "/tmp/" not in text and str(Path.home()) not in text


# ---- item 7: slow clients --------------------------------------------------------------


def test_a_slow_header_client_is_disconnected_after_the_header_timeout(server):
    sock = connect(server.url)
    headers = [b"GET /health HTTP/1.1\r\n"] + [b"X-Slow: 1\r\n"] * 100
    seconds = closed_after(sock, headers, 0.2)
    sock.close()
    assert HEADER_TIMEOUT_S - 0.1 <= seconds <= HEADER_TIMEOUT_S + 1.0, seconds


def test_a_silent_client_is_disconnected_after_the_header_timeout(server):
    sock = connect(server.url)
    seconds = closed_after(sock, [b""] * 100, 0.2)
    sock.close()
    assert HEADER_TIMEOUT_S - 0.1 <= seconds <= HEADER_TIMEOUT_S + 1.0, seconds


def test_a_slow_body_client_is_disconnected_after_the_body_timeout(server, tenants):
    sock = connect(server.url)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + tenants["acme"].key.encode() + b"\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    sock.sendall(head)
    seconds = closed_after(sock, [b" "] * 100, 0.2)
    sock.close()
    assert BODY_TIMEOUT_S - 0.1 <= seconds <= BODY_TIMEOUT_S + 1.0, seconds


def test_connections_past_the_cap_are_closed_at_once(server, tenants):
    socks = [connect(server.url) for _ in range(MAX_CONNECTIONS + 8)]
    try:
        time.sleep(0.3)  # well inside the header timeout: only the cap closes anything
        closed = [is_closed(sock) for sock in socks]
        assert sum(closed) == 8, closed
        assert not any(closed[: MAX_CONNECTIONS - 8])
    finally:
        for sock in socks:
            sock.close()
    wait_until(lambda: tenants["acme"].complete("acme-good").status_code == 200, "served", 10)
