"""Issue 20, items 3 and 4, against real servers with tenancy on a real Redis:

- quotas hold under bursts: a request reserves its worst case (prompt + max_tokens for
  each sequence) when admitted and gives back what it did not use when it ends, however it
  ends, so 16 concurrent requests against tokens_per_minute=100 are served at most 100;
- adapter names are per tenant: tenant B can tell nothing of tenant A's names from any
  route's status or body, and B's `sql` is not A's `sql`.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gateway_test_plugin import GatedPlugin
from gateway_testlib import sse_payloads, wait_until
from tenancy_testlib import ADMIN_KEY, VISIBILITY_S, Api, requests_naming_an_adapter

QUOTA = 100
SECRET = "ledger-7"  # acme's adapter: what globex must not be able to detect
MISSING = "ledger-8"  # never registered by anyone
NAME = "NAME"


@pytest.fixture
def pair(replicas):
    return tuple(Api(s.url, ADMIN_KEY) for s in replicas(2))


def _stream_usage(api: Api, path: str, body: dict) -> int:
    """Tokens a streamed completion reported in its final usage chunk (0 if refused)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{api.url}{path}", json=body, headers=api.headers, timeout=120) as r:
        if r.status_code != 200:
            r.read()
            return -r.status_code
        chunks = sse_payloads(r.iter_lines())
    return chunks[-1]["usage"]["total_tokens"]


# ---- item 3: quotas ----------------------------------------------------------------------


def test_a_burst_of_16_concurrent_requests_is_served_no_more_tokens_than_the_quota(pair):
    a, b = pair
    base = a.base_model()
    key = a.create_tenant("bursty", tokens_per_minute=QUOTA)
    replicas = [a.as_key(key), b.as_key(key)]
    body = {"model": base, "prompt": "Tell me a story", "max_tokens": 30, "ignore_eos": True}

    def one(i: int):
        api = replicas[i % 2]
        if i % 4 == 3:  # some stream, across both replicas
            return ("stream", _stream_usage(api, "/v1/completions", body))
        got = api.post("/v1/completions", body)
        return ("whole", got)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))

    served, refused = 0, 0
    for kind, got in results:
        if kind == "stream":
            if got > 0:
                served += got
            else:
                assert got == -429
                refused += 1
            continue
        if got.status_code == 200:
            served += got.json()["usage"]["total_tokens"]
        else:
            assert got.status_code == 429, got.text
            assert got.json()["error"]["code"] == "tokens_per_minute"
            assert 1 <= int(got.headers["retry-after"]) <= 60
            refused += 1
    assert 0 < served <= QUOTA, f"served {served} tokens against a quota of {QUOTA}"
    assert refused >= 16 - QUOTA // 30, "each worst case is more than 30 tokens"
    # Metering stays exact: what the tenant is billed is what it was served.
    total = wait_until(
        lambda: (t := a.as_key(key).usage()["bursty"]["total"])["requests"] == 16 - refused and t,
        "usage of the burst",
        VISIBILITY_S * 5,
    )
    assert total["prompt_tokens"] + total["completion_tokens"] == served
    # What is left of the minute is exactly QUOTA - served, on either replica: a one-token
    # prompt with max_tokens = left needs one token too many; with one less, it fits.
    left = QUOTA - served
    got = replicas[1].complete(base, [1], max_tokens=left)
    assert got.status_code == 429 and got.json()["error"]["code"] == "tokens_per_minute"
    if left >= 2:
        assert replicas[0].complete(base, [1], max_tokens=left - 1).status_code == 200


def test_a_request_whose_worst_case_exceeds_the_quota_is_a_400_that_serves_nothing(pair):
    a, _ = pair
    base = a.base_model()
    key = a.create_tenant("small", tokens_per_minute=QUOTA)
    small = a.as_key(key)
    # The stream of max_tokens 300 (it ran to 302 tokens against a quota of 100).
    stream = {"model": base, "prompt": "Go", "max_tokens": 300, "stream": True}
    chat = {"model": base, "messages": [{"role": "user", "content": "hi"}]}  # no max_tokens
    tgi = {"inputs": "hi", "parameters": {"max_new_tokens": 300}}
    for path, body, param in (
        ("/v1/completions", stream, "max_tokens"),
        ("/v1/chat/completions", chat, "max_tokens"),
        ("/v1/chat/completions", {**chat, "max_completion_tokens": 200}, "max_completion_tokens"),
    ):
        got = small.post(path, body)
        assert got.status_code == 400, got.text
        error = got.json()["error"]
        assert (error["param"], error["code"]) == (param, "exceeds_tokens_per_minute")
        assert "tokens per minute" in error["message"]
    got = small.post("/generate", tgi)
    assert got.status_code == 400 and "tokens per minute" in got.json()["error"]
    assert small.usage()["small"]["total"]["requests"] == 0, "nothing reached the engine"
    # Within the quota, the same routes serve.
    assert small.post("/v1/chat/completions", {**chat, "max_tokens": 20}).status_code == 200


