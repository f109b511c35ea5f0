"""Reading a PEFT LoRA directory into plain float32 CPU tensors, or refusing it.

The weights file is read once, in one pass: each chunk is hashed (sha256, for the registry
and every cache tier) while the next one is read (or right after it, where the read is
paced), then the bytes are parsed as safetensors (adapters/safetensors_views.py), which runs
no code. The config file is hashed too, and both files are stat'ed before and after the
read: a directory rewritten mid-read is read again, so the hashes always describe the
tensors. Weights read again for a request admitted under them (`vouched`: the files' stamp,
unchanged since they were hashed, and that hash) are not hashed again when the stamps before
and after the read are that one: the same stat that admitted the request vouches for the
bytes. Pickle formats are refused outright.
"""

from __future__ import annotations

import mmap
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loragate.adapters.chunk_hasher import ChunkHasher
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
    SYSTEM_CLOCK,
    WEIGHTS_FILE,
    FilesStamp,
    StampClock,
    Vouch,
    WeightsIdentity,
    stamp_files,
)
from loragate.adapters.pacing import ALWAYS_PACED, CHUNK_BYTES, LoadPacing
from loragate.adapters.peft_config import LoraConfigFields, read_lora_config
from loragate.adapters.read_buffers import Lease, ReadBuffers
from loragate.adapters.safetensors_views import SafetensorsError, tensor_views
from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.vocab_extras import EMBED, HEAD, VocabExtras, is_vocab_key, read_vocab_extras

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
    # Per (layer, module), what the adapter does to each output column of its rows besides
    # adding B A x: DoRA's magnitude / norm(W + scale B A), computed here from the base
    # weight (PEFT's scale, detached), multiplying the module's output; and a lora_B bias,
    # already scaled, added to it.
    row_scales: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict, repr=False)
    row_biases: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict, repr=False)
    # LoRA on embed_tokens / lm_head, whole copies of them, trainable tokens (vocab_extras.py).
    vocab: VocabExtras | None = field(default=None, repr=False)
    # The rows device slots that borrow the stacks read, checked for the kernels per layer
    # and group, made on the loader thread (DeviceSlots.prepare).
    slot_rows: dict = field(default_factory=dict, repr=False, compare=False)

    def stack_modules(
        self,
        pacing: LoadPacing = ALWAYS_PACED,
        dtype: torch.dtype = torch.float32,
        pin_memory: bool = False,
    ) -> None:
        """Stack each module's layers (one rank, a run of layers) into ``stacked``, in
        ``dtype``; with ``pin_memory``, in page-locked memory, which a GPU copies from
        beside the running step (adapters/slot_copies.py)."""
        by_module: dict[str, list] = {}
        for (layer, module), (a, b) in sorted(self.weights.items()):
            by_module.setdefault(module, []).append((layer, a, b))
        for module, entries in by_module.items():
            layers = [layer for layer, _, _ in entries]
            ranks = {a.shape[0] for _, a, _ in entries}
            if len(ranks) == 1 and layers == list(range(layers[0], layers[-1] + 1)):
                a0, b0 = entries[0][1], entries[0][2]
                a_shape = (len(entries), *a0.shape)
                bt_shape = (len(entries), b0.shape[1], b0.shape[0])
                a_stack = torch.empty(a_shape, dtype=dtype, pin_memory=pin_memory)
                bt_stack = torch.empty(bt_shape, dtype=dtype, pin_memory=pin_memory)
                for i, (_, a, b) in enumerate(entries):  # a layer at a time, paced
                    began = pacing.now()
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
        extras = [*self.row_scales.values(), *self.row_biases.values()]
        vocab = self.vocab.num_params if self.vocab is not None else 0
        return (
            sum(a.numel() + b.numel() for a, b in self.weights.values())
            + sum(t.numel() for t in extras)
            + vocab
        )

    @property
    def kind(self) -> str:
        """What the adapter is, as the API and metrics say it: lora, dora, lora+bias."""
        kind = "dora" if self.row_scales else "lora+bias" if self.row_biases else "lora"
        vocab = self.vocab
        if vocab is not None and (vocab.embed_table is not None or vocab.head_table is not None):
            kind += "+saved-modules"
        if vocab is not None and (vocab.embed_lora is not None or vocab.head_lora is not None):
            kind += "+vocab-lora"
        if vocab is not None and vocab.token_ids is not None:
            kind += "+trainable-tokens"
        return kind


