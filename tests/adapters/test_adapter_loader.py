"""The loader reads exactly what PEFT wrote, and its math matches PEFT's merge."""

from __future__ import annotations

import copy
import hashlib
import json
import math

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from tiny_llama import ALL_MODULES, HF_INIT_NAME, hf_init_tiny_model
from transformers.pytorch_utils import Conv1D

from loragate.adapters import load_adapter
from loragate.engine.models.llama import lora_spec

ALL = list(ALL_MODULES)


def _peft_lora_weights(base_model, adapter_dir):
    """{(layer, module): (A, B, scaling)} straight from PEFT's own loaded model."""
    peft_model = PeftModel.from_pretrained(copy.deepcopy(base_model), adapter_dir)
    found = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            parts = name.split(".")
            layer = int(parts[parts.index("layers") + 1])
            found[(layer, parts[-1])] = (
                module.lora_A["default"].weight.detach(),
                module.lora_B["default"].weight.detach(),
                module.scaling["default"],
            )
    return found


def _merged_weights(base_model, adapter_dir):
    """{(layer, module): W} of PEFT's merge_and_unload, as [d_out, d_in]."""
    merged = PeftModel.from_pretrained(copy.deepcopy(base_model), adapter_dir).merge_and_unload()
    out = {}
    for name, module in merged.named_modules():
        parts = name.split(".")
        if parts[-1] in ALL_MODULES and "layers" in parts:
            weight = module.weight.detach()
            out[(int(parts[parts.index("layers") + 1]), parts[-1])] = (
                weight.T if isinstance(module, Conv1D) else weight
            )
    return out


def _base_weight(model, layer, module):
    block = model.model.layers[layer]
    owner = block.self_attn if hasattr(block.self_attn, module) else block.mlp
    linear = getattr(owner, module)
    return linear.weight.detach().T if isinstance(linear, Conv1D) else linear.weight.detach()


def _assert_matches_merge(base_model, adapter_dir, adapter):
    merged = _merged_weights(base_model, adapter_dir)
    assert set(adapter.weights) <= set(merged)
    for (layer, module), (a, b) in adapter.weights.items():
        ours = _base_weight(base_model, layer, module) + adapter.scale * (b @ a)
        torch.testing.assert_close(ours, merged[(layer, module)], rtol=1e-6, atol=1e-6)
        assert not torch.equal(merged[(layer, module)], _base_weight(base_model, layer, module))


def test_round_trips_peft_tensors_exactly(base_model, spec, make_adapter):
    path = make_adapter("rt", rank=8, targets=ALL, alpha=16, seed=3)
    adapter = load_adapter(path, spec, max_lora_rank=16)
    reference = _peft_lora_weights(base_model, path)
    assert set(adapter.weights) == set(reference) == {(i, m) for i in range(2) for m in ALL}
    for key, (a, b) in adapter.weights.items():
        ref_a, ref_b, scaling = reference[key]
        assert a.dtype == b.dtype == torch.float32 and a.device.type == "cpu"
        assert torch.equal(a, ref_a) and torch.equal(b, ref_b)
        assert adapter.scale == scaling == 2.0
    assert adapter.rank == 8 and adapter.alpha == 16.0 and not adapter.use_rslora
    assert adapter.target_modules == frozenset(ALL)
    weights_file = path / "adapter_model.safetensors"
    assert adapter.sha256 == hashlib.sha256(weights_file.read_bytes()).hexdigest()
    assert adapter.size_bytes == weights_file.stat().st_size
    assert adapter.base_model_name_or_path == HF_INIT_NAME
    assert adapter.num_params == sum(a.numel() + b.numel() for a, b in adapter.weights.values())


def test_only_targeted_modules_are_present(spec, make_adapter):
    adapter = load_adapter(make_adapter(targets=["k_proj", "down_proj"]), spec, max_lora_rank=8)
    assert adapter.target_modules == {"k_proj", "down_proj"}
    assert set(adapter.weights) == {(i, m) for i in range(2) for m in ("k_proj", "down_proj")}
    a, b = adapter.weights[(1, "k_proj")]
    assert a.shape == (4, 64) and b.shape == (32, 4)  # k_proj: 64 -> 2 kv heads * 16


@pytest.mark.parametrize("use_rslora", [False, True])
def test_matches_peft_merge(base_model, spec, make_adapter, use_rslora):
    path = make_adapter("m", rank=16, targets=ALL, alpha=8, use_rslora=use_rslora, seed=1)
    adapter = load_adapter(path, spec, max_lora_rank=16)
    expected_scale = 8 / math.sqrt(16) if use_rslora else 8 / 16
    assert adapter.scale == pytest.approx(expected_scale) and adapter.use_rslora == use_rslora
    _assert_matches_merge(base_model, path, adapter)


