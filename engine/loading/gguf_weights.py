"""A GGUF file's weights as the decoder's tensors, kept in their block types (no float copy).

Linear weights and the embedding stay in their blocks (kernels.QuantizedWeight: Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), read once from the file into the process's own memory;
F32, F16 and BF16 tensors (norms, biases, unquantized weights) become float32. Names map from
llama.cpp's (``blk.3.attn_q.weight``) to the HF names the decoder takes
(``model.layers.3.self_attn.q_proj.weight``), and Llama's q/k rows are put back in HF's order
(llama.cpp's converter interleaves the rotary halves; transformers reverses it as here, a
permutation of whole rows, so of whole rows of blocks).

Every tensor is checked before it is used: its type (an unsupported one is refused naming the
tensor and its type), its bytes within the file (a truncated file names the first tensor past
its end) and its shape against the model's config.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from transformers import PretrainedConfig

from loragate.engine.loading.gguf_header import GGUFHeader
from loragate.engine.loading.special_tokens import SOURCE_RECORD
from loragate.kernels import QuantizedWeight
from loragate.kernels.quant_blocks import GGUF_TYPES

log = logging.getLogger(__name__)

# GGUF architectures whose weights are served in their block types, and their HF model_type.
BLOCK_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3"}
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = (*GGUF_TYPES, *FLOAT_TYPES)

# The record's "weights" in a cached directory whose weights are read from the GGUF file.
WEIGHTS_IN_BLOCKS = "gguf-blocks"

_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Phi-3 stores q/k/v and gate/up fused (attn_qkv, and ffn_up holding gate then up).
_PHI3_LAYER = {**_LAYER, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_LAYER_PARTS = {
    "phi3": ("attn_norm", "ffn_norm", "attn_qkv", "attn_output", "ffn_up", "ffn_down"),
}
_LLAMA_PARTS = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output")
_LLAMA_PARTS += ("ffn_gate", "ffn_up", "ffn_down")


def gguf_weights_source(hf_dir: Path) -> Path | None:
    """The GGUF file a cached directory's weights are read from in their block types, if
    they are (engine/loading/model_loader.py writes the record)."""
    record = Path(hf_dir) / SOURCE_RECORD
    if not record.is_file():
        return None
    recorded = json.loads(record.read_text())
    return Path(recorded["gguf"]) if recorded.get("weights") == WEIGHTS_IN_BLOCKS else None


def hf_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """The decoder's (HF) name of a GGUF tensor; None for one the decoder does not read
    (rope_freqs and the like)."""
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    names = _PHI3_LAYER if architecture == "phi3" else _LAYER
    found = _BLOCK_NAME.match(gguf_name)
    if found is None or found.group(2) not in names:
        return None
    layer, part, kind = found.groups()
    return f"model.layers.{layer}.{names[part]}.{kind}"


def gguf_architecture(path: Path, header: GGUFHeader | None = None) -> str:
    """``general.architecture`` of the file (``header``: its header, already read)."""
    header = open_gguf(path) if header is None else header
    if header.architecture is None:
        raise ValueError(f"GGUF file {path} names no general.architecture")
    return header.architecture


def open_gguf(path: Path) -> GGUFHeader:
    """The file's header, every tensor checked to lie within the file."""
    try:
        return GGUFHeader(path)
    except (OSError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read GGUF file {path}: {exc}") from exc


def expected_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """The HF shape ([out, in], or [n]) of every tensor a Llama-family config's model has,
    by its name within a layer (``self_attn.q_proj.weight``) or at the top."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "lm_head.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q, hidden),
        "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden),
        "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (hidden, q),
        "self_attn.qkv_proj.weight": (q + 2 * kv, hidden),
        "mlp.gate_up_proj.weight": (2 * inter, hidden),
        "self_attn.q_norm.weight": (head_dim,),
        "self_attn.k_norm.weight": (head_dim,),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }


def _local_name(name: str) -> str:
    found = re.match(r"^model\.layers\.\d+\.(.*)$", name)
    return found.group(1) if found else name


def _qk_row_order(rows: int, heads: int) -> torch.Tensor:
    """Rows of llama.cpp's interleaved q/k taken in HF's order (transformers' reverse
    permutation: per head, the even rows then the odd ones)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(-1)


class GGUFWeights:
    """The file's tensors by HF name: ``tensors()`` reads them all (blocks kept), ``one``
    reads one dequantized to float32 (an adapter's view of a base weight: DoRA).

    The file's header is read once, here (engine/loading/gguf_header.py), and its tensors stay
    memory-mapped while this object lives: only the pages of the tensors read are loaded."""

    def __init__(self, path: Path, config: PretrainedConfig):
        self.path = Path(path)
        self.config = config
        self.header = open_gguf(self.path)
        self.architecture = gguf_architecture(self.path, self.header)
        if self.architecture not in BLOCK_ARCHITECTURES:
            raise ValueError(
                f"GGUF architecture {self.architecture!r} of {self.path} is not served in its "
                f"block types (served: {', '.join(BLOCK_ARCHITECTURES)}); "
                "--gguf-dequantize serves it dequantized"
            )

    def tensors(self) -> dict[str, torch.Tensor | QuantizedWeight]:
        reader = self.header
        shapes = expected_shapes(self.config)
        out: dict[str, torch.Tensor | QuantizedWeight] = {}
        for tensor in reader.tensors:
            name = hf_name(tensor.name, self.architecture)
            if name is None:
                continue
            out[name] = self._convert(tensor, name, shapes)
        self._check_complete(out)
        return out

    def one(self, name: str) -> torch.Tensor:
        """The tensor HF calls ``name`` in float32, as transformers loads it from the file."""
        from loragate.kernels.quant_dequant import dequantize

        for tensor in self.header.tensors:
            if hf_name(tensor.name, self.architecture) == name:
                value = self._convert(tensor, name, expected_shapes(self.config))
                return dequantize(value) if isinstance(value, QuantizedWeight) else value
        raise ValueError(f"GGUF file {self.path} has no tensor for {name!r}")

    def _convert(self, tensor, name: str, shapes) -> torch.Tensor | QuantizedWeight:
        type_name = tensor.tensor_type.name
        if type_name not in SUPPORTED_TYPES:
            raise ValueError(
                f"GGUF tensor {tensor.name} has type {type_name}, which loragate does not "
                f"serve in its blocks (supported: {', '.join(SUPPORTED_TYPES)}); "
                "--gguf-dequantize serves the file dequantized where transformers reads it"
            )
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        want = shapes.get(_local_name(name))
        if want is not None and shape != want:
            raise ValueError(
                f"GGUF tensor {tensor.name} ({type_name}) has shape {list(shape)}, expected "
                f"{list(want)} for {name} from the file's own metadata"
            )
        if type_name in FLOAT_TYPES:
            raw = np.array(tensor.data)
            if type_name == "BF16":
                bits = torch.from_numpy(raw.view(np.int16))
                value = bits.view(torch.bfloat16).float().reshape(shape)
            else:
                floats = raw.view(np.float32 if type_name == "F32" else np.float16)
                value = torch.from_numpy(floats.astype(np.float32)).reshape(shape)
        else:
            blocks = torch.from_numpy(np.array(tensor.data).reshape(shape[0], -1))
            value = QuantizedWeight.of(blocks, type_name, shape[1])
        return self._reordered(tensor.name, value)

    def _reordered(self, gguf_name: str, value):
        """Llama's q and k rows back in HF's order (llama.cpp's converter interleaves them)."""
        if self.architecture != "llama":
            return value
        heads = self.config.num_attention_heads
        if ".attn_k." in gguf_name:
            heads = getattr(self.config, "num_key_value_heads", None) or heads
        elif ".attn_q." not in gguf_name:
            return value
        rows = _qk_row_order(value.shape[0], heads)
        if isinstance(value, QuantizedWeight):
            return QuantizedWeight(value.blocks[rows].contiguous(), value.format, *value.shape)
        return value[rows].contiguous()

    def _check_complete(self, found: dict) -> None:
        needed = ["model.embed_tokens.weight", "model.norm.weight"]
        names = _PHI3_LAYER if self.architecture == "phi3" else _LAYER
        for i in range(self.config.num_hidden_layers):
            for part in _LAYER_PARTS.get(self.architecture, _LLAMA_PARTS):
                needed.append(f"model.layers.{i}.{names[part]}.weight")
        missing = [n for n in needed if n not in found]
        if missing:
            raise ValueError(
                f"GGUF file {self.path} lacks {len(missing)} tensors the model needs, "
                f"first {missing[0]}"
            )


def describe(weights: dict) -> str:
    """Bytes held per tensor type, for the start log: ``Q4_1 66.4 MB in 210 tensors, ...``."""
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for value in weights.values():
        kind = value.format if isinstance(value, QuantizedWeight) else str(value.dtype)[6:]
        nbytes = value.nbytes if isinstance(value, QuantizedWeight) else value.numel() * 4
        sizes[kind] += nbytes
        counts[kind] += 1
    parts = [f"{k} {sizes[k] / 1e6:.1f} MB in {counts[k]} tensors" for k in sorted(sizes)]
    return ", ".join(parts)
