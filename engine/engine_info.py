"""What the engine tells its callers about itself: the model it serves, and one snapshot of
its state for metrics. Both are plain data, copied on the engine thread, so a caller never
reads engine state while a step changes it."""

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
    # What the model offers LoRA (module shapes, layers): how big a valid adapter can be.
    lora_spec: LoRAModelSpec | None = field(default=None, repr=False, compare=False)


@dataclass
class EngineStats:
    """Queues, KV blocks (as `LLMEngine.get_memory_stats`) and adapter residency (as
    `AdapterCache.stats`; empty with LoRA off), with the engine's token counters."""

    unfinished_requests: int = 0
    running: int = 0
    waiting: int = 0
    memory: dict = field(default_factory=dict)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    adapters: dict = field(default_factory=dict)
    busy_adapters: frozenset[str] = frozenset()
    # Adapter names of the sequences waiting for their first step (vllm:lora_requests_info).
    waiting_adapters: frozenset[str] = frozenset()
    # Weights in memory by sha256: "device" (a slot) or "cpu"; any other adapter is on disk.
    adapter_tiers: dict = field(default_factory=dict)
    # sha256 -> (disk loads, their seconds, device slot loads, their seconds)
    adapter_loads: dict = field(default_factory=dict)
    # Fair shares (engine/fair_share.py), by tenant (else "adapter:<name>", else "base"):
    # weighted tokens received since start, and the virtual counters of the active ones.
    tenant_service: dict = field(default_factory=dict)
    tenant_virtual_service: dict = field(default_factory=dict)


def runtime_info(engine) -> dict:
    """ModelInfo's fields on how an LLMEngine runs: what its config resolved to."""
    import torch

    config = engine.config
    lora = engine.adapters is not None
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
        lora_spec=engine.model.lora_spec(engine.base_model_name) if lora else None,
    )
