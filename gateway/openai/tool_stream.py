"""One chat choice's tool calls as OpenAI streams them: a call's first delta carries its id,
type and name, the next ones fragments of its arguments; content goes as content."""

from __future__ import annotations

from dataclasses import dataclass, field

from loragate.gateway.openai.schemas import DeltaFunctionCall, DeltaToolCall
from loragate.gateway.openai.tool_parsers import ToolCallFormat
from loragate.gateway.openai.tools import new_call_id


@dataclass
class ToolStreamStep:
    content: str = ""
    tool_calls: list[DeltaToolCall] = field(default_factory=list)


class ToolCallStreamer:
    """What one choice has sent; `step(text, final)` returns what is new in `text`."""

    def __init__(self, fmt: ToolCallFormat):
        self.fmt = fmt
        self.sent_content = 0
        self.sent_arguments: list[str] = []
        self.ids: list[str] = []

    @property
    def called(self) -> bool:
        return bool(self.ids)

    def step(self, text: str, final: bool) -> ToolStreamStep:
        parsed = self.fmt.parse(text, final)
        out = ToolStreamStep()
        if parsed is None:  # not a call after all: what is left is content (if no call began)
            if not self.called:
                out.content = text[self.sent_content :]
                self.sent_content = len(text)
            return out
        if parsed.content.strip():  # whitespace alone around calls is not worth a chunk
            out.content = parsed.content[self.sent_content :]
            self.sent_content = len(parsed.content)
        for index, call in enumerate(parsed.calls):
            if call.name is None:
                break
            if index == len(self.ids):
                self.ids.append(new_call_id())
                self.sent_arguments.append("")
                out.tool_calls.append(
                    DeltaToolCall(
                        index=index,
                        id=self.ids[index],
                        type="function",
                        function=DeltaFunctionCall(name=call.name, arguments=""),
                    )
                )
            sent = self.sent_arguments[index]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                out.tool_calls.append(
                    DeltaToolCall(
                        index=index,
                        function=DeltaFunctionCall(arguments=call.arguments[len(sent) :]),
                    )
                )
                self.sent_arguments[index] = call.arguments
        return out
