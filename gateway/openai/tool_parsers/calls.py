"""Tool calls read out of text that may still be growing: what every call format shares.

A format's `parse(text, final)` gives the content and the calls seen so far. Before the
end, both only ever grow (text that could still turn into a call is held back), so a
stream can send what is new at each step; at the end it gives None when the text is not
a well-formed call after all, and the caller answers the whole text as content (never a
500). Arguments are the model's own JSON text, so streamed fragments add up to exactly the
arguments of the whole answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol

_DECODER = json.JSONDecoder()
# A call object's head: its name, then the key its arguments go under.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(\w+)"\s*:\s*')


@dataclass(frozen=True)
class PartialCall:
    """One call as far as the text goes: `name` is None until it is complete."""

    name: str | None
    arguments: str
    done: bool


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    calls: list[PartialCall]


class ToolCallFormat(Protocol):
    def parse(self, text: str, final: bool) -> ParsedOutput | None:
        """Content and calls so far; at the end (`final`), None if the text is malformed."""


def call_object(text: str, keys: tuple[str, ...]) -> tuple[PartialCall | None, int | None]:
    """The call that the JSON object at the start of `text` makes so far, and where the
    object ends once it is complete. (None, end) when the complete object is no call."""
    start = len(text) - len(text.lstrip())
    try:
        value, end = _DECODER.raw_decode(text, start)
    except ValueError:
        value, end = None, None
    head = _HEAD.match(text)
    if head is not None and head.group(2) not in keys:
        head = None
    if end is not None:
        return _complete_call(value, keys, text[head.end() :] if head else None), end
    if head is None:
        return PartialCall(None, "", False), None
    rest = text[head.end() :]
    return PartialCall(_string(head.group(1)), json_prefix(rest), False), None


def json_prefix(text: str) -> str:
    """`text` up to the end of the JSON value it starts with, or all of it while the value
    is still incomplete."""
    try:
        _, end = _DECODER.raw_decode(text)
    except ValueError:
        return text
    return text[:end]


def held_back(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def _complete_call(value, keys: tuple[str, ...], raw_rest: str | None) -> PartialCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    key = next((k for k in keys if k in value), None)
    if key is None:
        return None
    arguments = json_prefix(raw_rest) if raw_rest is not None else json.dumps(value[key])
    return PartialCall(value["name"], arguments, True)


def _string(body: str) -> str:
    return json.loads(f'"{body}"')
