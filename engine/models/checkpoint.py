"""One base weight read back from the model's checkpoint on demand, in float32: what an
adapter derives from the base when it is loaded (DoRA's column norms), on the loader thread.

The engine's own copies are packed for the CPU's matrix multiply (or in bfloat16, or kept in
GGUF blocks), so the float32 values PEFT takes its norms from are read from the safetensors
files themselves, one tensor at a time (memory-mapped: nothing else of the file is read), or
for a GGUF base served in its blocks, from the GGUF file, dequantized as transformers
dequantizes it (the base PEFT sees when it loads that file); for a base quantized at load or
an AWQ/GPTQ checkpoint, the dequantized weight the kernels multiply by
(engine/loading/quantization.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from safetensors import safe_open

from loragate.engine.loading.gguf_weights import GGUFWeights, gguf_weights_source
from loragate.engine.loading.quantization import Quantization, quantization_for
from loragate.engine.models.llama import LlamaFamily


class CheckpointWeights:
    """``weight(layer, module)``: that module's base weight ``[d_out, d_in]`` in float32."""

    def __init__(self, hf_dir: Path, family: LlamaFamily, quantization: str | None = None):
        self.hf_dir = Path(hf_dir)
        self.family = family
        self.quantization = quantization  # --quantization, as the base was loaded with
        self._held: Quantization | None = None
        self._where: dict[str, tuple[Path, str]] | None = None
        self._gguf_weights: GGUFWeights | bool | None = None  # False: not a GGUF base
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Sent to another process (a replica's spec) without the lock and the index."""
        return {"hf_dir": self.hf_dir, "family": self.family, "quantization": self.quantization}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["hf_dir"], state["family"], state.get("quantization"))

    def weight(self, layer: int, module: str) -> torch.Tensor:
        name = self.family.module_weight_name(layer, module)
        gguf = self._gguf()
        if gguf is not None:
            return gguf.one(name)
        if self._held is None:
            self._held = quantization_for(self.quantization, self.hf_dir)
        return self._held.base_weight(self._tensor, name)

    def _tensor(self, name: str) -> torch.Tensor:
        where = self._index().get(name)
        if where is None:
            raise ValueError(f"the checkpoint in {self.hf_dir} has no tensor {name!r}")
        file, key = where
        with safe_open(str(file), framework="pt") as handle:
            return handle.get_tensor(key)  # as stored: AWQ/GPTQ's packed int32 stay so

    def _gguf(self) -> GGUFWeights | None:
        """The GGUF file the base is served from in its block types, opened once."""
        with self._lock:
            if self._gguf_weights is None:
                path = gguf_weights_source(self.hf_dir)
                if path is None:
                    self._gguf_weights = False
                else:
                    from transformers import AutoConfig

                    config = AutoConfig.from_pretrained(self.hf_dir)
                    self._gguf_weights = GGUFWeights(path, config)
            return self._gguf_weights or None

    def _index(self) -> dict[str, tuple[Path, str]]:
        """The decoder's name of every tensor -> (file, name in the file), read once."""
        with self._lock:
            if self._where is None:
                where = {}
                for file in sorted(self.hf_dir.glob("*.safetensors")):
                    with safe_open(str(file), framework="pt") as handle:
                        keys = set(handle.keys())
                    renamed = self.family.checkpoint_names(keys)
                    where.update((renamed.get(key, key), (file, key)) for key in keys)
                self._where = where
            return self._where
