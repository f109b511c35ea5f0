"""vLLM's `llama3_json` tool-call parser: Llama 3.1-3.3's JSON calls,
`{"name": ..., "parameters": {...}}`, several separated by ';', optionally after
`<|python_tag|>`. An answer that does not begin with one is plain content."""

from __future__ import annotations

from loragate.gateway.openai.tool_parsers.calls import ParsedOutput, PartialCall, call_object

PYTHON_TAG = "<|python_tag|>"
_KEYS = ("parameters", "arguments")


class Llama3JsonParser:
    def parse(self, text: str, final: bool) -> ParsedOutput | None:
        body = text.lstrip()
        tagged = body.startswith(PYTHON_TAG)
        if tagged:
            body = body[len(PYTHON_TAG) :].lstrip()
        if not final and (not body or (not tagged and PYTHON_TAG.startswith(body))):
            return ParsedOutput("", [])  # nothing yet, or what may become the tag
        if not body.startswith("{"):
            return ParsedOutput(text, [])
        calls: list[PartialCall] = []
        pos = 0
        while pos < len(body):
            call, end = call_object(body[pos:], _KEYS)
            if call is None:
                return None if final else ParsedOutput("", calls)
            calls.append(call)
            if end is None:
                break
            pos += end
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
            if pos < len(body) and body[pos] != "{":
                return None if final else ParsedOutput("", calls)
        if final and not all(c.done for c in calls):
            return None
        return ParsedOutput("", calls)
