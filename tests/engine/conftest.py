"""Engine fixtures: the default model, tiny random Llama-family models, and a leak check."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from loragate.engine import LLM
from loragate.engine.model_loader import resolve_model

LIVE_ENGINES: list = []


def track(llm: LLM) -> LLM:
    LIVE_ENGINES.append(llm.engine)
    return llm


@pytest.fixture(autouse=True)
def no_kv_leaks():
    """After every test, every engine it touched has all KV blocks free and consistent."""
    yield
    for engine in LIVE_ENGINES:
        engine.check_integrity()
        if not engine.has_unfinished_requests():
            stats = engine.get_memory_stats()
            assert stats["allocated_blocks"] == 0, f"KV blocks leaked: {stats}"


@pytest.fixture(scope="session")
def make_llm():
    """Build an LLM whose KV blocks the leak check watches."""
    return lambda *args, **kwargs: track(LLM(*args, **kwargs))


@pytest.fixture(scope="session")
def default_hf_dir():
    return resolve_model(None).hf_dir


@pytest.fixture(scope="session")
def default_llm():
    return track(LLM(max_num_seqs=32, max_model_len=1024, kv_cache_memory_gb=0.5))


@pytest.fixture(scope="session")
def hf_default_model(default_hf_dir):
    return AutoModelForCausalLM.from_pretrained(default_hf_dir, dtype=torch.float32).eval()


TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    vocab_size=49152,
    rms_norm_eps=1e-5,
)


def tiny_config(kind: str):
    """Tiny random models covering the family's variants."""
    if kind == "llama":
        return LlamaConfig(**TINY, tie_word_embeddings=True)
    if kind == "llama3-rope":
        return LlamaConfig(
            **{**TINY, "num_key_value_heads": 1},
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
        return Qwen2Config(**TINY, tie_word_embeddings=False, use_sliding_window=False)
    raise ValueError(kind)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_hf_dir):
    """Factory: a saved tiny random model of a kind, with the default model's tokenizer."""
    made = {}

    def make(kind: str = "llama"):
        if kind not in made:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(tiny_config(kind), dtype=torch.float32)
            out = tmp_path_factory.mktemp(f"tiny-{kind}")
            model.save_pretrained(out, safe_serialization=True)
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if (default_hf_dir / name).exists():
                    shutil.copy(default_hf_dir / name, out / name)
            made[kind] = out
        return made[kind]

    return make
