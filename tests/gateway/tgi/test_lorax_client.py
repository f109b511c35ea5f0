"""The lorax-client and text-generation clients, unchanged, against the TGI-compatible routes."""

from __future__ import annotations

import httpx
import pytest
from lorax import Client as LoraxClient
from lorax.errors import NotFoundError, ValidationError
from text_generation import Client as TGIClient

from loragate.engine import SamplingParams


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n)


def test_lorax_generate_with_adapter(url, offline, lora_of):
    client = LoraxClient(url, timeout=60)
    got = client.generate("Tell me a story", adapter_id="delta", max_new_tokens=7, details=True)
    (ref,) = offline.generate(
        ["Tell me a story"], greedy(7), lora_request=lora_of("delta"), use_tqdm=False
    )
    assert got.generated_text == ref.outputs[0].text
    assert got.details.generated_tokens == len(ref.outputs[0].token_ids)
    assert got.details.prompt_tokens == len(ref.prompt_token_ids)
    assert [t.id for t in got.details.tokens] == ref.outputs[0].token_ids
    assert got.details.finish_reason.value in ("length", "eos_token")


def test_lorax_generate_stream_with_adapter(url, offline, lora_of):
    client = LoraxClient(url, timeout=60)
    events = list(client.generate_stream("Tell me a story", adapter_id="alpha", max_new_tokens=6))
    (ref,) = offline.generate(
        ["Tell me a story"], greedy(6), lora_request=lora_of("alpha"), use_tqdm=False
    )
    assert [e.token.id for e in events] == ref.outputs[0].token_ids
    assert "".join(e.token.text for e in events) == ref.outputs[0].text
    assert all(e.token.logprob <= 0 for e in events)
    assert events[-1].generated_text == ref.outputs[0].text
    assert events[-1].details.generated_tokens == len(ref.outputs[0].token_ids)
    assert all(e.details is None for e in events[:-1])


def test_lorax_base_model_when_no_adapter(url, offline):
    got = LoraxClient(url, timeout=60).generate("Hello there", max_new_tokens=5)
    (ref,) = offline.generate(["Hello there"], greedy(5), use_tqdm=False)
    assert got.generated_text == ref.outputs[0].text


def test_lorax_errors_map_to_its_exceptions(url):
    client = LoraxClient(url, timeout=60)
    with pytest.raises(NotFoundError, match="no-such-adapter"):
        client.generate("Hi", adapter_id="no-such-adapter", max_new_tokens=2)
    with pytest.raises(ValidationError, match="typical_p"):
        client.generate("Hi", typical_p=0.5, max_new_tokens=2)


def test_text_generation_client(url, offline, lora_of):
    client = TGIClient(url, timeout=60)
    got = client.generate("Once", max_new_tokens=4)
    (ref,) = offline.generate(["Once"], greedy(4), use_tqdm=False)
    assert got.generated_text == ref.outputs[0].text
    streamed = "".join(e.token.text for e in client.generate_stream("Once", max_new_tokens=4))
    assert streamed == ref.outputs[0].text


def test_generate_route_and_return_full_text(url, offline):
    body = {"inputs": "Count:", "parameters": {"max_new_tokens": 3, "return_full_text": True}}
    got = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert got.status_code == 200
    (ref,) = offline.generate(["Count:"], greedy(3), use_tqdm=False)
    assert got.json()["generated_text"] == "Count:" + ref.outputs[0].text


def test_sampling_is_seeded(url, offline):
    """A seed gives the offline engine's sampled answer for that seed; other seeds differ."""

    def sampled(seed: int) -> str:
        body = {
            "inputs": "Hi",
            "parameters": {"max_new_tokens": 8, "do_sample": True, "seed": seed},
        }
        return httpx.post(f"{url}/generate", json=body, timeout=60).json()["generated_text"]

    (ref,) = offline.generate(
        ["Hi"], SamplingParams(temperature=1.0, seed=3, max_tokens=8), use_tqdm=False
    )
    assert sampled(3) == ref.outputs[0].text
    assert sampled(3) == ref.outputs[0].text
    assert len({sampled(seed) for seed in range(3, 8)}) > 1


def test_lorax_best_of_lists_the_other_candidates(url):
    got = LoraxClient(url, timeout=60).generate(
        "Tell me a story",
        adapter_id="gamma",
        max_new_tokens=6,
        best_of=3,
        do_sample=True,
        details=True,
        decoder_input_details=True,
    )
    details = got.details
    others = details.best_of_sequences
    assert len(others) == 2

    def score(tokens):
        return sum(t.logprob for t in tokens)

    assert score(details.tokens) >= max(score(o.tokens) for o in others)
    for o in others:
        assert o.generated_tokens == len(o.tokens) > 0
        assert o.generated_text == "".join(t.text for t in o.tokens)
        assert o.finish_reason.value in ("length", "eos_token")
        assert [t.id for t in o.prefill] == [t.id for t in details.prefill]
    plain = TGIClient(url).generate("Tell me a story", max_new_tokens=3)
    assert plain.details.best_of_sequences is None


def test_best_of_cannot_stream(url):
    body = {"inputs": "x", "parameters": {"best_of": 2, "do_sample": True}, "stream": True}
    for path in ("/generate_stream", "/"):
        got = httpx.post(f"{url}{path}", json=body)
        assert got.status_code == 400 and "best_of" in got.json()["error"]
