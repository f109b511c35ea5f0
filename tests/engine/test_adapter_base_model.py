"""Adapters made from the served weights are accepted without a BaseModelMismatchWarning,
whatever name the model is served under (issue 21)."""

from __future__ import annotations

import warnings

import torch
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.tools import make_random_adapter


def test_adapters_of_the_served_weights_load_silently_under_an_alias(
    tiny_model_dir, tmp_path, make_llm
):
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # As `loragate adapters make-random` writes them (the source's name), and as PEFT records
    # a model loaded from the (converted) directory: its path.
    named = make_random_adapter(
        base, tmp_path / "named", rank=2, targets=["q_proj"], base_model_name=model_dir.name
    )
    by_path = make_random_adapter(base, tmp_path / "by-path", rank=2, targets=["q_proj"])
    llm = make_llm(
        model=str(model_dir),
        served_model_name="alias",
        enable_lora=True,
        max_model_len=64,
        num_kv_blocks=16,
        max_lora_rank=8,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, path in enumerate((named, by_path)):
            llm.engine.residency.preload(LoRARequest(path.name, i + 1, str(path)))
    assert llm.engine.model_name == "alias"
