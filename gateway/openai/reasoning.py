"""vLLM's `--reasoning-parser`: a thinking model's answer split into `reasoning_content` (what
it wrote between `<think>` and `</think>`) and `content` (what follows), whole or streamed.

Qwen3 writes `<think>...</think>` first when thinking is on; with `enable_thinking: false`
its template closes an empty think block in the prompt, and the answer is all content.
Thinking-only variants open `<think>` in the prompt, so their answer starts inside it: the
prompt says which (`started_in_prompt`). An answer cut before `</think>` is all reasoning,
streamed or not. While streaming, text that may be the start of a tag is held back until
the next token says whether it is one, so no tag reaches the client split in two.
"""

from __future__ import annotations

from dataclasses import dataclass

# --reasoning-parser NAME -> the tags that open and close its reasoning.
REASONING_PARSERS = {"qwen3": ("<think>", "</think>")}


@dataclass(frozen=True)
class Split:
    reasoning: str | None  # None: the answer has no reasoning part
    content: str | None  # None: nothing after the reasoning (yet)


class ReasoningSplitter:
    """Splits one choice's answer; ``step`` takes the whole text so far, each time."""

    def __init__(self, parser: str, started_in_prompt: bool = False):
        if parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, got {parser!r}"
            )
        self.start, self.end = REASONING_PARSERS[parser]
        self.started_in_prompt = started_in_prompt
        self._sent_reasoning = 0
        self._sent_content = 0

    def split(self, text: str, final: bool = True) -> Split:
        """The answer's two parts; before the end (``final`` False) without the text that
        may still turn out to be a tag."""
        body = text
        if not self.started_in_prompt:
            opened = text.lstrip()
            if opened.startswith(self.start):
                body = opened[len(self.start) :]
            elif not final and self.start.startswith(opened):
                return Split("", "")  # an opening tag may be coming
            else:
                return Split(None, text or None)
        end = body.find(self.end)
        if end >= 0:
            return Split(body[:end], body[end + len(self.end) :] or None)
        if not final:
            body = body[: len(body) - _partial_tag(body, self.end)]
        return Split(body, None)

    def step(self, text: str, final: bool) -> Split:
        """What is new in each part since the last step (None where nothing is)."""
        now = self.split(text, final)
        reasoning, content = now.reasoning or "", now.content or ""
        new_reasoning = reasoning[self._sent_reasoning :]
        new_content = content[self._sent_content :]
        self._sent_reasoning, self._sent_content = len(reasoning), len(content)
        return Split(new_reasoning or None, new_content or None)


def started_in_prompt(prompt_tail: str, parser: str) -> bool:
    """Whether the prompt's end leaves a reasoning block open (thinking-only templates)."""
    start, end = REASONING_PARSERS[parser]
    return prompt_tail.rfind(start) > prompt_tail.rfind(end)


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (0: none)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
