"""GGUF bases served in their block types (issue 59): a tiny random Llama written in each
type, a mixed batch of base rows and PEFT adapters (plain LoRA on every projection, DoRA,
LoRA on lm_head), float32 greedy, token-equal to HF transformers loading the same file
(dequantized to float32) plus PEFT; the default model held in its file's bytes; bad files
refused naming what is wrong."""

from __future__ import annotations

import logging

import pytest
from gguf_testlib import K_QUANTS, MIXED, QUANTIZED_BY_GGUF, write_quantized_gguf
from tiny_llama import ALL_MODULES, peft_greedy, peft_model_with

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.loading.default_model import default_model_path
from loragate.engine.loading.model_loader import resolve_model
from loragate.kernels import QuantizedWeight, StackedWeights
from loragate.tools import make_random_adapter

PROMPTS = [[5, 70, 71, 72, 90, 33], list(range(40, 90)), [120] * 9 + [7, 8]]
NEW_TOKENS = 16
ADAPTERS = {
    "plain": dict(rank=8, targets=list(ALL_MODULES)),
    "dora": dict(rank=4, targets=["q_proj", "v_proj", "down_proj"], use_dora=True),
    "head": dict(rank=4, targets=["q_proj", "lm_head"]),
}


# Phi-3's own modules are the fused projections.
PHI3_ADAPTERS = {
    "plain": dict(rank=8, targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
    "dora": dict(rank=4, targets=["qkv_proj", "down_proj"], use_dora=True),
    "head": dict(rank=4, targets=["qkv_proj", "lm_head"]),
}


def _adapters(hf_dir, root):
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    specs = PHI3_ADAPTERS if base.config.model_type == "phi3" else ADAPTERS
    return {
        name: make_random_adapter(base, root / name, seed=i, init_scale=0.4, **spec)
        for i, (name, spec) in enumerate(specs.items())
    }


def _served_against_peft(
    make_llm, tmp_path, gguf, prompts=PROMPTS, new_tokens=NEW_TOKENS, **engine_kwargs
):
    """The engine's greedy tokens and PEFT's for every prompt under every adapter and the
    base, all in one batch; and the engine."""
    hf_dir = resolve_model(str(gguf), cache_dir=str(tmp_path / "cache")).hf_dir
    paths = _adapters(hf_dir, tmp_path / "adapters")
    llm = make_llm(
        model=str(gguf),
        weights_cache_dir=str(tmp_path / "cache"),
        max_model_len=256,
        kv_cache_memory_gb=0.05,
        enable_lora=True,
        max_lora_rank=8,
        max_loras=4,
        **engine_kwargs,
    )
    requests = [None, *(LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(paths.items()))]
    rows = [(prompt, request) for prompt in prompts for request in requests]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, min_tokens=new_tokens)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p, _ in rows],
        params,
        lora_request=[r for _, r in rows],
        use_tqdm=False,
    )
    peft = peft_model_with(hf_dir, paths)
    for (prompt, request), out in zip(rows, outs, strict=True):
        name = None if request is None else request.lora_name
        expected = peft_greedy(peft, name, prompt, new_tokens)
        assert out.outputs[0].token_ids == expected, f"adapter {name}, prompt {prompt[:4]}"
    return llm


@pytest.mark.parametrize("weight_type", [*QUANTIZED_BY_GGUF, *K_QUANTS])
def test_each_type_served_in_blocks_matches_hf_and_peft(make_llm, tmp_path, weight_type):
    gguf = write_quantized_gguf(tmp_path / f"tiny.{weight_type}.gguf", weight_type, seed=3)
    llm = _served_against_peft(make_llm, tmp_path, gguf)
    model = llm.llm_engine.model
    layer = model.layers[0]
    for value in (layer["qkv"], layer["gate_up"], layer["o"], layer["down"], model.lm_head):
        assert isinstance(value, QuantizedWeight) and value.format == weight_type
    assert isinstance(model.embed_tokens, QuantizedWeight)
    assert set(model.weight_bytes()) == {weight_type, "float32"}


