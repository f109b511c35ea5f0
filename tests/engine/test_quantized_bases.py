"""Float bases quantized at load (``--quantization int8|int4``) and AWQ / GPTQ checkpoints
(issue 59): a mixed batch of base rows and PEFT adapters (plain LoRA on every projection,
DoRA, LoRA on lm_head), float32 greedy, token-equal to HF transformers whose linear weights
were replaced by the dequantized values (decoded in float64 by the test library from the
documented layouts) plus PEFT; the weights held in their integer formats; bad values and
unsupported checkpoints refused naming them."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from quant_checkpoint_testlib import (
    copy_tokenizer,
    int_reference,
    save_reference,
    write_quantized_checkpoint,
)
from tiny_llama import ALL_MODULES, build_tiny_model, hf_greedy, peft_greedy, peft_model_with

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.loading.quantization import CHECKPOINT_METHODS, Quantization
from loragate.kernels import QuantizedWeight, StackedWeights
from loragate.tools import make_random_adapter

PROMPTS = [[5, 70, 71, 72, 90, 33], list(range(40, 90)), [120] * 9 + [7, 8]]
NEW_TOKENS = 16
ADAPTERS = {
    "plain": dict(rank=8, targets=list(ALL_MODULES)),
    "dora": dict(rank=4, targets=["q_proj", "v_proj", "down_proj"], use_dora=True),
    "head": dict(rank=4, targets=["q_proj", "lm_head"]),
}
# Rows of 128 (hidden) and 256 (intermediate) weights: whole groups of 128.
WIDE = dict(hidden_size=128, intermediate_size=256)


def _float_base(tmp_path, tokenizer_dir, kind="llama", seed=3, **overrides):
    model = build_tiny_model(kind, seed=seed, **{**WIDE, **overrides})
    out = tmp_path / f"float-{kind}"
    model.save_pretrained(out, safe_serialization=True)
    copy_tokenizer(tokenizer_dir, out)
    return out, model


def _at_load_reference(model, method: str, out, tokenizer_dir):
    """The model with each linear weight replaced by its quantized value, as the test
    library decodes the blocks the engine's quantizer makes."""
    held = {}
    for name, param in model.named_parameters():
        if name.endswith("_proj.weight"):
            blocks = Quantization(at_load=method).quantize(param.detach())
            held[name] = int_reference(blocks.blocks.numpy(), blocks.format, blocks.in_features)
    return save_reference(model, held, out, tokenizer_dir)


