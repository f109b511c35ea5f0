"""What this CPU's instruction set offers, read from /proc/cpuinfo at run time, never assumed.

The kernels pick their CPU paths from it (lora_segment_gemm.py: AMX tiles or not, float32
products on AVX2 without AVX-512), the engine its default dtype (engine/loading/cpu_features.py:
native bfloat16 or not). Machines differ between runs of the same code: an AMD EPYC with
AVX512-BF16, one with AVX2 only, an Intel Xeon with AMX as well.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
AMX_FLAGS = ("amx_tile", "amx_bf16")  # both: tile registers and their bf16 products
AMX_INT8_FLAGS = ("amx_tile", "amx_int8")  # tile registers and their int8 products
AVX512_BF16_FLAG = "avx512_bf16"
AVX2_FLAGS = ("avx2", "fma")  # 256-bit vectors with fused multiply-add
AVX512F_FLAG = "avx512f"


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first CPU's feature flags (x86 `flags`, Arm `Features`); empty where unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@cache
def this_cpu_flags() -> frozenset[str]:
    """This machine's flags, read once per process (they do not change while it runs)."""
    return cpu_flags()


def has_amx(flags: frozenset[str]) -> bool:
    return all(flag in flags for flag in AMX_FLAGS)


def has_amx_int8(flags: frozenset[str]) -> bool:
    return all(flag in flags for flag in AMX_INT8_FLAGS)


def avx2_without_avx512(flags: frozenset[str]) -> bool:
    """AVX2 and FMA, no AVX-512 (an AMD EPYC of Zen 3 or before, an Intel client core)."""
    return all(flag in flags for flag in AVX2_FLAGS) and AVX512F_FLAG not in flags
