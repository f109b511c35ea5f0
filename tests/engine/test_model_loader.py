"""Model sources: GGUF files convert once to a cached HF directory; bad paths are clear errors."""

from __future__ import annotations

import pytest
import transformers

from loragate.engine.default_model import DEFAULT_MODEL_NAME, default_model_path
from loragate.engine.model_loader import load_config, resolve_model


def test_gguf_converts_once_then_reads_the_cache(tmp_path, monkeypatch):
    first = resolve_model(str(default_model_path()), cache_dir=str(tmp_path))
    assert first.name == DEFAULT_MODEL_NAME
    assert (first.hf_dir / "model.safetensors").is_file()
    assert (first.hf_dir / "tokenizer.json").is_file()
    assert load_config(first.hf_dir).num_hidden_layers == 30

    def no_conversion(*args, **kwargs):
        raise AssertionError("the second start must not convert the GGUF file again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_conversion)
    again = resolve_model(str(default_model_path()), cache_dir=str(tmp_path))
    assert again.hf_dir == first.hf_dir


def test_non_gguf_file_is_refused(tmp_path):
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"x")
    with pytest.raises(ValueError, match=".gguf file or an HF directory"):
        resolve_model(str(bogus))


def test_corrupt_gguf_is_a_value_error(tmp_path):
    bogus = tmp_path / "broken.gguf"
    bogus.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError, match="cannot read GGUF model"):
        resolve_model(str(bogus), cache_dir=str(tmp_path / "cache"))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        load_config(resolve_model(str(tmp_path)).hf_dir)
