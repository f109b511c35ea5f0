"""loragate.engine: the offline LLM API, async engine, scheduler, KV blocks, model and sampler."""

from loragate.adapters import LoRARequest
from loragate.engine.async_engine import AsyncLLMEngine, EngineDeadError
from loragate.engine.beam_search_params import (
    BeamSearchOutput,
    BeamSearchParams,
    BeamSearchSequence,
)
from loragate.engine.config import SCHEDULING_POLICIES, EngineConfig
from loragate.engine.engine_args import AsyncEngineArgs, EngineArgs
from loragate.engine.engine_client import EngineClient
from loragate.engine.engine_info import EngineStats, ModelInfo
from loragate.engine.llm import LLM
from loragate.engine.llm_engine import LLMEngine, PromptInput
from loragate.engine.outputs import CompletionOutput, RequestOutput
from loragate.engine.sampling_params import SamplingParams
from loragate.engine.structured_outputs import GuidedDecodingParams, StructuredOutputsParams

__all__ = [
    "LLM",
    "AsyncEngineArgs",
    "AsyncLLMEngine",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "EngineArgs",
    "CompletionOutput",
    "EngineClient",
    "EngineConfig",
    "EngineDeadError",
    "EngineStats",
    "GuidedDecodingParams",
    "LLMEngine",
    "LoRARequest",
    "ModelInfo",
    "PromptInput",
    "RequestOutput",
    "SCHEDULING_POLICIES",
    "SamplingParams",
    "StructuredOutputsParams",
]
