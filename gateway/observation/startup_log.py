"""What the server logs before it listens: how the engine resolved its settings, so an
operator sees at a glance what this process serves and with how much memory. One line per
item, always in this order (a test reads them)."""

from __future__ import annotations

import logging

from loragate.engine import ModelInfo

log = logging.getLogger("loragate.startup")


def startup_lines(info: ModelInfo, registry: str) -> list[str]:
    kv_tokens = info.num_kv_blocks * info.block_size
    if info.lora_enabled:
        lora = (
            f"LoRA: on, {info.max_loras} device slots, max rank {info.max_lora_rank}, "
            f"{info.max_cpu_loras} adapters in CPU memory"
        )
    else:
        lora = "LoRA: off"
    return [
        f"model: {info.served_name} (base {info.base_model_name})",
        f"dtype: {info.dtype}" + (f" ({info.dtype_reason})" if info.dtype_reason else ""),
        f"weights: {weight_line(info)}",
        f"device: {info.device}",
        f"threads: {info.threads}",
        f"KV cache: {info.num_kv_blocks} blocks of {info.block_size} tokens ({kv_tokens} tokens)",
        f"max_model_len: {info.max_model_len}, max_num_seqs: {info.max_num_seqs}",
        lora,
        f"prefix caching: {'on' if info.prefix_caching else 'off'}",
        f"plugins: {', '.join(info.plugins) or 'none'}",
        f"registry: {registry}",
    ]


def weight_line(info: ModelInfo) -> str:
    """``int4: I4_G128 1.2 MB, float32 25.3 MB`` (quantization, then bytes per type)."""
    held = ", ".join(f"{kind} {size / 1e6:.1f} MB" for kind, size in info.weight_bytes)
    return f"{info.quantization or 'none'}: {held or 'no tensors counted'}"


def log_startup(info: ModelInfo, registry: str) -> None:
    for line in startup_lines(info, registry):
        log.info("%s", line)


def registry_description(where: str) -> str:
    """'in-memory (this process only)' or 'Redis at <url without password>'."""
    if where in ("", "memory"):
        return "in-memory (this process only)"
    return f"Redis at {where}"
