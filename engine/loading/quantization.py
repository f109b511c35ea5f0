"""How a base's linear weights are held quantized, besides a GGUF file's own block types.

- ``--quantization int8|int4`` (vLLM's on-the-fly options) quantizes a float base (HF
  safetensors) at load: int8 symmetric per output channel (I8_CH), int4 asymmetric in groups
  of 128 along the input (I4_G128; 64 or 32 where a row is not whole groups of 128, as a
  576-wide row: the start log names the block types held). Only the decoder layers' linear
  weights are quantized; embeddings, the output matrix, norms and biases stay float, as vLLM
  leaves them.
- An AWQ or GPTQ checkpoint (4-bit, found from config.json's ``quantization_config``) is
  served as vLLM loads it: its packed integers, zeros and scales repacked into I4_G<group>
  rows (kernels/quant_pack.py), the same values (GPTQ's act-order, desc_act with g_idx,
  holds the inputs sorted by group and takes x's columns in that order). ``--quantization
  awq|gptq`` may name the method a checkpoint has; any other method, bit width or layout is
  refused naming it.

Either way the weight the kernels use is d (q - z) in float32, and that dequantized weight
is the reference: HF transformers with its weights replaced by these values, plus PEFT.
An adapter's view of a base weight (DoRA's norms) is the same dequantized value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from loragate.kernels import QuantizedWeight
from loragate.kernels.quant_dequant import dequantize
from loragate.kernels.quant_int8 import ACTIVATION_QUANTIZATIONS
from loragate.kernels.quant_pack import awq_weight, gptq_weight, quantize_int4, quantize_int8

AT_LOAD = ("int8", "int4")
CHECKPOINT_METHODS = ("awq", "gptq")
QUANTIZATION_CHOICES = (*AT_LOAD, *CHECKPOINT_METHODS)
# The optional fast mode of block-format products (kernels/quant_int8.py).
ACTIVATION_QUANTIZATION_CHOICES = ACTIVATION_QUANTIZATIONS

# The decoder layers' linear weights (Llama-family names, Phi-3's fused ones).
_LINEAR = re.compile(r"\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight$")


def check_activation_quantization(value) -> None:
    """EngineConfig's check: None or one of ACTIVATION_QUANTIZATION_CHOICES."""
    if value is not None and value not in ACTIVATION_QUANTIZATION_CHOICES:
        raise ValueError(
            "activation_quantization must be one of "
            f"{', '.join(ACTIVATION_QUANTIZATION_CHOICES)} (or unset), got {value!r}"
        )


def check_quantization(value) -> None:
    """EngineConfig's check: None or one of QUANTIZATION_CHOICES."""
    if value is not None and value not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)} (or unset), "
            f"got {value!r}"
        )


@dataclass(frozen=True)
class CheckpointQuantization:
    """An AWQ or GPTQ checkpoint's layout, from its quantization_config."""

    method: str  # "awq" | "gptq"
    group_size: int
    zero_offset: int = 0  # GPTQ's "gptq" (v1) format stores each zero less 1
    sym: bool = False
    act_order: bool = False  # GPTQ's desc_act: groups by g_idx, not runs of inputs

    def weight(self, tensors: Callable[[str], torch.Tensor], prefix: str) -> QuantizedWeight:
        """The linear layer ``prefix`` (``...q_proj.``) from its packed tensors."""
        qweight, qzeros, scales = (tensors(prefix + n) for n in ("qweight", "qzeros", "scales"))
        if self.method == "awq":
            return awq_weight(qweight, qzeros, scales, self.group_size)
        g_idx = tensors(prefix + "g_idx") if self.act_order else None
        return gptq_weight(qweight, qzeros, scales, self.group_size, self.zero_offset, g_idx)

    def describe(self) -> str:
        kind = "symmetric" if self.sym else "asymmetric"
        order = ", act-order (g_idx)" if self.act_order else ""
        return f"{self.method} 4-bit, groups of {self.group_size}, {kind}{order}"


