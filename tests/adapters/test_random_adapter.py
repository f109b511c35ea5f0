"""make_random_adapter: real PEFT output, deterministic, visible but sane, base model untouched."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from peft import PeftModel
from tiny_llama import ALL_MODULES, hf_init_tiny_model

from loragate.adapters import load_adapter
from loragate.tools import make_random_adapter

ALL = list(ALL_MODULES)


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_same_seed_same_files_other_seed_other_weights(base_model, tmp_path):
    first = make_random_adapter(base_model, tmp_path / "1", rank=4, targets=ALL, seed=7)
    again = make_random_adapter(base_model, tmp_path / "2", rank=4, targets=ALL, seed=7)
    other = make_random_adapter(base_model, tmp_path / "3", rank=4, targets=ALL, seed=8)
    assert _files(first) == _files(again)
    assert _files(first)["adapter_model.safetensors"] != _files(other)["adapter_model.safetensors"]


def test_does_not_depend_on_or_disturb_the_global_rng(base_model, tmp_path):
    torch.manual_seed(1)
    first = make_random_adapter(base_model, tmp_path / "1", rank=4, targets=["q_proj"])
    after = torch.rand(3)
    torch.manual_seed(2)
    torch.rand(5)
    second = make_random_adapter(base_model, tmp_path / "2", rank=4, targets=["q_proj"])
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after)
    assert _files(first) == _files(second)


def test_leaves_the_base_model_untouched(tmp_path):
    model = hf_init_tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = {k: p.requires_grad for k, p in model.named_parameters()}
    make_random_adapter(model, tmp_path / "a", rank=4, targets=ALL)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert {k: p.requires_grad for k, p in model.named_parameters()} == grads
    assert not any("lora" in name for name, _ in model.named_modules())
    assert not hasattr(model, "peft_config")


def test_writes_the_requested_peft_config(base_model, tmp_path):
    path = make_random_adapter(
        base_model,
        tmp_path / "a",
        rank=8,
        targets=["q_proj", "down_proj"],
        alpha=4,
        use_rslora=True,
        base_model_name="org/tiny-llama",
    )
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 4
    assert config["use_rslora"] is True
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj"]
    assert config["base_model_name_or_path"] == "org/tiny-llama"
    assert (path / "adapter_model.safetensors").is_file()
    assert not list(path.glob("*.bin"))


@pytest.mark.parametrize("use_rslora", [False, True])
def test_changes_outputs_clearly_but_sanely(base_model, tmp_path, use_rslora):
    path = make_random_adapter(
        base_model, tmp_path / "a", rank=8, targets=ALL, use_rslora=use_rslora, init_scale=0.3
    )
    ids = torch.arange(1, 33).unsqueeze(0)
    with torch.no_grad():
        base_logits = base_model(ids).logits
        lora_logits = PeftModel.from_pretrained(copy.deepcopy(base_model), path)(ids).logits
    assert torch.isfinite(lora_logits).all()
    change = (lora_logits - base_logits).norm() / base_logits.norm()
    assert 0.05 < change < 2.0, f"relative logit change {change:.3f}"
    assert (lora_logits.argmax(-1) != base_logits.argmax(-1)).any()


def test_init_scale_sets_each_projections_relative_change(base_model, spec, tmp_path):
    """Per output feature, scale * B @ A @ x spreads about init_scale * rms(x)."""
    path = make_random_adapter(base_model, tmp_path / "a", rank=16, targets=["up_proj"], seed=3)
    adapter = load_adapter(path, spec, max_lora_rank=16)
    a, b = adapter.weights[(0, "up_proj")]
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0))
    delta = adapter.scale * (x @ a.T) @ b.T
    ratio = delta.pow(2).mean().sqrt() / x.pow(2).mean().sqrt()
    assert ratio == pytest.approx(0.1, rel=0.3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rank=0, targets=["q_proj"]), "rank"),
        (dict(rank=4, targets=[]), "targets"),
        (dict(rank=4, targets=["q_proj"], init_scale=-1.0), "init_scale"),
    ],
)
def test_bad_arguments(base_model, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_random_adapter(base_model, tmp_path / "a", **kwargs)
