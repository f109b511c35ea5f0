"""What the engine tells its callers about the model it serves (ModelInfo): plain data,
made once, so a caller never reads engine state. Its state for metrics, one snapshot at a
time, is engine_stats.py's EngineStats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loragate.adapters import LoRAModelSpec


@dataclass(frozen=True)
class ModelInfo:
    """The served model, as requests see it. `tokenizer` is the engine's own (read-only)."""

    served_name: str
    base_model_name: str
    max_model_len: int
    max_num_seqs: int
    lora_enabled: bool
    tokenizer: Any = field(repr=False, compare=False)
    # What the start-up log and the metrics' info series say about how it runs.
    dtype: str = ""
    dtype_reason: str = ""  # "asked for", or what "auto" read (the CPU's bf16 flags)
    device: str = ""
    threads: int = 0
    block_size: int = 0
    num_kv_blocks: int = 0
    max_loras: int = 0
    max_lora_rank: int = 0
    max_cpu_loras: int = 0
    prefix_caching: bool = False
    plugins: tuple[str, ...] = ()
    # How the base's weights are held (engine/loading/quantization.py's quantization_method), and
    # the bytes it holds per tensor type (a block type such as I4_G128 or Q4_1, or a dtype).
    quantization: str = ""
    weight_bytes: tuple[tuple[str, int], ...] = ()
    # What the model offers LoRA (module shapes, layers): how big a valid adapter can be.
    lora_spec: LoRAModelSpec | None = field(default=None, repr=False, compare=False)


def runtime_info(engine) -> dict:
    """ModelInfo's fields on how an LLMEngine runs: what its config resolved to."""
    import torch

    from loragate.engine.loading.quantization import quantization_method

    config = engine.config
    lora = engine.residency is not None
    dtype, reason = config.dtype_choice
    return dict(
        dtype=str(dtype).removeprefix("torch."),
        dtype_reason=reason,
        device=str(config.torch_device),
        threads=torch.get_num_threads(),
        block_size=config.block_size,
        num_kv_blocks=engine.kv_cache.num_blocks,
        max_loras=config.max_loras if lora else 0,
        max_lora_rank=config.max_lora_rank if lora else 0,
        max_cpu_loras=config.max_cpu_loras if lora else 0,
        prefix_caching=bool(config.enable_prefix_caching),
        plugins=tuple(p["name"] for p in engine.plugins.describe()),
        quantization=quantization_method(config.quantization, engine.hf_dir),
        weight_bytes=tuple(sorted(engine.model.weight_bytes().items())),
        lora_spec=engine.model.lora_spec(engine.base_model_name) if lora else None,
    )
