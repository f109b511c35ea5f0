"""A tiny random Llama written as a GGUF file: a byte-level BPE vocabulary of the default
model's three special tokens (ids 0-2, BOS 1, EOS 2) and 256 byte tokens, a ChatML template,
and the `tokenizer.ggml.add_bos_token` / `add_eos_token` flags a test chooses (None: no key).
A small vocabulary keeps writing and converting it to a few seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = (("h", "e"), ("l", "l"))
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: the byte-level BPE alphabet."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_gguf(
    path: Path, add_bos: bool | None, add_eos: bool | None = None, seed: int = 0
) -> Path:
    tokens = [*SPECIAL_TOKENS, *_byte_tokens(), *(a + b for a, b in MERGES)]
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIAL_TOKENS) + [1] * (len(tokens) - len(SPECIAL_TOKENS)))
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_eos is not None:
        writer.add_add_eos_token(add_eos)
    rng = np.random.default_rng(seed)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    kv = KV_HEADS * HIDDEN // HEADS
    writer.add_tensor("token_embd.weight", weight(len(tokens), HIDDEN))
    writer.add_tensor("output.weight", weight(len(tokens), HIDDEN))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for i in range(LAYERS):
        for name, shape in {
            "attn_q": (HIDDEN, HIDDEN),
            "attn_k": (kv, HIDDEN),
            "attn_v": (kv, HIDDEN),
            "attn_output": (HIDDEN, HIDDEN),
            "ffn_gate": (FFN, HIDDEN),
            "ffn_up": (FFN, HIDDEN),
            "ffn_down": (HIDDEN, FFN),
        }.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
