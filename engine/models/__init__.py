"""loragate.engine.models: the decoder families the engine runs, over one paged decoder.

Each family (llama.py, qwen3.py, gemma3.py, phi3.py) says only how it differs; decoder.py
runs them all through the same paged attention, batched LoRA and native kernels.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from loragate.engine.models.decoder import PagedDecoder
from loragate.engine.models.gemma3 import Gemma3Family
from loragate.engine.models.llama import LlamaFamily
from loragate.engine.models.phi3 import Phi3Family
from loragate.engine.models.qwen3 import Qwen3Family

FAMILIES: tuple[LlamaFamily, ...] = (LlamaFamily(), Qwen3Family(), Gemma3Family(), Phi3Family())
SUPPORTED_MODEL_TYPES = tuple(t for family in FAMILIES for t in family.model_types)


def family_of(config: PretrainedConfig) -> LlamaFamily:
    """The family that runs this config's model type; a clear error listing those we run."""
    for family in FAMILIES:
        if config.model_type in family.model_types:
            return family
    raise ValueError(
        f"model_type {config.model_type!r} is not supported; "
        f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


def build_model(config: PretrainedConfig, device: torch.device, dtype: torch.dtype):
    """The paged decoder for this config (weights not loaded yet)."""
    return PagedDecoder(config, family_of(config), device, dtype)


__all__ = ["FAMILIES", "SUPPORTED_MODEL_TYPES", "PagedDecoder", "build_model", "family_of"]
