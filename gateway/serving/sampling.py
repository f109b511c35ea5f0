"""Request bodies to engine SamplingParams, with every refusal naming the request's field.

The engine's own checks (SamplingParams raising ValueError) are the single source of truth
for value ranges; this module only maps names, fills the APIs' defaults and refuses the
fields this server cannot honour.
"""

from __future__ import annotations

from typing import Any

from loragate.engine import SamplingParams
from loragate.gateway.errors import InvalidRequestError, field_of
from loragate.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from loragate.gateway.serving.structured import openai_structured, tgi_structured
from loragate.gateway.tgi.schemas import TGIParameters

MAX_LOGPROBS = 20

# SamplingParams field -> the name a client used, per API.
_SHARED = (
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
    "include_stop_str_in_output",
    "skip_special_tokens",
)
TGI_FIELDS = {name: f"parameters.{name}" for name in _SHARED} | {
    "max_tokens": "parameters.max_new_tokens",
    "ignore_eos": "parameters.ignore_eos_token",
    "prompt": "inputs",
    "prompt_token_ids": "inputs",
    "prompt_logprobs": "parameters.decoder_input_details",
}


def tgi_fields(p: TGIParameters) -> dict[str, str]:
    _, structured_field = tgi_structured(p)
    return TGI_FIELDS | {"structured_outputs": structured_field or "parameters.grammar"}


def chat_fields(req: ChatCompletionRequest) -> dict[str, str]:
    max_name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    return openai_fields(req) | {
        "max_tokens": max_name,
        "logprobs": "top_logprobs",
        "prompt": "messages",
        "prompt_token_ids": "messages",
    }


def openai_fields(req: SamplingFields) -> dict[str, str]:
    """SamplingParams field -> the request field a refusal names, for this request."""
    _, structured_field = openai_structured(req)
    return {name: name for name in _SHARED} | {
        "structured_outputs": structured_field or "structured_outputs",
        "logit_bias": "logit_bias",
    }


def completion_fields(req: CompletionRequest) -> dict[str, str]:
    return openai_fields(req) | {
        "max_tokens": "max_tokens",
        "logprobs": "logprobs",
        "prompt": "prompt",
        "prompt_token_ids": "prompt",
    }


def completion_params(req: CompletionRequest, max_num_seqs: int) -> SamplingParams:
    _refuse_unsupported_openai(req, max_num_seqs)
    if req.suffix:
        raise InvalidRequestError("suffix is not supported", param="suffix")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"logprobs must be in [0, {MAX_LOGPROBS}], got {req.logprobs}", param="logprobs"
        )
    # echo with logprobs reports the prompt's tokens too, as vLLM does.
    prompt_logprobs = req.logprobs if req.echo and req.logprobs is not None else None
    fields = {"max_tokens": req.max_tokens, "logprobs": req.logprobs}
    fields["prompt_logprobs"] = prompt_logprobs
    return _build(_openai_common(req) | fields, completion_fields(req))


def chat_params(
    req: ChatCompletionRequest, max_num_seqs: int, tools: dict | None = None
) -> SamplingParams:
    """`tools`: the JSON schema tool calls must match (gateway/openai/tools.py), if any."""
    _refuse_unsupported_openai(req, max_num_seqs)
    top = req.top_logprobs
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}", param="top_logprobs"
        )
    if top is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    logprobs = (top or 0) if req.logprobs else None
    fields = _openai_common(req) | {"max_tokens": max_tokens, "logprobs": logprobs}
    if tools is not None:
        if fields["structured_outputs"] is not None:
            raise InvalidRequestError(
                "tool calls and structured output cannot be combined", param="tool_choice"
            )
        fields["structured_outputs"] = {"json": tools}
    return _build(
        fields, chat_fields(req) | ({"structured_outputs": "tools"} if tools is not None else {})
    )


