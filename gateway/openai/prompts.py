"""The prompt forms clients send, turned into engine prompts."""

from __future__ import annotations

import json
from typing import Any

from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.openai.schemas import ChatMessage

_PROMPT_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def completion_prompts(prompt: str | list[Any], add_special_tokens: bool = True) -> list[dict]:
    """One engine prompt per entry of the OpenAI `prompt` field; texts carry vLLM's
    `add_special_tokens` (token ids are taken as they are)."""
    if isinstance(prompt, str):
        return [_text(prompt, add_special_tokens)]
    if not prompt:
        raise InvalidRequestError("prompt must not be an empty list", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return [_text(p, add_special_tokens) for p in prompt]
    if all(_is_token(t) for t in prompt):
        return [{"prompt_token_ids": list(prompt)}]
    if all(isinstance(p, list) and p and all(_is_token(t) for t in p) for p in prompt):
        return [{"prompt_token_ids": list(p)} for p in prompt]
    raise InvalidRequestError(f"prompt must be {_PROMPT_FORMS}", param="prompt")


def _text(prompt: str, add_special_tokens: bool) -> dict:
    return {"prompt": prompt, "add_special_tokens": add_special_tokens}


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """Plain {"role", "content"} dicts for the chat template (with an assistant's
    `tool_calls` and a tool answer's `tool_call_id`); only text parts are accepted."""
    if not messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    out = []
    for i, message in enumerate(messages):
        content = message.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            parts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(
                        f"only text content parts are supported, got type {part.type!r}",
                        param=f"messages[{i}].content[{j}]",
                    )
                parts.append(part.text)
            text = "".join(parts)
        entry = {"role": message.role, "content": text}
        if message.tool_calls is not None:
            entry["tool_calls"] = [
                _call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(message.tool_calls)
            ]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        out.append(entry)
    return out


def _call(call: dict, param: str) -> dict:
    """An earlier tool call as templates read it: the arguments as an object (as vLLM)."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequestError("a tool call needs function.name", param=f"{param}.function")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as exc:
            raise InvalidRequestError(
                f"arguments must be JSON: {exc}", param=f"{param}.function.arguments"
            ) from exc
    return {**call, "function": {**function, "arguments": arguments}}
