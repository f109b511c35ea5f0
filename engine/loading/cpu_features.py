"""Whether this CPU computes bfloat16 natively, which decides the CPU's default dtype.

With AVX512-BF16 or AMX (x86) or BF16 (Arm) bf16 matmuls run about four times float32 on the
machines we measured; without them torch emulates bf16 and it is slower than float32. So
`dtype="auto"` picks bf16 only where the flags say so, as vLLM's CPU backend does. Read from
/proc/cpuinfo, never assumed; `LORAGATE_CPU_BF16=0|1` overrides the reading (an operator
pinning float32 on a bf16 machine, or a test suite that compares with float32 references).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from loragate.kernels.cpu_isa import cpu_flags

log = logging.getLogger(__name__)

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 flags; Arm's "Features" bf16
OVERRIDE_ENV = "LORAGATE_CPU_BF16"


@dataclass(frozen=True)
class Bf16Support:
    native: bool
    reason: str  # what the start-up log says after the dtype


def bf16_support(flags: frozenset[str] | None = None) -> Bf16Support:
    override = os.environ.get(OVERRIDE_ENV, "").strip()
    if override in ("0", "1"):
        native = override == "1"
        return Bf16Support(native, f"{OVERRIDE_ENV}={override}")
    if override:
        raise ValueError(f"{OVERRIDE_ENV} must be 0 or 1, got {override!r}")
    found = [f for f in NATIVE_BF16_FLAGS if f in (cpu_flags() if flags is None else flags)]
    if found:
        return Bf16Support(True, f"the CPU has {', '.join(found)}")
    return Bf16Support(False, "the CPU has no native bfloat16 (no avx512_bf16, amx_bf16 or bf16)")


def warn_if_emulated_bf16(device, dtype) -> None:
    """bf16 asked for on a CPU that only emulates it runs, but slower than float32."""
    if device.type == "cpu" and dtype == torch.bfloat16:
        support = bf16_support()
        if not support.native:
            log.warning(
                "dtype bfloat16 on a CPU without native bfloat16 (%s): it runs, but slower "
                "than float32; dtype='auto' would pick float32 here",
                support.reason,
            )
