"""Tenancy with --admin-key, on two replicas sharing Redis: 401 for any bad key, another
tenant's adapter a 404 indistinguishable from a missing one in every endpoint, admin-only
routes, public adapters, quotas (429 with Retry-After, counted across replicas), a
prefix cache never shared across tenants, and keys that never reach logs or metrics."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from gateway_test_plugin import GatedPlugin
from gateway_testlib import metrics, wait_until
from tenancy_testlib import ADMIN_KEY, VISIBILITY_S, Api, requests_naming_an_adapter

SECRET = "hidden-one"  # acme's adapter: nothing in its name says whose it is
MISSING = "never-registered"


@pytest.fixture
def pair(replicas):
    return tuple(Api(s.url, ADMIN_KEY) for s in replicas(2))


@pytest.fixture
def tenants(pair):
    """acme (owning SECRET, registered on replica a) and globex, each with a key."""
    a, b = pair
    acme_key, globex_key = a.create_tenant("acme"), a.create_tenant("globex")
    assert a.as_key(acme_key).register(SECRET, "sql").status_code == 201
    wait_until(lambda: b.get(f"/v1/adapters/acme/{SECRET}").status_code == 200, "b sees it", 5)
    return {"acme": acme_key, "globex": globex_key}


# ---- 401 ---------------------------------------------------------------------------------


def other_key(key: str) -> str:
    """`key` with its last character changed: well-formed, but not the key."""
    return key[:-1] + ("B" if key[-1] == "A" else "A")


TGI_ROUTES = {"/", "/generate", "/generate_stream", "/info"}


def assert_401(response, message: str | None = None) -> str:
    """The same refusal everywhere: OpenAI's error shape, TGI's on the TGI routes."""
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    if response.request.url.path in TGI_ROUTES:
        body = response.json()
        assert set(body) == {"error", "error_type"} and body["error_type"] == "authentication"
        text = body["error"]
    else:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        text = error["message"]
    if message is not None:
        assert text == message, "every refusal must read the same"
    return text


PROTECTED = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/x", None),
    ("POST", "/v1/completions", {"model": "x", "prompt": "hi"}),
    ("POST", "/v1/chat/completions", {"model": "x", "messages": []}),
    ("GET", "/v1/adapters", None),
    ("POST", "/v1/adapters", {"name": "x", "path": "sql"}),
    ("DELETE", "/v1/adapters/x", None),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "sql"}),
    ("POST", "/generate", {"inputs": "hi"}),
    ("POST", "/", {"inputs": "hi"}),
    ("GET", "/info", None),
    ("GET", "/v1/usage", None),
    ("GET", "/v1/tenants", None),
    ("POST", "/v1/tenants", {"name": "evil"}),
    ("GET", "/metrics", None),
    ("GET", "/schema/openapi.json", None),
]


def test_every_route_but_health_needs_a_valid_key(pair, tenants):
    a, b = pair
    rotated_out = a.create_tenant("rotating")
    assert a.post("/v1/tenants/rotating/keys").status_code == 201
    deleted = a.create_tenant("leaving")
    assert a.delete("/v1/tenants/leaving").status_code == 200
    bad_headers = [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": f"Basic {ADMIN_KEY}"},
        {"Authorization": ADMIN_KEY},
        {"Authorization": f"Bearer {ADMIN_KEY}x"},
        {"Authorization": f"Bearer {ADMIN_KEY[:-1]}"},
        {"Authorization": f"Bearer lg-{'0' * 16}-{'A' * 43}"},
        {"Authorization": f"Bearer {other_key(tenants['acme'])}"},
        {"Authorization": f"Bearer {rotated_out}"},
        {"Authorization": f"Bearer {deleted}"},
    ]
    message = None
    for server in (a, b):
        anonymous = server.as_key(None)
        for i, (method, path, body) in enumerate(PROTECTED):
            # Every route with a few bad headers, every bad header on a few routes.
            for headers in bad_headers if i % 5 == 0 else bad_headers[i % 3 :: 3]:
                got = anonymous.request(method, path, json=body, headers=headers)
                message = assert_401(got, message)
        assert anonymous.get("/health").status_code == 200
    assert "Bearer" in message
    for key in (ADMIN_KEY, tenants["acme"], tenants["globex"]):
        assert b.as_key(key).get("/v1/models").status_code == 200
    # Lower-case scheme, as some clients send it.
    assert b.get("/v1/models", headers={"Authorization": f"bearer {ADMIN_KEY}"}).status_code == 200


def test_rotation_and_deletion_reach_the_other_replica_within_a_second(pair, tenants):
    a, b = pair
    old = tenants["globex"]
    assert b.as_key(old).get("/v1/models").status_code == 200  # remembered by b now
    rotated = a.post("/v1/tenants/globex/keys")
    assert rotated.status_code == 201
    new = rotated.json()["api_key"]
    assert new != old and rotated.json()["tenant"]["name"] == "globex"
    wait_until(
        lambda: b.as_key(old).get("/v1/models").status_code == 401, "old key refused", VISIBILITY_S
    )
    assert b.as_key(new).get("/v1/models").status_code == 200

    acme = b.as_key(tenants["acme"])
    assert acme.complete(SECRET).status_code == 200
    assert a.delete("/v1/tenants/acme").status_code == 200
    wait_until(lambda: acme.get("/v1/models").status_code == 401, "key refused", VISIBILITY_S)
    wait_until(
        lambda: b.get(f"/v1/adapters/acme/{SECRET}").status_code == 404,
        "adapter gone",
        VISIBILITY_S,
    )
    assert a.get("/v1/tenants/acme").status_code == 404


# ---- 404: another tenant's adapter does not exist ---------------------------------------


def test_another_tenants_adapter_is_a_404_like_a_missing_one_everywhere(pair, tenants):
    a, b = pair
    for server in (a, b):
        globex = server.as_key(tenants["globex"])
        foreign, missing = (
            requests_naming_an_adapter(globex, SECRET),
            requests_naming_an_adapter(globex, MISSING),
        )
        for what, got in foreign.items():
            assert got.status_code == 404, (what, got.text)
            assert got.headers.get("content-type") == missing[what].headers.get("content-type")
            unnamed = missing[what].text.replace(MISSING, "NAME")
            assert got.text.replace(SECRET, "NAME") == unnamed, what
            assert "acme" not in got.text
        listings = [
            [m["id"] for m in globex.get("/v1/models").json()["data"]],
            [m["name"] for m in globex.get("/v1/adapters").json()["data"]],
        ]
        for names in listings:
            assert SECRET not in names and "house" not in names  # the operator's is private

    acme = b.as_key(tenants["acme"])
    assert acme.complete(SECRET).status_code == 200, "the owner still uses it"
    assert SECRET in [m["id"] for m in acme.get("/v1/models").json()["data"]]
    own = acme.get(f"/v1/adapters/{SECRET}").json()
    assert own["owner"] == "acme" and own["public"] is False and own["path"] == "acme/sql"
    assert own["name"] == SECRET, "a tenant names its own adapters without a prefix"
    admin_view = a.get(f"/v1/adapters/acme/{SECRET}").json()  # the admin sees all, by key
    assert (admin_view["owner"], admin_view["name"]) == ("acme", f"acme/{SECRET}")
    assert a.get(f"/v1/adapters/{SECRET}").status_code == 404, "not the admin's own name"


def test_names_are_per_tenant_and_paths_stay_in_the_tenants_folder(pair, tenants, tenant_root):
    a, b = pair
    globex = b.as_key(tenants["globex"])
    # Another tenant's name is free in globex's own namespace, and in the admin's.
    assert globex.register(SECRET, "sql").status_code == 201
    loaded = globex.post("/v1/load_lora_adapter", {"lora_name": "other", "lora_path": "sql"})
    assert loaded.status_code == 200, loaded.text
    assert a.register(SECRET, "house").status_code == 201
    keys = sorted(m["name"] for m in a.get("/v1/adapters").json()["data"])
    assert keys == sorted(["house", SECRET, f"acme/{SECRET}", f"globex/{SECRET}", "globex/other"])
    # A tenant registers from its own folder only.
    for path in ("../acme/sql", "../house", str(tenant_root / "acme" / "sql")):
        refused = globex.register("escape", path)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "path", path
    acme = a.as_key(tenants["acme"])
    assert acme.complete(SECRET).status_code == 200


# ---- admin-only routes and public adapters ----------------------------------------------


def test_admin_only_routes_refuse_tenants(pair, tenants):
    a, _ = pair
    acme = a.as_key(tenants["acme"])
    for method, path, body in [
        ("GET", "/v1/tenants", None),
        ("POST", "/v1/tenants", {"name": "sneaky"}),
        ("GET", "/v1/tenants/acme", None),
        ("PATCH", "/v1/tenants/acme", {"quota": {"requests_per_minute": 1000}}),
        ("DELETE", "/v1/tenants/globex", None),
        ("POST", "/v1/tenants/globex/keys", None),
        ("PATCH", f"/v1/adapters/{SECRET}", {"public": True}),
    ]:
        got = acme.request(method, path, json=body)
        assert got.status_code == 403, (path, got.text)
        assert got.json()["error"]["type"] == "permission_error"
    refused = acme.register("public-try", "tone", public=True)
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "public"
    assert a.get("/v1/tenants/globex").json()["name"] == "globex"
    listed = [t["name"] for t in a.get("/v1/tenants").json()["data"]]
    assert listed == ["acme", "globex"]
    assert "api_key" not in a.get("/v1/tenants").text
    assert a.post("/v1/tenants", {"name": "acme"}).status_code == 409
    for bad in ("default", "bad/name", ""):
        assert a.post("/v1/tenants", {"name": bad}).status_code == 400, bad


def test_public_adapters_are_usable_by_every_tenant_but_owned_by_one(pair, tenants):
    a, b = pair
    acme, globex = a.as_key(tenants["acme"]), b.as_key(tenants["globex"])
    expected = acme.complete(SECRET).json()["choices"][0]["text"]
    shared = a.patch(f"/v1/adapters/acme/{SECRET}", {"public": True})
    assert shared.status_code == 200 and shared.json()["public"] is True
    wait_until(lambda: globex.complete(SECRET).status_code == 200, "b shares it", VISIBILITY_S)
    assert globex.complete(SECRET).json()["choices"][0]["text"] == expected
    info = globex.get(f"/v1/adapters/{SECRET}").json()
    assert info["public"] is True and info["owner"] is None, "the owner of a public adapter"
    assert SECRET in [m["id"] for m in globex.get("/v1/models").json()["data"]]
    denied = globex.delete(f"/v1/adapters/{SECRET}")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "not_owner"
    # The operator's preloaded adapter, made public, is everyone's to use.
    assert globex.complete("house").status_code == 404
    assert b.patch("/v1/adapters/house", {"public": True}).status_code == 200
    wait_until(lambda: a.as_key(tenants["globex"]).complete("house").status_code == 200, "", 5)
    # Sharing is undone as easily; the owner deletes it.
    assert a.patch(f"/v1/adapters/acme/{SECRET}", {"public": False}).status_code == 200
    wait_until(lambda: globex.complete(SECRET).status_code == 404, "unshared", VISIBILITY_S)
    assert acme.delete(f"/v1/adapters/{SECRET}").status_code == 200


def test_an_open_server_has_no_tenants(url):
    open_api = Api(url)
    refused = open_api.post("/v1/tenants", {"name": "acme"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "tenancy_disabled"
    assert open_api.complete(open_api.base_model()).status_code == 200
    usage = wait_until(lambda: open_api.usage().get("default"), "usage of the open server", 10)
    assert usage["total"]["requests"] >= 1
    assert open_api.health()["registry"]["backend"] == "memory"


# ---- quotas ------------------------------------------------------------------------------


def assert_429(response, code: str) -> None:
    assert response.status_code == 429, response.text
    retry_after = int(response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    if "error" in response.json() and isinstance(response.json()["error"], dict):
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == code
        assert "quota" in error["message"] or "maximum" in error["message"]
    else:  # TGI's shape
        assert response.json()["error_type"] == "overloaded"


def test_quotas_are_429_with_retry_after_and_hold_across_replicas(pair):
    a, b = pair
    base = a.base_model()
    limited = a.create_tenant("limited", requests_per_minute=3)
    one, other = a.as_key(limited), b.as_key(limited)
    assert one.complete(base).status_code == 200
    assert other.complete(base).status_code == 200
    assert one.complete(base).status_code == 200
    assert_429(other.complete(base), "requests_per_minute")
    assert_429(one.post("/generate", {"inputs": "hi"}), "requests_per_minute")
    assert_429(other.complete(base, stream=True), "requests_per_minute")

    thrifty = b.as_key(a.create_tenant("thrifty", tokens_per_minute=10))
    got = thrifty.complete(base, "one two three", max_tokens=7, ignore_eos=True)
    assert got.json()["usage"]["prompt_tokens"] == 3  # no BOS: the model file asks for none
    assert got.status_code == 200 and got.json()["usage"]["total_tokens"] == 10, "3 + 7 fit"
    assert_429(thrifty.complete(base), "tokens_per_minute")

    acme = b.as_key(a.create_tenant("acme", max_adapters=1))
    assert acme.register("acme-1", "sql").status_code == 201
    assert acme.register("acme-1", "tone").status_code == 201, "replacing stays within it"
    assert_429(acme.register("acme-2", "tone"), "max_adapters")
    assert a.patch("/v1/tenants/acme", {"quota": {"max_adapters": 2}}).status_code == 200
    assert acme.register("acme-2", "tone").status_code == 201


def rate_limited(api: Api, tenant: str) -> dict[str, float]:
    """The replica's loragate_tenant_rate_limited_total for `tenant`, by reason."""
    found = {}
    for sample, value in metrics(api.url, api.headers).items():
        if sample.startswith("loragate_tenant_rate_limited_total{") and (
            f'tenant="{tenant}"' in sample
        ):
            found[sample.split('reason="', 1)[1].split('"', 1)[0]] = value
    return found


