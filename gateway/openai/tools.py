"""OpenAI function calling on chat: `tools` with `tool_choice`.

A named function or "required" constrains the answer to JSON (the function's parameters
schema, or an array of calls to any of the tools), as vLLM does without extra flags.
"auto" (the default when tools are given) lets the model choose, as vLLM does with
`--enable-auto-tool-choice --tool-call-parser NAME`: the chat template lays out the tools
and the parser reads the model's own call format; without a template that knows tools, or
without those flags, it is a 400 that says why. "none" ignores the tools. Either way the
calls come back as `tool_calls`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.openai.schemas import FunctionCall, ToolCall
from loragate.gateway.openai.tool_parsers import (
    TOOL_PARSERS,
    CallArray,
    NamedCall,
    ToolCallFormat,
)


@dataclass(frozen=True)
class ToolPlan:
    """What the tools ask of one request: the JSON schema the answer must match (None for
    "auto"), how the answer reads as calls, and the tools for the chat template."""

    schema: dict | None
    format: ToolCallFormat
    named: str | None
    tools: list[dict]


def tool_plan(
    tools: list[Any] | None, tool_choice: Any, template: str | None, auto_parser: str | None
) -> ToolPlan | None:
    """`auto_parser`: the --tool-call-parser name when --enable-auto-tool-choice is on."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if choice == "auto":
        return ToolPlan(None, _auto_format(template, auto_parser), None, tools)
    if choice == "required":
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "parameters": params},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for name, params in functions.items()
        ]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        return ToolPlan(schema, CallArray(), None, tools)
    name = _named(choice)
    if name not in functions:
        raise InvalidRequestError(
            f"tool_choice names function {name!r}, which is not among the tools",
            param="tool_choice",
        )
    return ToolPlan(functions[name], NamedCall(name), name, tools)


def _auto_format(template: str | None, auto_parser: str | None) -> ToolCallFormat:
    reasons = []
    if not template or "tools" not in template:
        reasons.append(
            "this model's chat template does not lay out tools (give one that does "
            "with --chat-template)"
        )
    if auto_parser is None:
        reasons.append("the server runs without --enable-auto-tool-choice and --tool-call-parser")
    if reasons:
        raise InvalidRequestError(
            f"tool_choice 'auto' (the default with tools) is not available: {'; '.join(reasons)}"
            "; use tool_choice 'required' or name a function",
            param="tool_choice",
        )
    return TOOL_PARSERS[auto_parser]()


def tool_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[ToolCall]] | None:
    """(content, calls) of a whole answer; None when it holds no well-formed call (cut by
    max_tokens, or the model answered in words), so that it is all content."""
    parsed = plan.format.parse(text, final=True)
    if parsed is None or not parsed.calls:
        return None
    calls = [
        ToolCall(id=new_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
        for c in parsed.calls
    ]
    return (parsed.content if parsed.content.strip() else None), calls


def new_call_id() -> str:
    return f"call_{uuid4().hex[:24]}"


def _functions(tools: list[Any]) -> dict[str, dict]:
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
        ):
            raise InvalidRequestError(
                "each tool must be {'type': 'function', 'function': {...}}", param=f"tools[{i}]"
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError("a function needs a name", param=f"tools[{i}].function.name")
        params = function.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise InvalidRequestError(
                "parameters must be a JSON schema object", param=f"tools[{i}].function.parameters"
            )
        functions[name] = params
    return functions


def _named(choice: Any) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequestError(
            "tool_choice must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    return function["name"]
