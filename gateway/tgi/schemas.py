"""Request and response bodies of the TGI / LoRAX routes (`/generate`, `/generate_stream`, `/`).

The lorax and text-generation clients send every parameter, most as null: those this
server cannot honour are refused only when set.
"""

from __future__ import annotations

from typing import Any

import msgspec


class TGIParameters(msgspec.Struct, kw_only=True):
    adapter_id: str | None = None
    adapter_source: str | None = None
    merged_adapters: dict[str, Any] | None = None
    api_token: str | None = None
    do_sample: bool = False
    max_new_tokens: int | None = None
    ignore_eos_token: bool = False
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    return_full_text: bool | None = False
    stop: list[str] | None = None
    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    truncate: int | None = None
    typical_p: float | None = None
    best_of: int | None = None
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    return_k_alternatives: int | None = None
    top_n_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    grammar: dict[str, Any] | None = None
    speculative: bool = True  # loragate's: false keeps this request out of speculation


class TGIRequest(msgspec.Struct, kw_only=True):
    inputs: str
    parameters: TGIParameters | None = None
    stream: bool = False


class TGIToken(msgspec.Struct, kw_only=True):
    id: int
    text: str
    logprob: float | None = None
    special: bool = False


class TGIInputToken(msgspec.Struct, kw_only=True):
    id: int
    text: str
    logprob: float | None = None


class TGIBestOfSequence(msgspec.Struct, kw_only=True):
    """One of best_of's other candidates, as TGI reports it."""

    generated_text: str
    finish_reason: str
    generated_tokens: int
    seed: int | None = None
    prefill: list[TGIInputToken]
    tokens: list[TGIToken]
    top_tokens: list[list[TGIToken]] | None = None


class TGIDetails(msgspec.Struct, kw_only=True):
    finish_reason: str
    prompt_tokens: int
    generated_tokens: int
    seed: int | None = None
    prefill: list[TGIInputToken]
    tokens: list[TGIToken]
    top_tokens: list[list[TGIToken]] | None = None  # with parameters.top_n_tokens
    best_of_sequences: list[TGIBestOfSequence] | None = None  # with parameters.best_of > 1


class TGIResponse(msgspec.Struct, kw_only=True):
    generated_text: str
    details: TGIDetails | None = None


class TGIStreamDetails(msgspec.Struct, kw_only=True):
    finish_reason: str
    prompt_tokens: int
    generated_tokens: int
    seed: int | None = None


class TGIStreamResponse(msgspec.Struct, kw_only=True):
    token: TGIToken
    top_tokens: list[TGIToken] | None = None  # with parameters.top_n_tokens
    generated_text: str | None = None
    details: TGIStreamDetails | None = None