def test_a_mixed_file_with_tied_embeddings(make_llm, tmp_path, caplog):
    """Q4_K_M-like: q/k in Q4_K and v in Q6_K (a fused projection of two types), the
    embedding (tied: no output.weight) in Q8_0."""
    types = {**MIXED, "token_embd": "Q8_0"}
    gguf = write_quantized_gguf(tmp_path / "tiny.mixed.gguf", "Q4_K", 4, tied=True, types=types)
    caplog.set_level(logging.INFO, logger="loragate.engine.loading.model_loader")
    caplog.set_level(logging.INFO, logger="loragate.engine.models.decoder")
    llm = _served_against_peft(make_llm, tmp_path, gguf)
    model = llm.llm_engine.model
    assert isinstance(model.layers[0]["qkv"], StackedWeights)
    assert model.lm_head is model.embed_tokens
    assert model.weight_bytes().keys() == {"Q4_K", "Q6_K", "Q8_0", "float32"}
    lines = [r.getMessage() for r in caplog.records]
    assert any("weights served in their block types" in line for line in lines)
    assert any("kept in its GGUF types: Q4_K" in line for line in lines)
    held = [line for line in lines if line.startswith("base weights held: ")]
    assert held and "Q4_K" in held[0] and "Q6_K" in held[0] and "Q8_0" in held[0]


@pytest.mark.parametrize(
    "architecture,weight_type",
    [("qwen2", "Q4_K"), ("qwen3", "Q5_0"), ("phi3", "Q6_K")],
    ids=["qwen2", "qwen3", "phi3"],
)
def test_other_families_served_in_blocks_match_hf_and_peft(
    make_llm, tmp_path, architecture, weight_type
):
    """Qwen2 (q/k/v biases, rows not interleaved), Qwen3 (q/k norms, head_dim 128) and
    Phi-3 (q/k/v and gate/up stored fused, adapters on the fused modules)."""
    gguf = write_quantized_gguf(
        tmp_path / f"tiny-{architecture}.gguf", weight_type, seed=6, architecture=architecture
    )
    llm = _served_against_peft(make_llm, tmp_path, gguf)
    model = llm.llm_engine.model
    assert model.arch.family == ("llama" if architecture == "qwen2" else architecture)
    assert isinstance(model.layers[0]["qkv"], QuantizedWeight)


def test_the_dequantizing_path_stays_behind_its_flag(make_llm, tmp_path, caplog):
    gguf = write_quantized_gguf(tmp_path / "tiny.Q8_0.gguf", "Q8_0", seed=5)
    caplog.set_level(logging.INFO, logger="loragate.engine.loading.model_loader")
    llm = make_llm(
        model=str(gguf),
        gguf_dequantize=True,
        weights_cache_dir=str(tmp_path / "cache"),
        max_model_len=128,
        kv_cache_memory_gb=0.02,
    )
    assert set(llm.llm_engine.model.weight_bytes()) == {"float32"}
    assert any("dequantized to float32" in r.getMessage() for r in caplog.records)


def test_the_default_model_is_held_in_its_files_bytes(default_llm_in_blocks):
    """Must-show 2: the Q4_1 file's weights, held as the engine accounts its tensors, take
    at most 1.2x their bytes in the file."""
    from gguf import GGUFReader

    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(default_model_path()).tensors)
    held = default_llm_in_blocks.llm_engine.model.weight_bytes()
    assert held.keys() == {"Q4_1", "Q8_0", "float32"}
    assert sum(held.values()) <= 1.2 * file_bytes


@pytest.fixture(scope="module")
def default_llm_in_blocks():
    from loragate.engine import LLM

    return LLM(max_model_len=256, kv_cache_memory_gb=0.05)


# ---- bad files ------------------------------------------------------------------------
def _refused(tmp_path, gguf, match):
    from loragate.engine import LLM

    with pytest.raises(ValueError, match=match):
        LLM(
            model=str(gguf),
            weights_cache_dir=str(tmp_path / "cache"),
            max_model_len=64,
            kv_cache_memory_gb=0.01,
        )