def load_adapter(
    path: str | Path,
    spec: LoRAModelSpec,
    max_lora_rank: int,
    strict_base_model: bool = False,
    pacing: LoadPacing = ALWAYS_PACED,
    stack_dtype: torch.dtype = torch.float32,
    vouched: Vouch | None = None,
    buffers: ReadBuffers | None = None,
    pin_memory: bool = False,
    clock: StampClock = SYSTEM_CLOCK,
) -> LoRAAdapter:
    """Load and validate the PEFT adapter in directory ``path`` for the model ``spec``;
    ``pacing`` says how it shares the cores with running steps (adapters/pacing.py);
    ``stack_dtype`` is the dtype of its stacked modules (LoRAAdapter.stacked). With
    ``vouched`` (a trusted stamp of these files and the identity they hashed to), files
    whose stamps before and after the read are that stamp are not hashed again. The weights
    are read into memory ``buffers`` lends (adapters/read_buffers.py; a fresh mapping
    without it). ``pin_memory``: the stacks in page-locked memory (for a GPU's slots).
    ``clock``: the time the files' stamps are taken at (adapters/identity.py)."""
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
        stamp = stamp_files(root, clock)
        if stamp is None:
            raise AdapterNotFoundError("adapter files vanished while being read", path=root)
        known = vouched_identity(stamp, vouched)
        with (buffers or ReadBuffers(kept=0)).lend() as lease:
            adapter = _read(
                root, spec, max_lora_rank, strict_base_model, stamp, pacing, known, lease
            )
            if stamp.same_files(stamp_files(root, clock) or stamp):
                adapter.stack_modules(pacing, stack_dtype, pin_memory)
                return adapter  # the lease ends after: its mapping is kept if unviewed
    raise AdapterError(
        f"the files kept changing while being read ({READ_ATTEMPTS} tries); "
        "write adapters elsewhere and rename the directory into place",
        path=root,
    )


def vouched_identity(stamp: FilesStamp, vouched: Vouch | None) -> WeightsIdentity | None:
    """The identity ``vouched`` gives files stamped ``stamp``: its own when it is a trusted
    stamp of the very same files, else None (hash them)."""
    if vouched is None:
        return None
    trusted, identity = vouched
    return identity if trusted.trusted and trusted.same_files(stamp) else None


def hashed_read(
    path: Path, pacing: LoadPacing = ALWAYS_PACED, hash_it: bool = True, lease: Lease | None = None
):
    """The file's bytes and their sha256 hex digest (None unless ``hash_it``), in one pass:
    read in chunks straight into one anonymous mapping, whose pages the reads touch (they
    leave the GIL free, where a zeroed bytearray or joined chunks would fill tens of MB under
    it), with a pause after each (adapters/pacing.py). The mapping is ``lease``'s (one kept
    from an earlier read where it has one, adapters/read_buffers.py), else a fresh one. Each
    chunk is hashed while the next is read, on a thread of its own (adapters/chunk_hasher.py),
    unless the read is paced now or fits one chunk: then right after it is read, while it is
    still in the CPU's cache."""
    hasher = None
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if hash_it:
                hasher = ChunkHasher(threaded=size > CHUNK_BYTES and not pacing.active())
            mapping = (lease.take(size) if lease else mmap.mmap(-1, size)) if size else b""
            view, done = memoryview(mapping)[:size], 0
            while done < size:
                began = pacing.now()
                count = file.readinto(view[done : done + CHUNK_BYTES])
                if not count:  # the file shrank since fstat
                    break
                if hasher is not None:
                    hasher.update(view[done : done + count])
                done += count
                pacing.pause_after(began)
            extra = file.read()  # or grew: the stat check after the read tells
        if extra and hasher is not None:
            hasher.update(memoryview(extra))
        data = view[:done] if not extra else memoryview(bytes(view[:done]) + extra)
        return data, None if hasher is None else hasher.hexdigest()
    finally:
        if hasher is not None:
            hasher.close()


