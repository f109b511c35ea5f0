"""Prefill / mixed-batch attention over the paged KV cache (varlen, causal, prefix-aware).

On the CPU, sequences with a short run of new tokens (a short prompt joining a batch, a small
last chunk) go to the native paged kernel (attention_cpu.c) together, each new token as its
own query over the context it may see: no gathered copy of the context, no mask, no
per-sequence ops. Long runs keep torch's SDPA, which reuses each key across many queries.
`_prefill_torch`, torch for every sequence, is the reference both are tested against."""

import torch

from . import _backend
from ._backend import compute_dtype, require, resolve_backend
from ._paged import check_paged_inputs, check_window, gather_context
from .attention_cpu import NativeAttention, native_attention

# Sequences with at most this many new tokens go to the native kernel. Measured on 2 cores
# (9 heads, 3 KV heads, dim 64, both dtypes): native 3.5-6x faster at 8-13 new tokens, about
# even at 32, 2-10x slower from 64 up (it reads each key once per query; SDPA reuses it).
NATIVE_MAX_QUERY_LEN = 16


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    backend: str | None = None,
    *,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention of a flat batch of new tokens over each sequence's paged context.

    q [T, H, D] holds every sequence's new tokens back to back: sequence b owns rows
    query_start_loc[b]:query_start_loc[b + 1] ([B + 1] int32, cumulative). Those q_len tokens
    are the LAST q_len positions of a context of seq_lens[b] tokens, all of whose K/V (the new
    ones included) are already in the cache, so a cached prefix (prefix caching, an earlier
    chunk of a chunked prefill) is attended as well. Returns [T, H, D].

    window > 0 is a sliding window: a query at position p sees keys p - window < k <= p only.
    """
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    check_window(window)
    require(
        query_start_loc.shape == (block_tables.shape[0] + 1,),
        lambda: (
            f"query_start_loc must be [B+1={block_tables.shape[0] + 1}], "
            f"got {tuple(query_start_loc.shape)}"
        ),
    )
    if resolve_backend(backend, q) == "triton":
        from .prefill_attention_triton import prefill_triton

        return prefill_triton(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=window
        )
    return _prefill_cpu(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window)


def check_query_layout(starts: list[int], lens: list[int], num_tokens: int) -> None:
    """Host-side checks of the varlen layout (the Triton path runs them too)."""
    require(starts[0] == 0, lambda: f"query_start_loc must start at 0, got {starts[0]}")
    require(
        starts[-1] == num_tokens,
        lambda: f"query_start_loc ends at {starts[-1]}, q has {num_tokens}",
    )
    for b, (begin, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        if end < begin:
            raise ValueError(f"query_start_loc decreases at sequence {b}")
        if end - begin > lens[b]:
            raise ValueError(
                f"sequence {b} has {end - begin} new tokens but a context of only {lens[b]}"
            )


def _prefill_cpu(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=0):
    """Short runs through the native kernel in one call, the rest through torch."""
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    check_query_layout(starts, lens, q.shape[0])
    native = None
    if NativeAttention.fits(q, k_cache, v_cache, block_tables, seq_lens):
        native = native_attention()
    short = [
        b
        for b in range(len(lens))
        if native is not None and 0 < starts[b + 1] - starts[b] <= NATIVE_MAX_QUERY_LEN
    ]
    out = _backend.empty_output(tuple(q.shape), q)
    if short:
        _attend_short_runs(
            native, out, q, k_cache, v_cache, block_tables, short, starts, lens, scale, window
        )
    skip = set(short)
    for b in range(len(lens)):
        if b not in skip:
            _attend_sequence(out, q, k_cache, v_cache, block_tables, b, starts, lens, scale, window)
    return out


def _attend_short_runs(
    native, out, q, k_cache, v_cache, block_tables, short, starts, lens, scale, window
):
    """Each new token is one decode query: token i of a run of q_len new tokens at the end of
    a context of n sees the first n - q_len + i + 1 positions, through its sequence's table
    (the last ``window`` of them under a sliding window)."""
    rows, owners, visible = [], [], []
    for b in short:
        begin, end = starts[b], starts[b + 1]
        rows.extend(range(begin, end))
        owners.extend([b] * (end - begin))
        first = lens[b] - (end - begin) + 1
        visible.extend(range(first, first + end - begin))
    rows_t = torch.tensor(rows, device=q.device)
    tables = block_tables.index_select(0, torch.tensor(owners, device=q.device))
    seen = torch.tensor(visible, dtype=torch.int32, device=q.device)
    queries = q.index_select(0, rows_t)
    attended = native.decode(queries, k_cache, v_cache, tables, seen, scale, window)
    out.index_copy_(0, rows_t, attended)


def _prefill_torch(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=0):
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    check_query_layout(starts, lens, q.shape[0])
    out = _backend.empty_output(tuple(q.shape), q)
    for b in range(len(lens)):
        _attend_sequence(out, q, k_cache, v_cache, block_tables, b, starts, lens, scale, window)
    return out


def _attend_sequence(
    out, q, k_cache, v_cache, block_tables, b, starts, lens, scale, window=0
) -> None:
    begin, end, context = starts[b], starts[b + 1], lens[b]
    if end == begin:
        return
    q_len = end - begin
    block_size = k_cache.shape[1]
    # Under a sliding window the first query sees nothing before `first`: whole blocks before
    # it are not gathered.
    first = max(0, context - q_len - window + 1) if window else 0
    first_block = first // block_size
    skipped = first_block * block_size
    dtype = compute_dtype(q.dtype)
    table = block_tables[b, first_block : -(-context // block_size)].long()
    length = context - skipped
    keys = gather_context(k_cache, table)[:length].to(dtype).transpose(0, 1)  # [H_kv, L, D]
    values = gather_context(v_cache, table)[:length].to(dtype).transpose(0, 1)
    queries = q[begin:end].to(dtype).transpose(0, 1)  # [H, q_len, D]
    # Query i sits at context position context - q_len + i and sees keys up to there (and,
    # under a window, none at or before context - q_len + i - window).
    visible = torch.ones(q_len, length, dtype=torch.bool, device=q.device).tril(length - q_len)
    if window:
        visible &= ~torch.ones_like(visible).tril(length - q_len - window)
    attended = torch.nn.functional.scaled_dot_product_attention(
        queries.unsqueeze(0),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=visible,
        scale=scale,
        enable_gqa=queries.shape[0] != keys.shape[0],
    )
    out[begin:end] = attended[0].transpose(0, 1).to(q.dtype)
