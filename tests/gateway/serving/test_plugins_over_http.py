"""Beam search and plugin samplers reached through the API: the same tokens as offline; a
plugin that fails fails its own request alone, as a plugin_error naming the plugin."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gateway_testlib import ENGINE, sse_payloads

from loragate.engine import LLM, SamplingParams

PLUGIN = "gateway_test_plugin:RunnerUpPlugin"
EXPLODING = "gateway_test_plugin:ExplodingPlugin"


def base_model(url):
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


def complete(url, **body):
    body = {"model": base_model(url), "prompt": "The weather today", "max_tokens": 6, **body}
    got = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert got.status_code == 200, got.text
    return got.json()


def test_beam_search_matches_offline(url, offline):
    got = complete(url, use_beam_search=True, best_of=3, n=2, temperature=0)
    params = SamplingParams(use_beam_search=True, best_of=3, n=2, temperature=0, max_tokens=6)
    (ref,) = offline.generate(["The weather today"], params, use_tqdm=False)
    assert [c["text"] for c in got["choices"]] == [c.text for c in ref.outputs]
    assert [c["index"] for c in got["choices"]] == [0, 1]


def test_builtin_samplers_by_name(url):
    greedy = complete(url, temperature=0)["choices"][0]["text"]
    assert complete(url, sampler="greedy")["choices"][0]["text"] == greedy
    args = {"temperature": 1.0, "seed": 11}
    first = complete(url, sampler="random", sampler_args=args)["choices"][0]["text"]
    assert complete(url, sampler="random", sampler_args=args)["choices"][0]["text"] == first


@pytest.fixture(scope="module")
def plugin_server(start_server):
    return start_server(plugins=(PLUGIN, EXPLODING))


def test_plugin_sampler_named_in_a_request(plugin_server, tiny_dir):
    url = plugin_server.url
    got = complete(url, sampler="runner_up")["choices"][0]["text"]
    offline = LLM(str(tiny_dir), plugins=(PLUGIN,), **ENGINE)
    params = SamplingParams(sampler="runner_up", max_tokens=6)
    (ref,) = offline.generate(["The weather today"], params, use_tqdm=False)
    assert got == ref.outputs[0].text
    assert got != complete(url, temperature=0)["choices"][0]["text"]
    unknown = httpx.post(
        f"{url}/v1/completions",
        json={"model": base_model(url), "prompt": "x", "sampler": "missing_sampler"},
    )
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "sampler"


def _explode_or_greedy(url: str, kind: str) -> httpx.Response | list:
    """One request of `kind`; streams come back as their list of SSE lines."""
    model = base_model(url)
    explode = {"sampler": "explode"} if kind.startswith("explode") else {"temperature": 0}
    if kind == "explode chat stream":
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "stream": True,
            **explode,
        }
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            return list(r.iter_lines())
    if kind == "explode stream":
        body = {
            "model": model,
            "prompt": "The weather today",
            "max_tokens": 5,
            "stream": True,
            **explode,
        }
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            return list(r.iter_lines())
    if kind == "explode tgi":  # TGI names no sampler: the failing logits processor, by seed
        body = {"inputs": "The weather today", "parameters": {"max_new_tokens": 5, "seed": 666}}
        return httpx.post(f"{url}/generate", json=body, timeout=60)
    body = {"model": model, "prompt": "The weather today", "max_tokens": 6, **explode}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_a_failing_plugin_fails_its_request_alone(plugin_server, offline):
    url = plugin_server.url
    kinds = ["explode", "explode stream", "explode chat stream", "explode tgi"] + ["greedy"] * 8
    with ThreadPoolExecutor(len(kinds)) as pool:
        results = dict(enumerate(pool.map(lambda k: _explode_or_greedy(url, k), kinds)))
    named = "of plugin 'gateway_test_plugin:ExplodingPlugin' raised RuntimeError"

    failed = results[0]
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert error["type"] == "plugin_error" and error["code"] == "plugin_error"
    assert named in error["message"] and "always fails" in error["message"]
    for lines in (results[1], results[2]):
        events = sse_payloads(lines)
        assert events[-1]["error"]["type"] == "plugin_error", events
        assert named in events[-1]["error"]["message"]
        assert [line for line in lines if line.startswith("data:")][-1] == "data: [DONE]"
    tgi = results[3]
    assert tgi.status_code == 500, tgi.text
    assert "logits processor" in tgi.json()["error"] and "ExplodingPlugin" in tgi.json()["error"]

    params = SamplingParams(temperature=0, max_tokens=6)
    (ref,) = offline.generate(["The weather today"], params, use_tqdm=False)
    for i in range(4, len(kinds)):
        assert results[i].status_code == 200, results[i].text
        assert results[i].json()["choices"][0]["text"] == ref.outputs[0].text
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok", json.dumps(health)
