"""Writing new keys and values into the paged KV cache (vLLM's reshape_and_cache)."""

import torch
import triton
import triton.language as tl

from ._backend import require, resolve_backend


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str | None = None,
) -> None:
    """Store key[t]/value[t] at slot slot_mapping[t] = block * block_size + offset.

    key/value [T, H_kv, D]; caches [num_blocks, block_size, H_kv, D]. A negative slot skips the
    token (padding), so a batch can be padded without touching the cache.
    """
    _check(key, value, k_cache, v_cache, slot_mapping)
    if resolve_backend(backend, key) == "triton":
        _write_kv_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        _write_kv_torch(key, value, k_cache, v_cache, slot_mapping)


def _check(key, value, k_cache, v_cache, slot_mapping) -> None:
    require(key.dim() == 3, lambda: f"key must be [T, H_kv, D], got shape {tuple(key.shape)}")
    require(
        value.shape == key.shape,
        lambda: f"value shape {tuple(value.shape)} != key {tuple(key.shape)}",
    )
    require(
        k_cache.dim() == 4,
        lambda: f"k_cache must be [blocks, block_size, H_kv, D], got {k_cache.dim()}-D",
    )
    require(v_cache.shape == k_cache.shape, "k_cache and v_cache shapes differ")
    require(
        k_cache.shape[2:] == key.shape[1:],
        lambda: (
            f"cache heads/dim {tuple(k_cache.shape[2:])} != key heads/dim {tuple(key.shape[1:])}"
        ),
    )
    require(
        slot_mapping.shape == (key.shape[0],),
        lambda: f"slot_mapping must be [T={key.shape[0]}], got {tuple(slot_mapping.shape)}",
    )


def _write_kv_torch(key, value, k_cache, v_cache, slot_mapping) -> None:
    slots = slot_mapping.long()
    if bool((slots < 0).any()):
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    for cache, new in ((k_cache, key), (v_cache, value)):
        new = new.to(cache.dtype)
        if cache.stride(0) == cache.shape[1] * cache.stride(1):
            # Slots index the cache viewed as [num_blocks * block_size, H_kv, D] directly.
            cache.view(-1, *cache.shape[2:])[slots] = new
        else:
            cache[slots // cache.shape[1], slots % cache.shape[1]] = new


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    cache_stride_b,
    cache_stride_o,
    cache_stride_h,
    block_size,
    num_heads,
    head_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (dims < head_dim)
    src_k = key_ptr + token * key_stride_t + heads * key_stride_h + dims
    src_v = value_ptr + token * value_stride_t + heads * value_stride_h + dims
    dst = block * cache_stride_b + offset * cache_stride_o + heads * cache_stride_h + dims
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _write_kv_triton(key, value, k_cache, v_cache, slot_mapping) -> None:
    require(k_cache.stride() == v_cache.stride(), "k_cache and v_cache must share strides")
    require(
        key.stride(2) == 1 and value.stride(2) == 1 and k_cache.stride(3) == 1,
        "the head dimension of key, value and caches must be contiguous",
    )
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        num_heads,
        head_dim,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
