"""tool_choice "auto" as vLLM serves it (--enable-auto-tool-choice --tool-call-parser hermes
--chat-template FILE), and tool calls streamed as OpenAI streams them, through the
official openai client. The tiny model's answers are made tool calls by a guided regex."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from tools_testlib import ASK, HERMES_CALL_REGEX, HERMES_TEMPLATE, TIME, WEATHER

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def tools_url(start_server, tmp_path_factory):
    template = tmp_path_factory.mktemp("templates") / "hermes.jinja"
    template.write_text(HERMES_TEMPLATE)
    options = dict(
        chat_template=str(template), enable_auto_tool_choice=True, tool_call_parser="hermes"
    )
    return start_server(gateway=options).url


@pytest.fixture(scope="module")
def client(tools_url):
    return openai.OpenAI(base_url=f"{tools_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def base_name(client):
    (base,) = [m for m in client.models.list().data if getattr(m, "parent", None) is None]
    return base.id


def test_the_template_file_lays_out_the_tools(tools_url, base_name, client):
    def rendered(**extra) -> str:
        body = {"model": base_name, "messages": ASK, **extra}
        ids = httpx.post(f"{tools_url}/tokenize", json=body).json()["tokens"]
        return httpx.post(f"{tools_url}/detokenize", json={"tokens": ids}).json()["prompt"]

    with_tools = rendered(tools=[WEATHER])
    assert "<tools>" in with_tools and '"name": "get_weather"' in with_tools
    assert "<tools>" not in rendered()
    # An earlier call and its answer go back through the template too.
    turn = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    history = rendered(messages=turn, tools=[WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in history
    assert "<tool_response>\nsunny, 21 C" in history
    answer = client.chat.completions.create(
        model=base_name, messages=turn, tools=[WEATHER], max_tokens=3, temperature=0
    )
    assert answer.choices[0].message.content is not None


def test_auto_reads_the_models_hermes_call_as_tool_calls(client, base_name):
    choice = client.chat.completions.create(
        model="alpha",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="auto",
        max_tokens=96,
        temperature=0,
        extra_body={"guided_regex": HERMES_CALL_REGEX},
    ).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure. "  # the text before the call, as vLLM's
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    words = client.chat.completions.create(
        model=base_name, messages=ASK, tools=[WEATHER], max_tokens=6, temperature=0
    ).choices[0]
    assert words.message.tool_calls is None and words.message.content
    assert words.finish_reason == "length"


def test_a_call_cut_by_max_tokens_is_content_not_an_error(client):
    choice = client.chat.completions.create(
        model="beta",
        messages=ASK,
        tools=[WEATHER],
        max_tokens=12,
        temperature=0,
        extra_body={"guided_regex": HERMES_CALL_REGEX},
    ).choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content.startswith("Sure. <tool_call>")


@pytest.mark.parametrize(
    ("choice", "extra", "finish"),
    [
        ("auto", {"guided_regex": HERMES_CALL_REGEX}, "tool_calls"),
        (NAMED, {}, "stop"),
        ("required", {}, "tool_calls"),
    ],
    ids=["auto", "named", "required"],
)
def test_streamed_tool_calls_add_up_to_the_whole_answer(client, choice, extra, finish):
    kwargs = dict(
        model="gamma",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice=choice,
        max_tokens=96,
        temperature=0,
        extra_body=extra,
    )
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == finish and whole.message.tool_calls
    with client.chat.completions.stream(**kwargs) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion().choices[0]
    deltas = [d for c in chunks for choice_ in c.choices for d in choice_.delta.tool_calls or []]
    assert all(len(c.choices) <= 1 for c in chunks)
    firsts = [d for d in deltas if d.id is not None]
    assert len(firsts) == len(whole.message.tool_calls)
    for d in firsts:  # each call opens with its id, type and name, arguments to come
        assert d.type == "function" and d.function.name and d.function.arguments == ""
    assert len(deltas) > 2 * len(firsts)  # the arguments come in fragments
    assert final.finish_reason == finish
    got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
    assert got == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    for name, arguments in got:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    assert (final.message.content or None) == whole.message.content


def test_a_bad_earlier_call_is_a_400_naming_it(client, base_name):
    turn = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{not json"},
                }
            ],
        },
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=base_name, messages=turn, tools=[WEATHER])
    assert err.value.body["param"] == "messages[1].tool_calls[0].function.arguments"
