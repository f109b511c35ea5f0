"""EngineRequest: one request to the engine, as every hop hands it on.

vLLM's `generate(prompt, sampling_params, request_id, lora_request, ...)` takes eight values;
they travel as this one frozen, picklable object, checked once where it is built: the
gateway builds it once per engine request (gateway/serving/accounting.py) and it goes whole
through `EngineClient.generate_request`, the async engine's inbox and `LLMEngine.add`, and
over the replica wire (gateway/replicas/). The public call shapes (`AsyncLLMEngine.generate`,
`LLMEngine.add_request`, `LLM.generate`) build one and pass it on.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from loragate.adapters import LoRARequest
from loragate.engine.api.input_processor import PromptInput
from loragate.engine.api.thread_bridge import check_request_id
from loragate.engine.core.fair_share import check_tenant_weight
from loragate.engine.sampling.sampling_params import SamplingParams
from loragate.plugins import InvalidParam


@dataclass(frozen=True)
class EngineRequest:
    """One request: its prompt, how to sample it (None: the defaults), its id (any hashable
    value, given back as each output's `request_id`), its adapter (None: the base model),
    the prefix-cache scope `cache_salt` (set by the server), the tenant's name (which
    plugins see) and its share under the `fair` policy (`tenant_weight`), and vLLM's
    `priority` (lower first under the `priority` policy).

    Built checked: TypeError for an id that is not hashable, InvalidParam("priority") for a
    priority that is not an int, ValueError for a tenant weight that is not a finite number
    > 0. What depends on the engine (the id already in use, the prompt's length, the
    adapter) is checked where the engine takes it (`LLMEngine.add`)."""

    prompt: PromptInput
    sampling_params: SamplingParams | None
    request_id: Hashable
    lora_request: LoRARequest | None = None
    cache_salt: str | None = None
    tenant: str | None = None
    priority: int = 0
    tenant_weight: float = 1.0

    def __post_init__(self) -> None:
        check_request_id(self.request_id)
        priority = self.priority
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidParam("priority", f"priority must be an integer, got {priority!r}")
        object.__setattr__(self, "tenant_weight", check_tenant_weight(self.tenant_weight))
        if self.sampling_params is None:
            object.__setattr__(self, "sampling_params", SamplingParams())
