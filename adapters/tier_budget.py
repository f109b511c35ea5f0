"""What an adapter weighs in the CPU tier and in the device slots, and what each tier holds.

Adapters differ a hundredfold in size: a plain LoRA of rank 8 and one carrying whole copies
of ``embed_tokens`` and ``lm_head`` (``modules_to_save``; a 135M model's embedding alone is
28M parameters) are both "one adapter". So each tier counts bytes as well as adapters: it
holds at most its count of adapters (``max_cpu_loras``, ``max_loras``) and at most its byte
budget (``max_cpu_lora_bytes``, ``max_lora_bytes``). By default the budget is room for that
count of the largest adapters on the layers alone (``unit_bytes``: rank ``max_lora_rank`` on
every module, with DoRA's magnitude and a lora_B bias), one of which may instead be the
largest vocabulary-side adapter (``largest_bytes``: whole copies of the embedding and the
output matrix and LoRA on both): so every adapter the loader accepts fits a tier alone, and
adapters on the layers fit exactly as many as before, while a second adapter carrying whole
matrices takes the room of as many plain ones as its bytes need, and eviction frees that
much. An adapter larger than a whole tier (only where a budget is set lower, or one with
trainable tokens besides whole copies) is refused (AdapterTooLargeError, a 4xx), naming the
sizes.

Bytes are the memory the tier holds for the adapter: in the CPU tier its tensors as loaded
(layers' LoRA in the stacks' dtype, DoRA scales and biases and the vocabulary side in
float32); in the slots its rows in the slots' dtype (a slot's own rows: at most one unit),
DoRA scales and biases in float32, and the vocabulary side as the slots keep it
(VocabExtras.to: saved matrices and trainable rows in the slots' dtype, LoRA factors float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loragate.adapters.errors import AdapterTooLargeError
from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.vocab_extras import VocabExtras

FLOAT32 = 4  # DoRA scales, biases and vocabulary LoRA factors are kept in float32


def unit_bytes(spec: LoRAModelSpec, max_rank: int, dtype: torch.dtype) -> int:
    """The largest adapter on the layers alone: A and B of rank ``max_rank`` on every module
    of every layer in ``dtype``, plus a DoRA scale and a lora_B bias per output (float32)."""
    itemsize = dtype.itemsize
    per_layer = sum(
        max_rank * (d_in + d_out) * itemsize + 2 * d_out * FLOAT32
        for d_in, d_out in spec.modules.values()
    )
    return spec.num_layers * per_layer


def largest_bytes(
    spec: LoRAModelSpec, max_rank: int, dtype: torch.dtype, table_dtype: torch.dtype
) -> int:
    """``unit_bytes`` plus whole copies of the embedding and the output matrix (in
    ``table_dtype``) and a LoRA of rank ``max_rank`` on each (float32)."""
    vocab, hidden = spec.vocab_size, spec.hidden_size
    tables = 2 * vocab * hidden * table_dtype.itemsize
    loras = 2 * max_rank * (vocab + hidden) * FLOAT32
    return unit_bytes(spec, max_rank, dtype) + tables + loras


def vocab_bytes(vocab: VocabExtras | None, dtype: torch.dtype | None = None) -> int:
    """The vocabulary side's bytes: as held (``dtype`` None) or as ``VocabExtras.to(dtype)``
    makes it."""
    if vocab is None:
        return 0
    if dtype is None:
        return sum(t.nbytes for t in vocab.tensors)
    total = 0
    for table in (vocab.embed_table, vocab.head_table, vocab.token_rows):
        if table is not None:
            total += table.numel() * dtype.itemsize
    if vocab.token_ids is not None:
        total += vocab.token_ids.numel() * 8
    for lora in (vocab.embed_lora, vocab.head_lora):
        if lora is not None:
            total += (lora[0].numel() + lora[1].numel()) * FLOAT32
    return total


def cpu_bytes(adapter: LoRAAdapter) -> int:
    """What ``adapter`` holds in CPU memory. Stacked modules' per-layer weights are views of
    the stacks, so each byte counts once."""
    layers = sum(a.nbytes + b.nbytes for a, b in adapter.weights.values())
    rows = sum(t.nbytes for t in (*adapter.row_scales.values(), *adapter.row_biases.values()))
    return layers + rows + vocab_bytes(adapter.vocab)


def slot_bytes(adapter: LoRAAdapter, dtype: torch.dtype) -> int:
    """What ``adapter`` takes in a device slot whose rows are ``dtype``."""
    layers = sum(a.numel() + b.numel() for a, b in adapter.weights.values()) * dtype.itemsize
    rows = sum(
        t.numel() * FLOAT32 for t in (*adapter.row_scales.values(), *adapter.row_biases.values())
    )
    return layers + rows + vocab_bytes(adapter.vocab, dtype)


@dataclass(frozen=True)
class TierBudget:
    """One tier's limits: ``count`` adapters and ``limit`` bytes of them (by default room for
    ``count - 1`` adapters of ``unit`` bytes and one of ``largest``). The options name the
    settings that raise them, for errors."""

    tier: str  # "CPU tier" or "device slots"
    count: int
    count_option: str
    unit: int
    largest: int
    limit: int
    bytes_option: str

    @classmethod
    def make(
        cls,
        tier: str,
        count: int,
        count_option: str,
        unit: int,
        largest: int,
        limit: int | None,
        bytes_option: str,
    ) -> TierBudget:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ValueError(f"{bytes_option} must be an int >= 1, got {limit!r}")
        if limit is not None and limit < 1:
            raise ValueError(f"{bytes_option} must be an int >= 1, got {limit!r}")
        default = (count - 1) * unit + max(unit, largest)
        return cls(
            tier,
            count,
            count_option,
            unit,
            largest,
            default if limit is None else limit,
            bytes_option,
        )

    def fits(self, adapters: int, used: int, size: int) -> bool:
        """Whether one more adapter of ``size`` bytes fits beside ``adapters`` of ``used``."""
        return adapters + 1 <= self.count and used + size <= self.limit

    def check(self, name: str, size: int, path=None) -> None:
        """Refuse an adapter that would not fit in this tier even alone."""
        if size <= self.limit:
            return
        raise AdapterTooLargeError(
            f"adapter {name!r} takes {_size(size)} ({size} bytes) in the {self.tier}, which "
            f"hold {_size(self.limit)} ({self.limit} bytes: {self._how()}); raise "
            f"{self.bytes_option}",
            path=path,
            field="size_bytes",
            size=size,
            limit=self.limit,
        )

    def _how(self) -> str:
        if self.limit != (self.count - 1) * self.unit + max(self.unit, self.largest):
            return f"{self.bytes_option}"
        return (
            f"{self.count_option} {self.count} adapters of {_size(self.unit)} on the layers "
            f"alone at max_lora_rank, one of which may be one of {_size(self.largest)} with "
            "whole embedding and output matrices"
        )


def _size(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
