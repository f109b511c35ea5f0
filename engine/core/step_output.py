"""What the step hands to output processing: each request's new token ids, no text.

The step thread keeps only what frees KV blocks (stop by token id, EOS, max_tokens, the
context limit); detokenizing, stop strings and the outputs callers see are built from these
records beside it (engine/outputs/output_processor.py), as vLLM V1's EngineCoreOutputs feed its
OutputProcessor. A record holds plain data copied on the step thread, and the request it
belongs to, of which only the fields fixed when it was added are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loragate.engine.core.sequence import Request
from loragate.engine.sampling.sampler import SampleResult


@dataclass(slots=True)
class SeqTokens:
    """One sample's tokens from this step, and whether the step finished it (for a token
    id: "stop" with the stop token or None for EOS, or "length"; else "abort", "error")."""

    index: int
    results: list[SampleResult]
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(slots=True)
class RequestTokens:
    """A request touched by the step: its samples' new tokens and its state, copied."""

    request: Request
    seqs: list[SeqTokens]
    finished: bool
    error: str | None = None
    error_type: str | None = None
    first_token_time: float | None = None
    first_scheduled_time: float | None = None
    prompt_logprobs: list | None = None  # once the whole prompt's are known
    beam_results: list | None = None  # a finished beam search's (token ids, score) pairs


@dataclass(slots=True)
class StepOutput:
    """One step's records, after the requests added and aborted since the step before
    (in order: a request id may come back once its request is gone)."""

    events: list[tuple[bool, Request]] = field(default_factory=list)  # True: added, False: aborted
    requests: list[RequestTokens] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SeqStop:
    """Output processing stopped a sample (a stop string, or its text failed): the step
    thread finishes it, freeing its blocks, and keeps its first `num_output_tokens`."""

    request: Request
    index: int
    finish_reason: str
    stop_reason: int | str | None
    num_output_tokens: int
