"""write_kv stores each token's K/V at its slot, skips negative slots, touches nothing else."""

import pytest
import torch
from kernel_reference import BACKENDS

from loragate import kernels


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads_kv,head_dim", [(1, 64), (3, 128)])
def test_write_kv_matches_reference(backend, block_size, heads_kv, head_dim):
    num_blocks, tokens = 5, 23
    shape = (num_blocks, block_size, heads_kv, head_dim)
    k_cache, v_cache = torch.randn(shape), torch.randn(shape)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    key, value = torch.randn(tokens, heads_kv, head_dim), torch.randn(tokens, heads_kv, head_dim)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[2, 9, 22]] = torch.tensor([-1, -7, -1])
    kernels.write_kv(key, value, k_cache, v_cache, slots, backend=backend)

    expected_k, expected_v = k_before.clone(), v_before.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = key[t]
            expected_v[slot // block_size, slot % block_size] = value[t]
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_kv_strided_key_from_fused_qkv(backend):
    """K and V are column slices of one fused qkv projection output."""
    heads_kv, head_dim, tokens = 2, 64, 7
    qkv = torch.randn(tokens, (4 + 2 * heads_kv) * head_dim)
    key = qkv[:, 4 * head_dim : 6 * head_dim].view(tokens, heads_kv, head_dim)
    value = qkv[:, 6 * head_dim :].view(tokens, heads_kv, head_dim)
    k_cache, v_cache = (
        torch.randn(2, 16, heads_kv, head_dim),
        torch.randn(2, 16, heads_kv, head_dim),
    )
    slots = torch.arange(3, 3 + tokens)
    kernels.write_kv(key, value, k_cache, v_cache, slots, backend=backend)
    assert torch.equal(k_cache.view(32, heads_kv, head_dim)[3 : 3 + tokens], key)
    assert torch.equal(v_cache.view(32, heads_kv, head_dim)[3 : 3 + tokens], value)


def test_write_kv_rejects_mismatched_shapes():
    cache = torch.zeros(2, 16, 2, 64)
    with pytest.raises(ValueError, match="cache heads/dim"):
        kernels.write_kv(
            torch.zeros(3, 2, 32), torch.zeros(3, 2, 32), cache, cache.clone(), torch.arange(3)
        )
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.write_kv(
            torch.zeros(3, 2, 64), torch.zeros(3, 2, 64), cache, cache.clone(), torch.arange(4)
        )


def test_unknown_backend_is_a_value_error():
    cache = torch.zeros(2, 16, 2, 64)
    with pytest.raises(ValueError, match="unknown kernel backend 'cuda'"):
        kernels.write_kv(
            torch.zeros(1, 2, 64), torch.zeros(1, 2, 64), cache, cache, torch.zeros(1), "cuda"
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_kv_into_interleaved_caches(backend):
    """K and V caches that are views of one [blocks, 2, block_size, H_kv, D] allocation."""
    storage = torch.randn(4, 2, 16, 2, 64)
    k_cache, v_cache = storage[:, 0], storage[:, 1]
    before = storage.clone()
    key, value = torch.randn(5, 2, 64), torch.randn(5, 2, 64)
    slots = torch.tensor([0, 17, -1, 63, 40])
    kernels.write_kv(key, value, k_cache, v_cache, slots, backend=backend)
    expected = before.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // 16, 0, slot % 16] = key[t]
            expected[slot // 16, 1, slot % 16] = value[t]
    assert torch.equal(storage, expected)
