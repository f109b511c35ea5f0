"""Sizes fixed at start-up: the longest sequence, the KV block count, the EOS ids."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PretrainedConfig

from loragate.engine.api.config import EngineConfig
from loragate.engine.models import PagedDecoder
from loragate.engine.runner.kv_cache import KVCache


def resolve_max_model_len(config: EngineConfig, model_config: PretrainedConfig) -> int:
    model_max = getattr(model_config, "max_position_embeddings", None) or 2048
    wanted = config.max_model_len or model_max
    if wanted > model_max and not getattr(model_config, "rope_scaling", None):
        raise ValueError(
            f"max_model_len {wanted} exceeds the model's max_position_embeddings {model_max}"
        )
    budget = config.max_num_batched_tokens
    if not config.enable_chunked_prefill and budget is not None and budget < wanted:
        raise ValueError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= "
            f"max_model_len ({wanted}) without chunked prefill"
        )
    return wanted


DEFAULT_CPU_KV_GB = 2.0


def num_kv_blocks(config: EngineConfig, model: PagedDecoder, max_model_len: int) -> int:
    """From the memory budget (or the explicit override); enough for one full sequence."""
    per_block = KVCache.bytes_per_block(
        model.num_layers, config.block_size, model.num_kv_heads, model.head_dim, model.dtype
    )
    where = "the KV memory budget (kv_cache_memory_gb)"
    if config.num_kv_blocks is not None:
        blocks = config.num_kv_blocks
    elif config.kv_cache_memory_gb is not None:
        blocks = int(config.kv_cache_memory_gb * (1 << 30) // per_block)
    elif model.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(model.device)
        budget = total * config.gpu_memory_utilization - (total - free) - (1 << 30)
        blocks = max(0, int(budget // per_block))
        where = (
            f"gpu_memory_utilization={config.gpu_memory_utilization} of the GPU's "
            f"{total / 2**30:.1f} GiB ({(total - free) / 2**30:.1f} GiB already in use), "
            "or set kv_cache_memory_gb"
        )
    else:
        blocks = int(DEFAULT_CPU_KV_GB * (1 << 30) // per_block)
    needed = -(-max_model_len // config.block_size)
    if blocks < needed:
        raise ValueError(
            f"the KV cache holds {blocks} blocks of {config.block_size} tokens but one sequence "
            f"of max_model_len={max_model_len} needs {needed}: raise {where}, "
            "or lower max_model_len"
        )
    return blocks


def swap_blocks(config: EngineConfig, kv_cache: KVCache) -> int:
    """CPU blocks for swap preemption: on CUDA (or if asked); 0 means recompute."""
    mode = config.preemption_mode
    if mode == "recompute" or (mode == "auto" and kv_cache.data.device.type != "cuda"):
        return 0
    per_block = kv_cache.data[:, :, 0].numel() * kv_cache.data.element_size()
    blocks = int(config.swap_space * (1 << 30) // per_block)
    if mode == "swap" and blocks == 0:
        raise ValueError(
            f"preemption_mode='swap' but swap_space={config.swap_space} GiB holds no KV block "
            f"of {per_block} bytes: raise swap_space or use preemption_mode='recompute'"
        )
    return blocks


def eos_token_ids(hf_dir: Path, tokenizer) -> set[int]:
    """The model's generation config is the truth (the GGUF tokenizer names <|im_start|>)."""
    ids: set[int] = set()
    try:
        eos = GenerationConfig.from_pretrained(hf_dir).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:
        pass
    if not ids and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
