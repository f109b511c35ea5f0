"""A model of a given size class with random weights, saved as an HF directory: Llama sizes,
and Qwen3-0.6B's and Gemma-3-1B's shapes made from their own config classes.

Speed does not depend on the weights' values, so benchmarks of larger models need no
download: the shapes come from a published config, the vocabulary and tokenizer from the
default model (so its chat template and token ids work unchanged).

    .venv/bin/python benchmarks/random_llama.py --size 1b --out /tmp/llama-1b
    .venv/bin/python benchmarks/random_llama.py --size qwen3-0.6b --out /tmp/qwen3-0.6b
    .venv/bin/python benchmarks/random_llama.py --size 8b --out /tmp/llama-8b

The 8B shape (Llama-3.1-8B's layers) does not fit this machine's memory as a float model,
so its checkpoint is written tensor by tensor, shard by shard (about 15 GB in bfloat16),
never held whole: it is meant for llama.cpp's converter and quantizer, whose Q4_K_M and
Q8_0 files loragate then serves in their block types.

Where the default model is absent (a GPU machine: its GGUF does not fit the call's 64 MiB),
`--tokenizer-dir` names a folder holding its tokenizer files (`make gpu-assets`), and
`--size 135m` stands in for the default model itself: its shapes, random weights.
"""

from __future__ import annotations

import argparse
import json
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
    # Llama-3.1-8B's layers.
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        tie_word_embeddings=False,
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
# Other families' published shapes (Qwen3-0.6B's, Qwen3-1.7B's and Gemma-3-1B's config.json),
# with the default model's vocabulary in place of their own (151,936 and 262,144 tokens).
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
    # Qwen3-1.7B's layers.
    "qwen3-1.7b": (
        Qwen3Config,
        dict(
            hidden_size=2048,
            intermediate_size=6144,
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


# Shapes written tensor by tensor (not held whole in memory), and the shard size.
STREAMED = {"8b"}
SHARD_BYTES = 2 << 30


def write_streamed(config, out: Path, dtype: torch.dtype) -> int:
    """The model's safetensors shards with random weights (normal, the config's
    initializer_range; norms one), made one tensor at a time; its parameter count."""
    from safetensors.torch import save_file

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {
        name: (tuple(p.shape), name.endswith("norm.weight")) for name, p in model.named_parameters()
    }
    architecture = type(model).__name__  # what converters read the model's kind from
    out.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype
    config.architectures = [architecture]
    config.save_pretrained(out)
    generator = torch.Generator().manual_seed(0)
    index, shard, shard_bytes, count = {}, {}, 0, 0

    def flush() -> None:
        nonlocal shard, shard_bytes
        name = f"model-{len(set(index.values())) + 1:05d}.safetensors"
        save_file(shard, out / name, metadata={"format": "pt"})
        index.update(dict.fromkeys(shard, name))
        shard, shard_bytes = {}, 0

    for name, (shape, is_norm) in shapes.items():
        if is_norm:
            tensor = torch.ones(shape, dtype=dtype)
        else:
            tensor = torch.empty(shape, dtype=dtype)
            tensor.normal_(0.0, config.initializer_range, generator=generator)
        shard[name] = tensor
        shard_bytes += tensor.numel() * tensor.element_size()
        count += tensor.numel()
        if shard_bytes >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    total = sum((out / f).stat().st_size for f in set(index.values()))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=1)
    )
    return count


def make_random_llama(
    size: str, out: Path, dtype: torch.dtype = torch.bfloat16, tokenizer_dir: Path | None = None
) -> int:
    """Save the model to `out`, with the tokenizer of `tokenizer_dir` (default: the default
    model's); return its parameter count."""
    default_dir = tokenizer_dir or resolve_model(None).hf_dir
    config = size_config(size)
    if size in STREAMED:
        params = write_streamed(config, out, dtype)
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.save_pretrained(out, safe_serialization=True)
        params = sum(p.numel() for p in model.parameters())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (default_dir / name).exists():
            shutil.copy(default_dir / name, out / name)
    for template in default_dir.glob("chat_template.*"):
        shutil.copy(template, out / template.name)
    return params


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
