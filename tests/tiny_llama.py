"""The one tiny test model of the engine and gateway tests: small, random, and not an echo.

HF's default init (std 0.02, tied embeddings) gives a model whose greedy output repeats the
last prompt token, so a bug that loses KV, context or adapters still gives the same tokens.
Here embeddings are untied and every weight is drawn at unit scale per input feature, so each
greedy token depends on the whole context. `assert_has_signal` checks that this stays true.

Imported by bare name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from loragate.engine.models.llama import lora_module_shapes

SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    vocab_size=49152,
    rms_norm_eps=1e-5,
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def tiny_config(kind: str = "llama", **overrides):
    """Configs covering the family's variants; all untied."""
    sizes = {**SIZES, **overrides}
    if kind == "llama":
        return LlamaConfig(**sizes, tie_word_embeddings=False)
    if kind == "llama3-rope":
        return LlamaConfig(
            **{**sizes, "num_key_value_heads": 1},
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        )
    if kind == "qwen2":
        return Qwen2Config(**sizes, tie_word_embeddings=False, use_sliding_window=False)
    raise ValueError(kind)


# Every module the engine's model offers LoRA, as the model declares them.
ALL_MODULES = tuple(lora_module_shapes(tiny_config()))


def build_tiny_model(kind: str = "llama", seed: int = 0, **overrides):
    """A float32 HF model whose linear layers keep unit scale, so attention and MLP matter."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0, 1)
        model.lm_head.weight.normal_(0, 1)
        for layer in model.model.layers:
            for linear in (*_children(layer.self_attn), *_children(layer.mlp)):
                linear.weight.normal_(0, linear.in_features**-0.5)
                if linear.bias is not None:
                    linear.bias.normal_(0, 0.1)
    return model.eval()


def _children(module) -> list[torch.nn.Linear]:
    return [m for m in module.children() if isinstance(m, torch.nn.Linear)]


def save_tiny_model(out: Path, tokenizer_dir: Path, kind: str = "llama") -> Path:
    """Save the tiny model with the default model's tokenizer and chat template."""
    build_tiny_model(kind).save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, Path(out) / name)
    return Path(out)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """HF's greedy continuation of exactly n tokens: the reference."""
    ids = torch.tensor([prompt])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=2,
    )
    return out[0, len(prompt) :].tolist()


def assert_has_signal(model, n: int = 16) -> None:
    """Outputs differ between prompts, have many distinct tokens, depend on the first prompt
    token, and change when attention is switched off: an engine bug cannot hide in an echo."""
    prompts = [[1] + list(range(300 + 11 * i, 330 + 11 * i)) for i in range(4)]
    outs = [hf_greedy(model, p, n) for p in prompts]
    assert len({tuple(o) for o in outs}) == len(outs), "different prompts, same output"
    assert all(len(set(o)) >= n // 2 for o in outs), f"too few distinct tokens: {outs}"
    first_changed = hf_greedy(model, [1, 999] + prompts[0][2:], n)
    assert first_changed != outs[0], "output ignores the start of the context"
    saved = [layer.self_attn.o_proj.weight.clone() for layer in model.model.layers]
    try:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
        no_attention = [hf_greedy(model, p, n) for p in prompts]
    finally:
        with torch.no_grad():
            for layer, weight in zip(model.model.layers, saved, strict=True):
                layer.self_attn.o_proj.weight.copy_(weight)
    assert all(a != b for a, b in zip(outs, no_attention, strict=True)), "attention is inert"
