"""Turn a model path (HF directory or GGUF file) into a config, weights and a tokenizer.

The engine serves a GGUF file's weights in their own block types (engine/loading/gguf_weights.py):
its config, generation config and tokenizer are written once to a cached directory with no
weights in it, whose record names the file, and every start reads the weights from the file.
With ``--gguf-dequantize`` (and for tools that load the model with transformers, and for an
architecture not served in blocks), the file is dequantized once through transformers and
cached as an HF directory (config + float32 safetensors + tokenizer) instead. Either way the
tokenizer saved there adds the special tokens the GGUF metadata asks for, not the BOS that
transformers' GGUF tokenizer adds regardless (see special_tokens.py). The start log says
which path ran.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from loragate.engine.loading.default_model import DEFAULT_MODEL_NAME, default_model_path
from loragate.engine.loading.gguf_weights import (
    BLOCK_ARCHITECTURES,
    WEIGHTS_IN_BLOCKS,
    GGUFWeights,
    gguf_architecture,
    gguf_weights_source,
)
from loragate.engine.loading.gguf_weights import describe as describe_weights
from loragate.engine.loading.quantization import quantization_for
from loragate.engine.loading.special_tokens import (
    SOURCE_RECORD,
    follow_gguf_rule,
    read_gguf_rule,
    recorded_gguf_rule,
)
from loragate.engine.models import SUPPORTED_MODEL_TYPES

log = logging.getLogger(__name__)

# Part of the cache key: bump it whenever a conversion writes something different, so an
# older cached directory is never read as a current one. 2: the tokenizer follows the
# GGUF's add_bos_token / add_eos_token and SOURCE_RECORD records them. 3: the tokenizer
# is declared as the generic fast tokenizer (see _declare_generic_tokenizer).
CONVERSION_VERSION = 3


@dataclass(frozen=True)
class ModelSource:
    """A loadable HF directory and the name the model is served under."""

    hf_dir: Path
    name: str


def resolve_model(
    model: str | None, cache_dir: str | None = None, gguf_blocks: bool = False
) -> ModelSource:
    """Find the model on disk; a GGUF file gets a cached float32 HF directory (what tools
    and references load with transformers), or with ``gguf_blocks`` (the engine's default) a
    cached directory of its config and tokenizer whose weights `load_weights` reads from the
    file in their block types."""
    if model is None:
        gguf = default_model_path()
        hf_dir = _gguf_dir(gguf, DEFAULT_MODEL_NAME, cache_dir, gguf_blocks)
        return ModelSource(hf_dir, DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {model}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model file must be a .gguf file or an HF directory: {model}")
        name = path.stem.split(".")[0]
        return ModelSource(_gguf_dir(path, name, cache_dir, gguf_blocks), name)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory has no config.json: {path}")
    return ModelSource(path, path.resolve().name)


def load_config(hf_dir: Path) -> PretrainedConfig:
    """The model's config; a multimodal checkpoint that nests a text model we run (gemma3)
    gives that text model's config."""
    config = AutoConfig.from_pretrained(hf_dir)
    if config.model_type == "gemma3" and getattr(config, "text_config", None) is not None:
        config = config.get_text_config()
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {config.model_type!r} in {hf_dir / 'config.json'} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The directory's tokenizer; a converted GGUF's follows the rule recorded from the file."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    gguf_rule = recorded_gguf_rule(Path(path))
    if gguf_rule is not None:
        follow_gguf_rule(tokenizer, gguf_rule)
    return tokenizer


def load_weights(hf_dir: Path, quantization: str | None = None) -> dict:
    """All tensors of the safetensors files in the directory (pickle files are refused), or
    of the GGUF file it stands for, kept in their block types. ``quantization``:
    ``--quantization`` (engine/loading/quantization.py); an AWQ/GPTQ checkpoint is unpacked into its
    integer blocks whether or not it is named."""
    gguf = gguf_weights_source(hf_dir)
    held = quantization_for(quantization, hf_dir, gguf_blocks=gguf is not None)
    if gguf is not None:
        if not gguf.is_file():
            raise FileNotFoundError(f"the GGUF file {gguf} recorded in {hf_dir} is gone")
        weights = GGUFWeights(gguf, load_config(hf_dir)).tensors()
        log.info("weights: %s kept in its GGUF types: %s", gguf.name, describe_weights(weights))
        return weights
    files = sorted(hf_dir.glob("*.safetensors"))
    converted_from = recorded_gguf_rule(hf_dir)
    if converted_from is not None and files:
        log.info(
            "weights: %s dequantized to float32 (the GGUF file's types are kept unless "
            "--gguf-dequantize)",
            Path(converted_from["gguf"]).name,
        )
    if not files:
        pickles = [p.name for p in hf_dir.glob("*.bin")] + [p.name for p in hf_dir.glob("*.pt")]
        hint = f" (found {', '.join(pickles)}: pickle weights are refused)" if pickles else ""
        raise FileNotFoundError(f"no .safetensors weights in {hf_dir}{hint}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ValueError(f"corrupt weights file {file}: {exc}") from exc
    if held.at_load is None and held.checkpoint is None:
        return weights
    weights = held.convert(weights)
    log.info("weights: quantization %s: %s", held.describe(), describe_weights(weights))
    return weights


class _ConversionStages:
    """Numbered stage lines with the time spent so far."""

    STAGES = 3

    def __init__(self, gguf: Path):
        self.gguf, self.started, self.number = gguf, time.perf_counter(), 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def begin(self, what: str) -> None:
        self.number += 1
        log.info(
            "converting %s: stage %d/%d, %s (%.1f s so far)",
            self.gguf.name,
            self.number,
            self.STAGES,
            what,
            self.elapsed(),
        )


def _gguf_dir(gguf: Path, name: str, cache_dir: str | None, blocks: bool) -> Path:
    """The cached directory standing for the GGUF file on the path chosen for it."""
    if blocks:
        cached = _cache_target(gguf, name, cache_dir, ":blocks")
        if (cached / "config.json").is_file():  # the file's header parsed at the first start
            log.info("GGUF %s: weights served in their block types", gguf.name)
            return cached
        architecture = gguf_architecture(gguf)
        if architecture in BLOCK_ARCHITECTURES:
            log.info(
                "GGUF %s: weights served in their block types (--gguf-dequantize serves "
                "them as float32)",
                gguf.name,
            )
            return _gguf_to_config_dir(gguf, name, cache_dir)
        log.info(
            "GGUF %s: architecture %r is not served in block types (served: %s): "
            "dequantizing it to float32",
            gguf.name,
            architecture,
            ", ".join(BLOCK_ARCHITECTURES),
        )
    return _gguf_to_hf_dir(gguf, name, cache_dir)


def _cache_target(gguf: Path, name: str, cache_dir: str | None, kind: str) -> Path:
    stat = gguf.stat()
    identity = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:v{CONVERSION_VERSION}{kind}"
    key = hashlib.sha256(identity.encode())
    root = Path(cache_dir or os.environ.get("LORAGATE_CACHE", "~/.cache/loragate")).expanduser()
    return root / "models" / key.hexdigest()[:16] / name


def _gguf_to_config_dir(gguf: Path, name: str, cache_dir: str | None) -> Path:
    """A directory of the file's config, generation config and tokenizer, no weights: its
    record says the weights are read from the file in their block types."""
    target = _cache_target(gguf, name, cache_dir, ":blocks")
    if (target / "config.json").is_file():
        return target
    from transformers import GenerationConfig

    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        gguf_rule = read_gguf_rule(gguf)
    except Exception as exc:  # transformers raises many types for a bad file
        raise ValueError(f"cannot read GGUF model {gguf}: {exc}") from exc
    follow_gguf_rule(tokenizer, gguf_rule)
    record = {
        "gguf": str(gguf.resolve()),
        "weights": WEIGHTS_IN_BLOCKS,
        "special_tokens": gguf_rule,
    }

    def fill(tmp: Path) -> None:
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        _save_tokenizer(tmp, tokenizer, record)

    _publish(target, fill)
    return target


def _gguf_to_hf_dir(gguf: Path, name: str, cache_dir: str | None) -> Path:
    """The converted directory is named after the model, so adapters trained on it record
    a base_model_name_or_path whose basename is the served model's name."""
    target = _cache_target(gguf, name, cache_dir, "")
    if (target / "config.json").is_file():
        return target
    # The first start spends seconds to minutes here: a line per stage says it is alive.
    stage = _ConversionStages(gguf)
    log.info("converting %s to an HF directory at %s (once)", gguf, target)
    from transformers import AutoModelForCausalLM

    try:
        stage.begin("reading and dequantizing the GGUF weights")
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        stage.begin("reading the GGUF tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        gguf_rule = read_gguf_rule(gguf)
    except Exception as exc:  # transformers raises many types for a bad file
        raise ValueError(f"cannot read GGUF model {gguf}: {exc}") from exc
    follow_gguf_rule(tokenizer, gguf_rule)
    record = {"gguf": str(gguf.resolve()), "special_tokens": gguf_rule}

    def fill(tmp: Path) -> None:
        stage.begin("writing safetensors and the tokenizer")
        model.save_pretrained(tmp, safe_serialization=True)
        _save_tokenizer(tmp, tokenizer, record)

    _publish(target, fill)
    log.info("converted %s in %.1f s; later starts read %s", gguf.name, stage.elapsed(), target)
    return target


def _publish(target: Path, fill: Callable[[Path], None]) -> None:
    """Write a cached directory whole: ``fill`` writes into a temporary directory beside
    ``target``, which is then renamed into place, so no reader sees half of it. A process
    that lost the race to another keeps the winner's directory."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        fill(tmp)
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():  # another process may have won the race
            raise


def _save_tokenizer(hf_dir: Path, tokenizer, record: dict) -> None:
    """The tokenizer as any transformers reads it, and the record of where it came from."""
    tokenizer.save_pretrained(hf_dir)
    _declare_generic_tokenizer(hf_dir)
    (hf_dir / SOURCE_RECORD).write_text(json.dumps(record, indent=2))


def _declare_generic_tokenizer(hf_dir: Path) -> None:
    """Declare the saved tokenizer as `PreTrainedTokenizerFast`, which reads tokenizer.json
    as it is in every transformers.

    transformers' GGUF reader builds a llama file's byte-level BPE as a `LlamaTokenizerFast`
    and saves it under `"tokenizer_class": "LlamaTokenizer"`; transformers 5.x reads that
    class as a SentencePiece-style tokenizer of its own making, so a tool pointed at this
    folder (guidellm, aiperf, inference-perf install 5.x) got other ids than the server's
    and decoded them without spaces."""
    config_file = hf_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if not (hf_dir / "tokenizer.json").is_file():
        raise ValueError(f"the tokenizer saved in {hf_dir} has no tokenizer.json")
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))