def _read(
    root: Path,
    spec: LoRAModelSpec,
    max_lora_rank: int,
    strict: bool,
    stamp: FilesStamp,
    pacing: LoadPacing,
    known: WeightsIdentity | None = None,
    lease: Lease | None = None,
) -> LoRAAdapter:
    config_path, weights_path = root / CONFIG_FILE, root / WEIGHTS_FILE
    _, config_sha256 = hashed_read(config_path, pacing, hash_it=known is None)
    supported = set(spec.modules) | ({EMBED, HEAD} if spec.vocab_size else set())
    config = read_lora_config(
        config_path, max_lora_rank=max_lora_rank, supported_modules=frozenset(supported)
    )
    _check_base_model(config, spec, strict)

    data, sha256 = hashed_read(weights_path, pacing, hash_it=known is None, lease=lease)
    if known is not None:
        sha256, config_sha256 = known.sha256, known.config_sha256
    try:
        tensors = tensor_views(data, pacing)
    except SafetensorsError as exc:
        raise CorruptWeightsError(f"cannot parse safetensors: {exc}", path=weights_path) from exc
    vocab = read_vocab_extras(
        {k: v for k, v in tensors.items() if is_vocab_key(k)}, config, spec, weights_path
    )
    layer_tensors = {k: v for k, v in tensors.items() if not is_vocab_key(k)}
    weights, extras = _lora_weights(
        layer_tensors, config, spec, weights_path, vocab is not None, pacing
    )
    row_scales, row_biases = _row_extras(extras, weights, config, spec, weights_path, pacing)
    targets = {module for _, module in weights}
    if vocab is not None:
        targets |= {EMBED} if vocab.embed_lora is not None else set()
        targets |= {HEAD} if vocab.head_lora is not None else set()
    ranks = [a.shape[0] for a, _ in weights.values()]
    if vocab is not None and vocab.embed_lora is not None:
        ranks.append(vocab.embed_lora[0].shape[1])
    if vocab is not None and vocab.head_lora is not None:
        ranks.append(vocab.head_lora[0].shape[0])
    adapter = LoRAAdapter(
        path=root,
        rank=max(ranks, default=config.r),
        alpha=config.lora_alpha,
        scale=config.scale,
        use_rslora=config.use_rslora,
        target_modules=frozenset(targets),
        weights=weights,
        sha256=sha256,
        size_bytes=len(data),
        base_model_name_or_path=config.base_model_name_or_path,
        config_sha256=config_sha256,
        stamp=stamp,
        row_scales=row_scales,
        row_biases=row_biases,
        vocab=vocab,
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
    """``...layers.3.self_attn.q_proj.lora_A[.name].weight`` -> (module_key, 3, 'q_proj', 'A');
    a DoRA magnitude (``...q_proj.lora_magnitude_vector``) is half 'magnitude', a lora_B bias
    (``...q_proj.lora_B[.name].bias``) half 'bias'."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part == "lora_magnitude_vector" and 0 < i and len(parts) - i in (1, 2, 3):
            half = "magnitude"
        elif part == "lora_B" and 0 < i and parts[-1] == "bias" and len(parts) - i in (2, 3):
            half = "bias"
        elif (
            part in ("lora_A", "lora_B")
            and 0 < i
            and parts[-1] == "weight"
            and len(parts) - i in (2, 3)
        ):
            half = part[-1]
        else:
            half = None
        if half is not None:
            module_parts = parts[:i]
            if module_parts[:2] == ["base_model", "model"]:
                module_parts = module_parts[2:]
            layer = None
            for j in range(len(module_parts) - 2, -1, -1):
                if module_parts[j] == "layers" and module_parts[j + 1].isdigit():
                    layer = int(module_parts[j + 1])
                    break
            return ".".join(module_parts), layer, parts[i - 1], half
    return None


def _refuse_key(key: str, path: Path) -> AdapterError:
    if "lora_magnitude_vector" in key:
        return UnsupportedAdapterError(
            f"tensor {key!r} is a DoRA magnitude but adapter_config.json's 'use_dora' is not true",
            path=path,
            field=key,
        )
    if "lora_embedding_" in key:
        return UnsupportedTargetModuleError(
            f"tensor {key!r} is a LoRA on an embedding, which is not supported",
            path=path,
            field=key,
        )
    if re.search(r"lora_B(\.[^.]+)?\.bias$", key):
        return UnsupportedAdapterError(
            f"tensor {key!r} is a lora_B bias but adapter_config.json's 'lora_bias' is not true",
            path=path,
            field=key,
        )
    return UnsupportedAdapterError(
        f"tensor {key!r} is not a LoRA A/B weight loragate can serve", path=path, field=key
    )


def _lora_weights(
    tensors: dict[str, torch.Tensor],
    config: LoraConfigFields,
    spec: LoRAModelSpec,
    path: Path,
    vocab_side: bool = False,
    pacing: LoadPacing = ALWAYS_PACED,
) -> tuple[dict, dict]:
    """(layer, module) -> (A, B) in float32, and -> {'magnitude' | 'bias': vector, 'key':
    the module's name in the adapter}: the extras DoRA and lora_bias adapters carry."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    module_keys: dict[tuple[int, str], str] = {}
    extras: dict[tuple[int, str], dict] = {}
    for key in pacing.paced(sorted(tensors)):
        parsed = _parse_lora_key(key)
        if parsed is None or (parsed[3] == "magnitude" and not config.use_dora):
            raise _refuse_key(key, path)
        if parsed[3] == "bias" and not config.lora_bias:
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
        if half in ("magnitude", "bias"):
            slot = extras.setdefault((layer, module), {"key": module_key})
        else:
            slot = halves.setdefault((layer, module), {})
        if half in slot:
            raise AdapterShapeError(
                f"tensor {key!r} repeats lora_{half} of layer {layer} {module}",
                path=path,
                field=key,
            )
        slot[half] = tensor
        module_keys[(layer, module)] = module_key

    if not halves and not vocab_side:
        raise AdapterShapeError("holds no LoRA tensors", path=path)
    weights = {}
    for (layer, module), pair in pacing.paced(sorted(halves.items())):
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
    return weights, extras


def _row_extras(
    extras: dict,
    weights: dict,
    config: LoraConfigFields,
    spec: LoRAModelSpec,
    path: Path,
    pacing: LoadPacing = ALWAYS_PACED,
) -> tuple[dict, dict]:
    """DoRA's per-column scales and lora_B's scaled biases, checked against the modules."""
    stray = sorted(set(extras) - set(weights))
    if stray:
        layer, module = stray[0]
        raise AdapterShapeError(
            f"layers.{layer}.{module} has a DoRA magnitude or lora_B bias but no lora_A/lora_B",
            path=path,
            field=f"layers.{layer}.{module}",
        )
    if config.use_dora and spec.base_weight is None:
        raise UnsupportedAdapterError(
            "field 'use_dora' is true, but this model gives no base weights to take DoRA's "
            "norms from",
            path=path,
            field="use_dora",
        )
    scales, biases = {}, {}
    for (layer, module), (a, b) in pacing.paced(weights.items()):
        where = f"layers.{layer}.{module}"
        found = extras.get((layer, module), {})
        d_out = spec.modules[module][1]
        for half, name, wanted in (
            ("magnitude", "lora_magnitude_vector", config.use_dora),
            ("bias", "lora_B bias", config.lora_bias),
        ):
            if wanted and half not in found:
                raise AdapterShapeError(f"{where} has no {name}", path=path, field=where)
            vector = found.get(half)
            if vector is not None and (
                vector.dim() != 1 or vector.shape[0] != d_out or not vector.is_floating_point()
            ):
                raise AdapterShapeError(
                    f"{where}: {name} has shape {tuple(vector.shape)}, but the base model's "
                    f"{module} gives {d_out} outputs",
                    path=path,
                    field=where,
                )
        if config.lora_bias:
            module_scale = config.scale_for(found["key"])
            biases[(layer, module)] = (found["bias"].to(torch.float32) * module_scale).contiguous()
        if config.use_dora:
            scales[(layer, module)] = _dora_scale(
                spec.base_weight(layer, module), a, b, config.scale, found["magnitude"]
            )
    return scales, biases


def _dora_scale(weight, a, b, scale: float, magnitude) -> torch.Tensor:
    """magnitude / ||W + scale B A|| over the input dimension, as PEFT takes it (B here
    carries any per-module alpha already, so the adapter's one scale is the module's)."""
    merged = weight.to(torch.float32) + scale * (b @ a)
    norm = torch.linalg.norm(merged, dim=1)
    return (magnitude.to(torch.float32) / norm).contiguous()


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
