"""When a sequence stops, decided after each new token from plain data (vLLM's rules).

Order: nothing stops before ``min_tokens`` outputs exist; then EOS (unless ignore_eos),
stop_token_ids, stop strings, and finally ``max_tokens`` ("length"); `stop_after` adds the
context limit and cuts the text.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from loragate.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class StopDecision:
    """Why a sequence finished, and how much of its text to keep.

    ``stop_reason`` is the matched stop string or stop token id (None for EOS and
    length); ``truncate_to`` is the text length to keep (None: keep it all).
    """

    finish_reason: str
    stop_reason: str | int | None = None
    truncate_to: int | None = None


def check_stop(
    params: SamplingParams,
    output_token_ids: Sequence[int],
    new_token_id: int,
    text: str,
    num_new_chars: int,
    eos_token_ids: Collection[int],
) -> StopDecision | None:
    """Decide whether the sequence stops after ``new_token_id``.

    ``output_token_ids`` are all generated ids *including* ``new_token_id`` (the last);
    ``text`` is the output text so far, whose last ``num_new_chars`` came with this step.
    """
    if not output_token_ids or output_token_ids[-1] != new_token_id:
        raise ValueError("output_token_ids must end with new_token_id (the token just added)")
    if not 0 <= num_new_chars <= len(text):
        raise ValueError(f"num_new_chars must be in [0, {len(text)}], got {num_new_chars}")
    if len(output_token_ids) < params.min_tokens:
        return None
    if new_token_id in eos_token_ids and not params.ignore_eos:
        return StopDecision("stop", None, _drop_token_text(text, num_new_chars, params))
    if new_token_id in params.stop_token_ids:
        return StopDecision("stop", new_token_id, _drop_token_text(text, num_new_chars, params))
    match = find_stop_string(text, num_new_chars, params.stop)
    if match is not None:
        start, stop = match
        keep = start + len(stop) if params.include_stop_str_in_output else start
        return StopDecision("stop", stop, keep if keep < len(text) else None)
    if params.max_tokens is not None and len(output_token_ids) >= params.max_tokens:
        return StopDecision("length")
    return None


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


def stop_after(
    seq, token_id: int, num_new_chars: int, eos_token_ids: Collection[int], max_model_len: int
) -> StopDecision | None:
    """`check_stop` for a sequence that just took `token_id`, plus the context limit; the
    text of a sequence that stops is flushed and cut to what it keeps."""
    decision = check_stop(
        seq.request.params, seq.output_token_ids, token_id, seq.text, num_new_chars, eos_token_ids
    )
    if decision is None and seq.num_tokens >= max_model_len:
        decision = StopDecision("length", None, None)
    if decision is not None:
        seq.text += seq.detokenizer.flush()
        if decision.truncate_to is not None:
            seq.text = seq.text[: decision.truncate_to]
    return decision
