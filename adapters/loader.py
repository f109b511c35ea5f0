"""Reading a PEFT LoRA directory into plain float32 CPU tensors, or refusing it.

The weights file is read once: the same bytes are hashed (sha256, for the registry and
every cache tier) and parsed as safetensors (adapters/safetensors_views.py), which runs no
code. The config file is hashed too, and both files are stat'ed before and after the read:
a directory rewritten mid-read is read again, so the hashes always describe the tensors.
Pickle formats are refused outright.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loragate.adapters.errors import (
    AdapterError,
    AdapterNotFoundError,
    AdapterShapeError,
    BaseModelMismatchError,
    BaseModelMismatchWarning,
    CorruptWeightsError,
    PickleWeightsError,
    UnsupportedAdapterError,
    UnsupportedTargetModuleError,
)
from loragate.adapters.identity import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    FilesStamp,
    WeightsIdentity,
    stamp_files,
)
from loragate.adapters.pacing import ALWAYS_PACED, CHUNK_BYTES, LoadPacing
from loragate.adapters.peft_config import LoraConfigFields, read_lora_config
from loragate.adapters.safetensors_views import SafetensorsError, tensor_views
from loragate.adapters.spec import LoRAModelSpec

# Reads of a directory that keeps changing under them before giving up.
READ_ATTEMPTS = 3
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


@dataclass(frozen=True, eq=False)
class LoRAAdapter:
    """One adapter in CPU memory, ready for a device slot (copied in, or on a CPU read in place).

    ``weights[(layer, module)] = (A [r, d_in], B [d_out, r])`` in float32 (in the stacks'
    dtype for stacked modules: the slots' own on a CPU, whose slots read them in place), with
    any per-module alpha (alpha_pattern) already folded into B, so one ``scale`` per adapter
    reproduces PEFT exactly.
    """

    path: Path
    rank: int
    alpha: float
    scale: float
    use_rslora: bool
    target_modules: frozenset[str]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    sha256: str
    size_bytes: int
    base_model_name_or_path: str | None
    config_sha256: str = ""
    stamp: FilesStamp | None = None  # the files as stat'ed before they were read
    # Per module, when its layers form one run at one rank: (first layer, A [L, r, d_in],
    # B transposed [L, r, d_out]), the layout a device slot holds, made on the loader thread
    # so copying into a slot on the engine's step is one plain copy per tensor (and on a CPU,
    # in the slots' dtype, no copy at all: the slot reads them where they are).
    stacked: dict = field(default_factory=dict, repr=False, compare=False)

    def stack_modules(
        self, pacing: LoadPacing = ALWAYS_PACED, dtype: torch.dtype = torch.float32
    ) -> None:
        by_module: dict[str, list] = {}
        for (layer, module), (a, b) in sorted(self.weights.items()):
            by_module.setdefault(module, []).append((layer, a, b))
        for module, entries in by_module.items():
            layers = [layer for layer, _, _ in entries]
            ranks = {a.shape[0] for _, a, _ in entries}
            if len(ranks) == 1 and layers == list(range(layers[0], layers[-1] + 1)):
                a0, b0 = entries[0][1], entries[0][2]
                a_stack = a0.new_empty(len(entries), *a0.shape, dtype=dtype)
                bt_stack = b0.new_empty(len(entries), b0.shape[1], b0.shape[0], dtype=dtype)
                for i, (_, a, b) in enumerate(entries):  # a layer at a time, paced
                    began = time.perf_counter()
                    a_stack[i].copy_(a)
                    bt_stack[i].copy_(b.T)
                    pacing.pause_after(began)
                self.stacked[module] = (layers[0], a_stack, bt_stack)
                for i, layer in enumerate(layers):  # views: the weights are held once
                    self.weights[(layer, module)] = (a_stack[i], bt_stack[i].T)

    @property
    def identity(self) -> WeightsIdentity:
        return WeightsIdentity(self.sha256, self.config_sha256)

    @property
    def num_params(self) -> int:
        return sum(a.numel() + b.numel() for a, b in self.weights.values())


def load_adapter(
    path: str | Path,
    spec: LoRAModelSpec,
    max_lora_rank: int,
    strict_base_model: bool = False,
    pacing: LoadPacing = ALWAYS_PACED,
    stack_dtype: torch.dtype = torch.float32,
) -> LoRAAdapter:
    """Load and validate the PEFT adapter in directory ``path`` for the model ``spec``;
    ``pacing`` says how it shares the cores with running steps (adapters/pacing.py);
    ``stack_dtype`` is the dtype of its stacked modules (LoRAAdapter.stacked)."""
    if isinstance(max_lora_rank, bool) or not isinstance(max_lora_rank, int) or max_lora_rank < 1:
        raise ValueError(f"max_lora_rank must be an int >= 1, got {max_lora_rank!r}")
    root = Path(path)
    if not root.exists():
        raise AdapterNotFoundError("adapter directory does not exist", path=root)
    if not root.is_dir():
        raise AdapterNotFoundError("adapter path is not a directory", path=root)
    config_path = root / CONFIG_FILE
    weights_path = root / WEIGHTS_FILE
    if not config_path.is_file():
        raise AdapterNotFoundError(f"{CONFIG_FILE} is missing", path=config_path)
    if not weights_path.is_file():
        pickles = sorted(p.name for p in root.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        if pickles:
            raise PickleWeightsError(
                f"only pickle weights found ({', '.join(pickles)}); they are never loaded "
                f"because unpickling can run code: save the adapter as {WEIGHTS_FILE}",
                path=root / pickles[0],
            )
        raise AdapterNotFoundError(f"{WEIGHTS_FILE} is missing", path=weights_path)

    for _ in range(READ_ATTEMPTS):
        stamp = stamp_files(root)
        if stamp is None:
            raise AdapterNotFoundError("adapter files vanished while being read", path=root)
        adapter = _read(root, spec, max_lora_rank, strict_base_model, stamp, pacing)
        if stamp.same_files(stamp_files(root) or stamp):
            adapter.stack_modules(pacing, stack_dtype)
            return adapter
    raise AdapterError(
        f"the files kept changing while being read ({READ_ATTEMPTS} tries); "
        "write adapters elsewhere and rename the directory into place",
        path=root,
    )


def sha256_hex(data: bytes, pacing: LoadPacing = ALWAYS_PACED) -> str:
    """The content hash of one file's bytes (a function so tests can count hashes), paced."""
    digest = hashlib.sha256()
    view = memoryview(data)
    for start in range(0, len(view), CHUNK_BYTES):
        began = time.perf_counter()
        digest.update(view[start : start + CHUNK_BYTES])
        pacing.pause_after(began)
    return digest.hexdigest()


def paced_read(path: Path, pacing: LoadPacing = ALWAYS_PACED) -> memoryview:
    """The file's bytes, read in chunks with pauses (adapters/pacing.py) straight into one
    anonymous mapping: its pages are touched by the reads, which leave the GIL free, where a
    zeroed bytearray or joined chunks would fill tens of MB under it."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        view, done = memoryview(mmap.mmap(-1, size)) if size else memoryview(b""), 0
        while done < size:
            began = time.perf_counter()
            count = file.readinto(view[done : done + CHUNK_BYTES])
            if not count:  # the file shrank since fstat
                break
            done += count
            pacing.pause_after(began)
        extra = file.read()  # or grew: the stat check after the read tells
    return view[:done] if not extra else memoryview(bytes(view[:done]) + extra)


def _read(
    root: Path,
    spec: LoRAModelSpec,
    max_lora_rank: int,
    strict: bool,
    stamp: FilesStamp,
    pacing: LoadPacing,
) -> LoRAAdapter:
    config_path, weights_path = root / CONFIG_FILE, root / WEIGHTS_FILE
    config_sha256 = sha256_hex(config_path.read_bytes(), pacing)
    config = read_lora_config(
        config_path, max_lora_rank=max_lora_rank, supported_modules=frozenset(spec.modules)
    )
    _check_base_model(config, spec, strict)

    data = paced_read(weights_path, pacing)
    began = time.perf_counter()
    try:
        tensors = tensor_views(data)
    except SafetensorsError as exc:
        raise CorruptWeightsError(f"cannot parse safetensors: {exc}", path=weights_path) from exc
    weights = _lora_weights(tensors, config, spec, weights_path)
    pacing.pause_after(began)
    adapter = LoRAAdapter(
        path=root,
        rank=max(a.shape[0] for a, _ in weights.values()),
        alpha=config.lora_alpha,
        scale=config.scale,
        use_rslora=config.use_rslora,
        target_modules=frozenset(module for _, module in weights),
        weights=weights,
        sha256=sha256_hex(data, pacing),
        size_bytes=len(data),
        base_model_name_or_path=config.base_model_name_or_path,
        config_sha256=config_sha256,
        stamp=stamp,
    )
    return adapter


def _normalized_model_name(name: str) -> str:
    """``org/SmolLM2-135M-Instruct``, ``/x/smollm2-135m-instruct.Q4_1.gguf`` -> one form."""
    base = re.split(r"[/\\]", name.rstrip("/\\"))[-1].lower()
    base = re.sub(r"\.(gguf|safetensors|bin)$", "", base)
    return re.sub(r"[.-](q\d\w*|i?q\d_\w+|f16|f32|bf16)$", "", base)


def _check_base_model(config: LoraConfigFields, spec: LoRAModelSpec, strict: bool) -> None:
    named = config.base_model_name_or_path
    if named and _normalized_model_name(named) == _normalized_model_name(spec.model_name):
        return
    if not named:
        if strict:
            raise BaseModelMismatchError(
                "field 'base_model_name_or_path' is missing, so the base model cannot be "
                f"checked against {spec.model_name!r} (strict_base_model=True)",
                path=config.path,
                field="base_model_name_or_path",
            )
        return
    message = (
        f"field 'base_model_name_or_path' is {named!r} but the served model is {spec.model_name!r}"
    )
    if strict:
        raise BaseModelMismatchError(message, path=config.path, field="base_model_name_or_path")
    warnings.warn(f"{config.path}: {message}", BaseModelMismatchWarning, stacklevel=4)


def _parse_lora_key(key: str) -> tuple[str, int | None, str, str] | None:
    """``...layers.3.self_attn.q_proj.lora_A[.name].weight`` -> (module_key, 3, 'q_proj', 'A')."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if (
            part in ("lora_A", "lora_B")
            and 0 < i
            and parts[-1] == "weight"
            and len(parts) - i
            in (
                2,
                3,
            )
        ):
            module_parts = parts[:i]
            if module_parts[:2] == ["base_model", "model"]:
                module_parts = module_parts[2:]
            layer = None
            for j in range(len(module_parts) - 2, -1, -1):
                if module_parts[j] == "layers" and module_parts[j + 1].isdigit():
                    layer = int(module_parts[j + 1])
                    break
            return ".".join(module_parts), layer, parts[i - 1], part[-1]
    return None


