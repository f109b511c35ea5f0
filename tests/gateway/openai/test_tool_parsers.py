"""Each tool-call format, on whole answers and on answers fed a character at a time: the
streamed content and argument fragments add up to what the whole answer gives, and
malformed output is content, never an error."""

from __future__ import annotations

import json

import pytest

from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.openai.tool_parsers import (
    CallArray,
    HermesParser,
    Llama3JsonParser,
    NamedCall,
)
from loragate.gateway.openai.tool_stream import ToolCallStreamer
from loragate.gateway.openai.tools import tool_plan

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def whole(fmt, text):
    parsed = fmt.parse(text, final=True)
    if parsed is None:
        return None
    return parsed.content.strip(), [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def streamed(fmt, text):
    """(content, [(name, arguments)], ids) as a stream of one character per step sends."""
    streamer = ToolCallStreamer(fmt)
    content, calls, ids = "", {}, []
    for end in range(1, len(text) + 1):
        got = streamer.step(text[:end], final=end == len(text))
        content += got.content
        for d in got.tool_calls:
            if d.id is not None:
                assert d.index == len(calls) and d.type == "function" and d.function.name
                calls[d.index] = [d.function.name, d.function.arguments]
                ids.append(d.id)
            else:
                assert d.function.name is None
                calls[d.index][1] += d.function.arguments
    return content, [(n, a) for n, a in calls.values()], ids


HERMES = (
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": [1, 2]}}\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": '
    '{"zone": "CET"}}</tool_call>'
)


def test_hermes_reads_every_call_and_the_text_around_them():
    content, calls = whole(HermesParser(), HERMES)
    assert content == "Let me check."
    assert calls == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}),
        ("get_time", {"zone": "CET"}),
    ]
    s_content, s_calls, ids = streamed(HermesParser(), HERMES)
    assert s_content.strip() == content and len(set(ids)) == 2
    assert s_content == HermesParser().parse(HERMES, final=True).content
    assert [(n, json.loads(a)) for n, a in s_calls] == calls
    # The streamed arguments are exactly the whole answer's, character for character.
    parsed = HermesParser().parse(HERMES, final=True)
    assert [a for _, a in s_calls] == [c.arguments for c in parsed.calls]


def test_hermes_without_a_closing_tag_and_with_the_name_last():
    _, calls = whole(HermesParser(), '<tool_call>{"name": "f", "arguments": {"a": 1}}')
    assert calls == [("f", {"a": 1})]
    late = '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>'
    assert whole(HermesParser(), late)[1] == [("f", {"a": 1})]
    assert [(n, json.loads(a)) for n, a in streamed(HermesParser(), late)[1]] == [("f", {"a": 1})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call>',  # cut JSON
        '<tool_call>{"name": "f", "arguments": {"a": 1',  # cut by max_tokens
        "<tool_call>not json at all</tool_call>",
        '<tool_call>{"nom": "f"}</tool_call>',  # JSON, but no call
        '<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>',
    ],
)
def test_hermes_malformed_output_is_all_content(text):
    assert HermesParser().parse(text, final=True) is None
    content, calls, _ = streamed(HermesParser(), text)
    # A stream sends what it can; what no call began is content.
    if not calls:
        assert content == text


def test_hermes_plain_answer_and_a_tag_prefix_held_back():
    assert whole(HermesParser(), "Just words.") == ("Just words.", [])
    partial = HermesParser().parse("Hello <tool_", final=False)
    assert partial.content == "Hello " and partial.calls == []
    assert HermesParser().parse("Hello <tool_", final=True).content == "Hello <tool_"


LLAMA = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}; '
    '{"name": "get_time", "parameters": {"zone": "UTC"}}'
)


def test_llama3_json_reads_calls_separated_by_semicolons():
    content, calls = whole(Llama3JsonParser(), LLAMA)
    assert content == ""
    assert calls == [("get_weather", {"city": "Rome"}), ("get_time", {"zone": "UTC"})]
    s_content, s_calls, _ = streamed(Llama3JsonParser(), LLAMA)
    assert s_content == "" and [(n, json.loads(a)) for n, a in s_calls] == calls
    bare = '{"name": "f", "parameters": {}}'
    assert whole(Llama3JsonParser(), bare)[1] == [("f", {})]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "f", "parameters": {"a": ',  # cut
        '{"name": "f", "parameters": {}} and then words',
        '{"not": "a call"}',
    ],
)
def test_llama3_json_malformed_output_is_content(text):
    assert Llama3JsonParser().parse(text, final=True) is None


def test_llama3_json_words_are_content_whole_and_streamed():
    assert whole(Llama3JsonParser(), "The weather is fine.") == ("The weather is fine.", [])
    content, calls, _ = streamed(Llama3JsonParser(), "The weather is fine.")
    assert content == "The weather is fine." and calls == []


def test_forced_formats_stream_what_the_whole_answer_gives():
    named = '{"city": "Oslo", "unit": "C"}'
    assert whole(NamedCall("get_weather"), named)[1] == [("get_weather", json.loads(named))]
    content, calls, _ = streamed(NamedCall("get_weather"), named)
    assert content == "" and calls == [("get_weather", named)]
    array = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    assert whole(CallArray(), array)[1] == [("a", {"x": 1}), ("b", {})]
    assert streamed(CallArray(), array)[1] == [("a", '{"x": 1}'), ("b", "{}")]
    assert NamedCall("f").parse('{"city": "Os', final=True) is None
    assert CallArray().parse('[{"name": "a", "parameters": {', final=True) is None


def test_auto_tool_choice_needs_a_tools_template_and_a_parser():
    with pytest.raises(InvalidRequestError) as err:
        tool_plan([WEATHER], "auto", "{{ messages }}", "hermes")
    assert "chat template does not lay out tools" in err.value.message
    with pytest.raises(InvalidRequestError) as err:
        tool_plan([WEATHER], None, "{% if tools %}{% endif %}", None)
    assert "--enable-auto-tool-choice" in err.value.message
    plan = tool_plan([WEATHER], "auto", "{% if tools %}{% endif %}", "llama3_json")
    assert isinstance(plan.format, Llama3JsonParser) and plan.schema is None
    assert plan.tools == [WEATHER]
