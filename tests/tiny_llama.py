"""The tests' one builder of tiny models and adapters, and their HF/PEFT references.

The tiny test model of the engine and gateway tests is small, random, and not an echo.

HF's default init (std 0.02, tied embeddings) gives a model whose greedy output repeats the
last prompt token, so a bug that loses KV, context or adapters still gives the same tokens.
Here embeddings are untied and every weight is drawn at unit scale per input feature, so each
greedy token depends on the whole context. `assert_has_signal` checks that this stays true.

Also here: the same shapes with HF's own init (the adapter and beam-search tests), the same
model written as a GGUF file, random PEFT adapters with a PEFT model to compare against.

Imported by bare name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config

from loragate.engine.models.llama import lora_module_shapes
from loragate.tools import make_random_adapter
from loragate.tools.base_model import TOKENIZER_FILES

SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
SIZES = dict(**SHAPE, max_position_embeddings=4096, vocab_size=49152, rms_norm_eps=1e-5)
# The HF-init flavour (adapter and beam-search tests): a small vocabulary, HF's defaults.
HF_INIT_SIZES = dict(**SHAPE, vocab_size=128, max_position_embeddings=128)
HF_INIT_NAME = "tiny-llama"


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


def hf_init_tiny_model(seed: int = 0, **overrides) -> LlamaForCausalLM:
    """The tiny shape with HF's default init (tied-off embeddings, std 0.02): for tests of
    adapter files and of decoding strategies, which compare with PEFT or HF directly."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**HF_INIT_SIZES, **overrides})).eval()


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


# ---- adapters and the PEFT reference -----------------------------------------------------
def make_adapters(model_dir, out_root, specs, init_scale=0.3) -> dict[str, Path]:
    """Random PEFT adapters for the model in ``model_dir``: specs name -> (rank, targets,
    use_rslora); seeds follow the specs' order."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    paths = {}
    for seed, (name, (rank, targets, rslora)) in enumerate(specs.items()):
        paths[name] = make_random_adapter(
            base,
            Path(out_root) / name,
            rank=rank,
            targets=targets,
            use_rslora=rslora,
            seed=seed,
            init_scale=init_scale,
        )
    return paths


def ranked_adapters(model_dir, out_root: Path, ranks: dict[str, int], seed: int) -> dict[str, Path]:
    """One random adapter per name at its rank on every module (seeded `seed + rank`), made
    from the tiny model in `model_dir`."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {
        name: make_random_adapter(
            base, out_root / name, rank=rank, targets=ALL_MODULES, seed=seed + rank, init_scale=0.4
        )
        for name, rank in ranks.items()
    }


def peft_model_with(model_dir, paths: dict):
    """The base model in float32 with every adapter of ``paths`` loaded under its name."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    names = list(paths)
    model = PeftModel.from_pretrained(base, paths[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(paths[name], adapter_name=name)
    return model.eval()


def peft_greedy(peft_model, name: str | None, prompt: list[int], n: int) -> list[int]:
    """PEFT's greedy continuation under adapter ``name`` (None: the base model)."""
    if name is None:
        with peft_model.disable_adapter():
            return hf_greedy(peft_model, prompt, n)
    peft_model.set_adapter(name)
    return hf_greedy(peft_model, prompt, n)


# ---- the tiny shape as a GGUF file ---------------------------------------------------------
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
    """The tiny shape written as a GGUF file: a byte-level BPE vocabulary of the default
    model's three special tokens (ids 0-2, BOS 1, EOS 2) and 256 byte tokens, a ChatML
    template, and the `tokenizer.ggml.add_bos_token` / `add_eos_token` flags a test chooses
    (None: no key). A small vocabulary keeps writing and converting it to a few seconds."""
    HIDDEN, FFN = SHAPE["hidden_size"], SHAPE["intermediate_size"]
    LAYERS, HEADS = SHAPE["num_hidden_layers"], SHAPE["num_attention_heads"]
    KV_HEADS = SHAPE["num_key_value_heads"]
    from gguf import GGUFWriter

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
    import numpy as np

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
