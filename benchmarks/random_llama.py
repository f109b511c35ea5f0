"""A model of a given size class with random weights, saved as an HF directory: Llama sizes,
and Qwen3-0.6B's and Gemma-3-1B's shapes made from their own config classes.

Speed does not depend on the weights' values, so benchmarks of larger models need no
download: the shapes come from a published config, the vocabulary and tokenizer from the
default model (so its chat template and token ids work unchanged).

    .venv/bin/python benchmarks/random_llama.py --size 1b --out /tmp/llama-1b
    .venv/bin/python benchmarks/random_llama.py --size qwen3-0.6b --out /tmp/qwen3-0.6b

Where the default model is absent (a GPU machine: its GGUF does not fit the call's 64 MiB),
`--tokenizer-dir` names a folder holding its tokenizer files (`make gpu-assets`), and
`--size 135m` stands in for the default model itself: its shapes, random weights.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen3Config

from loragate.engine.loading.model_loader import resolve_model

# Llama-3.2-1B's shapes (hidden 2048, 16 layers, 32 query / 8 KV heads, SwiGLU 8192), with the
# default model's 49,152-token vocabulary in place of Llama 3's 128,256.
SIZES = {
    # The engine's own time (benchmarks/overhead.py): layers of microseconds, so what is left
    # is the output layer, scheduling, batching, sampling and outputs.
    "tiny": dict(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=1,  # head_dim 64: vLLM-CPU's attention has no kernel for 16
        num_key_value_heads=1,
        rope_theta=100000.0,
        tie_word_embeddings=False,
    ),
    # The default model's own shapes (SmolLM2-135M-Instruct's config.json).
    "135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
}
# Other families' published shapes (Qwen3-0.6B's and Gemma-3-1B's config.json), with the
# default model's vocabulary in place of their own (151,936 and 262,144 tokens).
FAMILY_SIZES = {
    "qwen3-0.6b": (
        Qwen3Config,
        dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        ),
    ),
    "gemma3-1b": (
        Gemma3TextConfig,
        dict(
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=512,
            rope_theta=1_000_000.0,
            rope_local_base_freq=10_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        ),
    ),
}


def size_config(size: str):
    if size in FAMILY_SIZES:
        config_class, shape = FAMILY_SIZES[size]
        return config_class(**shape, vocab_size=49152, max_position_embeddings=8192)
    return LlamaConfig(
        **SIZES[size], vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5
    )


def make_random_llama(
    size: str, out: Path, dtype: torch.dtype = torch.bfloat16, tokenizer_dir: Path | None = None
) -> int:
    """Save the model to `out`, with the tokenizer of `tokenizer_dir` (default: the default
    model's); return its parameter count."""
    default_dir = tokenizer_dir or resolve_model(None).hf_dir
    config = size_config(size)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (default_dir / name).exists():
            shutil.copy(default_dir / name, out / name)
    for template in default_dir.glob("chat_template.*"):
        shutil.copy(template, out / template.name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1b", choices=sorted([*SIZES, *FAMILY_SIZES]))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer-dir", type=Path, help="default: the default model's")
    args = ap.parse_args()
    params = make_random_llama(args.size, args.out, tokenizer_dir=args.tokenizer_dir)
    print(f"{args.out}: {params / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
