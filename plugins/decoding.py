"""What a decoding strategy is: the protocol the engine drives, one step at a time.

A strategy decides, for one sequence group, which candidate continuations keep running.
The engine owns the sequences and their KV blocks; the strategy sees only token ids and
log-probabilities, and answers with plain data:

- ``state = strategy.start(params, eos_token_ids, max_tokens)``: ``params`` is the
  request's SamplingParams as a dict, ``eos_token_ids`` a set of ids that finish a
  hypothesis (empty with ``ignore_eos``), ``max_tokens`` the most tokens to generate.
  There is one running sequence at first: the prompt.
- ``decision = strategy.step(state, logprobs)``: ``logprobs`` is ``[num_running, vocab]``,
  row i the log-probabilities of running sequence i (of logits / temperature when the
  request's temperature is neither 0 nor 1). The engine then makes the new running
  sequences: new sequence j = old sequence ``decision.parents[j]`` + ``decision.tokens[j]``
  (parents may repeat: fork, sharing blocks; old sequences no parent names are freed),
  in that order. When ``decision.done`` the group is over.
- ``results = strategy.finish(state)``: ``[(output_token_ids, score), ...]``, best first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch


@dataclass(frozen=True)
class StepDecision:
    """The next running sequences, as (parent index, appended token) pairs."""

    parents: list[int]
    tokens: list[int]
    done: bool


class Hypothesis(NamedTuple):
    """A finished sequence: its generated tokens (with any EOS) and its final score."""

    token_ids: list[int]
    score: float


class DecodingStrategy(Protocol):
    def start(self, params: dict, eos_token_ids: set[int], max_tokens: int) -> Any: ...

    def step(self, state: Any, logprobs: torch.Tensor) -> StepDecision: ...

    def finish(self, state: Any) -> list[Hypothesis]: ...


STRATEGY_METHODS = ("start", "step", "finish")
