"""What the engine tells its callers about itself: the model it serves, and one snapshot of
its state for metrics. Both are plain data, copied on the engine thread, so a caller never
reads engine state while a step changes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelInfo:
    """The served model, as requests see it. `tokenizer` is the engine's own (read-only)."""

    served_name: str
    base_model_name: str
    max_model_len: int
    max_num_seqs: int
    lora_enabled: bool
    tokenizer: Any = field(repr=False, compare=False)


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
