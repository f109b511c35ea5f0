"""Shared checks and helpers for attention over the paged KV cache."""

import torch

from ._backend import require


def check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens) -> None:
    require(q.dim() == 3, lambda: f"q must be [tokens, H, D], got shape {tuple(q.shape)}")
    require(
        k_cache.dim() == 4 and v_cache.shape == k_cache.shape,
        "k_cache and v_cache must both be [num_blocks, block_size, H_kv, D]",
    )
    heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[2]
    require(
        k_cache.shape[3] == head_dim, lambda: f"cache head_dim {k_cache.shape[3]} != q's {head_dim}"
    )
    require(
        heads % kv_heads == 0,
        lambda: f"query heads {heads} must be a multiple of KV heads {kv_heads} (GQA)",
    )
    require(
        block_tables.dim() == 2,
        lambda: f"block_tables must be [B, max_blocks], got {block_tables.dim()}-D",
    )
    require(
        seq_lens.shape == (block_tables.shape[0],),
        lambda: f"seq_lens must be [B={block_tables.shape[0]}], got {tuple(seq_lens.shape)}",
    )


def check_window(window: int) -> None:
    """A sliding window is a count of positions; 0 means the whole context."""
    require(
        isinstance(window, int) and not isinstance(window, bool) and window >= 0,
        lambda: f"window must be an int >= 0 (0: no sliding window), got {window!r}",
    )


def gather_context(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """cache[table] laid out as one contiguous context: [..., blocks * block_size, H_kv, D]."""
    gathered = cache[table]
    return gathered.flatten(-4, -3)
