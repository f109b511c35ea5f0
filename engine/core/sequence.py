"""A request and the sequences it samples, with the state the scheduler and sampler read."""

from __future__ import annotations

import enum
import hashlib
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from loragate.adapters import LoRARequest, WeightsIdentity
from loragate.engine.sampling.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


class Sequence:
    """One token stream: the prompt, its outputs so far, and its KV blocks."""

    def __init__(self, seq_id: int, request: Request, index: int, generator):
        self.seq_id = seq_id
        self.request = request
        self.index = index  # which of the request's n samples
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.prompt_len = len(self.token_ids)
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # prefix-cache names of its full blocks
        self.swapped_blocks: list[int] = []  # CPU blocks holding its KV while swapped out
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.lora_slot = -1
        self.slot_wait_steps = 0  # steps it stayed waiting for lack of an adapter slot
        self.running_since = -1  # the scheduler step it last started (or resumed) running
        # Tokens whose computation its tenant was charged for: a recompute after preemption
        # computes them again at no charge (engine/core/fair_share.py).
        self.charged_through = 0
        self.generator: torch.Generator | None = generator
        # Summed only where the sampler scores tokens (SamplingParams.scores_tokens).
        self.cumulative_logprob: float | None = 0.0 if request.params.scores_tokens else None
        # Tokens taken since the step last reported this sequence (their text, stop strings
        # and logprobs are output processing's: engine/outputs/output_processor.py).
        self.unreported: list = []
        self.beam_logprobs: torch.Tensor | None = None  # waiting for its beam group
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def cache_key(self) -> bytes:
        return self.request.cache_key

    @property
    def lora_request(self) -> LoRARequest | None:
        return self.request.lora_request

    def __repr__(self) -> str:
        return f"Sequence({self.seq_id}, {self.status.value}, tokens={self.num_tokens})"


@dataclass
class Request:
    """What a caller asked for; its sequences are filled in by the engine."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    lora_request: LoRARequest | None = None
    # The weights it was admitted under (None: the base model). With the tenant, it scopes
    # which cached KV the request may reuse.
    adapter_identity: WeightsIdentity | None = None
    cache_salt: str | None = None  # scopes prefix caching (the tenant and its creation)
    tenant: str | None = None  # the tenant's own name, for plugins and fair shares
    priority: int = 0  # vLLM's: with the `priority` policy, lower values go first
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    first_scheduled_time: float | None = None  # its first step: queue time ends here
    seqs: list[Sequence] = field(default_factory=list)
    pending_forks: list[Sequence] = field(default_factory=list)
    logits_processors: list = field(default_factory=list)
    error: str | None = None  # set when this request alone failed
    error_type: str | None = None  # "plugin_error" or "request_failed"
    beam: Any = None  # a beam_search.BeamGroup when a decoding strategy drives it
    # With params.prompt_logprobs: vLLM's list, None for the first prompt token, then
    # {token: logprob} for each one after, filled in as its prefill chunks run.
    prompt_logprobs: list[dict[int, float] | None] | None = None

    @property
    def finished(self) -> bool:
        return all(seq.finished for seq in self.seqs)

    @cached_property
    def cache_key(self) -> bytes:
        weights = self.adapter_identity.key if self.adapter_identity is not None else ""
        key = f"{weights}|{self.cache_salt or ''}"
        return hashlib.blake2b(key.encode(), digest_size=16).digest()


def sample_generator(seed: int | None, index: int) -> torch.Generator | None:
    """Per-sample generator: the same seed gives the same tokens, whatever shares the batch."""
    if seed is None:
        return None
    return torch.Generator().manual_seed((seed + index * 0x9E3779B1) % (1 << 63))
