"""Model sources: GGUF files convert once to a cached HF directory; bad paths are clear errors."""

from __future__ import annotations

import logging

import pytest
import transformers
from tiny_llama import write_tiny_gguf

from loragate.engine.loading.default_model import DEFAULT_MODEL_NAME, default_model_path
from loragate.engine.loading.model_loader import load_config, resolve_model


def test_gguf_converts_once_then_reads_the_cache(monkeypatch):
    """The default model's file named by its path, in the cache every test shares (its
    conversion, 20-30 s, is done once per machine; the tiny GGUF below shows a first
    conversion's stages in a fresh cache)."""
    first = resolve_model(str(default_model_path()))
    assert first.hf_dir == resolve_model(None).hf_dir
    assert first.name == DEFAULT_MODEL_NAME
    assert (first.hf_dir / "model.safetensors").is_file()
    assert (first.hf_dir / "tokenizer.json").is_file()
    assert load_config(first.hf_dir).num_hidden_layers == 30

    def no_conversion(*args, **kwargs):
        raise AssertionError("the second start must not convert the GGUF file again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_conversion)
    again = resolve_model(str(default_model_path()))
    assert again.hf_dir == first.hf_dir


def test_the_first_conversion_logs_a_line_per_stage_and_later_starts_none(tmp_path, caplog):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", add_bos=True)
    caplog.set_level(logging.INFO, logger="loragate.engine.loading.model_loader")
    resolve_model(str(gguf), cache_dir=str(tmp_path / "cache"))
    lines = [
        r.getMessage() for r in caplog.records if r.name == "loragate.engine.loading.model_loader"
    ]
    assert lines[0].startswith(f"converting {gguf} to an HF directory")
    stages = [line for line in lines if ": stage " in line]
    assert [s.split(": stage ")[1][:3] for s in stages] == ["1/3", "2/3", "3/3"]
    assert "dequantizing" in stages[0] and "tokenizer" in stages[1] and "writing" in stages[2]
    assert lines[-1].startswith("converted tiny.gguf in ")
    caplog.clear()
    resolve_model(str(gguf), cache_dir=str(tmp_path / "cache"))
    assert not [r for r in caplog.records if r.name == "loragate.engine.loading.model_loader"]


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
