"""What strict clients and load generators check before they read an answer: a stream is
sent as `text/event-stream` on every streamed route (aiperf refused the JSON type and failed
every request), HEAD answers wherever GET does, vLLM's `continuous_usage_stats` puts the
usage so far on every chunk, and the model folder declares a tokenizer that any
transformers reads as the server does."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoTokenizer

CHAT = {"messages": [{"role": "user", "content": "Say something."}]}


@pytest.fixture(scope="module")
def base(url):
    (model,) = [
        m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"] if m.get("parent") is None
    ]
    return model


def _streamed(url: str, path: str, body: dict) -> tuple[httpx.Headers, list[dict]]:
    """The response's headers and every `data:` event of a streamed request but [DONE]."""
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
        headers = response.headers
    return headers, [json.loads(line[5:]) for line in lines if line != "data: [DONE]"]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/completions", {"prompt": "Once upon a time", "stream": True}),
        ("/generate_stream", {"inputs": "Once upon a time", "parameters": {}}),
        ("/", {"inputs": "Once upon a time", "parameters": {}, "stream": True}),
    ],
)
def test_every_streamed_route_is_an_event_stream(url, base, path, body):
    body = {"model": base, "max_tokens": 4, **body}
    if "inputs" in body:
        body.pop("max_tokens")
        body["parameters"] = {"max_new_tokens": 4}
    headers, events = _streamed(url, path, body)
    assert headers["content-type"].split(";")[0] == "text/event-stream"
    assert headers["cache-control"] == "no-cache"
    assert events, "the stream sent no event"


def test_a_whole_answer_stays_json(url, base):
    response = httpx.post(
        f"{url}/v1/completions", json={"model": base, "prompt": "Hi", "max_tokens": 2}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].split(";")[0] == "application/json"


@pytest.mark.parametrize("path", ["/metrics", "/v1/models", "/health", "/version", "/info"])
def test_head_answers_wherever_get_does(url, path):
    got = httpx.get(f"{url}{path}")
    head = httpx.head(f"{url}{path}")
    assert got.status_code == 200, got.text
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]


def test_head_on_a_post_only_route_is_still_405(url):
    assert httpx.head(f"{url}/v1/completions").status_code == 405


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(url, base, route):
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": base, "max_tokens": 6, "ignore_eos": True, "temperature": 0, "stream": True}
    body["stream_options"] = options
    if route == "chat":
        _, events = _streamed(url, "/v1/chat/completions", {**body, **CHAT})
    else:
        _, events = _streamed(url, "/v1/completions", {**body, "prompt": "Once upon a time"})
    usages = [event["usage"] for event in events]
    assert all(usage is not None for usage in usages), usages
    prompt = {usage["prompt_tokens"] for usage in usages}
    assert len(prompt) == 1 and prompt.pop() > 0
    done = [usage["completion_tokens"] for usage in usages]
    assert done == sorted(done), "the usage so far went backwards"
    assert done[-1] == 6 and done[0] < 6
    for usage in usages:
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_without_continuous_usage_only_the_last_chunk_carries_usage(url, base):
    body = {"model": base, "max_tokens": 6, "ignore_eos": True, "stream": True, **CHAT}
    _, events = _streamed(
        url, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
    )
    assert [event.get("usage") is not None for event in events] == [False] * (len(events) - 1) + [
        True
    ]
    assert events[-1]["usage"]["completion_tokens"] == 6


def test_the_model_folder_tokenizes_as_the_server_does(url, base, tiny_dir):
    """The folder's tokenizer is declared as the generic fast tokenizer (transformers 5.x
    reads `LlamaTokenizer` as another tokenizer) and gives the ids /tokenize gives."""
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    text = "Hello world, how are you? Ünïcödé  spaces\tand tabs."
    served = httpx.post(f"{url}/tokenize", json={"model": base, "prompt": text}).json()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert tokenizer.encode(text, add_special_tokens=False) == served["tokens"]
    assert tokenizer.decode(served["tokens"]) == text
