"""Tiny random Llama bases held in loragate's integer formats (issue 59), and their reference.

- ``int_reference``: rows of I8_CH / I4_G* blocks decoded in float64 from the layout
  kernels/quant_blocks.py documents (not from the code under test).
- ``awq_pack`` and ``gptq_pack``: float64 reference packers following the formats as
  AutoAWQ (GEMM: qweight [in, out/8], outputs 0 2 4 6 1 3 5 7 in an int32's nibbles, zero
  point) and GPTQ (qweight [in/8, out], inputs in order; qzeros stored as zero - 1 in the
  "gptq" v1 format; sym: every zero 8) write them, each returning the packed tensors and the
  float64 weights they stand for.
- ``write_quantized_checkpoint``: a random model from its transformers config class saved as
  an AWQ or GPTQ checkpoint (config.json's quantization_config), beside a float32 reference
  directory whose linear weights are the dequantized ones: what HF + PEFT run.

Imported by bare name (tests/ is on sys.path).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from loragate.kernels.quant_blocks import FORMATS
from loragate.tools.base_model import TOKENIZER_FILES

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# up_proj takes a permutation of its own (gate's differs): a fused projection of two orders.
FUSED_LAST = ("up_proj",)
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LINEAR_NAMES += ("qkv_proj", "gate_up_proj")  # Phi-3's fused ones, quantized whole


def int_reference(blocks: np.ndarray, name: str, in_features: int) -> np.ndarray:
    """The weights of rows in an integer format, decoded in float64 from the documented
    layout: w = d q (I8_CH: a float32 d, then int8s) or d (q - z) (I4_G*: d float32, z u8,
    nibbles: byte i holds weight i low and weight i + group/2 high)."""
    fmt = FORMATS[name]
    rows = blocks.shape[0]
    if name == "I8_CH":
        d = blocks[:, :4].copy().view(np.float32).astype(np.float64)
        q = blocks[:, 4:].copy().view(np.int8).astype(np.float64)
        return d * q
    b = blocks.reshape(-1, fmt.block_bytes)
    d = b[:, :4].copy().view(np.float32).astype(np.float64)
    z = b[:, 4:5].astype(np.float64)
    half = fmt.block_size // 2
    q = np.empty((b.shape[0], fmt.block_size))
    for i in range(half):
        q[:, i] = b[:, 5 + i] & 0x0F
        q[:, i + half] = b[:, 5 + i] >> 4
    return (d * (q - z)).reshape(rows, in_features)


def _pack_nibbles(values: np.ndarray, axis_order) -> np.ndarray:
    """uint [..., c, 8] nibbles -> int32 [..., c], nibble i from values[..., axis_order[i]]."""
    packed = np.zeros(values.shape[:-1], dtype=np.uint32)
    for i, j in enumerate(axis_order):
        packed |= (values[..., j].astype(np.uint32) & 0xF) << (4 * i)
    return packed.view(np.int32)


def _groups(w: np.ndarray, group: int, sym: bool):
    """Per group of ``group`` inputs: (scale as float16 stores it, zero, q) in float64."""
    out_features, in_features = w.shape
    g = w.reshape(out_features, in_features // group, group)
    if sym:
        top = np.abs(g).max(axis=2, keepdims=True)
        scale = (2 * top / 15).astype(np.float16).astype(np.float64)
        zero = np.full_like(scale, 8.0)
    else:
        top, bottom = g.max(axis=2, keepdims=True), g.min(axis=2, keepdims=True)
        scale = ((top - bottom) / 15).astype(np.float16).astype(np.float64)
        zero = np.clip(np.round(-bottom / scale), 0, 15)
    q = np.clip(np.round(g / scale) + zero, 0, 15)
    return scale[..., 0], zero[..., 0], q.reshape(out_features, in_features)


def awq_pack(w: np.ndarray, group: int = 128):
    """w float64 [out, in] -> (qweight int32 [in, out/8], qzeros int32 [in/group, out/8],
    scales float16 [in/group, out], the float64 weights they hold [out, in])."""
    scale, zero, q = _groups(w, group, sym=False)
    out_features, in_features = w.shape
    qweight = _pack_nibbles(q.T.reshape(in_features, -1, 8), AWQ_ORDER)
    qzeros = _pack_nibbles(zero.T.reshape(in_features // group, -1, 8), AWQ_ORDER)
    held = np.repeat(scale, group, axis=1) * (q - np.repeat(zero, group, axis=1))
    return qweight, qzeros, np.ascontiguousarray(scale.T.astype(np.float16)), held


def gptq_pack(
    w: np.ndarray,
    group: int = 128,
    sym: bool = True,
    zero_offset: int = 1,
    act_order: np.ndarray | None = None,
):
    """w float64 [out, in] -> (qweight int32 [in/8, out], qzeros int32 [in/group, out/8],
    each stored as zero - ``zero_offset`` (1: the "gptq" v1 format, 0: gptq_v2), scales
    float16 [in/group, out], g_idx int32 [in], the float64 weights a reader of the file gets:
    d (q - (stored zero + offset)), so in v1 a zero of 0, stored as 15, reads as 16, as
    GPTQ's v1 kernels read it). ``act_order``: a permutation of the inputs (desc_act): group
    g holds inputs act_order[g * group ...] and g_idx says each input's group; qweight keeps
    the inputs in their own order."""
    out_features, in_features = w.shape
    perm = np.arange(in_features) if act_order is None else np.asarray(act_order)
    scale, zero, q_sorted = _groups(w[:, perm], group, sym=sym)
    q = np.empty_like(q_sorted)
    q[:, perm] = q_sorted
    g_idx = np.empty(in_features, dtype=np.int32)
    g_idx[perm] = np.arange(in_features) // group
    qweight = _pack_nibbles(
        q.T.reshape(in_features // 8, 8, out_features).transpose(0, 2, 1), range(8)
    )
    stored = (zero - zero_offset).astype(np.int64) & 0xF
    qzeros = _pack_nibbles(stored.T.reshape(in_features // group, -1, 8), range(8))
    read_zero = (stored + zero_offset)[:, g_idx]
    held = scale[:, g_idx] * (q - read_zero)
    return qweight, qzeros, np.ascontiguousarray(scale.T.astype(np.float16)), g_idx, held


def _linear_names(model) -> list[str]:
    return [
        n
        for n, _ in model.named_parameters()
        if n.endswith(".weight") and n.split(".")[-2] in LINEAR_NAMES
    ]


def copy_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, Path(out) / name)


def save_reference(model, held: dict, out: Path, tokenizer_dir: Path) -> Path:
    """The model with the linear weights ``held`` (float64, by name) as float32, saved."""
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in held.items():
            params[name].copy_(torch.from_numpy(value).float())
    model.save_pretrained(out, safe_serialization=True)
    copy_tokenizer(tokenizer_dir, out)
    return Path(out)


def write_quantized_checkpoint(
    model, method: str, out: Path, reference: Path, tokenizer_dir: Path, **options
) -> tuple[Path, Path]:
    """``model`` (a float32 HF model) as an ``awq`` or ``gptq`` checkpoint in ``out``
    (options: group, sym, checkpoint_format, desc_act), and its float32 reference."""
    group = options.get("group", 128)
    sym = options.get("sym", True)
    tensors = {n: p.detach().clone().contiguous() for n, p in model.state_dict().items()}
    held = {}
    for name in _linear_names(model):
        w = tensors.pop(name).double().numpy()
        prefix = name.removesuffix("weight")
        if method == "awq":
            qweight, qzeros, scales, held[name] = awq_pack(w, group)
        else:
            offset = 1 if options.get("checkpoint_format", "gptq") == "gptq" else 0
            order = None
            if options.get("desc_act"):  # one permutation per input: q/k/v share theirs
                rng = np.random.default_rng(w.shape[1] + (name.split(".")[-2] in FUSED_LAST))
                order = rng.permutation(w.shape[1])
            qweight, qzeros, scales, g_idx, held[name] = gptq_pack(w, group, sym, offset, order)
            tensors[prefix + "g_idx"] = torch.from_numpy(g_idx)
        tensors[prefix + "qweight"] = torch.from_numpy(qweight)
        tensors[prefix + "qzeros"] = torch.from_numpy(qzeros)
        tensors[prefix + "scales"] = torch.from_numpy(scales)
    out.mkdir(parents=True, exist_ok=True)
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"))
    if method == "awq":
        quant = {"quant_method": "awq", "bits": 4, "group_size": group}
        quant.update(zero_point=True, version=options.get("version", "gemm"))
    else:
        quant = {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": sym}
        quant.update(
            desc_act=options.get("desc_act", False),
            checkpoint_format=options.get("checkpoint_format", "gptq"),
        )
    model.config.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {**quant, **options.get("extra", {})}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    copy_tokenizer(tokenizer_dir, out)
    return out, save_reference(model, held, reference, tokenizer_dir)
