"""The paged KV cache tensors: per layer [num_blocks, block_size, num_kv_heads, head_dim]."""

from __future__ import annotations

import torch


class KVCache:
    """One allocation for all layers' keys and values; blocks are handed out by the BlockManager."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (2, num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.data = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int) -> KVCache:
        """A cache shaped for `model`'s layers and KV heads, in its dtype and on its device."""
        return cls(
            model.num_layers,
            num_blocks,
            block_size,
            model.num_kv_heads,
            model.head_dim,
            model.dtype,
            model.device,
        )

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[0, i], self.data[1, i]

    @staticmethod
    def bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize
