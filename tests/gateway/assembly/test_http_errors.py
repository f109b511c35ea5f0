"""Error shapes and status codes: 400 naming the field, 404, 413, 503, and never a 500
for anything a client sends. Plus /health, /metrics and the OpenAPI schema."""

from __future__ import annotations

import httpx
import pytest
from gateway_testlib import kv_idle, metrics, wait_until


def base_model(url):
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


def post(url, path, body=None, content=None, headers=None):
    return httpx.post(f"{url}{path}", json=body, content=content, headers=headers, timeout=60)


def assert_openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("top_p", 5, "top_p"),
        ("temperature", -1, "temperature"),
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", "many", "max_tokens"),
        ("n", 0, "n"),
        ("presence_penalty", 9, "presence_penalty"),
        ("stop", 3, "stop"),
        ("logprobs", 99, "logprobs"),
        ("top_k", -5, "top_k"),
        ("min_tokens", -1, "min_tokens"),
        ("repetition_penalty", 0, "repetition_penalty"),
        ("use_beam_search", True, "best_of"),
        ("sampler", "no-such-sampler", "sampler"),
        ("logit_bias", {"1": 200.0}, "logit_bias"),
        ("logit_bias", {"one": 2.0}, "logit_bias"),
        ("logit_bias", {"99999999": 2.0}, "logit_bias"),
        ("echo", "yes", "echo"),
        ("suffix", "tail", "suffix"),
        ("prompt", [], "prompt"),
        ("prompt", [1, "a"], "prompt"),
        ("prompt", [10**9], "prompt"),
        ("prompt", "", "prompt"),
        ("seed", 10**30, "seed"),
        ("stop", [1], "stop[0]"),
    ],
)
def test_completion_field_errors_are_400_naming_the_field(url, field, value, param):
    body = {"model": base_model(url), "prompt": "hi", "max_tokens": 2, field: value}
    assert_openai_error(post(url, "/v1/completions", body), 400, param)


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, None),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"max_completion_tokens": -2}, "max_completion_tokens"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": "hello"}, "messages"),
    ],
)
def test_chat_field_errors_are_400(url, patch, param):
    body = {"model": base_model(url), "messages": [{"role": "user", "content": "hi"}], **patch}
    assert_openai_error(post(url, "/v1/chat/completions", body), 400, param)


def test_prompt_longer_than_max_model_len_is_400(url):
    body = {"model": base_model(url), "prompt": "word " * 600, "max_tokens": 2}
    error = assert_openai_error(post(url, "/v1/completions", body), 400, "prompt")
    assert "max_model_len" in error["message"]


def test_unknown_model_is_404_everywhere(url):
    error = assert_openai_error(
        post(url, "/v1/completions", {"model": "nope", "prompt": "x"}), 404, "model"
    )
    assert error["code"] == "model_not_found"
    chat = {"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    assert_openai_error(post(url, "/v1/chat/completions", chat), 404, "model")
    tgi = post(url, "/generate", {"inputs": "x", "parameters": {"adapter_id": "nope"}})
    assert tgi.status_code == 404 and tgi.json()["error_type"] == "not_found"
    assert_openai_error(httpx.get(f"{url}/v1/adapters/nope"), 404)
    assert_openai_error(httpx.get(f"{url}/no/such/route"), 404)


def test_oversized_body_is_413(url):
    body = {"model": base_model(url), "prompt": "x" * (3 * 1024 * 1024)}
    assert_openai_error(post(url, "/v1/completions", body), 413)


def test_tgi_validation_errors_use_tgi_shape(url):
    got = post(url, "/generate", {"inputs": "x", "parameters": {"max_new_tokens": "lots"}})
    assert got.status_code == 400
    assert got.json()["error_type"] == "validation" and "max_new_tokens" in got.json()["error"]
    got = post(url, "/", {"inputs": "x", "parameters": {"top_p": 2.0}})
    assert got.status_code == 400 and "top_p" in got.json()["error"]


MALFORMED = [
    ("/v1/completions", b"not json"),
    ("/v1/completions", b""),
    ("/v1/completions", b"[]"),
    ("/v1/completions", b"null"),
    ("/v1/completions", b'{"model": 1, "prompt": "x"}'),
    ("/v1/completions", b'{"model": "m", "prompt": {"a": 1}}'),
    ("/v1/completions", b'{"model": "m", "prompt": [[1, 2], "x"]}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "stream_options": 3}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "n": 1e400}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "temperature": NaN}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "seed": 99999999999999999999999}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "sampler_args": [1]}'),
    ("/v1/completions", b"\xff\xfe\x00garbage"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [null]}'),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": 1, "content": "x"}]}'),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": [1]}]}'),
    ("/v1/adapters", b'{"name": ["x"], "path": "alpha"}'),
    ("/v1/adapters", b'{"name": "x"}'),
    ("/v1/adapters", b'{"name": "x", "path": "\\u0000"}'),
    ("/v1/load_lora_adapter", b"{}"),
    ("/generate", b'{"inputs": 5}'),
    ("/generate", b'{"inputs": "x", "parameters": []}'),
    ("/", b'{"inputs": "x", "stream": "yes"}'),
    ("/generate_stream", b'{"parameters": {}}'),
]


