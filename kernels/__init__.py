"""loragate.kernels: pure tensor ops for the engine's hot path.

Every op has a Triton kernel and a torch version with the same signature and results.
`backend=None` runs Triton on CUDA tensors and torch otherwise; "triton" or "torch" forces one
(Triton on CPU tensors needs TRITON_INTERPRET=1). On the CPU the torch backend runs native C
kernels (the .c files here, float32 and bfloat16, built on first use by _native.py) for decode
attention, RMSNorm, RoPE, multi-slot LoRA and products with block-format (GGUF) weights
wherever they were built and take the tensors; the torch code beside each is its tested
reference and its fallback. On CUDA, products with block-format weights run
quant_triton.py's kernel, which dequantizes each group of 32 weights in registers.
"""

from .decode_attention import paged_decode_attention
from .kv_cache import write_kv
from .linear import PackedWeight, linear, pack_weight
from .lora import lora_apply, lora_expand, lora_shrink
from .lora_groups import LoraIndex, lora_index, static_lora_index
from .lora_modules import LoRAModules, SlotRows, lora_apply_modules, slot_rows
from .norm import add_rms_norm, rms_norm
from .omp_runtime import release_thread_pool, use_one_thread
from .prefill_attention import paged_prefill_attention
from .quant_blocks import QuantizedWeight, StackedWeights, stack_rows
from .quant_linear import dequantized_rows
from .rope import apply_rope, apply_rope_
from .token_mask import apply_token_mask_, apply_token_masks_

__all__ = [
    "LoRAModules",
    "LoraIndex",
    "PackedWeight",
    "QuantizedWeight",
    "StackedWeights",
    "SlotRows",
    "add_rms_norm",
    "apply_rope",
    "apply_rope_",
    "apply_token_mask_",
    "apply_token_masks_",
    "lora_apply",
    "lora_apply_modules",
    "lora_expand",
    "lora_index",
    "linear",
    "lora_shrink",
    "paged_decode_attention",
    "pack_weight",
    "paged_prefill_attention",
    "dequantized_rows",
    "stack_rows",
    "release_thread_pool",
    "rms_norm",
    "slot_rows",
    "static_lora_index",
    "use_one_thread",
    "write_kv",
]
