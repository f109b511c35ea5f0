"""Every adapter loragate refuses, each with its own error type naming the file and the field."""

from __future__ import annotations

import copy
import json
import pickle
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import LoHaConfig, get_peft_model
from safetensors.torch import load_file, save_file
from tiny_llama import HF_INIT_NAME, hf_init_tiny_model

from loragate.adapters import (
    AdapterConfigError,
    AdapterError,
    AdapterNotFoundError,
    AdapterRankError,
    AdapterShapeError,
    BaseModelMismatchError,
    BaseModelMismatchWarning,
    CorruptWeightsError,
    PickleWeightsError,
    UnsupportedAdapterError,
    UnsupportedTargetModuleError,
    load_adapter,
)
from loragate.engine.models.llama import lora_spec
from loragate.tools import make_random_adapter


def _edit_config(path: Path, **changes) -> None:
    config_file = path / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps(config))


def _edit_tensors(path: Path, edit) -> None:
    weights_file = path / "adapter_model.safetensors"
    save_file(edit(load_file(weights_file)), weights_file)


def _refused(path, spec, error_type, *words, max_lora_rank=64, **kwargs) -> AdapterError:
    with pytest.raises(error_type) as info:
        load_adapter(path, spec, max_lora_rank=max_lora_rank, **kwargs)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return info.value


def _assert_loaded_as_written(adapter, path: Path, rank: int, targets) -> None:
    """The adapter that loaded is the one on disk: rank, targets and every A and B."""
    assert adapter.rank == rank and adapter.target_modules == frozenset(targets)
    tensors = load_file(path / "adapter_model.safetensors")
    assert len(adapter.weights) == len(tensors) // 2
    for (layer, module), (a, b) in adapter.weights.items():
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
        assert torch.equal(a, tensors[f"{prefix}.lora_A.weight"])
        assert torch.equal(b, tensors[f"{prefix}.lora_B.weight"])


class _TouchOnUnpickle:
    """Unpickling this creates a file: proof that a loader ran pickle code."""

    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.touch, (self.sentinel,))


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_pickle_weights_are_refused_and_never_unpickled(spec, make_adapter, tmp_path, suffix):
    path = make_adapter()
    (path / "adapter_model.safetensors").unlink()
    sentinel = tmp_path / "unpickled"
    (path / f"adapter_model{suffix}").write_bytes(pickle.dumps(_TouchOnUnpickle(sentinel)))
    error = _refused(path, spec, PickleWeightsError, f"adapter_model{suffix}", "pickle", "never")
    assert error.path == str(path / f"adapter_model{suffix}")
    assert not sentinel.exists()


def test_pickle_beside_safetensors_is_ignored(spec, make_adapter, tmp_path):
    path = make_adapter()
    sentinel = tmp_path / "unpickled"
    (path / "adapter_model.bin").write_bytes(pickle.dumps(_TouchOnUnpickle(sentinel)))
    _assert_loaded_as_written(
        load_adapter(path, spec, max_lora_rank=8), path, 4, ["q_proj", "v_proj"]
    )
    assert not sentinel.exists()


def test_missing_directory(spec, tmp_path):
    error = _refused(tmp_path / "nope", spec, AdapterNotFoundError, "nope", "does not exist")
    assert isinstance(error, FileNotFoundError) and isinstance(error, ValueError)


def test_path_that_is_a_file(spec, tmp_path):
    (tmp_path / "file").write_text("x")
    _refused(tmp_path / "file", spec, AdapterNotFoundError, "not a directory")


def test_missing_config(spec, make_adapter):
    path = make_adapter()
    (path / "adapter_config.json").unlink()
    error = _refused(path, spec, AdapterNotFoundError, "adapter_config.json", "missing")
    assert error.path == str(path / "adapter_config.json")


def test_missing_weights(spec, make_adapter):
    path = make_adapter()
    (path / "adapter_model.safetensors").unlink()
    _refused(path, spec, AdapterNotFoundError, "adapter_model.safetensors", "missing")


