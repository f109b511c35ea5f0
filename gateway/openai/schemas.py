"""Request and response bodies of the OpenAI-compatible routes, as msgspec Structs.

Fields follow OpenAI's API plus the extra sampling fields vLLM accepts (top_k, min_p,
repetition_penalty, min_tokens, ignore_eos, use_beam_search, best_of, length_penalty)
and loragate's plugin sampler (`sampler`, `sampler_args`) and speculation opt-out
(`speculative`). Unknown fields are ignored,
as OpenAI clients send fields this server has no use for.
"""

from __future__ import annotations

from typing import Any

import msgspec


class StreamOptions(msgspec.Struct, kw_only=True):
    """OpenAI's `include_usage` (a last chunk with the request's usage) and vLLM's
    `continuous_usage_stats` (with `include_usage`: every chunk carries the usage so far)."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


def final_usage(options: StreamOptions | None) -> bool:
    """Whether a stream ends with a chunk that carries the request's usage."""
    return options is not None and options.include_usage


def usage_on_every_chunk(options: StreamOptions | None) -> bool:
    """Whether every chunk of a stream carries the usage so far (vLLM's rule: both set)."""
    return final_usage(options) and options.continuous_usage_stats


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by completions and chat completions."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    use_beam_search: bool = False
    priority: int = 0  # vLLM's: lower first under --scheduling-policy priority
    best_of: int | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    sampler: str | None = None
    sampler_args: dict[str, Any] | None = None
    speculative: bool = True  # loragate's: false keeps this request out of speculation
    # Structured output: OpenAI's response_format, or vLLM's extra fields (one at most).
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: Any = None


class CompletionRequest(SamplingFields, kw_only=True):
    """`prompt` is a string, a list of strings, a list of token ids or a list of such lists."""

    prompt: str | list[Any]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    # vLLM's field: text prompts get the model's own special tokens (its BOS rule) unless false.
    add_special_tokens: bool = True


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    """`tool_calls` (an assistant's earlier calls) and `tool_call_id` (a tool's answer) go
    to the chat template as OpenAI sends them, the arguments as an object."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    add_generation_prompt: bool = True
    # vLLM's field: the chat template writes its own special tokens; true adds the model's
    # rule on top (never a second BOS).
    add_special_tokens: bool = False
    # vLLM's field: more variables for the chat template (Qwen3's enable_thinking).
    chat_template_kwargs: dict[str, Any] | None = None


class UsageInfo(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(msgspec.Struct, kw_only=True):
    """Also the shape of each streamed chunk (`usage` only in the last one, if asked)."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as OpenAI's


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCall


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None
    # What a thinking model reasoned, split off by --reasoning-parser (vLLM's field).
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaFunctionCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A call's first delta has its id, type and name; later ones add argument text."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunctionCall


class DeltaMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class BaseQuantization(msgspec.Struct, kw_only=True):
    """How the base's weights are held: ``method`` (awq, gptq, int8, int4, gguf or none) and
    the bytes held per tensor type (a block type such as I4_G128 or Q4_1, or a dtype)."""

    method: str
    weight_bytes: dict[str, int]


class ModelCard(msgspec.Struct, kw_only=True):
    """One servable model: the base (parent null) or an adapter (parent = the base); the
    base's card says its quantization."""

    id: str
    object: str = "model"
    created: int
    owned_by: str = "loragate"
    root: str
    parent: str | None = None
    max_model_len: int | None = None
    quantization: BaseQuantization | None = None


class ModelList(msgspec.Struct, kw_only=True):
    """The base model, then a page of adapters: `has_more` says another follows, asked
    for with `?after=<last_id>`."""

    object: str = "list"
    data: list[ModelCard]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
