"""Which family runs a checkpoint, what the start log says of it, and what is refused: a
model type the engine does not run (Qwen3 MoE) fails at start with the supported list."""

from __future__ import annotations

import json
import logging

import pytest
from family_models import family_config, save_family_model
from transformers import Gemma3Config, Qwen3MoeConfig

from loragate.engine import LLM
from loragate.engine.loading.model_loader import load_config
from loragate.engine.models import SUPPORTED_MODEL_TYPES, family_of
from loragate.engine.models.gemma3 import Gemma3Family


def test_a_qwen3_moe_checkpoint_is_refused_with_the_supported_list(tmp_path):
    Qwen3MoeConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4).save_pretrained(
        tmp_path
    )
    with pytest.raises(ValueError) as refused:
        LLM(model=str(tmp_path), dtype="float32")
    message = str(refused.value)
    assert "model_type 'qwen3_moe'" in message and "is not supported" in message
    for supported in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3"):
        assert supported in SUPPORTED_MODEL_TYPES and supported in message


def test_a_multimodal_gemma3_config_serves_its_text_model(tmp_path):
    text = family_config("gemma3").to_dict()
    Gemma3Config(
        text_config=text, vision_config={"hidden_size": 32, "num_hidden_layers": 1}
    ).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma3"
    config = load_config(tmp_path)
    assert config.model_type == "gemma3_text" and config.sliding_window == 8
    assert isinstance(family_of(config), Gemma3Family)
    renamed = Gemma3Family().checkpoint_names(
        {
            "model.language_model.layers.0.mlp.down_proj.weight",
            "language_model.model.norm.weight",
            "language_model.lm_head.weight",
            "model.vision_tower.x.weight",
        }
    )
    assert renamed == {
        "model.language_model.layers.0.mlp.down_proj.weight": "model.layers.0.mlp.down_proj.weight",
        "language_model.model.norm.weight": "model.norm.weight",
        "language_model.lm_head.weight": "lm_head.weight",
    }


@pytest.mark.parametrize(
    "family,says",
    [
        ("gemma3", ["gemma3:", "sliding window 8 on 2 of 3 layers", "q/k norm", "gelu_tanh"]),
        ("qwen3", ["qwen3:", "head_dim 32", "q/k norm"]),
        ("phi3", ["phi3:", "partial rotary (8 of 16 dims)", "fused qkv_proj and gate_up_proj"]),
        ("mistral", ["llama:", "sliding window 8 on 2 of 2 layers"]),
    ],
)
def test_the_start_log_names_the_family_and_what_it_uses(family, says):
    config = family_config(family)
    line = family_of(config).architecture(config).describe()
    for part in says:
        assert part in line, line


def test_an_engine_on_a_gemma3_directory_logs_its_family(tmp_path, tokenizer_dir, caplog):
    model_dir = save_family_model("gemma3", tmp_path / "gemma3", tokenizer_dir)
    with caplog.at_level(logging.INFO, logger="loragate.engine.core.llm_engine"):
        llm = LLM(model=str(model_dir), dtype="float32", max_model_len=64)
    assert llm.llm_engine.model.arch.layer_windows == (8, 0, 8)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("model: "))
    assert line.startswith("model: gemma3: 3 layers") and "sliding window 8" in line
