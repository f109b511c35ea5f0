"""Swap preemption: a preempted sequence's KV blocks wait in CPU memory instead of being dropped."""

from __future__ import annotations

import torch

from loragate.engine.core.block_manager import BlockManager
from loragate.engine.core.sequence import Sequence
from loragate.engine.runner.kv_cache import KVCache


class KVSwapper:
    """A CPU block pool the size of `swap_space`, and the copies in and out of it."""

    def __init__(self, kv_cache: KVCache, block_manager: BlockManager, num_cpu_blocks: int):
        shape = list(kv_cache.data.shape)
        shape[2] = num_cpu_blocks
        pin = kv_cache.data.is_cuda
        self.cpu = torch.zeros(shape, dtype=kv_cache.data.dtype, pin_memory=pin)
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.num_cpu_blocks = num_cpu_blocks
        self.free_cpu_blocks = list(range(num_cpu_blocks))
        self.num_swap_outs = 0
        self.num_swap_ins = 0

    @property
    def num_swapped_blocks(self) -> int:
        return self.num_cpu_blocks - len(self.free_cpu_blocks)

    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= len(self.free_cpu_blocks)

    def swap_out(self, seq: Sequence) -> None:
        n = len(seq.block_table)
        cpu_blocks = [self.free_cpu_blocks.pop() for _ in range(n)]
        src = torch.tensor(seq.block_table, device=self.kv_cache.data.device)
        self.cpu[:, :, cpu_blocks] = self.kv_cache.data[:, :, src].to("cpu")
        self.block_manager.free(seq)
        seq.swapped_blocks = cpu_blocks
        self.num_swap_outs += 1

    def can_swap_in(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Room for its blocks plus those its next `num_new_tokens` need (a sequence swapped
        out mid-prompt comes back with a chunk of several tokens, not one)."""
        bs = self.block_manager.block_size
        total = -(-(seq.num_computed_tokens + num_new_tokens) // bs)
        needed = max(total, len(seq.swapped_blocks))
        return needed <= self.block_manager.num_free_blocks

    def swap_in(self, seq: Sequence) -> None:
        blocks = [self.block_manager.take_free_block() for _ in seq.swapped_blocks]
        dst = torch.tensor(blocks, device=self.kv_cache.data.device)
        self.kv_cache.data[:, :, dst] = self.cpu[:, :, seq.swapped_blocks].to(dst.device)
        self.release(seq)
        self.block_manager.set_table(seq, blocks)
        self.num_swap_ins += 1

    def release(self, seq: Sequence) -> None:
        self.free_cpu_blocks.extend(seq.swapped_blocks)
        seq.swapped_blocks = []
