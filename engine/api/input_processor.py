"""Prompts in every accepted shape become checked token ids, before any KV block is touched.

A text gets the special tokens of the model's own rule (`SpecialTokenRule`), never a second
copy of a BOS it already starts with; `add_special_tokens=False` (vLLM's field) gives none.
"""

from __future__ import annotations

from typing import Any

from loragate.engine.api.chat_prompt import ChatPrompt
from loragate.engine.loading.special_tokens import SpecialTokenRule
from loragate.engine.sampling.sampling_params import SamplingParams
from loragate.plugins import InvalidParam

PromptInput = str | dict[str, Any]


class InputProcessor:
    def __init__(self, tokenizer, rule: SpecialTokenRule, vocab_size: int, max_model_len: int):
        self.tokenizer = tokenizer
        self.rule = rule
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of a text: the model's special tokens unless `add_special_tokens` is
        False (None and True both mean the model's rule, as True does in vLLM)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.rule.apply(ids) if _flag(add_special_tokens, True) else ids

    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        """(text, token ids) for a string, {"prompt": ..., "add_special_tokens": ...} or
        {"prompt_token_ids": [...]} (ids are taken as they are)."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidParam("prompt", "prompt is empty")
            return prompt, self.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if not isinstance(ids, list | tuple) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in ids
                ):
                    raise InvalidParam(
                        "prompt_token_ids", "prompt_token_ids must be a list of integers"
                    )
                return prompt.get("prompt"), list(ids)
            if "prompt" in prompt:
                text = prompt["prompt"]
                if not isinstance(text, str):
                    raise InvalidParam(
                        "prompt", f"prompt must be a string, got {type(text).__name__}"
                    )
                if not text:
                    raise InvalidParam("prompt", "prompt is empty")
                return text, self.encode(text, prompt.get("add_special_tokens"))
        raise InvalidParam(
            "prompt",
            "prompt must be a string or a dict with 'prompt' or 'prompt_token_ids', "
            f"got {type(prompt).__name__}",
        )

    def check(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise InvalidParam("prompt", "prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise InvalidParam(
                "prompt",
                f"prompt has {len(token_ids)} tokens; max_model_len is {self.max_model_len}, "
                "which must leave room for at least one generated token",
            )
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidParam(
                "prompt",
                f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
            )

    def apply_chat_template(self, chat: ChatPrompt) -> list[int]:
        """Prompt token ids for a conversation, through its chat template (ChatPrompt says
        what each of its values does; it was checked as it was built)."""
        ids = self.tokenizer.apply_chat_template(
            chat.messages,
            add_generation_prompt=chat.add_generation_prompt,
            tokenize=True,
            tools=chat.tools or None,
            chat_template=chat.chat_template,
            **(chat.chat_template_kwargs or {}),
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        return self.rule.apply(ids) if chat.add_special_tokens else ids


def _flag(value, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidParam(
            "add_special_tokens", f"add_special_tokens must be true or false, got {value!r}"
        )
    return value


def check_request(inputs: InputProcessor, plugins, token_ids: list[int], params) -> None:
    """Raise a ValueError naming what is wrong with a request's prompt or parameters."""
    if not isinstance(params, SamplingParams):
        raise InvalidParam(
            "sampling", f"sampling params must be SamplingParams, got {type(params).__name__}"
        )
    inputs.check(token_ids)
    if params.use_beam_search:
        try:
            plugins.decoding_strategy("beam")  # ValueError if no plugin provides it
        except ValueError as exc:
            raise InvalidParam("use_beam_search", str(exc)) from exc
    if params.sampler is not None:
        try:
            plugins.sampler(params.sampler)  # ValueError naming the known samplers
        except ValueError as exc:
            raise InvalidParam("sampler", str(exc)) from exc