def test_tokens_per_minute_holds_across_replicas_for_one_tenant_only(pair):
    """Issue 60, must-show 4: a tenant over its tokens per minute is refused 429 with
    Retry-After on both replicas (what one served counts on the other); another tenant is
    served meanwhile; the limit, changed over the admin API, holds at once everywhere. Each
    replica's /metrics counts its refusals per tenant."""
    a, b = pair
    base = a.base_model()
    flood = a.create_tenant("flood", tokens_per_minute=10)
    calm = a.create_tenant("calm", tokens_per_minute=20)
    on_a, on_b = a.as_key(flood), b.as_key(flood)
    full = dict(max_tokens=7, ignore_eos=True)  # 3 prompt tokens + 7: the whole minute's 10
    got = on_a.complete(base, "one two three", **full)
    assert got.status_code == 200 and got.json()["usage"]["total_tokens"] == 10, got.text
    assert_429(on_b.complete(base), "tokens_per_minute")  # a's tokens count on b
    assert_429(on_a.complete(base), "tokens_per_minute")
    tgi = {"inputs": "hi", "parameters": {"max_new_tokens": 2}}
    assert_429(on_b.post("/generate", tgi), "tokens_per_minute")
    for replica in (a, b):  # another tenant: its own minute, untouched by flood's
        got = replica.as_key(calm).complete(base, "one two three", **full)
        assert got.status_code == 200, got.text
    assert on_b.complete(base).status_code == 429, "nothing flood was refused counted"
    # Each replica's /metrics counts the refusals it made, per tenant and quota.
    assert rate_limited(a, "flood") == {"tokens_per_minute": 1}
    assert rate_limited(b, "flood") == {"tokens_per_minute": 3}
    assert rate_limited(a, "calm") == rate_limited(b, "calm") == {}

    raised = a.patch("/v1/tenants/flood", {"quota": {"tokens_per_minute": 100}})
    assert raised.status_code == 200 and raised.json()["quota"]["tokens_per_minute"] == 100
    wait_until(lambda: on_b.complete(base).status_code == 200, "b serves the raised limit", 5)
    assert on_a.complete(base).status_code == 200
    lowered = b.patch("/v1/tenants/flood", {"quota": {"tokens_per_minute": 10}})
    assert lowered.status_code == 200
    wait_until(lambda: on_a.complete(base).status_code == 429, "a refuses the lower limit", 5)
    assert_429(on_a.complete(base), "tokens_per_minute")
    assert_429(on_b.complete(base), "tokens_per_minute")