def checkpoint_quantization(hf_dir: Path) -> CheckpointQuantization | None:
    """What config.json's quantization_config says, checked; None where it has none."""
    config_file = Path(hf_dir) / "config.json"
    try:
        found = json.loads(config_file.read_text()).get("quantization_config")
    except (OSError, ValueError):
        return None
    if not found:
        return None
    method = str(found.get("quant_method", "")).lower()
    where = f"{config_file}'s quantization_config"
    if method not in CHECKPOINT_METHODS:
        raise ValueError(
            f"quantization method {method!r} in {where} is not supported (supported: "
            f"{', '.join(CHECKPOINT_METHODS)}; --quantization int8|int4 quantizes a float base)"
        )
    bits = found.get("bits", found.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{method} with bits={bits!r} in {where} is not supported (only 4)")
    group = found.get("group_size", found.get("q_group_size"))
    if group not in (32, 64, 128):
        raise ValueError(
            f"{method} with group_size={group!r} in {where} is not supported (32, 64, 128)"
        )
    if method == "awq":
        version = str(found.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(
                f"AWQ version {version!r} in {where} is not supported (only 'gemm' packing)"
            )
        if found.get("zero_point", True) is not True:
            raise ValueError(f"AWQ with zero_point=false in {where} is not supported")
        return CheckpointQuantization("awq", group)
    layout = str(found.get("checkpoint_format", "gptq")).lower()
    if layout not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"GPTQ checkpoint_format {layout!r} in {where} is not supported (gptq, gptq_v2)"
        )
    offset = 1 if layout == "gptq" else 0
    sym, act_order = bool(found.get("sym", True)), bool(found.get("desc_act", False))
    return CheckpointQuantization("gptq", group, offset, sym, act_order)


@dataclass(frozen=True)
class Quantization:
    """How one base is held: ``at_load`` (int8/int4) or ``checkpoint`` (AWQ/GPTQ) or
    neither (float weights, or a GGUF file's blocks)."""

    at_load: str | None = None
    checkpoint: CheckpointQuantization | None = None

    def convert(self, weights: dict) -> dict:
        """The loaded tensors with the decoder layers' linear weights quantized (at load) or
        unpacked from their qweight/qzeros/scales (a checkpoint)."""
        if self.checkpoint is not None:
            return _repacked(weights, self.checkpoint)
        if self.at_load is None:
            return weights
        return {
            name: self.quantize(value) if _LINEAR.search(name) and value.dim() == 2 else value
            for name, value in weights.items()
        }

    def quantize(self, weight: torch.Tensor) -> QuantizedWeight:
        return quantize_int8(weight) if self.at_load == "int8" else quantize_int4(weight)

    def base_weight(self, tensors: Callable[[str], torch.Tensor], name: str) -> torch.Tensor:
        """The float32 weight the kernels multiply by, for the checkpoint tensor ``name``
        (``...q_proj.weight``): what an adapter sees of the base (DoRA's norms)."""
        if self.checkpoint is not None and _LINEAR.search(name):
            return dequantize(self.checkpoint.weight(tensors, name.removesuffix("weight")))
        value = tensors(name).to(torch.float32)
        if self.at_load is not None and _LINEAR.search(name):
            return dequantize(self.quantize(value))
        return value

    def describe(self) -> str:
        if self.checkpoint is not None:
            return f"{self.checkpoint.describe()} (from the checkpoint's quantization_config)"
        if self.at_load == "int8":
            return "int8 at load: symmetric per output channel (I8_CH)"
        if self.at_load == "int4":
            return (
                "int4 at load: asymmetric, groups of 128 along the input (I4_G128; I4_G64 or "
                "I4_G32 where a row is not whole groups of 128)"
            )
        return "none"


def quantization_method(asked: str | None, hf_dir: Path) -> str:
    """How the served base is held, in one word for /v1/models, /metrics and the start log:
    awq, gptq (a checkpoint's), int8, int4 (at load), gguf (a GGUF file's block types) or
    none (float weights)."""
    from loragate.engine.loading.gguf_weights import gguf_weights_source

    found = checkpoint_quantization(hf_dir)
    if found is not None:
        return found.method
    if gguf_weights_source(hf_dir) is not None:
        return "gguf"
    return asked or "none"


def quantization_for(asked: str | None, hf_dir: Path, gguf_blocks: bool = False) -> Quantization:
    """The quantization of the base in ``hf_dir`` given ``--quantization`` ``asked``: a
    checkpoint's own (which ``asked`` may name), or int8/int4 at load of a float base."""
    check_quantization(asked)
    found = checkpoint_quantization(hf_dir)
    if found is not None:
        if asked not in (None, found.method):
            raise ValueError(
                f"--quantization {asked}: the checkpoint in {hf_dir} is already quantized "
                f"with {found.method} (its config.json's quantization_config)"
            )
        return Quantization(checkpoint=found)
    if asked in CHECKPOINT_METHODS:
        raise ValueError(
            f"--quantization {asked}: the checkpoint in {hf_dir} has no {asked} "
            "quantization_config (int8 and int4 quantize a float base at load)"
        )
    if asked is not None and gguf_blocks:
        raise ValueError(
            f"--quantization {asked}: a GGUF base is served in its own block types; "
            "--gguf-dequantize serves it as float32, which --quantization then quantizes"
        )
    return Quantization(at_load=asked)


def _repacked(weights: dict, found: CheckpointQuantization) -> dict:
    out = {}
    for name, value in weights.items():
        if name.endswith(".qweight"):
            prefix = name.removesuffix("qweight")
            out[prefix + "weight"] = found.weight(lambda n: _take(weights, n), prefix)
        elif name.endswith((".qzeros", ".scales", ".g_idx")):
            if name.endswith(".g_idx") and not found.act_order:
                _check_g_idx(value, found.group_size, name)
            continue
        else:
            out[name] = value
    return out


def _take(weights: dict, name: str) -> torch.Tensor:
    if name not in weights:
        raise ValueError(f"the quantized checkpoint lacks tensor {name!r}")
    return weights[name]


def _check_g_idx(g_idx: torch.Tensor, group: int, name: str) -> None:
    """desc_act=false checkpoints may carry a g_idx: it must be the plain grouping."""
    plain = torch.arange(g_idx.numel(), dtype=torch.int64) // group
    if not torch.equal(g_idx.to(torch.int64), plain):
        raise ValueError(
            f"{name} reorders the input columns (act-order), but the quantization_config "
            "says desc_act=false"
        )
