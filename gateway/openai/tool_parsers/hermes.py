"""vLLM's `hermes` tool-call parser: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks (Hermes 2/3, Qwen 2.5 and others), with any other text as content."""

from __future__ import annotations

from loragate.gateway.openai.tool_parsers.calls import (
    ParsedOutput,
    PartialCall,
    call_object,
    held_back,
)

START, END = "<tool_call>", "</tool_call>"
_KEYS = ("arguments", "parameters")


class HermesParser:
    def parse(self, text: str, final: bool) -> ParsedOutput | None:
        content: list[str] = []
        calls: list[PartialCall] = []
        pos = 0
        while True:
            start = text.find(START, pos)
            if start < 0:
                tail = text[pos:]
                content.append(tail if final else tail[: len(tail) - held_back(tail, START)])
                break
            content.append(text[pos:start])
            inner_start = start + len(START)
            stop = text.find(END, inner_start)
            inner = text[inner_start : stop if stop >= 0 else len(text)]
            call, end = call_object(inner, _KEYS)
            trailing = inner[end:] if end is not None else ""
            if stop < 0 and not final:
                trailing = trailing[: len(trailing) - held_back(trailing, END)]
            closed = not trailing.strip()
            if call is None or (end is not None and not closed):
                return None if final else ParsedOutput("".join(content), calls)
            if stop < 0 or end is None:
                if final and not call.done:  # cut off inside the call
                    return None
                calls.append(call)
                break
            calls.append(call)
            pos = stop + len(END)
        return ParsedOutput("".join(content), calls)