def test_a_lease_is_given_back_whichever_way_a_request_ends(replicas):
    """Completed, streamed, refused by the engine, or hung up on mid-stream: each gives its
    tenant's one place back. The hung-up stream's steps are the test's to give (a sampler
    that waits for a permit each step), and it is given fewer than it needs: it is running
    when b refuses, and its place can come back only because the client hung up (not
    because the stream ended, nor after the 300 s lease TTL)."""
    gate = GatedPlugin()
    a, b = (Api(s.url, ADMIN_KEY) for s in replicas(2, engine={"plugins": (gate,)}))
    base = a.base_model()
    solo = a.as_key(a.create_tenant("solo", max_concurrent_requests=1))
    for _ in range(3):  # one at a time: each gives its place back as it ends
        assert solo.complete(base).status_code == 200
    assert solo.post("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2}}).is_success
    refused = solo.complete(base, "x " * 600)  # admitted, then refused by the engine: too long
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"
    assert solo.complete(base).status_code == 200
    body = {
        "model": base,
        "prompt": "Go",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
        "sampler": "gated_greedy",
    }
    gate.allow(1)  # the response starts with the first token
    with httpx.stream("POST", f"{a.url}/v1/completions", json=body, headers=solo.headers) as r:
        lines = r.iter_lines()  # kept: dropping the iterator would close the connection
        next(line for line in lines if line.startswith("data:"))
        assert_429(b.as_key(solo.key).complete(base), "max_concurrent_requests")
    # The client hung up mid-stream, its next step still held on a: its place comes back.
    wait_until(lambda: b.as_key(solo.key).complete(base).status_code == 200, "place given back", 10)
    gate.open()
    assert solo.complete(base).status_code == 200


def test_a_stream_holds_its_tenants_concurrency_place_until_it_ends(replicas):
    """Over HTTP: while a tenant's one allowed stream runs, its other requests get 429; once
    it ends, its place is given back. That a lease outlives its TTL while its request runs
    is shown on a fake clock (test_tenancy_parts.py: ten lease lifetimes), not here.

    The stream's steps are the test's to give (a sampler that waits for a permit each
    step), and it gets fewer than it needs until every refusal is in, so it is running at
    each one however fast the server or slow the client: with a sampler merely slow, a
    loaded client once probed after the server had finished (one of eight came back 200).
    A request is answered between two engine steps, so while a probe is out the stream
    is given one step at a time until the probe is answered (`GatedPlugin.answer`)."""
    gate = GatedPlugin()
    (server,) = replicas(1, engine={"plugins": (gate,)})
    admin = Api(server.url, ADMIN_KEY)
    solo = admin.as_key(admin.create_tenant("solo", max_concurrent_requests=1))
    base = admin.base_model()
    needs = 200
    body = {
        "model": base,
        "prompt": "Go",
        "max_tokens": needs,
        "ignore_eos": True,
        "stream": True,
        "sampler": "gated_greedy",
    }
    gate.allow(8)  # the response starts with the first token
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=solo.headers) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        refusals = [
            gate.answer(lambda: solo.complete(base).status_code, short_of=needs) for _ in range(3)
        ]
        gate.allow(needs)
        rest = list(lines)
    assert "data: [DONE]" in rest
    assert refusals == [429, 429, 429], refusals
    wait_until(lambda: solo.complete(base).status_code == 200, "place given back", 10)


