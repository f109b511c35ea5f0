"""loragate.engine: the offline LLM API, async engine, scheduler, KV blocks, model and sampler."""

from loragate.adapters import LoRARequest
from loragate.engine.config import EngineConfig
from loragate.engine.llm import LLM
from loragate.engine.llm_engine import LLMEngine
from loragate.engine.outputs import CompletionOutput, RequestOutput
from loragate.engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "LoRARequest",
    "RequestOutput",
    "SamplingParams",
]
