"""Prompts in every accepted shape become checked token ids, before any KV block is touched."""

from __future__ import annotations

from typing import Any

PromptInput = str | dict[str, Any]


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        """(text, token ids) for a string, {"prompt": ...} or {"prompt_token_ids": [...]}."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if not isinstance(ids, list | tuple) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in ids
                ):
                    raise ValueError("prompt_token_ids must be a list of integers")
                return prompt.get("prompt"), list(ids)
            if "prompt" in prompt:
                return self.tokenize(prompt["prompt"])
        raise ValueError(
            "prompt must be a string or a dict with 'prompt' or 'prompt_token_ids', "
            f"got {type(prompt).__name__}"
        )

    def check(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens; max_model_len is {self.max_model_len}, "
                "which must leave room for at least one generated token"
            )
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
            )

    def apply_chat_template(self, messages: list[dict], add_generation_prompt=True) -> list[int]:
        """Prompt token ids for a conversation, through the model's chat template."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
