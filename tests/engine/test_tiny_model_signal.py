"""The tiny test model is not an echo: engine bugs that lose context change its tokens."""

from __future__ import annotations

import pytest
from tiny_llama import assert_has_signal
from transformers import AutoModelForCausalLM


@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "qwen2"])
def test_tiny_model_output_depends_on_its_whole_context(tiny_model_dir, kind):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(kind)).eval()
    assert not model.config.tie_word_embeddings
    assert_has_signal(model)
