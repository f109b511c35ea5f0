"""Beam search and plugin samplers reached through the API: the same tokens as offline."""

from __future__ import annotations

import httpx
import pytest
from gateway_testlib import ENGINE

from loragate.engine import LLM, SamplingParams

PLUGIN = "gateway_test_plugin:RunnerUpPlugin"


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
    return start_server(plugins=(PLUGIN,))


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
