"""Engine outputs to OpenAI response bodies: whole responses, stream deltas, logprobs, usage.

The engine streams deltas (serving/generation.py grows them, in place, into one cumulative
output per request, which the reasoning and tool parsers read whole); `DeltaTracker` takes
from that output what each choice has not sent yet, slicing only the new part, so a stream
carries every character and every token exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from loragate.engine import CompletionOutput, RequestOutput
from loragate.gateway.openai.schemas import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
    UsageInfo,
)

_MISSING_LOGPROB = -9999.0


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def usage_of(outputs: list[RequestOutput]) -> UsageInfo:
    prompt = sum(len(out.prompt_token_ids) for out in outputs)
    completion = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    return UsageInfo(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def prompt_text(tokenizer, out: RequestOutput) -> str:
    return out.prompt if isinstance(out.prompt, str) else tokenizer.decode(out.prompt_token_ids)


def echoed(tokenizer, out: RequestOutput, c: CompletionOutput) -> CompletionOutput:
    """The choice with the prompt in front (completions' `echo`), its logprobs too when the
    prompt's were computed (the first prompt token has none: an empty step)."""
    logprobs = None
    if c.logprobs is not None and out.prompt_logprobs is not None:
        logprobs = [step or {} for step in out.prompt_logprobs] + list(c.logprobs)
    return replace(
        c,
        text=prompt_text(tokenizer, out) + c.text,
        token_ids=list(out.prompt_token_ids) + list(c.token_ids),
        logprobs=logprobs,
    )


def completion_logprobs(
    tokenizer, token_ids: list[int], steps: list[dict[int, float]], text_offset: int = 0
) -> CompletionLogprobs:
    """The legacy completions shape: parallel lists over the generated tokens."""
    tokens, chosen, tops, offsets = [], [], [], []
    for token_id, step in zip(token_ids, steps, strict=False):
        text = token_text(tokenizer, token_id)
        tokens.append(text)
        chosen.append(step.get(token_id, _MISSING_LOGPROB) if step else None)
        tops.append({token_text(tokenizer, t): lp for t, lp in _ranked(step)} if step else None)
        offsets.append(text_offset)
        text_offset += len(text)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=chosen, top_logprobs=tops, text_offset=offsets
    )


def chat_logprobs(
    tokenizer, token_ids: list[int], steps: list[dict[int, float]], top_n: int
) -> ChatLogprobs:
    content = []
    for token_id, step in zip(token_ids, steps, strict=False):
        text = token_text(tokenizer, token_id)
        content.append(
            ChatTokenLogprob(
                token=text,
                logprob=step.get(token_id, _MISSING_LOGPROB),
                bytes=list(text.encode("utf-8")),
                top_logprobs=[
                    TopLogprob(
                        token=(t := token_text(tokenizer, tid)), logprob=lp, bytes=list(t.encode())
                    )
                    for tid, lp in _ranked(step)[:top_n]
                ],
            )
        )
    return ChatLogprobs(content=content)


def _ranked(step: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(step.items(), key=lambda item: -item[1])


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    stop_reason: int | str | None
    text_offset: int


class DeltaTracker:
    """What one choice has sent so far; `step` returns what is new, or None if nothing is."""

    def __init__(self) -> None:
        self.sent_chars = 0
        self.sent_tokens = 0
        self.done = False

    def step(self, choice: CompletionOutput, with_tokens: bool) -> Delta | None:
        if self.done:
            return None
        text = choice.text[self.sent_chars :]
        token_ids = choice.token_ids[self.sent_tokens :]
        logprobs = None
        if choice.logprobs is not None:
            logprobs = choice.logprobs[self.sent_tokens : len(choice.token_ids)]
        finish = choice.finish_reason
        if not text and finish is None and not (with_tokens and token_ids):
            return None
        delta = Delta(text, token_ids, logprobs, finish, choice.stop_reason, self.sent_chars)
        self.sent_chars = max(self.sent_chars, len(choice.text))
        self.sent_tokens = len(choice.token_ids)
        self.done = finish is not None
        return delta
