"""Qwen3 served as vLLM serves it: its chat template with and without thinking
(`chat_template_kwargs.enable_thinking`), `--reasoning-parser qwen3` splitting the answer into
`reasoning_content` and `content`, whole and streamed, and a tool call through the template
and the hermes parser; on the tiny Qwen3 (tests/family_models.py), through the official
openai client. A guided regex makes the random model answer as a thinking model would."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from family_models import save_family_model
from servers_testlib import start_tiny_server
from tools_testlib import ASK, WEATHER

from loragate.engine.loading.model_loader import resolve_model

# A chat template that lays out a conversation as Qwen3's does: ChatML turns, tools in a
# <tools> block with hermes-style calls, and with thinking off an empty think block opened and
# closed where the answer starts, so the model answers without reasoning.
QWEN3_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call one or more functions. Their signatures are within <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
For each call return <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""

THINKING = r"<think>\nThe user asks about (rain|sun)\.\n</think>\n\nIt is (sunny|rainy)\."
CALLING = (
    r"<think>\nA weather question\.\n</think>\n\n<tool_call>\n"
    r'\{"name": "get_weather", "arguments": \{"city": "Paris", "unit": "C"\}\}\n</tool_call>'
)


@pytest.fixture(scope="module")
def qwen3_url(tmp_path_factory):
    model_dir = save_family_model(
        "qwen3", tmp_path_factory.mktemp("qwen3"), resolve_model(None).hf_dir
    )
    template = tmp_path_factory.mktemp("qwen3-template") / "qwen3.jinja"
    template.write_text(QWEN3_TEMPLATE)
    server = start_tiny_server(
        model_dir,
        {"enable_lora": False},
        chat_template=str(template),
        reasoning_parser="qwen3",
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
    )
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def client(qwen3_url):
    return openai.OpenAI(base_url=f"{qwen3_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def answer(client, model, stream: bool, **extra):
    kwargs = dict(model=model, messages=ASK, max_tokens=80, temperature=0, **extra)
    if not stream:
        message = client.chat.completions.create(**kwargs).choices[0].message
        return message.reasoning_content, message.content
    reasoning, content = [], []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
    return "".join(reasoning) or None, "".join(content) or None


def test_the_template_opens_and_closes_an_empty_think_block_when_thinking_is_off(qwen3_url, model):
    def rendered(**extra) -> str:
        body = {"model": model, "messages": ASK, **extra}
        ids = httpx.post(f"{qwen3_url}/tokenize", json=body).json()["tokens"]
        return httpx.post(f"{qwen3_url}/detokenize", json={"tokens": ids}).json()["prompt"]

    off = rendered(chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert rendered().endswith("<|im_start|>assistant\n")
    assert rendered(chat_template_kwargs={"enable_thinking": True}) == rendered()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_and_content_split_as_vllm_splits_them(client, model, stream):
    reasoning, content = answer(client, model, stream, extra_body={"guided_regex": THINKING})
    assert reasoning is not None and reasoning.startswith("\nThe user asks about ")
    assert reasoning.endswith(".\n") and "<think>" not in reasoning
    assert content in ("\n\nIt is sunny.", "\n\nIt is rainy.")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_with_thinking_off_the_whole_answer_is_content(client, model, stream):
    extra = {"guided_regex": THINKING, "chat_template_kwargs": {"enable_thinking": False}}
    reasoning, content = answer(client, model, stream, extra_body=extra)
    assert reasoning is None
    assert content.startswith("<think>\nThe user asks about ") and "</think>" in content


def test_an_answer_without_think_tags_is_all_content(client, model):
    reasoning, content = answer(client, model, False, extra_body={"guided_regex": "It is [a-z]+"})
    assert reasoning is None and content.startswith("It is ")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_after_thinking_goes_through_the_hermes_parser(client, model, stream):
    kwargs = dict(
        model=model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=120,
        temperature=0,
        extra_body={"guided_regex": CALLING},
    )
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.reasoning_content == "\nA weather question.\n"
        (call,) = choice.message.tool_calls
        name, arguments = call.function.name, call.function.arguments
    else:
        reasoning, names, arguments, finish = [], [], [], None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
                for call in choice.delta.tool_calls or []:
                    names.append(call.function.name or "")
                    arguments.append(call.function.arguments or "")
                finish = choice.finish_reason or finish
        assert "".join(reasoning) == "\nA weather question.\n" and finish == "tool_calls"
        name, arguments = "".join(names), "".join(arguments)
    assert name == "get_weather"
    assert json.loads(arguments) == {"city": "Paris", "unit": "C"}