def test_invalid_json(spec, make_adapter):
    path = make_adapter()
    (path / "adapter_config.json").write_text('{"r": 4,')
    _refused(path, spec, AdapterConfigError, "adapter_config.json", "invalid JSON")


def test_config_that_is_not_an_object(spec, make_adapter):
    path = make_adapter()
    (path / "adapter_config.json").write_text("[1, 2]")
    _refused(path, spec, AdapterConfigError, "adapter_config.json", "JSON object")


def test_peft_type_not_lora(spec, base_model, tmp_path):
    loha = get_peft_model(copy.deepcopy(base_model), LoHaConfig(r=4, target_modules=["q_proj"]))
    loha.save_pretrained(tmp_path / "loha", save_embedding_layers=False)
    error = _refused(tmp_path / "loha", spec, UnsupportedAdapterError, "peft_type", "LOHA")
    assert error.field == "peft_type" and error.path.endswith("adapter_config.json")


def test_missing_peft_type(spec, make_adapter):
    path = make_adapter()
    config_file = path / "adapter_config.json"
    config = json.loads(config_file.read_text())
    del config["peft_type"]
    config_file.write_text(json.dumps(config))
    _refused(path, spec, AdapterConfigError, "peft_type", "missing")


def test_rank_above_max_lora_rank(spec, make_adapter):
    path = make_adapter(rank=16)
    error = _refused(path, spec, AdapterRankError, "'r'", "16", "max_lora_rank=8", max_lora_rank=8)
    assert error.field == "r"


def test_rank_pattern_above_max_lora_rank(spec, make_adapter):
    path = make_adapter(rank=4, rank_pattern={"v_proj": 16})
    _refused(path, spec, AdapterRankError, "rank_pattern", "16", "max_lora_rank=8", max_lora_rank=8)


def test_bad_rank_value(spec, make_adapter):
    path = make_adapter()
    _edit_config(path, r=0)
    _refused(path, spec, AdapterConfigError, "'r'", ">= 1")


@pytest.mark.parametrize("target", ["embed_tokens", "lm_head"])
def test_vocabulary_modules_where_the_model_offers_none(spec, make_adapter, target):
    """embed_tokens and lm_head are served (tests/engine/test_vocab_adapters.py) where the
    model offers its vocabulary side; a spec that offers none refuses them, naming them."""
    path = make_adapter(targets=["q_proj", target])
    spec = replace(spec, vocab_size=0, hidden_size=0)
    error = _refused(path, spec, UnsupportedTargetModuleError, "target_modules", target)
    assert error.field == "target_modules"


def test_modules_to_save_naming_another_module(spec, make_adapter):
    path = make_adapter()
    _edit_config(path, modules_to_save=["lm_head", "norm"])
    error = _refused(path, spec, UnsupportedAdapterError, "modules_to_save", "norm")
    assert "lm_head" not in str(error).split("names")[1].split(";")[0]


def test_saved_embedding_of_another_vocabulary(spec, make_adapter):
    path = make_adapter(modules_to_save=["embed_tokens"])
    _edit_tensors(
        path, lambda t: {k: (v[:100] if "embed_tokens" in k else v) for k, v in t.items()}
    )
    _refused(path, spec, AdapterShapeError, "embed_tokens", "(100, 64)", "(128, 64)")


def test_embedding_lora_of_another_vocabulary(spec, make_adapter):
    path = make_adapter(targets=["q_proj", "embed_tokens"])
    _edit_tensors(
        path,
        lambda t: {
            k: (v[:, :120].contiguous() if "lora_embedding_A" in k else v) for k, v in t.items()
        },
    )
    _refused(path, spec, AdapterShapeError, "lora_embedding_A", "(4, 120)")


def test_trainable_token_past_the_vocabulary(spec, make_adapter):
    path = make_adapter(trainable_token_indices=[3, 5])
    _edit_config(path, trainable_token_indices=[3, 500])
    _refused(path, spec, AdapterShapeError, "trainable_token_indices", "500", "128")


