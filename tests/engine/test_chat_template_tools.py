"""The offline API's chat with vLLM's `chat_template` and `tools`: the template lays the
tools out, LLM.chat answers as generate does on the same token ids, and the conversation's
values are checked once, as its ChatPrompt is built."""

from __future__ import annotations

import pytest
from tools_testlib import ASK, HERMES_TEMPLATE, WEATHER

from loragate.engine import ChatPrompt, InvalidParam, SamplingParams


@pytest.fixture(scope="module")
def llm(make_llm, tiny_model_dir):
    return make_llm(str(tiny_model_dir()), max_model_len=256, max_num_seqs=4, num_kv_blocks=64)


def test_tools_are_laid_out_by_the_given_template(llm):
    ids = llm.apply_chat_template(ASK, tools=[WEATHER], chat_template=HERMES_TEMPLATE)
    text = llm.engine.tokenizer.decode(ids)
    assert '"name": "get_weather"' in text and text.endswith("<|im_start|>assistant\n")
    plain = llm.engine.tokenizer.decode(llm.apply_chat_template(ASK))
    assert "get_weather" not in plain  # the model's own template, which knows no tools
    params = SamplingParams(temperature=0, max_tokens=6)
    (chat,) = llm.chat(ASK, params, tools=[WEATHER], chat_template=HERMES_TEMPLATE, use_tqdm=False)
    (direct,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    assert chat.prompt_token_ids == ids
    assert chat.outputs[0].token_ids == direct.outputs[0].token_ids


def test_tools_that_are_not_objects_are_a_value_error(llm):
    with pytest.raises(ValueError, match="tools must be a list of objects"):
        llm.apply_chat_template(ASK, tools=["get_weather"], chat_template=HERMES_TEMPLATE)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"add_special_tokens": "yes"}, "add_special_tokens"),
        ({"tools": ["get_weather"]}, "tools"),
        ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    ],
)
def test_a_chat_prompt_is_checked_as_it_is_built(values, field):
    """One conversation's values, checked once where they are put together (ChatPrompt):
    each refusal names its field, before any engine is asked."""
    with pytest.raises(InvalidParam) as refused:
        ChatPrompt(**({"messages": ASK} | values))
    assert refused.value.field == field


def test_a_chat_prompt_takes_no_special_tokens_unless_asked():
    assert ChatPrompt(ASK, add_special_tokens=None).add_special_tokens is False
