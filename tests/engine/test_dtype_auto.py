"""dtype="auto" on the CPU reads the CPU's flags: bf16 where it is native (AVX512-BF16, AMX,
Arm BF16), float32 elsewhere; bf16 asked for on a CPU without it runs, with a warning."""

from __future__ import annotations

import logging

import pytest
import torch

from loragate.engine import LLM, SamplingParams
from loragate.engine.api.config import EngineConfig
from loragate.engine.loading.cpu_features import OVERRIDE_ENV, bf16_support, cpu_flags

X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f {extra}\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve {extra}\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (X86.format(extra="avx512_bf16"), True),
        (X86.format(extra="amx_bf16 amx_tile"), True),
        (X86.format(extra="avx512_vnni"), False),
        (ARM.format(extra="bf16 i8mm"), True),
        (ARM.format(extra="i8mm"), False),
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, monkeypatch, text, expected):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    support = bf16_support(cpu_flags(cpuinfo))
    assert support.native is expected
    if expected:
        assert "bf16" in support.reason
    else:
        assert "no native bfloat16" in support.reason


def test_unreadable_cpuinfo_means_no_native_bf16(tmp_path, monkeypatch):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert not bf16_support(cpu_flags(tmp_path / "missing")).native


@pytest.mark.parametrize(("flag", "dtype"), [("1", torch.bfloat16), ("0", torch.float32)])
def test_auto_picks_the_dtype_the_cpu_runs_fastest(monkeypatch, flag, dtype):
    monkeypatch.setenv(OVERRIDE_ENV, flag)
    config = EngineConfig(device="cpu")
    assert config.torch_dtype == dtype
    assert config.dtype_choice[1] == f"auto: {OVERRIDE_ENV}={flag}"
    asked = EngineConfig(device="cpu", dtype="float32")
    assert asked.dtype_choice == (torch.float32, "asked for")


def test_auto_reads_the_real_flags_without_the_override(monkeypatch):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    native = bf16_support(cpu_flags()).native
    assert EngineConfig(device="cpu").torch_dtype == (torch.bfloat16 if native else torch.float32)


def test_a_bad_override_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "yes")
    with pytest.raises(ValueError, match=OVERRIDE_ENV):
        EngineConfig(device="cpu").torch_dtype  # noqa: B018


def test_bf16_without_native_support_runs_with_a_warning(monkeypatch, caplog, tiny_model_dir):
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    with caplog.at_level(logging.WARNING, logger="loragate.engine.core.llm_engine"):
        llm = LLM(str(tiny_model_dir("llama")), dtype="bfloat16", max_model_len=64)
    warned = [r.getMessage() for r in caplog.records if "without native bfloat16" in r.getMessage()]
    assert len(warned) == 1 and "slower than float32" in warned[0]
    greedy = SamplingParams(temperature=0, max_tokens=4)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], greedy)
    assert len(out[0].outputs[0].token_ids) == 4
    assert llm.llm_engine.model.dtype == torch.bfloat16


def test_no_warning_where_bf16_is_native(monkeypatch, caplog, tiny_model_dir):
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="loragate.engine.core.llm_engine"):
        LLM(str(tiny_model_dir("llama")), dtype="bfloat16", max_model_len=64)
    assert not [r for r in caplog.records if "without native bfloat16" in r.getMessage()]
