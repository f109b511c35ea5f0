"""Request bodies to engine SamplingParams: what every API shares.

The engine's own checks (SamplingParams raising ValueError) are the single source of truth
for value ranges; each API's module (openai/sampling.py, tgi/sampling.py) only maps names,
fills its defaults and refuses the fields this server cannot honour, and builds the
SamplingParams here, so that every refusal names the request's field.
"""

from __future__ import annotations

from typing import Any

from loragate.engine import SamplingParams
from loragate.gateway.errors import InvalidRequestError, param_of

MAX_LOGPROBS = 20

# SamplingParams fields every API names the same way (TGI under `parameters.`).
SHARED_FIELDS = (
    "n",
    "best_of",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "use_beam_search",
    "length_penalty",
    "sampler",
    "sampler_args",
    "speculative",
    "include_stop_str_in_output",
    "skip_special_tokens",
)

# What torch.Generator.manual_seed accepts.
_SEED_RANGE = (-(2**63), 2**64 - 1)


def build_params(fields: dict[str, Any], names: dict[str, str]) -> SamplingParams:
    """SamplingParams of `fields`; a refusal names the request's field (`names`)."""
    seed = fields.get("seed")
    if isinstance(seed, int) and not _SEED_RANGE[0] <= seed <= _SEED_RANGE[1]:
        raise InvalidRequestError(
            f"seed must be in [{_SEED_RANGE[0]}, {_SEED_RANGE[1]}], got {seed}",
            param=names["seed"],
        )
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param=param_of(exc, names)) from exc
    except TypeError as exc:  # a value of the wrong kind that msgspec let through (Any fields)
        raise InvalidRequestError(str(exc)) from exc
