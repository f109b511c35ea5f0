"""Text prompts get the special tokens the model file asks for (GGUF metadata, or the HF
directory's tokenizer as transformers reads it), never a second BOS, and none at all with
add_special_tokens=False. transformers' GGUF tokenizer adds a BOS whatever the file says."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from gguf import GGUFReader
from tiny_llama import write_tiny_gguf
from transformers import AutoTokenizer

from loragate.engine import ChatPrompt, SamplingParams
from loragate.engine.loading.default_model import default_model_path

BOS = 1  # <|im_start|>, for the default model and the tiny ones built here
TEXT = "hello world"
STARTS_WITH_BOS = "<|im_start|>user\nhi<|im_end|>\n"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompt_ids(llm, prompt, **kwargs) -> list[int]:
    one = SamplingParams(temperature=0, max_tokens=1)
    return llm.generate(prompt, one, use_tqdm=False, **kwargs)[0].prompt_token_ids


def body(llm, text: str) -> list[int]:
    return llm.tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-cache")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """tiny_gguf(add_bos) -> the path of a tiny GGUF with that flag (None: no such key)."""
    made = {}

    def make(add_bos: bool | None):
        if add_bos not in made:
            out = tmp_path_factory.mktemp(f"gguf-{add_bos}") / f"tiny-bos-{add_bos}.gguf"
            made[add_bos] = write_tiny_gguf(out, add_bos)
        return made[add_bos]

    return make


@pytest.fixture(scope="module")
def gguf_llm(tiny_gguf, gguf_cache, make_llm):
    """gguf_llm(add_bos) -> an LLM on that tiny GGUF (converted once into gguf_cache)."""
    made = {}

    def make(add_bos: bool | None):
        if add_bos not in made:
            made[add_bos] = make_llm(
                model=str(tiny_gguf(add_bos)),
                weights_cache_dir=str(gguf_cache),
                max_model_len=128,
                num_kv_blocks=32,
            )
        return made[add_bos]

    return make


# ---- the default model: its GGUF says add_bos_token = False ------------------------------
def test_default_gguf_says_no_bos():
    fields = GGUFReader(default_model_path()).fields
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert fields["tokenizer.ggml.bos_token_id"].contents() == BOS


def test_default_model_text_prompt_has_no_bos(default_llm, default_hf_dir):
    ids = prompt_ids(default_llm, TEXT)
    assert ids[0] != BOS
    assert ids == body(default_llm, TEXT)
    saved = AutoTokenizer.from_pretrained(default_hf_dir)  # the converted HF directory's
    assert ids == saved.encode(TEXT)
    assert len(ids) == len(saved(TEXT)["input_ids"])


def test_converted_directory_records_the_gguf_rule(default_hf_dir):
    config = json.loads((default_hf_dir / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is False
    record = json.loads((default_hf_dir / "loragate_source.json").read_text())
    assert record["special_tokens"]["add_bos_token"] is False
    assert record["special_tokens"]["gguf"] == str(default_model_path().resolve())


def test_chat_templated_text_equals_chat(default_llm):
    text = default_llm.tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    as_text = default_llm.generate(text, GREEDY, use_tqdm=False)[0]
    as_chat = default_llm.chat(CHAT, GREEDY, use_tqdm=False)[0]
    assert as_text.prompt_token_ids == as_chat.prompt_token_ids
    assert as_text.prompt_token_ids.count(BOS) == text.count("<|im_start|>")
    assert as_text.outputs[0].token_ids == as_chat.outputs[0].token_ids


# ---- tiny GGUF files that say either ------------------------------------------------------
@pytest.mark.parametrize("add_bos", [True, False])
def test_tiny_gguf_follows_its_add_bos_token(gguf_llm, add_bos):
    llm = gguf_llm(add_bos)
    plain = body(llm, TEXT)
    assert plain[0] != BOS
    assert prompt_ids(llm, TEXT) == ([BOS] if add_bos else []) + plain
    # The converted HF directory, read by transformers alone, says the same.
    saved = AutoTokenizer.from_pretrained(llm.engine.hf_dir)
    assert saved.encode(TEXT) == ([BOS] if add_bos else []) + plain


@pytest.mark.parametrize("add_bos", [True, False])
def test_text_that_starts_with_bos_gets_exactly_one(gguf_llm, add_bos):
    llm = gguf_llm(add_bos)
    ids = prompt_ids(llm, STARTS_WITH_BOS)
    assert ids == body(llm, STARTS_WITH_BOS)
    assert ids.count(BOS) == 1 and ids[0] == BOS


def test_bos_model_chat_templated_text_equals_chat(gguf_llm):
    llm = gguf_llm(True)
    text = llm.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>")
    as_text = llm.generate(text, GREEDY, use_tqdm=False)[0]
    as_chat = llm.chat(CHAT, GREEDY, use_tqdm=False)[0]
    assert as_text.prompt_token_ids == as_chat.prompt_token_ids
    assert as_text.prompt_token_ids.count(BOS) == 2  # the template's two turns, no extra one
    assert as_text.outputs[0].token_ids == as_chat.outputs[0].token_ids


def test_add_special_tokens_forces_either_way(gguf_llm):
    llm = gguf_llm(True)
    plain = body(llm, TEXT)
    assert prompt_ids(llm, TEXT, add_special_tokens=False) == plain
    assert prompt_ids(llm, {"prompt": TEXT, "add_special_tokens": False}) == plain
    assert prompt_ids(llm, TEXT, add_special_tokens=True) == [BOS] + plain
    assert prompt_ids(llm, [{"prompt_token_ids": plain}], add_special_tokens=True) == plain
    chat = llm.apply_chat_template(CHAT)
    with_bos = ChatPrompt(CHAT, add_special_tokens=True)  # the template writes its BOS
    assert llm.engine.apply_chat_template(with_bos) == chat
    assert llm.engine.apply_chat_template(ChatPrompt(CHAT, add_special_tokens=False)) == chat
    no_bos = gguf_llm(False)
    assert prompt_ids(no_bos, TEXT, add_special_tokens=True) == body(no_bos, TEXT)


def test_gguf_without_the_key_keeps_transformers_default(gguf_llm):
    llm = gguf_llm(None)
    assert prompt_ids(llm, TEXT) == [BOS] + body(llm, TEXT)
    assert "add_bos_token=absent" in llm.engine.special_token_rule.source


@pytest.mark.parametrize("add_bos", [True, False])
def test_start_log_names_the_rule_and_its_source(tiny_gguf, gguf_cache, make_llm, caplog, add_bos):
    path = tiny_gguf(add_bos)
    with caplog.at_level(logging.INFO, logger="loragate.engine.core.llm_engine"):
        make_llm(
            model=str(path), weights_cache_dir=str(gguf_cache), max_model_len=64, num_kv_blocks=8
        )
    (line,) = [r.getMessage() for r in caplog.records if "plain-text prompts get" in r.getMessage()]
    assert ("BOS <|im_start|> (id 1)" if add_bos else "no BOS") in line
    assert f"tokenizer.ggml.add_bos_token={add_bos}" in line
    assert str(path.resolve()) in line


# ---- HF directories: tokenizer_config.json as transformers reads it ----------------------
@pytest.fixture(scope="module")
def hf_dir_with(tiny_model_dir, tmp_path_factory):
    def make(add_bos: bool):
        out = tmp_path_factory.mktemp(f"hf-bos-{add_bos}")
        shutil.copytree(tiny_model_dir("llama"), out, dirs_exist_ok=True)
        config_file = out / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["add_bos_token"] = add_bos
        # A Llama tokenizer directory, whose class reads add_bos_token (the converted
        # folder it is copied from declares the generic fast tokenizer, which does not).
        config["tokenizer_class"] = "LlamaTokenizerFast"
        config_file.write_text(json.dumps(config))
        return out

    return make


@pytest.mark.parametrize("add_bos", [True, False])
def test_hf_directory_follows_its_tokenizer_config(hf_dir_with, make_llm, add_bos):
    path = hf_dir_with(add_bos)
    llm = make_llm(model=str(path), max_model_len=128, num_kv_blocks=32)
    plain = body(llm, TEXT)
    assert prompt_ids(llm, TEXT) == ([BOS] if add_bos else []) + plain
    assert AutoTokenizer.from_pretrained(path).encode(TEXT) == prompt_ids(llm, TEXT)
    ids = prompt_ids(llm, STARTS_WITH_BOS)
    assert ids.count(BOS) == 1 and ids[0] == BOS
    rule = llm.engine.special_token_rule
    config = path / "tokenizer_config.json"
    assert rule.source == f"{config} (add_bos_token={add_bos}, add_eos_token=False)"
