"""adapter_config.json, checked field by field before any tensor is read.

Anything a PEFT LoRA can express that our batched kernels cannot reproduce exactly is
refused here, naming the field, rather than served slightly wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from loragate.adapters.errors import (
    AdapterConfigError,
    AdapterRankError,
    UnsupportedAdapterError,
    UnsupportedTargetModuleError,
)
from loragate.adapters.json_depth import MAX_JSON_DEPTH, too_deep
from loragate.adapters.module_patterns import PatternError, compile_pattern, first_suffix_match

# adapter_config.json is a few hundred bytes in practice; anything larger is refused unread.
MAX_CONFIG_BYTES = 1 << 20
# lora_alpha (and alpha_pattern values) must be in (0, MAX_LORA_ALPHA]: the registry
# stores a positive alpha, and larger scales only overflow the float32 slots.
MAX_LORA_ALPHA = 1.0e6

# LoRA variants and extras that change the forward pass or the base weights; each is
# refused when set to anything but its PEFT default (None/False/empty).
_UNSUPPORTED_EXTRAS = {
    "layer_replication": "layer replication",
    "target_parameters": "LoRA on raw parameters",
    "alora_invocation_tokens": "activated LoRA (aLoRA)",
    "use_qalora": "QA-LoRA input pooling",
    "use_bdlora": "block-diagonal LoRA",
    "arrow_config": "Arrow routing",
    "kasa_config": "KaSA",
    "velora_config": "VeLoRA",
    "monteclora_config": "MonteCLoRA",
}

# init_lora_weights values whose adapters assume a modified base weight unless PEFT
# converted them on save (conversion writes init_lora_weights=true).
_BASE_MODIFYING_INITS = ("pissa", "corda", "olora", "loftq", "lora_ga")


@dataclass(frozen=True)
class LoraConfigFields:
    """The validated fields of one adapter_config.json that decide the math."""

    path: Path
    r: int
    lora_alpha: float
    use_rslora: bool
    fan_in_fan_out: bool
    target_modules: tuple[str, ...] | str | None
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    base_model_name_or_path: str | None
    use_dora: bool = False
    lora_bias: bool = False
    # Whole modules the adapter carries its own copy of (embed_tokens, lm_head), and the
    # embedding rows it retrains (PEFT's trainable tokens).
    modules_to_save: tuple[str, ...] = ()
    trainable_token_indices: tuple[int, ...] = ()

    @property
    def scale(self) -> float:
        """The adapter-wide scaling PEFT applies: alpha/r, or alpha/sqrt(r) with rsLoRA."""
        return _scaling(self.lora_alpha, self.r, self.use_rslora)

    def rank_for(self, module_key: str) -> int:
        """The rank PEFT gives the module named ``module_key`` (its rank_pattern rules)."""
        return self.rank_pattern.get(_pattern_key(self.rank_pattern, module_key), self.r)

    def scale_for(self, module_key: str) -> float:
        """The scaling PEFT gives ``module_key``, from its own rank and alpha."""
        alpha = self.alpha_pattern.get(
            _pattern_key(self.alpha_pattern, module_key), self.lora_alpha
        )
        return _scaling(alpha, self.rank_for(module_key), self.use_rslora)


def _scaling(alpha: float, r: int, use_rslora: bool) -> float:
    return alpha / math.sqrt(r) if use_rslora else alpha / r


def _pattern_key(patterns: dict, module_key: str) -> str | None:
    """The first pattern that matches the end of ``module_key``, as PEFT matches them
    (in linear time: see module_patterns)."""
    return first_suffix_match(patterns, module_key) if patterns else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)  # isfinite overflows on huge ints


def read_lora_config(
    path: Path, *, max_lora_rank: int, supported_modules: frozenset[str]
) -> LoraConfigFields:
    """Parse and check ``path`` (an adapter_config.json); raise an AdapterError naming the field."""
    raw = _read_json(path)

    peft_type = raw.get("peft_type")
    if peft_type is None:
        raise AdapterConfigError("field 'peft_type' is missing", path=path, field="peft_type")
    if str(peft_type).upper() != "LORA":
        raise UnsupportedAdapterError(
            f"field 'peft_type' is {peft_type!r}; only LORA adapters are served",
            path=path,
            field="peft_type",
        )
    _refuse_unsupported_features(raw, path)

    r = raw.get("r", 8)
    if not _is_int(r) or r < 1:
        raise AdapterConfigError(
            f"field 'r' must be an int >= 1, got {_shown(r)}", path=path, field="r"
        )
    if r > max_lora_rank:
        raise AdapterRankError(
            f"field 'r' is {_shown(r)}, above max_lora_rank={max_lora_rank}", path=path, field="r"
        )
    alpha = raw.get("lora_alpha", 8)
    if not _is_number(alpha):
        raise AdapterConfigError(
            f"field 'lora_alpha' must be a number, got {_shown(alpha)}",
            path=path,
            field="lora_alpha",
        )
    flags = {}
    for name in ("use_rslora", "fan_in_fan_out", "use_dora", "lora_bias"):
        value = raw.get(name, False)
        if not isinstance(value, bool):
            raise AdapterConfigError(
                f"field '{name}' must be true or false, got {value!r}", path=path, field=name
            )
        flags[name] = value
    if flags["use_dora"] and flags["lora_bias"]:
        raise UnsupportedAdapterError(
            "fields 'use_dora' and 'lora_bias' are both true; DoRA with a lora_B bias is "
            "not supported",
            path=path,
            field="lora_bias",
        )

    base_name = raw.get("base_model_name_or_path")
    if base_name is not None and not isinstance(base_name, str):
        raise AdapterConfigError(
            f"field 'base_model_name_or_path' must be a string, got {base_name!r}",
            path=path,
            field="base_model_name_or_path",
        )
    alpha_pattern = _read_pattern(raw, "alpha_pattern", path, None)
    if alpha == 0 and alpha_pattern:
        # Per-module alphas are folded into B relative to lora_alpha, which must not be 0.
        raise UnsupportedAdapterError(
            "field 'lora_alpha' is 0 while 'alpha_pattern' is set", path=path, field="lora_alpha"
        )
    if not 0 < alpha <= MAX_LORA_ALPHA:
        raise AdapterConfigError(
            f"field 'lora_alpha' must be in (0, {MAX_LORA_ALPHA:g}], got {_shown(alpha)}",
            path=path,
            field="lora_alpha",
        )
    return LoraConfigFields(
        path=path,
        r=r,
        lora_alpha=float(alpha),
        use_rslora=flags["use_rslora"],
        fan_in_fan_out=flags["fan_in_fan_out"],
        target_modules=_read_target_modules(raw, path, supported_modules),
        rank_pattern=_read_pattern(raw, "rank_pattern", path, max_lora_rank),
        alpha_pattern=alpha_pattern,
        base_model_name_or_path=base_name,
        use_dora=flags["use_dora"],
        lora_bias=flags["lora_bias"],
        modules_to_save=_read_modules_to_save(raw, path),
        trainable_token_indices=_read_token_indices(raw, path),
    )


def _read_json(path: Path) -> dict:
    """The config as a dict, refusing (without a traceback) files too large, too deeply
    nested, or holding numbers Python will not convert."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise AdapterConfigError(f"cannot be read ({exc.strerror})", path=path) from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise AdapterConfigError(f"is larger than {MAX_CONFIG_BYTES} bytes", path=path)
    if too_deep(data):
        raise AdapterConfigError(f"nests deeper than {MAX_JSON_DEPTH} levels", path=path)
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterConfigError(f"invalid JSON: {exc}", path=path) from exc
    except (ValueError, RecursionError) as exc:  # e.g. an integer of thousands of digits
        raise AdapterConfigError(f"invalid JSON: {exc}", path=path) from exc
    if not isinstance(raw, dict):
        raise AdapterConfigError("must hold a JSON object", path=path)
    return raw