def test_an_unsupported_type_is_refused_naming_the_tensor_and_type(tmp_path):
    path = write_quantized_gguf(tmp_path / "tiny.gguf", "Q8_0", types={"ffn_up": "Q2_K"})
    _refused(tmp_path, path, r"GGUF tensor blk\.0\.ffn_up\.weight has type Q2_K")


def test_a_truncated_file_is_refused_naming_the_tensor_past_its_end(tmp_path):
    path = write_quantized_gguf(tmp_path / "tiny.gguf", "Q4_0")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 3000])
    _refused(tmp_path, cut, r"cut\.gguf is truncated: tensor blk\.1\.\w+\.weight")


def test_a_wrong_tensor_shape_is_refused_naming_it(tmp_path, monkeypatch):
    """attn_k written with the query's rows: its shape disagrees with the file's own heads."""
    import gguf_testlib

    monkeypatch.setitem(gguf_testlib.SHAPE, "kv_heads", 4)
    path = write_quantized_gguf(tmp_path / "tiny.gguf", "Q8_0")
    import gguf

    # The metadata says 2 KV heads; the tensors were written for 4.
    reader = gguf.GGUFReader(path, "r+")
    field = reader.fields["llama.attention.head_count_kv"]
    field.parts[field.data[0]][0] = 2
    del reader
    _refused(
        tmp_path, path, r"blk\.0\.attn_k\.weight \(Q8_0\) has shape \[256, 256\], expected \[128"
    )


def test_a_server_refusing_a_bad_file_exits_non_zero_with_the_message(tmp_path):
    import os
    import subprocess
    import sys

    path = write_quantized_gguf(tmp_path / "tiny.gguf", "Q4_0")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 3000])
    env = {**os.environ, "LORAGATE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "loragate.gateway.assembly.cli", "serve", str(cut), "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode != 0
    assert "cut.gguf is truncated: tensor blk.1.ffn_down.weight" in done.stdout + done.stderr


def test_the_triton_product_serves_the_model_as_the_cpu_kernels_do(make_llm, tmp_path, monkeypatch):
    """Every decoder product with block weights through kernels/quant_triton.py (what CUDA
    runs), here under Triton's interpreter (slow: two prompts, three tokens, and the tied
    Q8_0 output layer of 49,152 rows on the CPU kernels): the model's own shapes and a fused
    projection of two types (Q4_K, Q6_K), with LoRA, DoRA and lm_head adapters in one
    batch; the same tokens as HF and PEFT."""
    import importlib

    from loragate.kernels import quant_linear, quant_triton

    linear_module = importlib.import_module("loragate.kernels.linear")
    calls = []

    def through_triton(x, weight, bias=None):
        if weight.shape[0] > 4096:  # the 49,152-row output layer: minutes interpreted
            return quant_linear.quantized_linear(x, weight, bias)
        parts = weight.parts if isinstance(weight, StackedWeights) else (weight,)
        calls.extend((p.shape, p.format) for p in parts if isinstance(p, QuantizedWeight))
        return quant_linear.quantized_linear(x, weight, bias, backend="triton")

    monkeypatch.setattr(linear_module, "quantized_linear", through_triton)
    # Wide tiles: the interpreter's time is per program (test_quant_linear.py checks the
    # kernel's own 64-wide tiles); a fixed token budget: no forward passes timed at start.
    monkeypatch.setattr(quant_triton, "BLOCK_N", 256)
    types = {**MIXED, "token_embd": "Q8_0"}
    gguf = write_quantized_gguf(tmp_path / "tiny.gguf", "Q4_K", 4, tied=True, types=types)
    _served_against_peft(
        make_llm, tmp_path, gguf, PROMPTS[::2], new_tokens=3, max_num_batched_tokens=256
    )
    assert {"Q4_K", "Q6_K"} <= {f for shape, f in calls}, calls