def _served_against_peft(
    make_llm, tmp_path, model_dir, reference_dir, adapters=ADAPTERS, **engine_kwargs
):
    """The engine's greedy tokens on ``model_dir`` and PEFT's on ``reference_dir`` for every
    prompt under every adapter and the base, all in one batch; the engine, and its tokens
    for the base rows."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32)
    paths = {
        name: make_random_adapter(
            base, tmp_path / "adapters" / name, seed=i, init_scale=0.4, **spec
        )
        for i, (name, spec) in enumerate(adapters.items())
    }
    settings = dict(max_model_len=256, kv_cache_memory_gb=0.05, enable_lora=True)
    settings.update(max_lora_rank=8, max_loras=4, **engine_kwargs)
    llm = make_llm(model=str(model_dir), **settings)
    requests = [None, *(LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(paths.items()))]
    rows = [(prompt, request) for prompt in PROMPTS for request in requests]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p, _ in rows],
        params,
        lora_request=[r for _, r in rows],
        use_tqdm=False,
    )
    peft = peft_model_with(reference_dir, paths)
    for (prompt, request), out in zip(rows, outs, strict=True):
        name = None if request is None else request.lora_name
        expected = peft_greedy(peft, name, prompt, NEW_TOKENS)
        assert out.outputs[0].token_ids == expected, f"adapter {name}, prompt {prompt[:4]}"
    base_rows = [
        out.outputs[0].token_ids for (_, r), out in zip(rows, outs, strict=True) if r is None
    ]
    return llm, base_rows


def _layer_formats(llm) -> set[str]:
    model = llm.llm_engine.model
    formats = set()
    for layer in model.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            value = layer[name]
            for part in value.parts if isinstance(value, StackedWeights) else (value,):
                assert isinstance(part, QuantizedWeight), name
                formats.add(part.format)
    return formats


@pytest.mark.parametrize(
    "method,kind,formats",
    [
        ("int8", "llama", {"I8_CH"}),
        ("int4", "llama", {"I4_G128"}),
        ("int4", "qwen2", {"I4_G128"}),
    ],
)
def test_a_float_base_quantized_at_load_matches_hf_with_dequantized_weights(
    make_llm, tmp_path, tokenizer_dir, method, kind, formats
):
    model_dir, model = _float_base(tmp_path, tokenizer_dir, kind)
    unquantized = [hf_greedy(model, prompt, NEW_TOKENS) for prompt in PROMPTS]
    reference = _at_load_reference(model, method, tmp_path / "ref" / model_dir.name, tokenizer_dir)
    llm, base_rows = _served_against_peft(
        make_llm, tmp_path, model_dir, reference, quantization=method
    )
    assert _layer_formats(llm) == formats
    if method == "int4":  # its rows differ from the float model's (int8's stay near them)
        assert base_rows != unquantized
    held = llm.llm_engine.model.weight_bytes()
    assert set(held) == formats | {"float32"}  # embeddings, lm_head and norms stay float


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3"])
def test_other_families_quantized_at_load_match_hf_with_dequantized_weights(
    make_llm, tmp_path, tokenizer_dir, family
):
    """Qwen3 (q/k norms), Gemma 3 (head_dim 256: o_proj rows of 1024, groups of 128; the
    rest groups of 64) and Phi-3 (fused qkv and gate_up, adapters on the fused modules)."""
    from family_models import LORA_TARGETS, PHI3_ORIGINAL_LEN, build_family_model

    model = build_family_model(family, seed=4)
    model_dir = tmp_path / f"float-{family}"
    model.save_pretrained(model_dir, safe_serialization=True)
    copy_tokenizer(tokenizer_dir, model_dir)
    reference = _at_load_reference(model, "int4", tmp_path / "ref" / model_dir.name, tokenizer_dir)
    targets = list(LORA_TARGETS[family])
    adapters = {
        "plain": dict(rank=8, targets=targets),
        "dora": dict(rank=4, targets=[targets[0], targets[-1]], use_dora=True),
        "head": dict(rank=4, targets=[targets[0], "lm_head"]),
    }
    # Phi-3's LongRoPE: HF's short factors hold up to its original length (PHI3_ORIGINAL_LEN)
    length = {"max_model_len": PHI3_ORIGINAL_LEN} if family == "phi3" else {}
    llm, _ = _served_against_peft(
        make_llm, tmp_path, model_dir, reference, adapters, quantization="int4", **length
    )
    assert _layer_formats(llm) <= {"I4_G64", "I4_G128"}


@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3"])
def test_other_families_as_awq_and_gptq_checkpoints(
    make_llm, tmp_path, tokenizer_dir, family, method
):
    """Each family written as a checkpoint in groups of 64 (its rows of 64 weights), Phi-3's
    fused projections quantized whole as AutoAWQ and GPTQ quantize them."""
    from family_models import LORA_TARGETS, PHI3_ORIGINAL_LEN, build_family_model

    model = build_family_model(family, seed=6)
    name = f"{method}-{family}"
    checkpoint, reference = write_quantized_checkpoint(
        model, method, tmp_path / name, tmp_path / "ref" / name, tokenizer_dir, group=64
    )
    targets = list(LORA_TARGETS[family])
    adapters = {
        "plain": dict(rank=8, targets=targets),
        "dora": dict(rank=4, targets=[targets[0], targets[-1]], use_dora=True),
        "head": dict(rank=4, targets=[targets[0], "lm_head"]),
    }
    length = {"max_model_len": PHI3_ORIGINAL_LEN} if family == "phi3" else {}
    llm, _ = _served_against_peft(make_llm, tmp_path, checkpoint, reference, adapters, **length)
    assert _layer_formats(llm) == {"I4_G64"}


def test_int4_rows_not_whole_groups_of_128_take_groups_of_64(make_llm, tmp_path, tokenizer_dir):
    """The tiny shape: hidden rows of 64 weights (groups of 64), the down projection's of
    128 (groups of 128); the start log names both."""
    model_dir, model = _float_base(tmp_path, tokenizer_dir, hidden_size=64, intermediate_size=128)
    reference = _at_load_reference(model, "int4", tmp_path / "ref" / model_dir.name, tokenizer_dir)
    llm, _ = _served_against_peft(make_llm, tmp_path, model_dir, reference, quantization="int4")
    assert _layer_formats(llm) == {"I4_G64", "I4_G128"}


def test_bad_quantization_values_are_refused_naming_them(tmp_path, tokenizer_dir):
    from loragate.engine import LLM, EngineArgs

    with pytest.raises(ValueError, match="quantization must be one of int8, int4, awq, gptq"):
        LLM(quantization="fp8")
    with pytest.raises(ValueError, match="got 'INT8'"):
        EngineArgs(quantization="INT8")
    model_dir, _ = _float_base(tmp_path, tokenizer_dir)
    with pytest.raises(ValueError, match="has no awq quantization_config"):
        LLM(model=str(model_dir), quantization="awq", max_model_len=64, kv_cache_memory_gb=0.01)


def test_the_cli_takes_quantization_into_the_engine_config(tmp_path, monkeypatch):
    """`serve DIR --quantization int4` builds the settings (the server itself not started)."""
    from click.testing import CliRunner

    from loragate.gateway.assembly import server
    from loragate.gateway.assembly.cli import main

    seen = []
    monkeypatch.setattr(server, "serve", lambda settings, announce: seen.append(settings) or True)
    result = CliRunner().invoke(main, ["serve", str(tmp_path), "--quantization", "int4"])
    assert result.exit_code == 0, result.output
    assert seen[-1].engine.quantization == "int4"


def test_the_cli_refuses_a_bad_quantization_naming_the_choices():
    from click.testing import CliRunner

    from loragate.gateway.assembly.cli import main

    result = CliRunner().invoke(main, ["serve", "--quantization", "fp8"])
    assert result.exit_code != 0
    assert "'fp8' is not one of 'int8', 'int4', 'awq', 'gptq'" in result.output


# ---- AWQ and GPTQ checkpoints -----------------------------------------------------------
CHECKPOINTS = {
    "awq": dict(method="awq", group=128),
    "gptq-sym": dict(method="gptq", group=128, sym=True),
    "gptq-asym-g64": dict(method="gptq", group=64, sym=False),
    "gptq-v2": dict(method="gptq", group=128, sym=False, checkpoint_format="gptq_v2"),
    # act-order: q/k/v share one input order, gate and up differ (a stacked projection)
    "gptq-act-order": dict(method="gptq", group=64, sym=False, desc_act=True),
}


def _checkpoint(tmp_path, tokenizer_dir, kind="llama", **options):
    model = build_tiny_model(kind, seed=5, **WIDE)
    method = options.pop("method")
    name = f"{method}-{kind}"  # the reference has the served model's name (adapters record it)
    return write_quantized_checkpoint(
        model, method, tmp_path / name, tmp_path / "ref" / name, tokenizer_dir, **options
    )


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_awq_and_gptq_checkpoints_match_hf_with_dequantized_weights(
    make_llm, tmp_path, tokenizer_dir, name, caplog
):
    options = dict(CHECKPOINTS[name])
    checkpoint, reference = _checkpoint(tmp_path, tokenizer_dir, **options)
    caplog.set_level(logging.INFO, logger="loragate.engine.loading.model_loader")
    llm, _ = _served_against_peft(make_llm, tmp_path, checkpoint, reference)
    assert _layer_formats(llm) == {f"I4_G{options['group']}"}
    if options.get("desc_act"):  # q/k/v in one order; gate and up each in its own
        layer = llm.llm_engine.model.layers[0]
        assert layer["qkv"].input_order is not None
        assert isinstance(layer["gate_up"], StackedWeights)
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"quantization {options['method']} 4-bit" in line for line in lines), lines


def test_a_qwen2_awq_checkpoint_with_biases(make_llm, tmp_path, tokenizer_dir):
    checkpoint, reference = _checkpoint(tmp_path, tokenizer_dir, "qwen2", method="awq")
    llm, _ = _served_against_peft(make_llm, tmp_path, checkpoint, reference, quantization="awq")
    assert _layer_formats(llm) == {"I4_G128"}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"quant_method": "fp8"}, "quantization method 'fp8' in .* is not supported"),
        ({"bits": 8}, "gptq with bits=8 in .* is not supported"),
        ({"zero_point": False, "quant_method": "awq"}, "AWQ with zero_point=false"),
        ({"group_size": 96}, "gptq with group_size=96 .* is not supported"),
        ({"checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin' .* is not supported"),
    ],
)
def test_unsupported_checkpoints_are_refused_naming_what(tmp_path, tokenizer_dir, change, message):
    from loragate.engine import LLM

    checkpoint, _ = _checkpoint(tmp_path, tokenizer_dir, method="gptq", extra=change)
    with pytest.raises(ValueError, match=message):
        LLM(model=str(checkpoint), max_model_len=64, kv_cache_memory_gb=0.01)


def test_a_quantized_checkpoint_refuses_another_quantization(tmp_path, tokenizer_dir):
    from loragate.engine import LLM

    checkpoint, _ = _checkpoint(tmp_path, tokenizer_dir, method="awq")
    with pytest.raises(ValueError, match="already quantized with awq"):
        LLM(model=str(checkpoint), quantization="int8", max_model_len=64, kv_cache_memory_gb=0.01)
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv"
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="AWQ version 'gemv' .* is not supported"):
        LLM(model=str(checkpoint), max_model_len=64, kv_cache_memory_gb=0.01)


# ---- memory: the bytes held -------------------------------------------------------------
@pytest.mark.parametrize(
    "source,bound", [("int8", 0.27), ("int4", 0.15), ("awq", 0.15), ("gptq", 0.15)]
)
def test_the_quantized_weights_are_held_in_their_bytes_with_no_float_copy(
    make_llm, tmp_path, tokenizer_dir, source, bound
):
    """The engine's own accounting of its tensors: the decoder layers' linear weights take
    at most ``bound`` of their float32 bytes (int8: 1 byte and a scale per row of 128, about
    0.26x; int4 in groups of 128: half a byte plus 5 bytes a group, about 0.135x), and the
    float32 it holds is exactly the weights left float (embeddings, lm_head, norms)."""
    if source in CHECKPOINT_METHODS:
        model_dir, _ = _checkpoint(tmp_path, tokenizer_dir, method=source, group=128)
        kwargs = {}
    else:
        model_dir, _ = _float_base(tmp_path, tokenizer_dir)
        kwargs = {"quantization": source}
    model = build_tiny_model("llama", seed=3, **WIDE)
    linear = sum(p.numel() for n, p in model.named_parameters() if n.endswith("_proj.weight"))
    rest = sum(p.numel() for n, p in model.named_parameters() if not n.endswith("_proj.weight"))
    llm = make_llm(model=str(model_dir), max_model_len=64, kv_cache_memory_gb=0.01, **kwargs)
    held = llm.llm_engine.model.weight_bytes()
    quantized = sum(size for kind, size in held.items() if kind != "float32")
    assert quantized <= bound * 4 * linear
    assert held["float32"] == 4 * rest


def test_a_gguf_base_takes_quantization_only_dequantized(make_llm, tmp_path):
    """A GGUF file is served in its own block types, so --quantization is refused for it;
    with --gguf-dequantize its float32 copy is a float base like any other."""
    from gguf_testlib import write_quantized_gguf

    from loragate.engine import LLM

    gguf = write_quantized_gguf(tmp_path / "tiny.Q8_0.gguf", "Q8_0", seed=2)
    settings = dict(weights_cache_dir=str(tmp_path / "cache"), max_model_len=64)
    with pytest.raises(ValueError, match="a GGUF base is served in its own block types"):
        LLM(model=str(gguf), quantization="int8", kv_cache_memory_gb=0.01, **settings)
    llm = make_llm(
        model=str(gguf),
        gguf_dequantize=True,
        quantization="int4",
        kv_cache_memory_gb=0.01,
        **settings,
    )
    assert _layer_formats(llm) == {"I4_G128"}  # rows of 256 and 512 weights