def _shown(value) -> str:
    """A value for an error message, cut short: a config may hold huge numbers."""
    if _is_int(value) and value.bit_length() > 64:
        return "an integer too large"
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _refuse_unsupported_features(raw: dict, path: Path) -> None:
    bias = raw.get("bias", "none")
    if bias != "none":
        raise UnsupportedAdapterError(
            f"field 'bias' is {bias!r}; only 'none' is supported", path=path, field="bias"
        )
    for name, what in _UNSUPPORTED_EXTRAS.items():
        if raw.get(name):
            raise UnsupportedAdapterError(
                f"field '{name}' is set ({what}), which is not supported", path=path, field=name
            )
    init = raw.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_BASE_MODIFYING_INITS):
        raise UnsupportedAdapterError(
            f"field 'init_lora_weights' is {init!r}: the adapter assumes a modified base model; "
            "save it with PEFT's path_initial_model_for_weight_conversion",
            path=path,
            field="init_lora_weights",
        )


# The modules an adapter may carry whole copies of (modules_to_save).
SAVABLE_MODULES = ("embed_tokens", "lm_head")


def _read_modules_to_save(raw: dict, path: Path) -> tuple[str, ...]:
    saved = raw.get("modules_to_save") or []
    if not isinstance(saved, list | tuple) or not all(isinstance(m, str) for m in saved):
        raise AdapterConfigError(
            f"field 'modules_to_save' must be a list of module names, got {_shown(saved)}",
            path=path,
            field="modules_to_save",
        )
    names = tuple(m.rsplit(".", 1)[-1] for m in saved)
    others = sorted({m for m, n in zip(saved, names, strict=True) if n not in SAVABLE_MODULES})
    if others:
        raise UnsupportedAdapterError(
            f"field 'modules_to_save' names {', '.join(others)}; only "
            f"{' and '.join(SAVABLE_MODULES)} may be saved whole",
            path=path,
            field="modules_to_save",
        )
    return tuple(sorted(set(names)))


