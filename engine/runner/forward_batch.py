"""The explicit batch object one forward pass runs on: no globals between runner and model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class PrefillAttention:
    """Sequences that add several tokens this step (prompts, chunks, recomputes)."""

    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32, context length after this step
    query_start_loc: torch.Tensor  # [B + 1] int32, offsets of each sequence's new tokens
    num_tokens: int


@dataclass
class DecodeAttention:
    """Sequences that add exactly one token this step."""

    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32


class LoRAWeights(Protocol):
    """What the model reads of the adapters: the device slots' stacked tensors per layer
    (adapters/slots.py), never the cache that decides what is in them."""

    scales: torch.Tensor

    def module_weights(
        self, layer: int, group: str, rank: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, slice], ...]: ...

    def ready(self, layer: int) -> None:
        """Called before the forward reads ``layer``'s slots: waits for their copies."""


@dataclass
class LoRABatch:
    """Per-token adapter slots (-1 = base model) and the slot stacks to read."""

    weights: LoRAWeights
    slot_ids: torch.Tensor  # [T] int64
    index: Any  # kernels.lora_index(...) result, computed once per step
    rank: int  # largest resident rank: the padding beyond it is skipped
    # The LoRA kernels' backend (None: Triton on CUDA, torch and the native loops on a CPU);
    # "triton" on a CPU only for DecodeGraphs' kept static batch (the CPU tests).
    backend: str | None = None


@dataclass
class ForwardBatch:
    """One flat batch: prefill tokens first, then decode tokens."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] int64, where each new K/V goes in the paged cache
    prefill: PrefillAttention | None
    decode: DecodeAttention | None
    sample_indices: torch.Tensor  # [N] rows of the batch whose logits are sampled
    lora: LoRABatch | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
