"""Many concurrent streams, disconnects, and the bounded queue: every KV block comes back."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlparse

import httpx
import pytest
from gateway_testlib import ADAPTER_NAMES, kv_idle, metrics, sse_payloads, wait_until

from loragate.engine import SamplingParams

LONG = dict(max_model_len=2048, max_num_seqs=2, num_kv_blocks=512)


@pytest.fixture(scope="module")
def long_server(start_server):
    """Room for requests that run for thousands of steps, two at a time, one more queued."""
    return start_server(gateway={"max_queue": 1}, **LONG)


def long_body(model, max_tokens=2000, stream=True):
    return {
        "model": model,
        "prompt": "Keep going",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }


def base_model(url):
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


async def _one_stream(client, url, model, prompt, max_tokens):
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        lines = [line async for line in response.aiter_lines()]
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    payloads = sse_payloads(lines)
    text = "".join(p["choices"][0]["text"] for p in payloads if p["choices"])
    finish = [p["choices"][0]["finish_reason"] for p in payloads if p["choices"]][-1]
    return text, finish, payloads[-1]["usage"]


def test_200_concurrent_streams_across_4_adapters_then_all_blocks_free(server, offline, lora_of):
    url = server.url
    base = base_model(url)
    models = [ADAPTER_NAMES[i % 4] if i % 5 else base for i in range(200)]
    prompts = [f"Request number {i} says" for i in range(200)]

    async def run():
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            streams = [
                _one_stream(client, url, m, p, 8 + i % 5)
                for i, (m, p) in enumerate(zip(models, prompts, strict=True))
            ]
            health = client.get(f"{url}/health")
            results = await asyncio.gather(*streams, health)
        return results[:-1], results[-1]

    results, health = asyncio.run(run())
    assert health.status_code == 200  # the HTTP side answers while the engine is busy
    loras = [None if m == base else lora_of(m) for m in models]
    params = [
        SamplingParams(temperature=0, max_tokens=8 + i % 5, ignore_eos=True) for i in range(200)
    ]
    refs = offline.generate(prompts, params, lora_request=loras, use_tqdm=False)
    for i, ((text, finish, usage), ref) in enumerate(zip(results, refs, strict=True)):
        assert finish == "length"
        assert usage["completion_tokens"] == 8 + i % 5
        assert usage["prompt_tokens"] == len(ref.prompt_token_ids)
        assert text == ref.outputs[0].text, f"request {i} ({models[i]})"
    wait_until(lambda: kv_idle(url), "every request to finish")
    assert metrics(url)["loragate_kv_cache_allocated_blocks"] == 0
    engine = server.app.state.services.engine
    asyncio.run(_check_integrity(engine))


async def _check_integrity(engine):
    await engine.check_integrity()


def test_disconnect_mid_stream_frees_blocks(long_server):
    url = long_server.url
    before = metrics(url)
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{url}/v1/completions", json=long_body(base_model(url))) as response,
    ):
        lines = response.iter_lines()
        got = []
        for line in lines:
            if line.startswith("data:"):
                got.append(line)
            if len(got) == 3:
                break
        assert metrics(url)["loragate_kv_cache_allocated_blocks"] > 0
    # leaving the block closed the connection mid-stream
    wait_until(lambda: kv_idle(url), "the aborted request to free its blocks")
    after = metrics(url)
    assert after["loragate_request_aborted_total"] == before["loragate_request_aborted_total"] + 1
    assert (
        after["loragate_generation_tokens_total"] - before["loragate_generation_tokens_total"]
        < 2000
    )


def send_raw(url: str, path: str, body: dict) -> socket.socket:
    """Send a POST and leave the connection open without reading: the request stays in flight
    until the socket is closed (a plain request answers only when it is done)."""
    data = json.dumps(body).encode()
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def in_flight(url: str) -> float:
    return metrics(url)["loragate_gateway_requests_in_flight"]


def test_disconnect_during_plain_request_frees_blocks(long_server):
    url = long_server.url
    before = metrics(url)
    with send_raw(url, "/v1/completions", long_body(base_model(url), stream=False)):
        wait_until(lambda: in_flight(url) == 1, "request admitted")
        wait_until(lambda: metrics(url)["loragate_kv_cache_allocated_blocks"] > 0, "prefill")
    wait_until(lambda: kv_idle(url), "the abandoned request to free its blocks")
    after = metrics(url)
    assert after["loragate_request_aborted_total"] == before["loragate_request_aborted_total"] + 1
    assert (
        after["loragate_generation_tokens_total"] - before["loragate_generation_tokens_total"]
        < 2000
    )


def test_full_queue_gives_429_with_retry_after(long_server):
    url = long_server.url
    base = base_model(url)
    # 2 running + 1 queued = max_num_seqs + max_queue
    holders = [send_raw(url, "/v1/completions", long_body(base, stream=False)) for _ in range(3)]
    try:
        wait_until(lambda: in_flight(url) == 3, "three requests admitted")
        with httpx.Client(timeout=60) as client:
            refused = client.post(f"{url}/v1/completions", json=long_body(base))
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "queue_full"
            tgi = client.post(f"{url}/generate", json={"inputs": "x"})
            assert tgi.status_code == 429 and tgi.json()["error_type"] == "overloaded"
            assert client.get(f"{url}/health").status_code == 200  # nothing else degrades
            assert client.get(f"{url}/v1/models").status_code == 200
        assert metrics(url)['loragate_request_rejected_total{reason="queue_full"}'] >= 2
    finally:
        for sock in holders:
            sock.close()
    wait_until(lambda: kv_idle(url), "the queue to drain")
    again = httpx.post(f"{url}/v1/completions", json=long_body(base, 4, stream=False), timeout=60)
    assert again.status_code == 200