def _read_token_indices(raw: dict, path: Path) -> tuple[int, ...]:
    """PEFT's trainable_token_indices: a list of token ids, or {"embed_tokens": [...]}."""
    given = raw.get("trainable_token_indices")
    if not given:
        return ()
    if isinstance(given, dict):
        others = sorted(k for k in given if k.rsplit(".", 1)[-1] != "embed_tokens")
        if others:
            raise UnsupportedAdapterError(
                f"field 'trainable_token_indices' names {', '.join(others)}; only "
                "embed_tokens' rows may be trained",
                path=path,
                field="trainable_token_indices",
            )
        given = [i for values in given.values() for i in (values or [])]
    if not isinstance(given, list | tuple) or not all(_is_int(i) and i >= 0 for i in given):
        raise AdapterConfigError(
            "field 'trainable_token_indices' must list token ids >= 0, got " + _shown(given),
            path=path,
            field="trainable_token_indices",
        )
    if len(set(given)) != len(given):
        raise AdapterConfigError(
            "field 'trainable_token_indices' repeats a token id",
            path=path,
            field="trainable_token_indices",
        )
    return tuple(given)


def _read_target_modules(raw: dict, path: Path, supported: frozenset[str]):
    """A tuple of module names, or a regex string (checked later against the weights)."""
    targets = raw.get("target_modules")
    if isinstance(targets, str):
        _check_regex(targets, path, "target_modules")
    if targets is None or isinstance(targets, str):
        return targets
    if not isinstance(targets, list | tuple) or not all(isinstance(t, str) for t in targets):
        raise AdapterConfigError(
            f"field 'target_modules' must be a list of names or a regex, got {targets!r}",
            path=path,
            field="target_modules",
        )
    unsupported = sorted({t for t in targets if t.rsplit(".", 1)[-1] not in supported})
    if unsupported:
        raise UnsupportedTargetModuleError(
            f"field 'target_modules' names {', '.join(unsupported)}; "
            f"LoRA is supported on {', '.join(sorted(supported))} only",
            path=path,
            field="target_modules",
        )
    return tuple(targets)


def _read_pattern(raw: dict, name: str, path: Path, max_rank: int | None) -> dict:
    pattern = raw.get(name) or {}
    if not isinstance(pattern, dict):
        raise AdapterConfigError(
            f"field '{name}' must be an object, got {pattern!r}", path=path, field=name
        )
    for key, value in pattern.items():
        _check_regex(key, path, name)
        if max_rank is not None:
            ok = _is_int(value) and value >= 1
        else:
            ok = _is_number(value) and 0 < value <= MAX_LORA_ALPHA
        if not ok:
            raise AdapterConfigError(
                f"field '{name}' has a bad value {_shown(value)} for {_shown(key)}",
                path=path,
                field=name,
            )
        if max_rank is not None and value > max_rank:
            raise AdapterRankError(
                f"field '{name}' gives {_shown(key)} rank {_shown(value)}, "
                f"above max_lora_rank={max_rank}",
                path=path,
                field=name,
            )
    return dict(pattern)


def _check_regex(pattern: str, path: Path, field: str) -> None:
    try:
        compile_pattern(pattern, anchored_suffix=field != "target_modules")
    except PatternError as exc:
        raise AdapterConfigError(f"field '{field}': {exc}", path=path, field=field) from exc