@pytest.mark.parametrize(("path", "content"), MALFORMED)
def test_malformed_bodies_are_client_errors_never_500(url, path, content):
    got = post(url, path, content=content, headers={"content-type": "application/json"})
    assert 400 <= got.status_code < 500, (got.status_code, got.text)
    assert "error" in got.json()


# Values in the sweep below that are right for their field: these must succeed.
RIGHT_TYPES = {("stop", "'str'"), ("ignore_eos", "True"), ("stream", "True")}


def test_model_field_with_real_model_but_wrong_types_everywhere(url):
    """A broad sweep: every field of a completion set to each wrong type is a 4xx."""
    base = base_model(url)
    fields = [
        "n",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "max_tokens",
        "logprobs",
        "top_k",
        "min_p",
        "ignore_eos",
        "best_of",
        "stop_token_ids",
        "sampler",
        "stream",
    ]
    wrong = []
    for field in fields:
        for bad in ("str", -3.5, {"a": 1}, [None], True):
            body = {"model": base, "prompt": "x", "max_tokens": 1, field: bad}
            got = post(url, "/v1/completions", body)
            ok = (
                got.status_code == 200
                if (field, repr(bad)) in RIGHT_TYPES
                else 400 <= got.status_code < 500
            )
            if not ok:
                wrong.append((field, bad, got.status_code, got.text[:200]))
    assert not wrong


def test_health_metrics_and_openapi(url):
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    post(url, "/v1/completions", {"model": base_model(url), "prompt": "x", "max_tokens": 2})
    wait_until(lambda: kv_idle(url), "idle")
    m = metrics(url)
    for name in (
        "loragate_num_requests_running",
        "loragate_num_requests_waiting",
        "loragate_kv_cache_usage_perc",
        "loragate_prompt_tokens_total",
        "loragate_generation_tokens_total",
        "loragate_time_to_first_token_seconds_count",
        "loragate_time_per_output_token_seconds_count",
        "loragate_e2e_request_latency_seconds_count",
        "loragate_num_preemptions_total",
        'loragate_adapter_loads_total{tier="cpu"}',
        'loragate_adapter_evictions_total{tier="device"}',
        'loragate_adapters_resident{tier="device"}',
        "loragate_adapters_registered",
    ):
        assert name in m, name
    assert m["loragate_generation_tokens_total"] >= 2
    assert m["loragate_e2e_request_latency_seconds_count"] >= 1
    schema = httpx.get(f"{url}/schema/openapi.json").json()
    for path in (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/adapters",
        "/generate",
        "/generate_stream",
        "/health",
        "/metrics",
    ):
        assert path in schema["paths"], path
    assert "CompletionRequest" in schema["components"]["schemas"]


def test_dead_engine_answers_503(start_server):
    doomed = start_server()
    engine = doomed.app.state.services.engine

    def fail():
        raise RuntimeError("simulated device failure")

    engine.engine.step_tokens = fail  # the engine thread, idle, calls it on the next request
    body = {"model": base_model(doomed.url), "prompt": "x", "max_tokens": 2}
    first = post(doomed.url, "/v1/completions", body)
    assert first.status_code == 503 and first.json()["error"]["type"] == "server_error"
    health = httpx.get(f"{doomed.url}/health")
    assert health.status_code == 503 and "simulated device failure" in health.json()["detail"]
    assert post(doomed.url, "/v1/completions", body).status_code == 503
    assert httpx.get(f"{doomed.url}/metrics").status_code == 200
