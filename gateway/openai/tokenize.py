"""vLLM's utility routes: POST /tokenize, POST /detokenize, GET /version.

Clients moving from vLLM count tokens and check versions this way. Tokenizing follows the
engine's rules (the model's BOS rule for text, the chat template for messages), on the
engine's prompt thread, as a generation's prompt is (engine/api/prompt_thread.py).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec
from litestar import Controller, get, post
from litestar.params import JSONBody

from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.openai.prompts import chat_messages
from loragate.gateway.openai.schemas import ChatMessage
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.tenancy.principal import Caller


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """Either `prompt` (text) or `messages` (a chat, rendered by the model's template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None  # laid out by templates that know tools
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: the template's own variables


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


def loragate_version() -> str:
    try:
        return version("loragate")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


class TokenizeController(Controller):
    tags = ["vLLM"]

    @post("/tokenize", status_code=200, summary="Token ids of a prompt or a chat")
    async def tokenize(
        self,
        data: JSONBody[TokenizeRequest],
        caller: Caller,
        served_model: ServedModel,
    ) -> TokenizeResponse:
        await served_model.resolve_model(data.model, caller=caller)
        if (data.prompt is None) == (data.messages is None):
            raise InvalidRequestError("give exactly one of prompt or messages", param="prompt")
        if data.messages is not None:
            ids = await served_model.apply_chat_template(
                chat_messages(data.messages),
                data.add_generation_prompt,
                bool(data.add_special_tokens),
                tools=data.tools,
                chat_template_kwargs=data.chat_template_kwargs,
            )
        else:
            special = True if data.add_special_tokens is None else data.add_special_tokens
            ids = await served_model.encode(data.prompt, special)
        return TokenizeResponse(
            count=len(ids), max_model_len=served_model.max_model_len, tokens=ids
        )

    @post("/detokenize", status_code=200, summary="Text of token ids")
    async def detokenize(
        self,
        data: JSONBody[DetokenizeRequest],
        caller: Caller,
        served_model: ServedModel,
    ) -> DetokenizeResponse:
        await served_model.resolve_model(data.model, caller=caller)
        vocab = len(served_model.tokenizer)
        bad = [t for t in data.tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"tokens must be ids in [0, {vocab}), got {bad[:5]}", param="tokens"
            )
        return DetokenizeResponse(prompt=served_model.tokenizer.decode(data.tokens))

    @get("/version", summary="loragate's version")
    async def get_version(self) -> dict[str, Any]:
        return {"version": loragate_version()}
