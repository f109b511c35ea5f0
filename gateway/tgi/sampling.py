"""TGI request parameters to engine SamplingParams, with every refusal naming the request's
field (`parameters.<name>`)."""

from __future__ import annotations

from loragate.engine import SamplingParams
from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.serving.sampling import MAX_LOGPROBS, SHARED_FIELDS, build_params
from loragate.gateway.serving.structured import tgi_structured
from loragate.gateway.tgi.schemas import TGIParameters

TGI_FIELDS = {name: f"parameters.{name}" for name in SHARED_FIELDS} | {
    "max_tokens": "parameters.max_new_tokens",
    "ignore_eos": "parameters.ignore_eos_token",
    "prompt": "inputs",
    "prompt_token_ids": "inputs",
    "prompt_logprobs": "parameters.decoder_input_details",
}


def tgi_fields(p: TGIParameters) -> dict[str, str]:
    _, structured_field = tgi_structured(p)
    return TGI_FIELDS | {"structured_outputs": structured_field or "parameters.grammar"}


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
        "speculative": p.speculative,
    }
    if p.top_n_tokens is not None and not 0 <= p.top_n_tokens <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"top_n_tokens must be in [0, {MAX_LOGPROBS}], got {p.top_n_tokens}",
            param="parameters.top_n_tokens",
        )
    return build_params(fields, tgi_fields(p))
