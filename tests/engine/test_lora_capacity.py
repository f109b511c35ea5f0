"""engine/lora/lora_capacity.py: where the operator names no counts, a GPU keeps 8 slots and 64
adapters in the CPU tier, and a CPU, whose slots borrow the tier's rows, as many adapters
as a quarter of its available memory holds, every one of them batchable; said in the start
log. Given counts are kept."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_llama import HF_INIT_NAME, hf_init_tiny_model

from loragate.adapters.tier_budget import unit_bytes
from loragate.engine import LLM
from loragate.engine.api.config import EngineConfig
from loragate.engine.lora.lora_capacity import (
    CPU_MAX_ADAPTERS,
    CPU_MIN_ADAPTERS,
    available_memory,
    lora_capacity,
)
from loragate.engine.models.llama import lora_spec

CPU, GPU = torch.device("cpu"), torch.device("cuda")
GIB = 1 << 30


@pytest.fixture(scope="module")
def spec():
    return lora_spec(hf_init_tiny_model().config, HF_INIT_NAME)


def config(**kw) -> EngineConfig:
    return EngineConfig(enable_lora=True, device="cpu", **kw)


def test_a_gpu_keeps_few_slots(spec):
    got = lora_capacity(config(), spec, GPU, torch.bfloat16)
    assert (got.max_loras, got.max_cpu_loras) == (8, 64)
    got = lora_capacity(config(max_loras=100), spec, GPU, torch.bfloat16)
    assert (got.max_loras, got.max_cpu_loras) == (100, 100), "the tier holds every slot's"
    got = lora_capacity(config(max_cpu_loras=4), spec, GPU, torch.bfloat16)
    assert (got.max_loras, got.max_cpu_loras) == (4, 4)


def test_a_cpu_sizes_both_from_memory(spec):
    unit = unit_bytes(spec, 16, torch.float32)
    memory = 4000 * unit  # a quarter of it holds 1000 adapters of max rank
    got = lora_capacity(config(), spec, CPU, torch.float32, memory=memory)
    assert (got.max_loras, got.max_cpu_loras) == (1000, 1000)
    assert "sized from memory" in got.describe() and "rank 16" in got.reason
    halved = lora_capacity(config(max_lora_rank=8), spec, CPU, torch.float32, memory=memory)
    assert 1800 < halved.max_cpu_loras <= 2000, "rank-8 adapters take about half the room"
    bf16 = lora_capacity(config(), spec, CPU, torch.bfloat16, memory=memory)
    assert 1800 < bf16.max_cpu_loras <= 2000, "bf16 rows take half of float32's"
    low = lora_capacity(config(), spec, CPU, torch.float32, memory=unit)
    assert low.max_cpu_loras == CPU_MIN_ADAPTERS
    high = lora_capacity(config(), spec, CPU, torch.float32, memory=10**6 * unit)
    assert high.max_cpu_loras == CPU_MAX_ADAPTERS


def test_given_counts_are_kept(spec):
    memory = 4000 * unit_bytes(spec, 16, torch.float32)
    both = lora_capacity(config(max_loras=3, max_cpu_loras=5), spec, CPU, torch.float32, memory)
    assert (both.max_loras, both.max_cpu_loras, both.reason) == (3, 5, "as configured")
    slots = lora_capacity(config(max_loras=2000), spec, CPU, torch.float32, memory)
    assert (slots.max_loras, slots.max_cpu_loras) == (2000, 2000)
    tier = lora_capacity(config(max_cpu_loras=7), spec, CPU, torch.float32, memory)
    assert (tier.max_loras, tier.max_cpu_loras) == (7, 7)
    with pytest.raises(ValueError, match="max_cpu_loras \\(2\\) must be >= max_loras \\(4\\)"):
        config(max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="max_loras must be a positive number"):
        config(max_loras=0)


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    assert available_memory(meminfo) == 20000000 * 1024
    assert available_memory(tmp_path / "missing") == 0
    assert available_memory() > GIB, "this machine's own"


def _sized_from_memory(tiny_model_dir) -> LLM:
    """A tiny LoRA engine given no LoRA counts."""
    return LLM(
        model=str(tiny_model_dir("llama")),
        enable_lora=True,
        dtype="float32",
        max_model_len=128,
        kv_cache_memory_gb=0.05,
    )


def test_the_engine_sizes_its_slots_and_says_so(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="loragate.engine.core.llm_engine"):
        llm = _sized_from_memory(tiny_model_dir)
    engine = llm.llm_engine
    said = [r.getMessage() for r in caplog.records if "sized from memory" in r.getMessage()]
    assert said, "the start log names the counts and how they were chosen"
    slots, tier = engine.config.max_loras, engine.config.max_cpu_loras
    assert slots == tier >= CPU_MIN_ADAPTERS, "every resident adapter may be in a batch"
    assert f"{slots} slots, {tier} in the CPU tier" in said[0]
    assert engine.residency.max_loras == slots


def test_the_kv_cache_is_sized_once_the_slots_exist(tiny_model_dir, monkeypatch):
    """On a GPU the slots' stacks are allocated with the residency and the KV budget counts
    the memory in use, so the residency comes first (else the KV cache takes the memory the
    slots then need)."""
    from loragate.engine.core import llm_engine

    seen = []
    sized = llm_engine.sizing.num_kv_blocks

    def num_kv_blocks(config, model, max_model_len):
        seen.append(config.max_loras)
        return sized(config, model, max_model_len)

    monkeypatch.setattr(llm_engine.sizing, "num_kv_blocks", num_kv_blocks)
    llm = _sized_from_memory(tiny_model_dir)
    # max_loras None: sized from memory with the residency, before the KV cache
    slots = llm.llm_engine.residency.max_loras
    assert seen == [slots], "the KV cache was sized before the slots were made"
