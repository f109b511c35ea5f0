"""OpenAI request bodies (completions, chat) to engine SamplingParams, with every refusal
naming the request's field."""

from __future__ import annotations

from typing import Any

from loragate.engine import SamplingParams
from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from loragate.gateway.serving.sampling import MAX_LOGPROBS, SHARED_FIELDS, build_params
from loragate.gateway.serving.structured import openai_structured


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
    return {name: name for name in SHARED_FIELDS} | {
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
    return build_params(_openai_common(req) | fields, completion_fields(req))


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
    return build_params(
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
        "speculative": req.speculative,
    }
