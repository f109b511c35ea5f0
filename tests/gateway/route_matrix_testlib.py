"""The route matrix: every kind of generation request the gateway serves, each reduced to
what must not depend on where it ran (ids and timestamps dropped), so that one process and
N replicas can be compared answer for answer."""

from __future__ import annotations

import json

import httpx
from gateway_testlib import sse_payloads
from tenancy_testlib import Api

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
VOLATILE = {"id", "created", "system_fingerprint"}


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _tool_call_ids_dropped(value):
    """Tool call ids are random per call (OpenAI's `call_...`); their shape is checked."""
    choices = value.get("choices", []) if isinstance(value, dict) else []
    for choice in choices:
        for call in (choice.get("message") or {}).get("tool_calls") or []:
            assert call.pop("id", "").startswith("call"), call
    return value


def _json(got: httpx.Response):
    assert got.status_code == 200, got.text
    return _stable(_tool_call_ids_dropped(got.json()))


def _events(api: Api, path: str, body: dict) -> list:
    with httpx.stream(
        "POST", f"{api.url}{path}", json=body, headers=api.headers, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        lines = list(response.iter_lines())
    if path.startswith("/v1/"):
        return [_stable(event) for event in sse_payloads(lines)]
    # TGI's stream: `data:` lines with no [DONE]
    return [_stable(json.loads(line[len("data:") :])) for line in lines if line.startswith("data:")]


def merged_stream(events: list) -> dict:
    """An OpenAI stream as one object: each choice's deltas joined (strings concatenated,
    lists extended, the last of any other value), the last usage. What a stream says, apart
    from where its chunks break: a speculating engine sends the tokens a step verified in one
    chunk, so its chunks differ from one that is not while the stream says the same."""
    merged: dict = {"choices": {}}
    for event in events:
        for key, value in event.items():
            if key != "choices" and value is not None:
                merged[key] = value
        for choice in event.get("choices", []):
            into = merged["choices"].setdefault(choice["index"], {})
            _join(into, choice)
    return merged


def _join(into: dict, part: dict) -> None:
    for key, value in part.items():
        if value is None:
            continue
        have = into.get(key)
        if isinstance(value, dict):
            _join(into.setdefault(key, {}), value)
        elif isinstance(value, list) and isinstance(have, list):
            have.extend(value)
        elif isinstance(value, str) and isinstance(have, str) and key != "finish_reason":
            into[key] = have + value
        else:
            into[key] = list(value) if isinstance(value, list) else value


def route_matrix(api: Api, base: str, adapter: str) -> dict[str, object]:
    """Each route's answer through `api`, on the base model and on `adapter`."""
    answers: dict[str, object] = {}
    greedy = {"temperature": 0, "max_tokens": 12}
    for model in (base, adapter):
        chat = {"model": model, "messages": CHAT, **greedy}
        completion = {"model": model, "prompt": "The quick brown fox", **greedy}
        answers[f"chat {model}"] = _json(api.post("/v1/chat/completions", chat))
        answers[f"chat stream {model}"] = _events(
            api, "/v1/chat/completions", {**chat, "stream": True}
        )
        answers[f"completion {model}"] = _json(api.post("/v1/completions", completion))
        answers[f"completion stream {model}"] = _events(
            api, "/v1/completions", {**completion, "stream": True, "logprobs": 1}
        )
        answers[f"n=3 seeded {model}"] = _json(
            api.post(
                "/v1/completions",
                {**completion, "n": 3, "temperature": 1.0, "seed": 7, "max_tokens": 8},
            )
        )
        answers[f"chat tool named {model}"] = _json(
            api.post(
                "/v1/chat/completions",
                {
                    **chat,
                    "max_tokens": 40,
                    "tools": [WEATHER_TOOL],
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                },
            )
        )
        answers[f"chat tool required {model}"] = _json(
            api.post(
                "/v1/chat/completions",
                {**chat, "max_tokens": 40, "tools": [WEATHER_TOOL], "tool_choice": "required"},
            )
        )
        answers[f"json schema {model}"] = _json(
            api.post(
                "/v1/chat/completions",
                {
                    **chat,
                    "max_tokens": 40,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "person", "schema": PERSON},
                    },
                },
            )
        )
        tgi = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 8}}
        if model != base:
            tgi["parameters"]["adapter_id"] = model
        answers[f"tgi generate {model}"] = _json(
            api.post("/generate", {**tgi, "parameters": {**tgi["parameters"], "details": True}})
        )
        answers[f"tgi stream {model}"] = _events(api, "/generate_stream", tgi)
        answers[f"tgi root {model}"] = _json(api.post("/", tgi))
    answers["tokenize messages"] = _json(
        api.post("/tokenize", {"model": base, "messages": CHAT, "add_generation_prompt": True})
    )
    answers["tokenize messages with tools"] = _json(
        api.post("/tokenize", {"model": base, "messages": CHAT, "tools": [WEATHER_TOOL]})
    )
    answers["tokenize prompt"] = _json(api.post("/tokenize", {"model": base, "prompt": "hi"}))
    return answers