# ---- prefix cache, keys in logs ----------------------------------------------------------


def test_the_prefix_cache_is_never_shared_across_tenants(replicas):
    (server,) = replicas(1)
    admin = Api(server.url, ADMIN_KEY)
    first, second = (admin.as_key(admin.create_tenant(n)) for n in ("first", "second"))
    base = admin.base_model()
    prompt = " ".join(f"word{i}" for i in range(60))  # several full KV blocks

    def hits_after(api: Api) -> float:
        before = metrics_of(admin)["loragate_prefix_cache_hit_tokens_total"]
        assert api.complete(base, prompt, max_tokens=1).status_code == 200
        return metrics_of(admin)["loragate_prefix_cache_hit_tokens_total"] - before

    assert hits_after(first) == 0
    assert hits_after(first) > 0, "the same tenant reuses its cached prefix"
    assert hits_after(second) == 0, "another tenant never hits the first tenant's blocks"
    assert hits_after(second) > 0
    assert hits_after(admin) == 0


def metrics_of(admin: Api) -> dict[str, float]:
    return metrics(admin.url, headers=admin.headers)


def test_keys_never_reach_logs_or_metrics(replicas, caplog):
    caplog.set_level(logging.DEBUG)
    a, b = (Api(s.url, ADMIN_KEY) for s in replicas(2))
    key = a.create_tenant("acme")
    rotated = a.post("/v1/tenants/acme/keys").json()["api_key"]
    acme = b.as_key(rotated)
    assert acme.register("acme-sql", "sql").status_code == 201
    assert acme.complete("acme-sql").status_code == 200
    assert b.as_key(key).complete("acme-sql").status_code == 401
    scraped = b.get("/metrics").text + a.get("/metrics").text
    server_logs = "\n".join(
        f"{r.getMessage()} {r.args!r} {getattr(r, 'exc_text', '')}"
        for r in caplog.records
        if r.name.split(".")[0] in ("loragate", "uvicorn", "litestar")
    )
    assert '"POST /v1/completions" 200' in server_logs  # the access log was captured
    # lg-<key_id>-<secret>: the secret part, which may itself hold "-"
    for secret in (ADMIN_KEY, key, rotated, key.split("-", 2)[2], rotated.split("-", 2)[2]):
        assert secret not in server_logs
        assert secret not in scraped
    assert json.dumps(a.health()).count("lg-") == 0
