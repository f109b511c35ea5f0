"""loragate.engine: the offline LLM API, async engine, scheduler, KV blocks, model and sampler."""

import os

# OpenMP workers (torch's GNU libgomp) spin this many iterations waiting for the next
# parallel region, then sleep. libgomp's default (300,000) keeps idle workers spinning so
# long that any other busy thread on the machine (the server's event loop, a neighbour)
# starves the step: measured on 2 cores under load, the tiny model's decode step took
# 27-43 ms with the default and 5.8-7.0 ms with 50,000, about what it takes on a quiet
# machine (BENCHMARKS.md, "The engine's own time"). Read when torch loads libgomp, so it
# is set before anything imports torch; a value in the environment wins. The server gets it
# here too: the gateway's first import that loads torch is this package.
os.environ.setdefault("GOMP_SPINCOUNT", "50000")

from loragate.adapters import LoRARequest
from loragate.engine.api.async_engine import AsyncLLMEngine, EngineDeadError
from loragate.engine.api.chat_prompt import ChatPrompt
from loragate.engine.api.config import SCHEDULING_POLICIES, EngineConfig
from loragate.engine.api.engine_args import AsyncEngineArgs, EngineArgs
from loragate.engine.api.engine_client import EngineClient
from loragate.engine.api.engine_request import EngineRequest
from loragate.engine.api.engine_stats import EngineStats
from loragate.engine.api.llm import LLM
from loragate.engine.api.model_info import ModelInfo
from loragate.engine.api.prompt_thread import PromptThread
from loragate.engine.core.llm_engine import LLMEngine, PromptInput
from loragate.engine.loading.quantization import (
    ACTIVATION_QUANTIZATION_CHOICES,
    QUANTIZATION_CHOICES,
)
from loragate.engine.lora.adapter_events import (
    AdapterEvents,
    AdapterWeightsChanged,
    WeightsListener,
)
from loragate.engine.lora.adapter_in_flight import InFlightRequests
from loragate.engine.lora.stored_adapters import object_of, store_path
from loragate.engine.outputs.request_output import CompletionOutput, RequestOutput
from loragate.engine.sampling.beam_search_params import (
    BeamSearchOutput,
    BeamSearchParams,
    BeamSearchSequence,
)
from loragate.engine.sampling.sampling_params import RequestOutputKind, SamplingParams
from loragate.engine.sampling.structured_outputs import (
    GuidedDecodingParams,
    StructuredOutputsParams,
)
from loragate.plugins import InvalidParam

__all__ = [
    "LLM",
    "AdapterEvents",
    "AdapterWeightsChanged",
    "AsyncEngineArgs",
    "AsyncLLMEngine",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "ChatPrompt",
    "EngineArgs",
    "CompletionOutput",
    "EngineClient",
    "EngineConfig",
    "EngineDeadError",
    "EngineRequest",
    "InvalidParam",
    "EngineStats",
    "GuidedDecodingParams",
    "InFlightRequests",
    "LLMEngine",
    "LoRARequest",
    "ModelInfo",
    "PromptInput",
    "PromptThread",
    "ACTIVATION_QUANTIZATION_CHOICES",
    "QUANTIZATION_CHOICES",
    "RequestOutput",
    "RequestOutputKind",
    "SCHEDULING_POLICIES",
    "SamplingParams",
    "StructuredOutputsParams",
    "WeightsListener",
    "object_of",
    "store_path",
]
