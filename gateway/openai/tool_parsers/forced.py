"""The formats of calls that constrained decoding forces (tool_choice named or "required"):
the arguments object of the one named function, or a JSON array of {"name", "parameters"}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from loragate.gateway.openai.tool_parsers.calls import ParsedOutput, PartialCall, call_object


@dataclass(frozen=True)
class NamedCall:
    """The whole answer is the arguments of `name`."""

    name: str

    def parse(self, text: str, final: bool) -> ParsedOutput | None:
        if final and not _is_json(text):
            return None
        arguments = text.strip() if final else text.lstrip()
        return ParsedOutput("", [PartialCall(self.name, arguments, final)])


class CallArray:
    """The answer is `[{"name": ..., "parameters": {...}}, ...]` (tool_choice "required")."""

    def parse(self, text: str, final: bool) -> ParsedOutput | None:
        body = text.lstrip()
        if final and not _is_json(body):
            return None
        if not body.startswith("["):
            return None if final else ParsedOutput("", [])
        calls: list[PartialCall] = []
        pos = 1
        while True:
            pos = _skip(body, pos, ",")
            if pos >= len(body) or body[pos] == "]":
                break
            call, end = call_object(body[pos:], ("parameters",))
            if call is None:
                return None if final else ParsedOutput("", calls)
            calls.append(call)
            if end is None:
                break
            pos += end
        if final and not all(c.done for c in calls):
            return None
        return ParsedOutput("", calls)


def _skip(text: str, pos: int, separator: str) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] == separator):
        pos += 1
    return pos


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
