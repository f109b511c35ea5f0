"""When a sequence stops, decided after each new token from plain data (vLLM's rules).

Order: nothing stops before ``min_tokens`` outputs exist; then EOS (unless ignore_eos),
stop_token_ids, stop strings, and finally ``max_tokens`` ("length"), then the context limit.
The step thread decides what token ids alone decide (`stop_by_token`: it frees KV blocks);
output processing, beside the step, adds what needs the text (`stop_by_text`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from loragate.engine.sampling.sampling_params import SamplingParams


@dataclass(frozen=True)
class StopDecision:
    """Why a sequence finished, and how much of its text to keep.

    ``stop_reason`` is the matched stop string or stop token id (None for EOS and
    length); ``truncate_to`` is the text length to keep (None: keep it all).
    """

    finish_reason: str
    stop_reason: str | int | None = None
    truncate_to: int | None = None


def stop_by_token(
    params: SamplingParams,
    num_output_tokens: int,
    token_id: int,
    eos_token_ids: Collection[int],
    num_tokens: int = 0,
    max_model_len: int | None = None,
) -> StopDecision | None:
    """What the step decides from token ids alone (it frees KV blocks): EOS, stop_token_ids,
    max_tokens and, given ``max_model_len``, the context limit; nothing before min_tokens
    but the context limit. Its "length" may still become a stop string's "stop"
    (`stop_by_text`)."""
    decision = None
    if num_output_tokens >= params.min_tokens:
        if token_id in eos_token_ids and not params.ignore_eos:
            decision = StopDecision("stop")
        elif token_id in params.stop_token_ids:
            decision = StopDecision("stop", token_id)
        elif params.max_tokens is not None and num_output_tokens >= params.max_tokens:
            decision = StopDecision("length")
    if decision is None and max_model_len is not None and num_tokens >= max_model_len:
        decision = StopDecision("length")
    return decision


def stop_by_text(
    params: SamplingParams,
    num_output_tokens: int,
    text: str,
    num_new_chars: int,
    by_token: StopDecision | None,
) -> StopDecision | None:
    """The final decision once the token's text is known: a stop token's text is dropped
    (unless asked for), and a stop string in the new text wins over "length"."""
    if by_token is not None and by_token.finish_reason == "stop":
        return StopDecision(
            "stop", by_token.stop_reason, _drop_token_text(text, num_new_chars, params)
        )
    if num_output_tokens >= params.min_tokens:
        match = find_stop_string(text, num_new_chars, params.stop)
        if match is not None:
            start, stop = match
            keep = start + len(stop) if params.include_stop_str_in_output else start
            return StopDecision("stop", stop, keep if keep < len(text) else None)
    return by_token


def find_stop_string(text: str, num_new_chars: int, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string that overlaps the new text, as (start index, string).

    Only the new characters and the ``len(stop) - 1`` before them are searched: an
    occurrence wholly inside older text would have stopped an earlier step.
    """
    if num_new_chars == 0:
        return None
    best: tuple[int, str] | None = None
    for stop in stops:
        start = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if start != -1 and (best is None or start < best[0]):
            best = (start, stop)
    return best


def stream_safe_len(text: str, params: SamplingParams) -> int:
    """How much of ``text`` may be streamed now.

    A tail that is the beginning of a stop string is held back: if the stop string then
    completes, it must not have been sent. Nothing is held back when stop strings are
    included in the output anyway.
    """
    if not params.stop or params.include_stop_str_in_output:
        return len(text)
    longest = max(len(stop) for stop in params.stop)
    for length in range(min(longest - 1, len(text)), 0, -1):
        tail = text[-length:]
        if any(stop.startswith(tail) for stop in params.stop):
            return len(text) - length
    return len(text)


def _drop_token_text(text: str, num_new_chars: int, params: SamplingParams) -> int | None:
    """Stop tokens (EOS, stop_token_ids) leave no text unless asked to (vLLM)."""
    if params.include_stop_str_in_output or num_new_chars == 0:
        return None
    return len(text) - num_new_chars