def _refuse_unsupported_openai(req: SamplingFields, max_num_seqs: int) -> None:
    for name in ("n", "best_of"):
        value = getattr(req, name)
        if isinstance(value, int) and value > max_num_seqs:
            raise InvalidRequestError(
                f"{name} must be <= max_num_seqs ({max_num_seqs}), got {value}", param=name
            )


def _openai_common(req: SamplingFields) -> dict[str, Any]:
    structured, _ = openai_structured(req)
    return {
        "structured_outputs": structured,
        "logit_bias": req.logit_bias,
        "n": req.n,
        "best_of": req.best_of,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": 0 if req.top_k is None else req.top_k,
        "min_p": 0.0 if req.min_p is None else req.min_p,
        "seed": req.seed,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "min_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos,
        "use_beam_search": req.use_beam_search,
        "length_penalty": req.length_penalty,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens,
        "sampler": req.sampler,
        "sampler_args": req.sampler_args,
    }


DEFAULT_MAX_NEW_TOKENS = 20


def tgi_params(p: TGIParameters, max_num_seqs: int) -> SamplingParams:
    """TGI samples when do_sample is set or any sampling warper is; otherwise it is greedy."""
    for name in ("merged_adapters", "typical_p"):
        if getattr(p, name) is not None:
            raise InvalidRequestError(f"{name} is not supported", param=f"parameters.{name}")
    if p.return_k_alternatives:
        raise InvalidRequestError(
            "return_k_alternatives is not supported", param="parameters.return_k_alternatives"
        )
    if p.watermark:
        raise InvalidRequestError("watermark is not supported", param="parameters.watermark")
    if p.best_of is not None and p.best_of > max_num_seqs:
        raise InvalidRequestError(
            f"best_of must be <= max_num_seqs ({max_num_seqs})", param="parameters.best_of"
        )
    sampling = p.do_sample or any(
        value is not None and value != neutral
        for value, neutral in ((p.temperature, 1.0), (p.top_k, 0), (p.top_p, 1.0))
    )
    fields = {
        "n": 1,
        "best_of": p.best_of,
        "temperature": (1.0 if p.temperature is None else p.temperature) if sampling else 0.0,
        "top_p": 1.0 if p.top_p is None else p.top_p,
        "top_k": 0 if p.top_k is None else p.top_k,
        "seed": p.seed,
        "stop": p.stop or None,
        "repetition_penalty": 1.0 if p.repetition_penalty is None else p.repetition_penalty,
        "frequency_penalty": 0.0 if p.frequency_penalty is None else p.frequency_penalty,
        "ignore_eos": p.ignore_eos_token,
        "max_tokens": DEFAULT_MAX_NEW_TOKENS if p.max_new_tokens is None else p.max_new_tokens,
        # TGI reports every token's logprob, and top_n_tokens alternatives when asked.
        "logprobs": p.top_n_tokens or 0,
        "prompt_logprobs": 0 if p.decoder_input_details else None,
        "structured_outputs": tgi_structured(p)[0],
    }
    if p.top_n_tokens is not None and not 0 <= p.top_n_tokens <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"top_n_tokens must be in [0, {MAX_LOGPROBS}], got {p.top_n_tokens}",
            param="parameters.top_n_tokens",
        )
    return _build(fields, tgi_fields(p))


# What torch.Generator.manual_seed accepts.
_SEED_RANGE = (-(2**63), 2**64 - 1)


def _build(fields: dict[str, Any], names: dict[str, str]) -> SamplingParams:
    seed = fields.get("seed")
    if isinstance(seed, int) and not _SEED_RANGE[0] <= seed <= _SEED_RANGE[1]:
        raise InvalidRequestError(
            f"seed must be in [{_SEED_RANGE[0]}, {_SEED_RANGE[1]}], got {seed}",
            param=names["seed"],
        )
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param=field_of(str(exc), names)) from exc
    except TypeError as exc:  # a value of the wrong kind that msgspec let through (Any fields)
        raise InvalidRequestError(str(exc)) from exc
