"""Float64 references for the kernel tests, written plainly (loops, no paging tricks)."""

import torch

CUDA = torch.cuda.is_available()
BACKENDS = ["torch", "triton"]


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (NaN anywhere in actual fails the check)."""
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    if torch.isnan(actual).any():
        return float("inf")
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def context_rows(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached rows of one sequence, [length, H_kv, D], by plain indexing."""
    block_size = cache.shape[1]
    positions = torch.arange(length, device=table_row.device)
    return cache[table_row[positions // block_size].long(), positions % block_size]


def attention_reference(q, keys, values, scale, q_positions, window=0):
    """q [n, H, D] at context positions q_positions attends keys/values [L, H_kv, D] causally
    (and, with a sliding window, only keys at positions p - window < k <= p)."""
    q, keys, values = q.double(), keys.double(), values.double()
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, keys) * scale
    positions = torch.arange(keys.shape[0], device=keys.device)
    at = torch.as_tensor(q_positions, device=keys.device)[:, None]
    visible = positions[None, :] <= at
    if window:
        visible &= positions[None, :] > at - window
    keys, values = keys.nan_to_num(), values.nan_to_num()  # poisoned rows out of the window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values)


def build_paged_cache(seq_lens, heads_kv, head_dim, block_size, dtype=torch.float32, device=None):
    """Random caches holding each sequence's context in shuffled blocks; every other slot NaN.

    Returns k_cache, v_cache, block_tables (unused entries hold an out-of-range block id).
    `device=None` is torch's default device (CUDA while a Triton-backend test runs on a GPU).
    """
    device = device or torch.get_default_device()
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    shape = (num_blocks, block_size, heads_kv, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    width = max(blocks_per_seq) + 2
    block_tables = torch.full(
        (len(seq_lens), width), num_blocks + 1000, dtype=torch.int32, device="cpu"
    )
    free = torch.randperm(num_blocks, device="cpu").tolist()
    for b, (n, count) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        for i in range(count):
            block = free.pop()
            block_tables[b, i] = block
            filled = min(block_size, n - i * block_size)
            shape = (filled, heads_kv, head_dim)
            k_cache[block, :filled] = torch.randn(shape, dtype=dtype, device=device)
            v_cache[block, :filled] = torch.randn(shape, dtype=dtype, device=device)
    return k_cache, v_cache, block_tables.to(device)


def lora_shrink_reference(x, lora_a, slot_ids):
    y = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float64)
    for t, slot in enumerate(slot_ids.tolist()):
        if slot >= 0:
            y[t] = lora_a[slot].double().cpu() @ x[t].double().cpu()
    return y


def lora_expand_reference(y, lora_b, slot_ids, scales, out):
    result = out.double().cpu().clone()
    for t, slot in enumerate(slot_ids.tolist()):
        if slot >= 0:
            result[t] += float(scales[slot]) * (lora_b[slot].double().cpu() @ y[t].double().cpu())
    return result