@pytest.mark.parametrize("bias", ["all", "lora_only"])
def test_bias_other_than_none(spec, make_adapter, bias):
    path = make_adapter(bias=bias)
    error = _refused(path, spec, UnsupportedAdapterError, "'bias'", bias)
    assert error.field == "bias"


def test_dora_without_base_weights_to_take_norms_from(spec, make_adapter):
    """DoRA is served (tests/engine/test_dora_and_bias.py) where the model gives its base
    weights; a spec that gives none refuses it, naming the field."""
    path = make_adapter(use_dora=True)
    _refused(path, spec, UnsupportedAdapterError, "use_dora", "base weights")


def test_dora_with_a_lora_bias(spec, make_adapter):
    path = make_adapter(use_dora=True)
    _edit_config(path, lora_bias=True)
    _refused(path, spec, UnsupportedAdapterError, "use_dora", "lora_bias")


def test_dora_magnitude_of_the_wrong_length(spec, make_adapter):
    path = make_adapter(use_dora=True, targets=["q_proj"])
    _edit_tensors(path, lambda t: {k: (v[:10] if "magnitude" in k else v) for k, v in t.items()})
    spec = replace(spec, base_weight=lambda layer, module: torch.zeros(64, 64))
    _refused(path, spec, AdapterShapeError, "lora_magnitude_vector", "(10,)", "64 outputs")


def test_dora_module_without_its_magnitude(spec, make_adapter):
    path = make_adapter(use_dora=True, targets=["q_proj"])
    _edit_tensors(path, lambda t: {k: v for k, v in t.items() if "magnitude" not in k})
    spec = replace(spec, base_weight=lambda layer, module: torch.zeros(64, 64))
    _refused(path, spec, AdapterShapeError, "q_proj has no lora_magnitude_vector")


def test_dora_magnitude_tensor_without_the_flag(spec, make_adapter):
    path = make_adapter(use_dora=True)
    _edit_config(path, use_dora=False)
    _refused(path, spec, UnsupportedAdapterError, "lora_magnitude_vector", "DoRA")


def test_lora_bias_tensor_without_the_flag(spec, make_adapter):
    path = make_adapter(lora_bias=True)
    _edit_config(path, lora_bias=False)
    _refused(path, spec, UnsupportedAdapterError, "lora_B bias", "lora_bias")


def test_lora_bias_of_the_wrong_length(spec, make_adapter):
    path = make_adapter(lora_bias=True, targets=["q_proj"])
    _edit_tensors(path, lambda t: {k: (v[:7] if k.endswith(".bias") else v) for k, v in t.items()})
    _refused(path, spec, AdapterShapeError, "lora_B bias", "(7,)")


def test_base_modifying_init(spec, make_adapter):
    path = make_adapter()
    _edit_config(path, init_lora_weights="pissa")
    _refused(path, spec, UnsupportedAdapterError, "init_lora_weights", "pissa")


def test_wrong_d_in(spec, make_adapter):
    other = hf_init_tiny_model(hidden_size=32, num_attention_heads=4, head_dim=16)
    path = make_adapter(model=other, targets=["q_proj"])
    _refused(path, spec, AdapterShapeError, "q_proj", "d_in 32", "takes 64")


def test_wrong_d_out(spec, make_adapter):
    path = make_adapter(targets=["up_proj"])
    _edit_tensors(path, lambda t: {k: (v[:100] if "lora_B" in k else v) for k, v in t.items()})
    _refused(path, spec, AdapterShapeError, "up_proj", "d_out 100", "gives 128")


def test_rank_differs_from_config(spec, make_adapter):
    path = make_adapter(rank=8)
    _edit_config(path, r=4)
    _refused(path, spec, AdapterShapeError, "rank", "r=4")


def test_layer_out_of_range(spec, make_adapter):
    path = make_adapter(model=hf_init_tiny_model(num_hidden_layers=3))
    _refused(path, spec, AdapterShapeError, "layers.2.", "layer 2", "0..1")


