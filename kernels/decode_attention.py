"""Decode attention over the paged KV cache: one new query token per sequence.

On the CPU the torch backend runs the native kernel (attention_cpu.py) where it was built and
takes the tensors; `_decode_torch` is the reference it is tested against and the fallback."""

import torch

from ._backend import compute_dtype, require, resolve_backend
from ._paged import check_paged_inputs, check_window
from .attention_cpu import NativeAttention, native_attention


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    backend: str | None = None,
    *,
    window: int = 0,
) -> torch.Tensor:
    """Attention of each sequence's single query over its whole cached context.

    q [B, H, D]; caches [num_blocks, block_size, H_kv, D]; block_tables [B, max_blocks] int32;
    seq_lens [B] int32 counts the context including the new token (already written to the
    cache), so every seq_len is >= 1. Entries of block_tables past a sequence's last block are
    never read. GQA: query head h reads KV head h // (H // H_kv). Returns [B, H, D].

    window > 0 is a sliding window: the query at position p sees keys at positions
    p - window < k <= p only (HF's sliding-window mask), so only the last ``window`` positions
    of each context are read.
    """
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    check_window(window)
    require(
        q.shape[0] == block_tables.shape[0],
        lambda: f"q has {q.shape[0]} sequences, block_tables {block_tables.shape[0]}",
    )
    if resolve_backend(backend, q) == "triton":
        from .decode_attention_triton import decode_triton

        return decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, window=window)
    native = _native(q, k_cache, v_cache, block_tables, seq_lens)
    if native is not None:
        return native.decode(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
    return _decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale, window)


def _native(q, k_cache, v_cache, block_tables, seq_lens):
    """The native CPU kernel (attention_cpu.py) where it takes these tensors and was built."""
    if q.shape[0] == 0 or not NativeAttention.fits(q, k_cache, v_cache, block_tables, seq_lens):
        return None
    return native_attention()


def _decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale, window=0) -> torch.Tensor:
    batch, heads, head_dim = q.shape
    if batch == 0:
        return q.new_empty(0, heads, head_dim)
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    lens = seq_lens.long()
    shortest, longest = torch.stack([lens.min(), lens.max()]).tolist()
    num_blocks = -(-longest // block_size)
    context = num_blocks * block_size
    # Only the first ceil(len / block_size) entries of a row are meaningful; the rest may be
    # padding of any value, so they are pointed at block 0 and masked out below.
    used = (
        torch.arange(num_blocks, device=q.device) < (lens[:, None] + block_size - 1) // block_size
    )
    table = torch.where(used, block_tables[:, :num_blocks].long(), 0).flatten()
    shape = (batch, context, kv_heads, head_dim)
    dtype = compute_dtype(q.dtype)
    keys = k_cache.index_select(0, table).view(shape).to(dtype)
    values = v_cache.index_select(0, table).view(shape).to(dtype)
    hidden = torch.arange(context, device=q.device) >= lens[:, None]  # [B, L]
    if window > 0:
        hidden |= torch.arange(context, device=q.device) < lens[:, None] - window
    queries = q.to(dtype).view(batch, kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(queries, keys.permute(0, 2, 3, 1))  # [B, H_kv, G, L]
    # masked_fill also replaces NaN that stale cache slots past a sequence's end may hold.
    scores = scores.masked_fill_(hidden[:, None, None, :], float("-inf")).mul_(scale)
    # A zero probability times a NaN value is still NaN: zero the values past each end
    # (only positions past the shortest sequence can be hidden).
    if window > 0:  # positions before a window hide values too
        values.masked_fill_(hidden[:, :, None, None], 0)
    else:
        values[:, shortest:].masked_fill_(hidden[:, shortest:, None, None], 0)
    out = torch.matmul(scores.softmax(-1), values.transpose(1, 2))  # [B, H_kv, G, D]
    return out.reshape(batch, heads, head_dim).to(q.dtype)