def test_rank_and_alpha_patterns_match_peft_merge(base_model, spec, make_adapter):
    path = make_adapter(
        "pat",
        rank=4,
        targets=["q_proj", "v_proj", "down_proj"],
        alpha=8,
        rank_pattern={"v_proj": 2, "model.layers.1.mlp.down_proj": 8},
        alpha_pattern={"down_proj": 3},
    )
    adapter = load_adapter(path, spec, max_lora_rank=8)
    assert adapter.weights[(0, "q_proj")][0].shape[0] == 4
    assert adapter.weights[(0, "v_proj")][0].shape[0] == 2
    assert adapter.weights[(1, "down_proj")][0].shape[0] == 8
    assert adapter.rank == 8 and adapter.scale == 2.0
    _assert_matches_merge(base_model, path, adapter)


def _conv1d_model():
    """The tiny Llama with its projections swapped for GPT-2 style Conv1D layers.

    PEFT only keeps fan_in_fan_out=True for Conv1D targets (it resets it for nn.Linear).
    """
    model = hf_init_tiny_model(seed=5)
    for block in model.model.layers:
        for owner in (block.self_attn, block.mlp):
            for name, child in list(owner.named_children()):
                if isinstance(child, torch.nn.Linear):
                    conv = Conv1D(child.out_features, child.in_features)
                    conv.weight.data = child.weight.data.T.contiguous()
                    conv.bias.data.zero_()
                    setattr(owner, name, conv)
    return model


def test_fan_in_fan_out_matches_peft_merge(spec, tmp_path):
    model = _conv1d_model()
    peft_model = get_peft_model(
        copy.deepcopy(model),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj"], fan_in_fan_out=True),
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    peft_model.save_pretrained(tmp_path / "ff")
    config = json.loads((tmp_path / "ff" / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True
    adapter = load_adapter(tmp_path / "ff", spec, max_lora_rank=8)
    a, b = adapter.weights[(0, "o_proj")]
    assert a.shape == (4, 64) and b.shape == (64, 4)
    _assert_matches_merge(model, tmp_path / "ff", adapter)


@pytest.mark.parametrize("form", ["adapter_name_segment", "no_peft_prefix"])
def test_accepts_other_peft_key_forms(spec, make_adapter, form):
    path = make_adapter(rank=4, targets=["q_proj", "up_proj"])
    weights_file = path / "adapter_model.safetensors"
    tensors = load_file(weights_file)
    if form == "adapter_name_segment":
        renamed = {
            k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): v
            for k, v in tensors.items()
        }
        assert any(".lora_A.default.weight" in k for k in renamed)
    else:
        renamed = {k.removeprefix("base_model.model."): v for k, v in tensors.items()}
    original = load_adapter(path, spec, max_lora_rank=4)
    save_file(renamed, weights_file)
    adapter = load_adapter(path, spec, max_lora_rank=4)
    assert set(adapter.weights) == set(original.weights)
    for key, (a, b) in adapter.weights.items():
        assert torch.equal(a, original.weights[key][0]) and torch.equal(b, original.weights[key][1])


def test_half_precision_weights_become_float32(spec, make_adapter):
    path = make_adapter(rank=4, targets=["q_proj"])
    weights_file = path / "adapter_model.safetensors"
    tensors = load_file(weights_file)
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, weights_file)
    adapter = load_adapter(path, spec, max_lora_rank=4)
    for key, (a, b) in adapter.weights.items():
        assert a.dtype == torch.float32 and b.dtype == torch.float32
        ref = tensors[f"base_model.model.model.layers.{key[0]}.self_attn.q_proj.lora_A.weight"]
        assert torch.equal(a, ref.to(torch.bfloat16).to(torch.float32))


def test_regex_target_modules_take_targets_from_weights(spec, make_adapter):
    path = make_adapter(rank=4, targets=["q_proj", "gate_proj"])
    config_file = path / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["target_modules"] = r".*\.(q_proj|gate_proj)"
    config_file.write_text(json.dumps(config))
    adapter = load_adapter(path, spec, max_lora_rank=4)
    assert adapter.target_modules == {"q_proj", "gate_proj"}


def test_model_lora_spec_matches_smollm2_shapes():
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
    )
    spec = lora_spec(config, "SmolLM2-135M-Instruct")
    assert spec.num_layers == 30
    assert spec.modules == {
        "q_proj": (576, 576),
        "k_proj": (576, 192),
        "v_proj": (576, 192),
        "o_proj": (576, 576),
        "gate_proj": (576, 1536),
        "up_proj": (576, 1536),
        "down_proj": (1536, 576),
    }
