"""The official openai client against the server: same tokens as the offline engine."""

from __future__ import annotations

import openai
import pytest

from loragate.engine import SamplingParams


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def base_name(client):
    models = client.models.list().data
    (base,) = [m for m in models if getattr(m, "parent", None) is None]
    return base.id


def greedy(max_tokens, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_completion_matches_offline_engine(client, base_name, offline):
    prompt = "The capital of France is"
    got = client.completions.create(model=base_name, prompt=prompt, max_tokens=12, temperature=0)
    (ref,) = offline.generate([prompt], greedy(12), use_tqdm=False)
    choice = got.choices[0]
    assert choice.text == ref.outputs[0].text
    assert choice.finish_reason == ref.outputs[0].finish_reason
    assert got.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert got.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    assert got.model == base_name and got.object == "text_completion"


def test_completion_with_adapter_matches_offline_and_differs_from_base(
    client, base_name, offline, lora_of
):
    prompt = "Once upon a time"
    with_adapter = client.completions.create(
        model="beta", prompt=prompt, max_tokens=10, temperature=0
    )
    base = client.completions.create(model=base_name, prompt=prompt, max_tokens=10, temperature=0)
    (ref,) = offline.generate([prompt], greedy(10), lora_request=lora_of("beta"), use_tqdm=False)
    assert with_adapter.choices[0].text == ref.outputs[0].text
    assert with_adapter.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert with_adapter.choices[0].text != base.choices[0].text, "the adapter changed nothing"


def test_batch_of_prompts_and_token_id_prompts(client, base_name, offline):
    prompts = ["one two three", "red green"]
    got = client.completions.create(model=base_name, prompt=prompts, max_tokens=6, temperature=0)
    refs = offline.generate(prompts, greedy(6), use_tqdm=False)
    assert [c.index for c in got.choices] == [0, 1]
    assert [c.text for c in got.choices] == [r.outputs[0].text for r in refs]
    assert got.usage.prompt_tokens == sum(len(r.prompt_token_ids) for r in refs)
    ids = refs[0].prompt_token_ids
    by_ids = client.completions.create(model=base_name, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == refs[0].outputs[0].text


def test_streamed_completion_concatenates_to_offline_text(client, offline, lora_of):
    prompt = "In the beginning"
    stream = client.completions.create(
        model="alpha",
        prompt=prompt,
        max_tokens=9,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    (ref,) = offline.generate([prompt], greedy(9), lora_request=lora_of("alpha"), use_tqdm=False)
    assert text == ref.outputs[0].text
    assert finish == [ref.outputs[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == len(ref.outputs[0].token_ids)


def test_chat_matches_offline_engine(client, base_name, offline):
    messages = [{"role": "user", "content": "Say hello."}]
    got = client.chat.completions.create(
        model=base_name, messages=messages, max_completion_tokens=8, temperature=0
    )
    (ref,) = offline.chat(messages, greedy(8), use_tqdm=False)
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == ref.outputs[0].text
    assert got.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert got.usage.completion_tokens == len(ref.outputs[0].token_ids)


def test_streamed_chat_naming_an_adapter(client, offline, lora_of):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ]
    stream = client.chat.completions.create(
        model="gamma",
        messages=messages,
        max_tokens=11,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (ref,) = offline.chat(messages, greedy(11), lora_request=lora_of("gamma"), use_tqdm=False)
    assert content == ref.outputs[0].text
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices if c.choices[0].finish_reason
    ]
    assert finishes == [ref.outputs[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == len(ref.prompt_token_ids)
    assert usage.completion_tokens == len(ref.outputs[0].token_ids)


def test_chat_logprobs_and_n(client, base_name):
    got = client.chat.completions.create(
        model=base_name,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0.8,
        seed=7,
        n=2,
        logprobs=True,
        top_logprobs=3,
    )
    assert sorted(c.index for c in got.choices) == [0, 1]
    for choice in got.choices:
        entries = choice.logprobs.content
        assert len(entries) >= 1
        for entry in entries:
            assert entry.logprob <= 0
            assert len(entry.top_logprobs) == 3
            ranked = [t.logprob for t in entry.top_logprobs]
            assert ranked == sorted(ranked, reverse=True)
    assert got.usage.completion_tokens == sum(len(c.logprobs.content) for c in got.choices)


def test_completion_logprobs_shape(client, base_name):
    got = client.completions.create(
        model=base_name, prompt="abc", max_tokens=5, temperature=0, logprobs=2
    )
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == got.choices[0].text
    assert lp.text_offset[0] == 0
    # greedy: the chosen token is the most likely one
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen == pytest.approx(max(top.values()))


def test_models_list_names_adapters_without_paths(client, base_name, adapter_root):
    models = {m.id: m for m in client.models.list().data}
    assert {"alpha", "beta", "gamma", "delta"} <= set(models)
    assert "notes" not in models  # not an adapter folder
    for name in ("alpha", "beta", "gamma", "delta"):
        assert models[name].parent == base_name
    assert models[base_name].parent is None
    dumped = str([m.model_dump() for m in models.values()])
    assert str(adapter_root) not in dumped
    assert client.models.retrieve("alpha").id == "alpha"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