def test_a_prompt_list_and_n_count_as_the_sequences_they_are(pair):
    a, _ = pair
    base = a.base_model()
    per_minute = a.as_key(a.create_tenant("counted", requests_per_minute=5))
    got = per_minute.complete(base, ["a", "b", "c"], n=2)  # 6 sequences: can never fit
    assert got.status_code == 400 and got.json()["error"]["code"] == "exceeds_requests_per_minute"
    assert per_minute.complete(base, ["a", "b"], n=2).status_code == 200  # 4 of 5
    got = per_minute.complete(base, ["a", "b"])  # 2 more: 6 > 5
    assert got.status_code == 429 and got.json()["error"]["code"] == "requests_per_minute"
    assert per_minute.complete(base, "a").status_code == 200  # the fifth


def test_what_a_request_did_not_use_is_given_back_however_it_ends(replicas):
    """Refused by the engine after admission, or hung up on mid-stream: the reservation
    comes back. The hung-up stream's steps are the test's to give (a sampler that waits
    for a permit each step), and it is given fewer than it needs: it is running when b
    refuses, and its reservation can come back only because the client hung up (not
    because the stream ended)."""
    gate = GatedPlugin()
    a, b = (Api(s.url, ADMIN_KEY) for s in replicas(2, engine={"plugins": (gate,)}))
    base = a.base_model()
    # Refused by the engine after admission (a token id outside the vocabulary).
    failing = a.as_key(a.create_tenant("failing", tokens_per_minute=QUOTA))
    got = failing.complete(base, [10**8], max_tokens=90)
    assert got.status_code == 400 and got.json()["error"]["param"] == "prompt"
    got = failing.complete(base, "Hello world", max_tokens=90, ignore_eos=True)
    assert got.status_code == 200, "the refused request's 91 reserved tokens came back"

    # A client that hangs up mid-stream: its reservation ends with the stream.
    hasty_key = a.create_tenant("hasty", tokens_per_minute=QUOTA)
    hasty = a.as_key(hasty_key)
    body = {
        "model": base,
        "prompt": "Go",
        "max_tokens": 90,
        "ignore_eos": True,
        "stream": True,
        "sampler": "gated_greedy",
    }
    gate.allow(1)  # the response starts with the first token
    with httpx.stream("POST", f"{a.url}/v1/completions", json=body, headers=hasty.headers) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        held = b.as_key(hasty_key).complete(base, max_tokens=40)
        assert held.status_code == 429, "while it streams, its worst case is held"
    # Its next step is still held on a: the hang-up alone gives the reservation back.
    wait_until(
        lambda: b.as_key(hasty_key).complete(base, max_tokens=40).status_code == 200,
        "the abandoned stream's reservation given back",
        10,
    )
    gate.open()
    usage = hasty.usage()["hasty"]["total"]
    assert usage["requests"] == 2, "both requests reached the engine and are metered"


# ---- item 4: per-tenant adapter names ----------------------------------------------------


@pytest.fixture
def tenants(pair):
    """acme owns SECRET (its folder `sql`); globex and initech own nothing yet."""
    a, b = pair
    keys = {name: a.create_tenant(name) for name in ("acme", "globex", "initech")}
    assert a.as_key(keys["acme"]).register(SECRET, "sql").status_code == 201
    wait_until(lambda: b.get(f"/v1/adapters/acme/{SECRET}").status_code == 200, "b sees it", 5)
    return keys


def _same_answer(first: httpx.Response, second: httpx.Response, names: tuple[str, str]):
    """Status, content type and body alike once each names its own probe as NAME."""
    assert first.status_code == second.status_code, (first.text, second.text)
    assert first.headers.get("content-type") == second.headers.get("content-type")
    assert _unnamed(first, names[0]) == _unnamed(second, names[1])


def _unnamed(response: httpx.Response, name: str):
    text = response.text.replace(name, NAME)
    try:
        body = json.loads(text)
    except ValueError:
        return text
    if isinstance(body, dict):  # a registration: its id and time are its own
        for volatile in ("id", "created"):
            body.pop(volatile, None)
    return body


