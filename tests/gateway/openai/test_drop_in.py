"""What a vLLM or LoRAX user relies on, through the official clients: structured output
per request in one batch, logit_bias, echo, top_n_tokens and decoder_input_details, the
context check on max_tokens, and the tokenize / detokenize / version routes."""

from __future__ import annotations

import json
import threading

import httpx
import jsonschema
import openai
import pytest
from lorax import Client as LoraxClient
from structured_testlib import COLOR, POINT
from text_generation import Client as TGIClient
from tools_testlib import ASK, TIME, WEATHER

from loragate.engine import SamplingParams


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def base_name(client):
    (base,) = [m for m in client.models.list().data if getattr(m, "parent", None) is None]
    return base.id


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


def test_two_schemas_and_a_free_request_at_once(client, base_name, offline):
    """A json_schema answer on the base model and one on an adapter, sent concurrently with
    an unconstrained request: each parses and validates; the free one is as offline."""
    results: dict[str, object] = {}

    def ask(key, model, **kwargs):
        results[key] = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Describe the sky as JSON."}],
            max_tokens=48,
            temperature=0,
            **kwargs,
        )

    jobs = [
        ("base", base_name, {"response_format": schema_format(COLOR)}),
        ("beta", "beta", {"response_format": schema_format(POINT)}),
        ("free", "alpha", {}),
    ]
    threads = [threading.Thread(target=ask, args=(k, m), kwargs=kw) for k, m, kw in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, schema in (("base", COLOR), ("beta", POINT)):
        choice = results[key].choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)
    free = results["free"].choices[0].message.content
    alone = client.chat.completions.create(
        model="alpha",
        messages=[{"role": "user", "content": "Describe the sky as JSON."}],
        max_tokens=48,
        temperature=0,
    )
    assert free == alone.choices[0].message.content


def test_vllm_guided_fields_and_json_object(client, base_name):
    choice = client.completions.create(
        model=base_name,
        prompt="Pick one:",
        max_tokens=12,
        temperature=0,
        extra_body={"guided_choice": ["left", "right"]},
    ).choices[0]
    assert choice.text in ("left", "right")
    regex = client.completions.create(
        model="gamma",
        prompt="Code:",
        max_tokens=16,
        temperature=0,
        extra_body={"guided_regex": "[A-Z]{3}-[0-9]{2}"},
    ).choices[0]
    assert len(regex.text) == 6 and regex.text[3] == "-" and regex.text[:3].isupper()
    obj = client.completions.create(
        model=base_name,
        prompt="{",
        max_tokens=64,
        temperature=0,
        extra_body={"guided_json": json.dumps(POINT)},
    ).choices[0]
    jsonschema.validate(json.loads(obj.text), POINT)


def test_bad_structured_output_is_a_400_naming_the_field(client, base_name):
    cases = [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_grammar": "start: ("}, "guided_grammar"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ]
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=base_name, prompt="x", max_tokens=4, extra_body=body)
        assert err.value.body["param"] == param, body


def test_logit_bias_and_echo(client, base_name, offline):
    prompt = "The capital of France is"
    plain = client.completions.create(model=base_name, prompt=prompt, max_tokens=4, temperature=0)
    (ref,) = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    first = ref.outputs[0].token_ids[0]
    biased = client.completions.create(
        model=base_name,
        prompt=prompt,
        max_tokens=4,
        temperature=0,
        logit_bias={str(first): -100},
    )
    assert biased.choices[0].text != plain.choices[0].text
    echoed = client.completions.create(
        model=base_name, prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    choice = echoed.choices[0]
    assert choice.text == prompt + plain.choices[0].text
    logprobs = choice.logprobs
    n_prompt = len(ref.prompt_token_ids)
    assert len(logprobs.tokens) == n_prompt + 4
    assert logprobs.token_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in logprobs.token_logprobs[1:])


def test_max_tokens_past_the_context_is_vllms_400(client, base_name):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=base_name, prompt="hello", max_tokens=100_000)
    body = err.value.body
    assert "maximum context length is 512 tokens" in body["message"]
    assert body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=base_name,
            messages=[{"role": "user", "content": "hi"}],
            max_completion_tokens=600,
        )
    assert err.value.body["param"] == "max_completion_tokens"


