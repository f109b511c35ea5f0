"""Turning generated token ids into text one step at a time.

Decoding a single token on its own is wrong for two reasons: a multi-byte character may
be split over several tokens (its first pieces decode to U+FFFD), and SentencePiece-style
decoders drop the leading space of whatever token comes first. So, as vLLM does, each
step decodes a short window twice: the "prefix" tokens already emitted (for context) and
the prefix plus the unread tokens; the new text is the difference. Text ending in U+FFFD
is held back until the character completes. The window only spans the last emitted
token(s) plus the unread ones, so each step costs O(1) in the sequence length.

Text is decoded exactly, with no ``clean_up_tokenization_spaces`` (which rewrites " ."
as "." and cannot be done incrementally), matching vLLM's streamed output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT_CHAR = "\ufffd"

# How many prompt tokens give the first generated token its context (vLLM uses 5).
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Streams the text of one sequence's generated tokens."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ):
        self.tokenizer = tokenizer
        # A fast tokenizer's own (Rust) decode: what transformers' decode calls for it,
        # without the per-call Python around it (the step decodes every new token twice).
        self._backend = _fast_backend(tokenizer)
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        # Only the tail the window can still reach is kept: context, then unread tokens.
        self._ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text: str | None = None
        self.text = ""

    def step(self, new_token_ids: Sequence[int]) -> str:
        """Add generated tokens; return the text they complete (may be empty)."""
        self._ids.extend(new_token_ids)
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        if len(window_text) <= len(self._prefix_text) or window_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = window_text[len(self._prefix_text) :]
        self._advance()
        self.text += delta
        return delta

    def flush(self) -> str:
        """Text still held back (an incomplete character at the very end), e.g. on finish."""
        window_text = self._decode(self._ids[self._prefix_offset :])
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        delta = window_text[len(prefix_text) :]
        if delta:
            self._advance()
            self.text += delta
        return delta

    def _advance(self) -> None:
        """Everything read so far becomes the next step's context; drop older tokens."""
        del self._ids[: self._read_offset]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = None

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        if self._backend is not None:
            return self._backend.decode(token_ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(
            token_ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            clean_up_tokenization_spaces=False,
        )


def _fast_backend(tokenizer: Any):
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer, else None. Its
    decode is exactly `tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_
    spaces=False)` (fast tokenizers ignore spaces_between_special_tokens)."""
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerFast):
        return tokenizer.backend_tokenizer
    return None
