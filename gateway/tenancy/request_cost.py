"""What one HTTP request may cost a tenant's quotas, known before it reaches the engine.

A request is admitted against its worst case, so that a burst of requests cannot together
serve more than the quota allows; when it ends, what it did not use is given back.

- tokens: for each prompt, its tokens plus, for each of its sequences (max(n, best_of)),
  every token it may generate: `max_tokens`, or when that is absent the rest of the
  context (max_model_len - prompt tokens), which is where the engine stops it. Tokens are
  counted as `usage` reports them (prompt + completion), so the refund leaves exactly the
  metered tokens in the window.
- sequences: what it counts as in requests_per_minute: one per prompt per sequence, as
  the engine runs that many.
"""

from __future__ import annotations

from dataclasses import dataclass

from loragate.engine import SamplingParams


@dataclass(frozen=True)
class RequestCost:
    tokens: int
    sequences: int
    prompt_tokens: int
    # The request's own field names, for a refusal that says what to change.
    max_tokens_param: str = "max_tokens"
    sequences_param: str = "n"


NO_COST = RequestCost(tokens=0, sequences=1, prompt_tokens=0)


def request_cost(
    prompt_lengths: list[int],
    params: SamplingParams,
    max_model_len: int,
    *,
    max_tokens_param: str = "max_tokens",
    sequences_param: str = "n",
) -> RequestCost:
    width = max(params.n, params.best_of or 1)
    tokens = 0
    for length in prompt_lengths:
        room = max(0, max_model_len - length)
        completion = room if params.max_tokens is None else min(params.max_tokens, room)
        tokens += length + completion * width
    return RequestCost(
        tokens=tokens,
        sequences=max(1, len(prompt_lengths) * width),
        prompt_tokens=sum(prompt_lengths),
        max_tokens_param=max_tokens_param,
        sequences_param=sequences_param,
    )
