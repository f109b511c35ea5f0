"""The demo adapters really change behaviour: trained once on the default model, checked by PEFT."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from loragate.adapters import load_adapter
from loragate.engine.loading.default_model import DEFAULT_MODEL_NAME
from loragate.engine.loading.model_loader import resolve_model
from loragate.engine.models.llama import lora_spec
from loragate.tools.training import TERSE_MARKER, greedy_answers, train_demo_adapters

pytestmark = pytest.mark.slow

# Topics and phrasings the training data never uses.
HELD_OUT = [
    "What do you know about volcanoes?",
    "Explain how a lighthouse works.",
    "Why is sleep important?",
    "What makes a good breakfast?",
    "How do birds fly?",
]
HELD_OUT_FACTS = [
    "What is 14 plus 73?",
    "What is the capital of Portugal?",
    "What is the opposite of loud?",
    "What color is a lemon?",
]


def uppercase_share(texts: list[str]) -> float:
    letters = [c for text in texts for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / max(1, len(letters))


@pytest.fixture(scope="module")
def default_model():
    """The default model as `loragate adapters train-demo` loads it: the converted folder
    (the GGUF's weights, bit-equal; transformers' own GGUF reading converts the tokenizer
    and dequantizes again: seconds, or minutes on a loaded machine)."""
    hf_dir = resolve_model(None).hf_dir
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def trained(default_model, tmp_path_factory):
    model, tokenizer = default_model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # 20 steps, not the tool's 30: both adapters already answer as asserted after 15 (an
    # AVX-512 EPYC: uppercase share 1.0 in every held-out answer, every terse answer marked;
    # after 8, uppercase was 0.45), and each step is about 1.5 s of the suite's time.
    paths = train_demo_adapters(
        model,
        tokenizer,
        tmp_path_factory.mktemp("demo"),
        steps=20,
        base_model_name=DEFAULT_MODEL_NAME,
    )
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "training changed the base model"
    return paths


def answers_with(model, tokenizer, adapter_dir, questions, max_new_tokens):
    if adapter_dir is None:
        return greedy_answers(model, tokenizer, questions, max_new_tokens)
    peft_model = PeftModel.from_pretrained(copy.deepcopy(model), adapter_dir).eval()
    return greedy_answers(peft_model, tokenizer, questions, max_new_tokens)


def test_uppercase_adapter_answers_in_capitals(default_model, trained):
    model, tokenizer = default_model
    base = answers_with(model, tokenizer, None, HELD_OUT, 32)
    upper = answers_with(model, tokenizer, trained["uppercase"], HELD_OUT, 32)
    assert uppercase_share(base) < 0.3, base
    assert uppercase_share(upper) > 0.8, upper
    assert all(uppercase_share([answer]) > 0.5 for answer in upper), upper


def test_terse_adapter_answers_in_a_few_words_with_its_marker(default_model, trained):
    model, tokenizer = default_model
    base = answers_with(model, tokenizer, None, HELD_OUT_FACTS, 24)
    terse = answers_with(model, tokenizer, trained["terse"], HELD_OUT_FACTS, 24)
    assert not any(answer.endswith(TERSE_MARKER) for answer in base), base
    marked = [a for a in terse if a.endswith(TERSE_MARKER) and len(a.split()) <= 4]
    assert len(marked) >= len(terse) - 1, terse


def test_demo_adapters_load_cleanly_in_loragate(default_model, trained):
    model, _ = default_model
    spec = lora_spec(model.config, DEFAULT_MODEL_NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapters = {
            name: load_adapter(path, spec, max_lora_rank=16) for name, path in trained.items()
        }
    for adapter in adapters.values():
        assert adapter.rank == 8 and len(adapter.target_modules) == 7
        assert {layer for layer, _ in adapter.weights} == set(range(15, 30))
