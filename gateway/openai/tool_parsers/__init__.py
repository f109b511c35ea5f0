"""Reading tool calls out of a model's answer: vLLM's `--tool-call-parser` formats for
tool_choice "auto", and the formats that constrained decoding forces (named, "required")."""

from loragate.gateway.openai.tool_parsers.calls import ParsedOutput, PartialCall, ToolCallFormat
from loragate.gateway.openai.tool_parsers.forced import CallArray, NamedCall
from loragate.gateway.openai.tool_parsers.hermes import HermesParser
from loragate.gateway.openai.tool_parsers.llama3_json import Llama3JsonParser

# --tool-call-parser NAME -> the format it reads.
TOOL_PARSERS: dict[str, type] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}

__all__ = [
    "TOOL_PARSERS",
    "CallArray",
    "HermesParser",
    "Llama3JsonParser",
    "NamedCall",
    "ParsedOutput",
    "PartialCall",
    "ToolCallFormat",
]