def test_a_without_b(spec, make_adapter):
    path = make_adapter(targets=["q_proj"])
    _edit_tensors(
        path, lambda t: {k: v for k, v in t.items() if k != next(x for x in t if "lora_B" in x)}
    )
    _refused(path, spec, AdapterShapeError, "lora_A without lora_B")


def test_no_lora_tensors(spec, make_adapter):
    path = make_adapter()
    save_file({}, path / "adapter_model.safetensors")
    _refused(path, spec, AdapterShapeError, "no LoRA tensors")


def test_weights_for_a_module_the_config_does_not_target(spec, make_adapter):
    path = make_adapter(targets=["q_proj", "v_proj"])
    _edit_config(path, target_modules=["q_proj"])
    _refused(path, spec, AdapterShapeError, "v_proj", "target_modules")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(spec, make_adapter, damage):
    path = make_adapter()
    weights_file = path / "adapter_model.safetensors"
    data = weights_file.read_bytes()
    weights_file.write_bytes(b"\x00garbage" * 10 if damage == "garbage" else data[: len(data) // 2])
    error = _refused(path, spec, CorruptWeightsError, "adapter_model.safetensors")
    assert isinstance(error, AdapterError)


def test_other_base_model_warns(spec, make_adapter):
    path = make_adapter(base_model_name="meta-llama/Llama-2-7b-hf")
    with pytest.warns(BaseModelMismatchWarning, match="Llama-2-7b-hf.*tiny-llama"):
        adapter = load_adapter(path, spec, max_lora_rank=8)
    assert adapter.base_model_name_or_path == "meta-llama/Llama-2-7b-hf"


def test_other_base_model_is_an_error_when_strict(spec, make_adapter):
    path = make_adapter(base_model_name="meta-llama/Llama-2-7b-hf")
    error = _refused(
        path,
        spec,
        BaseModelMismatchError,
        "base_model_name_or_path",
        "Llama-2-7b-hf",
        strict_base_model=True,
    )
    assert error.field == "base_model_name_or_path"


def test_missing_base_model_is_an_error_only_when_strict(spec, make_adapter):
    path = make_adapter()
    _edit_config(path, base_model_name_or_path=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapter = load_adapter(path, spec, max_lora_rank=8)
    assert adapter.base_model_name_or_path is None
    _assert_loaded_as_written(adapter, path, 4, ["q_proj", "v_proj"])
    _refused(path, spec, BaseModelMismatchError, "missing", strict_base_model=True)


@pytest.mark.parametrize(
    "recorded",
    [
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "/models/smollm2-135m-instruct/",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ],
)
def test_base_model_names_compare_loosely(tmp_path, recorded):
    model = hf_init_tiny_model()
    spec = lora_spec(model.config, "SmolLM2-135M-Instruct")
    path = make_random_adapter(model, tmp_path / "a", rank=2, targets=["q_proj"])
    _edit_config(path, base_model_name_or_path=recorded)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapter = load_adapter(path, spec, max_lora_rank=8, strict_base_model=True)
    assert adapter.base_model_name_or_path == recorded
    _assert_loaded_as_written(adapter, path, 2, ["q_proj"])


def test_bad_max_lora_rank(spec, make_adapter):
    with pytest.raises(ValueError, match="max_lora_rank"):
        load_adapter(make_adapter(), spec, max_lora_rank=0)


def test_tiny_name_is_accepted_silently(spec, make_adapter):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_adapter(make_adapter(), spec, max_lora_rank=8).base_model_name_or_path == (
            HF_INIT_NAME
        )


def test_zero_alpha_with_alpha_pattern(spec, make_adapter):
    path = make_adapter()
    _edit_config(path, lora_alpha=0, alpha_pattern={"q_proj": 4})
    _refused(path, spec, UnsupportedAdapterError, "lora_alpha", "alpha_pattern")


def test_invalid_regex_in_a_pattern(spec, make_adapter):
    path = make_adapter()
    _edit_config(path, rank_pattern={"q_proj(": 2})
    _refused(path, spec, AdapterConfigError, "rank_pattern", "invalid regex")
