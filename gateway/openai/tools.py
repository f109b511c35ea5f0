"""OpenAI function calling on chat: `tools` with `tool_choice`.

A named function or "required" constrains the answer to JSON (the function's parameters
schema, or an array of calls to any of the tools), as vLLM does without extra flags; the
answer comes back as `tool_calls`. "auto" needs a chat template that lays out tools and a
parser for the model's own call format; the default model's template has no tools, so
"auto" (the default when tools are given) is a 400 that says why. "none" ignores the tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.openai.schemas import FunctionCall, ToolCall


@dataclass(frozen=True)
class ToolPlan:
    """What the tools ask of one request: the JSON schema the answer must match, and
    whether it is one named call (its name) or an array of calls ('required')."""

    schema: dict
    named: str | None


def tool_plan(tools: list[Any] | None, tool_choice: Any, template: str | None) -> ToolPlan | None:
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if choice == "auto":
        reason = (
            "this model's chat template does not lay out tools"
            if not template or "tools" not in template
            else "parsing tool calls from this model's own format is not supported yet"
        )
        raise InvalidRequestError(
            f"tool_choice 'auto' (the default with tools) is not available: {reason}; "
            "use tool_choice 'required' or name a function",
            param="tool_choice",
        )
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
        return ToolPlan(schema, None)
    name = _named(choice)
    if name not in functions:
        raise InvalidRequestError(
            f"tool_choice names function {name!r}, which is not among the tools",
            param="tool_choice",
        )
    return ToolPlan(functions[name], name)


def tool_calls(plan: ToolPlan, text: str) -> list[ToolCall] | None:
    """The answer as tool calls; None when it is not complete JSON (cut by max_tokens)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    calls = [(plan.named, value)] if plan.named else [(c["name"], c["parameters"]) for c in value]
    return [
        ToolCall(
            id=f"call_{uuid4().hex[:24]}",
            function=FunctionCall(name=name, arguments=json.dumps(arguments)),
        )
        for name, arguments in calls
    ]


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
