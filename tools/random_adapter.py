"""Random but real PEFT adapters, for tests and load benchmarks.

PEFT itself builds and saves the adapter, so the files are exactly what users bring.
PEFT starts lora_B at zero (an adapter that changes nothing); both factors are redrawn
from a seeded generator so the adapter visibly changes outputs, deterministically.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch


def make_random_adapter(
    base_model,
    out_dir: str | Path,
    *,
    rank: int,
    targets,
    alpha: float | None = None,
    use_rslora: bool = False,
    seed: int = 0,
    init_scale: float = 0.1,
    base_model_name: str | None = None,
    **lora_config,
) -> Path:
    """Write a PEFT LoRA directory for ``base_model`` to ``out_dir`` and return its path.

    ``alpha`` defaults to ``rank``. ``init_scale`` sets the size of each adapted
    projection's change relative to its input: per output feature, ``scale * B @ A @ x``
    has about ``init_scale * rms(x)`` spread. The default 0.1 moves SmolLM2-135M's logits
    by about 14% (rank 8 on every projection; a quarter of greedy argmaxes change) while
    keeping them in the base model's range. ``base_model_name`` overrides the
    base_model_name_or_path PEFT records; extra keywords go to ``LoraConfig`` (tests use
    them to build adapters loragate must refuse). ``base_model`` is left untouched.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an int >= 1, got {rank!r}")
    targets = [targets] if isinstance(targets, str) else list(targets)
    if not targets:
        raise ValueError("targets must name at least one module")
    if init_scale < 0 or not math.isfinite(init_scale):
        raise ValueError(f"init_scale must be a finite number >= 0, got {init_scale!r}")
    from peft import LoraConfig, get_peft_model  # heavy; only this helper needs it

    config = LoraConfig(
        r=rank,
        lora_alpha=rank if alpha is None else alpha,
        use_rslora=use_rslora,
        target_modules=targets,
        task_type="CAUSAL_LM",
        **lora_config,
    )
    out = Path(out_dir)
    # PEFT wraps the model in place, freezes its weights and draws kaiming inits from the
    # global RNG: work on a copy and keep the caller's RNG stream as it was.
    with torch.random.fork_rng(devices=[]):
        peft_model = get_peft_model(copy.deepcopy(base_model), config)
        _randomize(peft_model, seed, init_scale)
        if base_model_name is not None:
            peft_model.peft_config["default"].base_model_name_or_path = base_model_name
        # save_embedding_layers="auto" would look the base model up on the Hub: offline here.
        peft_model.save_pretrained(out, safe_serialization=True, save_embedding_layers=False)
    _check_saved_name(out, base_model_name)
    return out


@torch.no_grad()
def _randomize(peft_model, seed: int, init_scale: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _, module in sorted(peft_model.named_modules(), key=lambda item: item[0]):
        pairs = []
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            pairs.append((module.lora_A["default"].weight, module.lora_B["default"].weight))
        if hasattr(module, "lora_embedding_A") and "default" in module.lora_embedding_A:
            pairs.append((module.lora_embedding_A["default"], module.lora_embedding_B["default"]))
        for a, b in pairs:
            scaling = module.scaling["default"] or 1.0
            r, d_in = a.shape
            a.copy_(torch.randn(a.shape, generator=generator) / math.sqrt(d_in))
            b_std = init_scale / (abs(scaling) * math.sqrt(r))
            b.copy_(torch.randn(b.shape, generator=generator) * b_std)
        # DoRA's magnitudes start as the merged weight's norms, lora_B's bias at zero: moved
        # too, so that each changes the output as a trained one would.
        magnitude = getattr(module, "lora_magnitude_vector", None)
        if magnitude is not None and "default" in magnitude:
            weight = magnitude["default"].weight
            weight.mul_(1 + init_scale * torch.randn(weight.shape, generator=generator))
        lora_b = getattr(module, "lora_B", None)
        if lora_b is not None and "default" in lora_b and lora_b["default"].bias is not None:
            bias = lora_b["default"].bias
            scaling = module.scaling["default"] or 1.0
            bias.copy_(torch.randn(bias.shape, generator=generator) * init_scale / abs(scaling))


def _check_saved_name(out: Path, expected: str | None) -> None:
    """PEFT may rewrite base_model_name_or_path on save; make sure ours is what landed."""
    if expected is None:
        return
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    if config.get("base_model_name_or_path") != expected:
        config["base_model_name_or_path"] = expected
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
