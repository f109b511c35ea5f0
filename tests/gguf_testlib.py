"""Tiny random Llama models written as GGUF files in llama.cpp's block types, and the
float32 HF directory transformers makes of the same file (the reference: HF loading the
GGUF dequantized to float32, then PEFT on top).

Types the `gguf` package quantizes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are quantized from random
float weights; the k-quants (Q4_K, Q5_K, Q6_K), which it only dequantizes, are random blocks
whose scales give weights of the same size. The shape has rows of 256 weights, whole blocks
of every type. Imported by bare name (tests/ is on sys.path).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_llama import CHAT_TEMPLATE, MERGES, SPECIAL_TOKENS, _byte_tokens

SHAPE = dict(hidden=256, ffn=512, layers=2, heads=4, kv_heads=2)
QUANTIZED_BY_GGUF = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
# A Q4_K_M-like mix: the value and down projections in Q6_K, the rest Q4_K.
MIXED = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}


def k_quant_blocks(name: str, rows: int, cols: int, rng) -> np.ndarray:
    """Random k-quant blocks, [rows, row_bytes], weights about cols**-0.5 in size."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[name]
    block, size = GGML_QUANT_SIZES[qtype]
    count = rows * cols // block
    blocks = rng.integers(0, 256, (count, size), dtype=np.uint8)
    spread = cols**-0.5 * rng.uniform(0.5, 1.5, (count, 1))
    if name == "Q6_K":  # d * scale (int8) * (q - 32)
        blocks[:, 208:210] = (spread / (64 * 16)).astype(np.float16).view(np.uint8)
    else:  # d * scale (0-63) * q - dmin * min (0-63): centred on average
        top = 15 if name == "Q4_K" else 31
        d = spread / (31 * top / 2)
        blocks[:, 0:2] = d.astype(np.float16).view(np.uint8)
        blocks[:, 2:4] = (d * top / 2).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


# Qwen3's GGUF metadata carries no head_dim that transformers reads: it takes its default
# (128), so the qwen3 model is wider.
ARCH_SHAPES = {"llama": {}, "qwen2": {}, "qwen3": dict(hidden=512, ffn=512), "phi3": {}}


def write_quantized_gguf(
    path: Path,
    weight_type: str,
    seed: int = 0,
    tied: bool = False,
    types: dict | None = None,
    architecture: str = "llama",
) -> Path:
    """A tiny Llama-family GGUF whose linear weights and embedding are ``weight_type``
    (``types`` overrides it per tensor kind: ``attn_v``, ``ffn_down``, ``output``...; a type
    neither quantized here nor a k-quant is written as zero blocks); norms F32.
    ``tied``: no output.weight (the embedding is the output matrix). ``architecture``:
    llama, qwen2 (q/k/v biases), qwen3 (q/k norms) or phi3 (fused qkv and gate_up)."""
    import gguf

    shape = {**SHAPE, **ARCH_SHAPES[architecture]}
    hidden, ffn, layers = shape["hidden"], shape["ffn"], shape["layers"]
    heads, kv_heads = shape["heads"], shape["kv_heads"]
    tokens = [*SPECIAL_TOKENS, *_byte_tokens(), *(a + b for a, b in MERGES)]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-quantized")
    writer.add_context_length(2048)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIAL_TOKENS) + [1] * (len(tokens) - len(SPECIAL_TOKENS)))
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    if architecture == "phi3":  # transformers builds Phi-3's tokenizer from scores
        writer.add_token_scores([0.0] * len(tokens))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)
    types = types or {}

    def add(name: str, kind: str, rows: int, cols: int, std: float) -> None:
        qtype = types.get(kind, weight_type)
        floats = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        if qtype == "F32":
            writer.add_tensor(name, floats)
            return
        if qtype in K_QUANTS:
            data = k_quant_blocks(qtype, rows, cols, rng)
        elif qtype in QUANTIZED_BY_GGUF:
            data = gguf.quants.quantize(floats, gguf.GGMLQuantizationType[qtype])
        else:  # a type loragate refuses: zero blocks of the right size
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
            data = np.zeros((rows, cols // block * size), dtype=np.uint8)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])

    kv = kv_heads * hidden // heads
    add("token_embd.weight", "token_embd", len(tokens), hidden, 1.0)
    if not tied:
        add("output.weight", "output", len(tokens), hidden, hidden**-0.5)
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        if architecture == "phi3":  # fused, as Phi-3 stores them
            kinds = {"attn_qkv": (hidden + 2 * kv, hidden), "ffn_up": (2 * ffn, hidden)}
        else:
            kinds = {"attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden)}
            kinds.update(ffn_gate=(ffn, hidden), ffn_up=(ffn, hidden))
        kinds.update(attn_output=(hidden, hidden), ffn_down=(hidden, ffn))
        for kind, (rows, cols) in kinds.items():
            add(f"blk.{i}.{kind}.weight", kind, rows, cols, cols**-0.5)
        for norm in ("attn_norm", "ffn_norm"):
            norm_weight = rng.uniform(0.8, 1.2, hidden).astype(np.float32)
            writer.add_tensor(f"blk.{i}.{norm}.weight", norm_weight)
        if architecture == "qwen2":
            for kind, size in (("attn_q", hidden), ("attn_k", kv), ("attn_v", kv)):
                bias = (rng.standard_normal(size) * 0.1).astype(np.float32)
                writer.add_tensor(f"blk.{i}.{kind}.bias", bias)
        if architecture == "qwen3":
            for norm in ("attn_q_norm", "attn_k_norm"):
                norm_weight = rng.uniform(0.8, 1.2, hidden // heads).astype(np.float32)
                writer.add_tensor(f"blk.{i}.{norm}.weight", norm_weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