def test_tenant_b_cannot_tell_whether_tenant_as_adapter_name_exists(pair, tenants):
    a, b = pair
    for server in (a, b):
        globex = server.as_key(tenants["globex"])
        pairs = [
            (SECRET, MISSING),  # in globex's namespace
            (f"acme/{SECRET}", f"acme/{MISSING}"),  # spelled as the admin names acme's
            (f"acme/{SECRET}", f"nobody/{SECRET}"),  # a tenant that exists or not
        ]
        for names in pairs:
            found, missing = (
                requests_naming_an_adapter(globex, names[0]),
                requests_naming_an_adapter(globex, names[1]),
            )
            for route, got in found.items():
                assert got.status_code == 404, (route, names, got.text)
                _same_answer(got, missing[route], names)
                assert "acme" not in got.text.replace(names[0], NAME), route
        listed = [m["id"] for m in globex.get("/v1/models").json()["data"]]
        assert not any(SECRET in m for m in listed)

    # Registering: the name acme holds is as free to globex as a name nobody holds.
    globex = b.as_key(tenants["globex"])
    registered = [globex.register(name, "sql") for name in (SECRET, MISSING)]
    _same_answer(*registered, (SECRET, MISSING))
    assert registered[0].status_code == 201
    loaded = [
        globex.post("/v1/load_lora_adapter", {"lora_name": n, "lora_path": "sql"})
        for n in (SECRET, MISSING)
    ]
    _same_answer(*loaded, (SECRET, MISSING))
    refused = [globex.register(f"acme/{n}", "sql") for n in (SECRET, MISSING)]
    _same_answer(*refused, (f"acme/{SECRET}", f"acme/{MISSING}"))
    assert refused[0].status_code == 400 and refused[0].json()["error"]["param"] == "name"
    deleted = [globex.delete(f"/v1/adapters/{n}") for n in (SECRET, MISSING)]
    _same_answer(*deleted, (SECRET, MISSING))
    assert deleted[0].status_code == 200
    assert a.get(f"/v1/adapters/acme/{SECRET}").status_code == 200, "acme's is untouched"


def test_two_tenants_sql_are_two_adapters_each_served_its_own_weights(pair, tenants):
    a, b = pair
    acme, globex = a.as_key(tenants["acme"]), b.as_key(tenants["globex"])
    assert acme.register("sql", "sql").status_code == 201
    assert globex.register("sql", "sql").status_code == 201, "not a 409: its own namespace"

    def text(api: Api, model: str) -> str:
        got = api.complete(model, "The quick brown fox", max_tokens=8, ignore_eos=True)
        assert got.status_code == 200, got.text
        return got.json()["choices"][0]["text"]

    wait_until(lambda: a.get("/v1/adapters/globex/sql").status_code == 200, "a sees it", 5)
    acme_weights, globex_weights = text(a, "acme/sql"), text(a, "globex/sql")
    assert acme_weights != globex_weights, "the two folders hold different weights"
    for server in (a, b):
        assert text(server.as_key(tenants["acme"]), "sql") == acme_weights
        assert text(server.as_key(tenants["globex"]), "sql") == globex_weights
    own = acme.get("/v1/adapters/sql").json()
    assert (own["name"], own["owner"], own["path"]) == ("sql", "acme", "acme/sql")

    # A public adapter is every tenant's by its bare name, unless the tenant has its own.
    assert a.patch("/v1/adapters/acme/sql", {"public": True}).status_code == 200
    initech = a.as_key(tenants["initech"])
    wait_until(lambda: initech.complete("sql").status_code == 200, "shared", VISIBILITY_S)
    assert text(initech, "sql") == acme_weights
    assert text(globex, "sql") == globex_weights, "its own name comes first"
    shown = initech.get("/v1/adapters/sql")
    assert (shown.json()["name"], shown.json()["owner"]) == ("sql", None)
    assert "acme" not in shown.text and "acme" not in initech.get("/v1/models").text
    clash = a.patch("/v1/adapters/globex/sql", {"public": True})
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "public_name_taken"

    # Deleting one tenant's sql leaves the other's.
    assert globex.delete("/v1/adapters/sql").status_code == 200
    wait_until(lambda: text(globex, "sql") == acme_weights, "globex falls back to the public", 5)
    assert text(acme, "sql") == acme_weights
    usage = {t: acme.as_key(k).usage()[t]["by_adapter"] for t, k in tenants.items() if t != "acme"}
    assert "sql" in usage["initech"] and not any("acme" in n for n in usage["initech"])


def test_names_equal_to_the_base_model_in_any_case_are_refused(pair, tenants):
    a, _ = pair
    base = a.base_model()
    acme = a.as_key(tenants["acme"])
    for api in (a, acme):
        for name in (base, base.upper(), base.lower()):
            got = api.register(name, "sql" if api is acme else "house")
            assert got.status_code == 400 and got.json()["error"]["param"] == "name", name


def test_the_admin_names_and_registers_a_tenants_adapter_as_tenant_slash_name(pair, tenants):
    a, b = pair
    got = a.register("acme/tone", "tone")
    assert got.status_code == 201, got.text
    assert (got.json()["name"], got.json()["owner"], got.json()["path"]) == (
        "acme/tone",
        "acme",
        "acme/tone",
    )
    acme = b.as_key(tenants["acme"])
    wait_until(lambda: acme.complete("tone").status_code == 200, "acme uses it", VISIBILITY_S)
    assert a.get("/v1/models/acme/tone").json()["id"] == "acme/tone"
    ghost = a.register("nobody/tone", "tone")
    assert ghost.status_code == 400 and ghost.json()["error"]["code"] == "tenant_not_found"
    assert a.delete("/v1/adapters/acme/tone").status_code == 200
    wait_until(lambda: acme.complete("tone").status_code == 404, "gone", VISIBILITY_S)
