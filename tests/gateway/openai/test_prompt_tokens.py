"""Over HTTP, on the default model: a text prompt gets the tokens its GGUF file asks for (no
BOS), counted as the converted HF directory's tokenizer counts them, and a chat-templated
text is the same prompt as the conversation sent to /v1/chat/completions."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from loragate.engine import EngineConfig
from loragate.engine.loading.default_model import DEFAULT_MODEL_NAME
from loragate.engine.loading.model_loader import resolve_model
from loragate.gateway.assembly.server import BackgroundServer
from loragate.gateway.settings import GatewaySettings

BOS = 1
TEXT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def default_url():
    config = EngineConfig(max_model_len=256, max_num_seqs=4, num_kv_blocks=64)
    server = BackgroundServer(GatewaySettings(engine=config, port=0)).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def saved_tokenizer():
    """The tokenizer of the HF directory the default GGUF converts into, read by transformers."""
    return AutoTokenizer.from_pretrained(resolve_model(None).hf_dir)


def post(url: str, path: str, body: dict) -> dict:
    got = httpx.post(f"{url}{path}", json=body, timeout=120)
    assert got.status_code == 200, got.text
    return got.json()


def generate_prefill(url: str, text: str, **parameters) -> tuple[list[int], int]:
    """The prompt ids /generate ran on, and the prompt_tokens it reported."""
    parameters |= {"max_new_tokens": 1, "details": True, "decoder_input_details": True}
    details = post(url, "/generate", {"inputs": text, "parameters": parameters})["details"]
    return [t["id"] for t in details["prefill"]], details["prompt_tokens"]


def completion(url: str, prompt: str, **extra) -> dict:
    body = {"model": DEFAULT_MODEL_NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    body |= extra
    return post(url, "/v1/completions", body)


def test_generate_prompt_has_no_bos(default_url, saved_tokenizer):
    ids, count = generate_prefill(default_url, TEXT)
    assert ids[0] != BOS
    assert ids == saved_tokenizer.encode(TEXT)
    assert count == len(saved_tokenizer(TEXT)["input_ids"])


def test_generate_truncate_keeps_the_last_tokens(default_url, saved_tokenizer):
    ids, count = generate_prefill(default_url, TEXT, truncate=3)
    assert ids == saved_tokenizer.encode(TEXT)[-3:]
    assert count == 3


def test_completions_prompt_tokens_match_the_saved_tokenizer(default_url, saved_tokenizer):
    expected = len(saved_tokenizer(TEXT)["input_ids"])
    assert saved_tokenizer.encode(TEXT)[0] != BOS
    assert completion(default_url, TEXT)["usage"]["prompt_tokens"] == expected
    listed = completion(default_url, [TEXT, TEXT + " Paris"])["usage"]["prompt_tokens"]
    assert listed == expected + len(saved_tokenizer(TEXT + " Paris")["input_ids"])
    forced = completion(default_url, TEXT, add_special_tokens=True)["usage"]["prompt_tokens"]
    assert forced == expected  # the model's rule adds nothing


def test_add_special_tokens_must_be_a_boolean(default_url):
    got = httpx.post(
        f"{default_url}/v1/completions",
        json={"model": DEFAULT_MODEL_NAME, "prompt": TEXT, "add_special_tokens": "yes"},
        timeout=60,
    )
    assert got.status_code == 400
    assert "add_special_tokens" in got.text


def test_chat_templated_text_equals_chat_completions(default_url, saved_tokenizer):
    text = saved_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    template_ids = saved_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    ids, count = generate_prefill(default_url, text)
    assert ids == list(template_ids)
    assert ids.count(BOS) == text.count("<|im_start|>")  # the template's own, no extra one
    as_text = completion(default_url, text)
    as_chat = post(
        default_url,
        "/v1/chat/completions",
        {"model": DEFAULT_MODEL_NAME, "messages": CHAT, "max_tokens": 12, "temperature": 0},
    )
    assert as_text["usage"]["prompt_tokens"] == as_chat["usage"]["prompt_tokens"] == count
    assert as_text["choices"][0]["text"] == as_chat["choices"][0]["message"]["content"]
    assert as_chat["choices"][0]["message"]["content"]
    forced = post(
        default_url,
        "/v1/chat/completions",
        {
            "model": DEFAULT_MODEL_NAME,
            "messages": CHAT,
            "max_tokens": 1,
            "temperature": 0,
            "add_special_tokens": True,
        },
    )
    assert forced["usage"]["prompt_tokens"] == count
