"""Tiny random Llama models and real PEFT adapter directories for the adapter tests."""

from __future__ import annotations

import pytest
from tiny_llama import HF_INIT_NAME, hf_init_tiny_model

from loragate.engine.models.llama import lora_spec
from loragate.tools import make_random_adapter


@pytest.fixture(scope="session")
def base_model():
    return hf_init_tiny_model()


@pytest.fixture(scope="session")
def spec(base_model):
    return lora_spec(base_model.config, HF_INIT_NAME)


@pytest.fixture
def make_adapter(base_model, tmp_path):
    """make_adapter(name, rank=..., targets=..., **kw) -> path of a fresh PEFT adapter dir."""

    def make(name="a", *, rank=4, targets=("q_proj", "v_proj"), model=None, **kwargs):
        kwargs.setdefault("base_model_name", HF_INIT_NAME)
        return make_random_adapter(
            model if model is not None else base_model,
            tmp_path / name,
            rank=rank,
            targets=list(targets),
            **kwargs,
        )

    return make
