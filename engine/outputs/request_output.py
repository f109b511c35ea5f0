"""What generate() returns, shaped as vLLM's RequestOutput / CompletionOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

from loragate.adapters import LoRARequest


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens_computed: int = 0
    first_scheduled_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    lora_request: LoRARequest | None = None
    # sha256 of the adapter weights file as it was when the request was admitted: the
    # weights it runs with, whatever the files hold by now.
    lora_sha256: str | None = None
    error: str | None = None  # this request alone failed (finish_reason "error")
    # "plugin_error" (a plugin's hook raised) or "request_failed" (anything else)
    error_type: str | None = None
    metrics: RequestMetrics | None = field(default=None, repr=False)
    # With SamplingParams.prompt_logprobs: None for the first prompt token, then for each
    # later one {token_id: logprob} of it and the most likely alternatives.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # With best_of > n, once finished: the candidates left out of `outputs`, likeliest
    # first (what TGI and LoRAX report as best_of_sequences). None otherwise.
    best_of_sequences: list[CompletionOutput] | None = None