def test_lorax_response_format_and_tgi_top_n_tokens_and_prefill(url):
    lorax = LoraxClient(url)
    got = lorax.generate(
        "Describe a point:",
        adapter_id="beta",
        max_new_tokens=48,
        response_format={"type": "json_object", "schema": POINT},
    )
    jsonschema.validate(json.loads(got.generated_text), POINT)
    detailed = TGIClient(url).generate(
        "one two three", max_new_tokens=3, decoder_input_details=True, top_n_tokens=3
    )
    prefill = detailed.details.prefill
    assert prefill[0].logprob is None and all(t.logprob <= 0 for t in prefill[1:])
    assert len(detailed.details.top_tokens) == 3
    for step, token in zip(detailed.details.top_tokens, detailed.details.tokens, strict=True):
        assert len(step) == 3 and step[0].logprob >= token.logprob


def test_tokenize_detokenize_and_version(url, base_name, offline):
    text = "The capital of France is"
    got = httpx.post(f"{url}/tokenize", json={"model": base_name, "prompt": text}).json()
    (ref,) = offline.generate([text], SamplingParams(max_tokens=1), use_tqdm=False)
    assert got["tokens"] == ref.prompt_token_ids and got["count"] == len(ref.prompt_token_ids)
    assert got["max_model_len"] == 512
    back = httpx.post(f"{url}/detokenize", json={"model": base_name, "tokens": got["tokens"]})
    assert back.json()["prompt"] == text
    chat = httpx.post(
        f"{url}/tokenize",
        json={"model": base_name, "messages": [{"role": "user", "content": "hi"}]},
    ).json()
    assert chat["count"] > 3
    bad = httpx.post(f"{url}/detokenize", json={"model": base_name, "tokens": [10**7]})
    assert bad.status_code == 400
    unknown = httpx.post(f"{url}/tokenize", json={"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404
    assert httpx.get(f"{url}/version").json()["version"]


def test_named_and_required_tool_choice_return_valid_tool_calls(client, base_name):
    named = client.chat.completions.create(
        model="beta",
        messages=ASK,
        max_tokens=64,
        temperature=0,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ).choices[0]
    assert named.message.content is None and named.finish_reason == "stop"
    (call,) = named.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    required = client.chat.completions.create(
        model=base_name,
        messages=ASK,
        max_tokens=96,
        temperature=0,
        tools=[WEATHER, TIME],
        tool_choice="required",
    ).choices[0]
    assert required.finish_reason == "tool_calls" and required.message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in required.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_tool_choice_auto_and_unknown_names_are_400s_that_say_why(client, base_name):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=base_name, messages=ASK, tools=[WEATHER])
    assert err.value.body["param"] == "tool_choice"
    assert "chat template does not lay out tools" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=base_name,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    assert "not among the tools" in err.value.body["message"]
    plain = client.chat.completions.create(
        model=base_name,
        messages=ASK,
        max_tokens=4,
        temperature=0,
        tools=[WEATHER],
        tool_choice="none",
    ).choices[0]
    assert plain.message.content and not plain.message.tool_calls


def test_n_greater_than_one_streams_one_choice_per_chunk(client, base_name):
    kwargs = dict(model=base_name, prompt="Once upon a time", max_tokens=8, n=3, seed=5)
    whole = client.completions.create(**kwargs, temperature=1.0)
    texts = {0: "", 1: "", 2: ""}
    for chunk in client.completions.create(**kwargs, temperature=1.0, stream=True):
        assert len(chunk.choices) == 1
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert [texts[i] for i in range(3)] == [c.text for c in whole.choices]
    chat_texts = {0: "", 1: ""}
    stream = client.chat.completions.create(
        model=base_name, messages=ASK, max_tokens=6, n=2, temperature=0, stream=True
    )
    for chunk in stream:
        assert len(chunk.choices) == 1
        chat_texts[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert chat_texts[0] == chat_texts[1] != ""