def _refuse_key(key: str, path: Path) -> AdapterError:
    if "lora_magnitude_vector" in key:
        return UnsupportedAdapterError(
            f"tensor {key!r} is a DoRA magnitude; DoRA is not supported", path=path, field=key
        )
    if "lora_embedding_" in key:
        return UnsupportedTargetModuleError(
            f"tensor {key!r} is a LoRA on an embedding, which is not supported",
            path=path,
            field=key,
        )
    if re.search(r"lora_B(\.[^.]+)?\.bias$", key):
        return UnsupportedAdapterError(
            f"tensor {key!r} is a lora_B bias; LoRA biases are not supported", path=path, field=key
        )
    return UnsupportedAdapterError(
        f"tensor {key!r} is not a LoRA A/B weight loragate can serve", path=path, field=key
    )


def _lora_weights(
    tensors: dict[str, torch.Tensor], config: LoraConfigFields, spec: LoRAModelSpec, path: Path
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    module_keys: dict[tuple[int, str], str] = {}
    for key in sorted(tensors):
        parsed = _parse_lora_key(key)
        if parsed is None:
            raise _refuse_key(key, path)
        module_key, layer, module, half = parsed
        if module not in spec.modules:
            raise UnsupportedTargetModuleError(
                f"tensor {key!r} targets {module!r}; LoRA is supported on "
                f"{', '.join(spec.modules)} only",
                path=path,
                field=key,
            )
        if layer is None or layer >= spec.num_layers:
            where = "has no layer index" if layer is None else f"is for layer {layer}"
            raise AdapterShapeError(
                f"tensor {key!r} {where}; the base model has layers 0..{spec.num_layers - 1}",
                path=path,
                field=key,
            )
        if isinstance(config.target_modules, tuple) and not any(
            module_key == t or module_key.endswith("." + t) for t in config.target_modules
        ):
            raise AdapterShapeError(
                f"tensor {key!r} is for {module!r}, which adapter_config.json's "
                "'target_modules' does not list",
                path=path,
                field=key,
            )
        tensor = tensors[key]
        if not tensor.is_floating_point():
            raise AdapterShapeError(
                f"tensor {key!r} has dtype {tensor.dtype}, not a float", path=path, field=key
            )
        slot = halves.setdefault((layer, module), {})
        if half in slot:
            raise AdapterShapeError(
                f"tensor {key!r} repeats lora_{half} of layer {layer} {module}",
                path=path,
                field=key,
            )
        slot[half] = tensor
        module_keys[(layer, module)] = module_key

    if not halves:
        raise AdapterShapeError("holds no LoRA tensors", path=path)
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        where = f"layers.{layer}.{module}"
        if set(pair) != {"A", "B"}:
            lone = next(iter(pair))
            missing = "B" if lone == "A" else "A"
            raise AdapterShapeError(
                f"{where} has lora_{lone} without lora_{missing}", path=path, field=where
            )
        module_key = module_keys[(layer, module)]
        a, b = _checked_pair(
            pair["A"], pair["B"], config.rank_for(module_key), spec, module, where, path
        )
        ratio = config.scale_for(module_key) / config.scale
        if ratio != 1.0:
            b = b * ratio
        weights[(layer, module)] = (a.contiguous(), b.contiguous())
    return weights


def _checked_pair(a, b, rank, spec, module, where, path):
    d_in, d_out = spec.modules[module]
    if a.dim() != 2 or b.dim() != 2:
        raise AdapterShapeError(
            f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} must be matrices",
            path=path,
            field=where,
        )
    if a.shape[1] != d_in:
        raise AdapterShapeError(
            f"{where}: lora_A has d_in {a.shape[1]} but the base model's {module} takes {d_in}",
            path=path,
            field=where,
        )
    if b.shape[0] != d_out:
        raise AdapterShapeError(
            f"{where}: lora_B has d_out {b.shape[0]} but the base model's {module} gives {d_out}",
            path=path,
            field=where,
        )
    if a.shape[0] != rank or b.shape[1] != rank:
        raise AdapterShapeError(
            f"{where}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} have a rank other than "
            f"the r={rank} that adapter_config.json gives",
            path=path,
            field=where,
        )
    return a.to(torch.float32), b.to(torch.float32)
