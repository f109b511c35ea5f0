"""The model the routes serve, as they name, tokenize and measure it: its name and aliases,
its adapters by name (for the caller), its chat template, and what a request's prompts cost
the caller's quotas."""

from __future__ import annotations

import time

from loragate.adapters import LoRARequest
from loragate.engine import ChatPrompt, EngineClient, ModelInfo, SamplingParams
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.tenancy.principal import OPERATOR, Principal
from loragate.gateway.tenancy.request_cost import RequestCost, request_cost


class ServedModel:
    def __init__(
        self,
        engine: EngineClient,
        adapters: AdapterManager,
        *,
        aliases: tuple[str, ...] = (),
        chat_template: str | None = None,
        auto_tool_parser: str | None = None,
        reasoning_parser: str | None = None,
    ):
        """`aliases`: other names of the base model (--served-model-name's extra names);
        `chat_template`: vLLM's --chat-template, in place of the model's own (None: the
        model's); `auto_tool_parser`: the parser of tool_choice "auto", when the server was
        started to allow it."""
        self.engine = engine
        self.info: ModelInfo = engine.model_info
        self.adapters = adapters
        self.aliases = aliases
        self.chat_template = chat_template
        self.auto_tool_parser = auto_tool_parser
        self.reasoning_parser = reasoning_parser  # --reasoning-parser, or None
        self.started_at = int(time.time())

    @property
    def model_name(self) -> str:
        return self.info.served_name

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def max_num_seqs(self) -> int:
        return self.info.max_num_seqs

    @property
    def tokenizer(self):
        return self.info.tokenizer

    async def resolve_model(
        self, name: str | None, param: str = "model", caller: Principal = OPERATOR
    ) -> LoRARequest | None:
        """None for the base model; the adapter's LoRARequest if `caller` may use it;
        NotFoundError (404) otherwise, the same whether it is missing or another tenant's."""
        if name is None or name == "" or name == self.model_name:
            return None
        if name in self.aliases:
            return None
        return (await self.adapters.lookup(name, param, caller)).lora_request

    @property
    def chat_template_text(self) -> str | None:
        """The template chats go through: --chat-template's, or the model's own."""
        return self.chat_template or getattr(self.tokenizer, "chat_template", None)

    async def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool,
        add_special_tokens: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[int]:
        """The conversation's prompt token ids, by --chat-template's template or the
        model's; any refusal (a value of the wrong shape, the template's own error) is the
        client's 400 on `messages`."""
        try:
            chat = ChatPrompt(
                messages,
                add_generation_prompt,
                add_special_tokens,
                tools=tools,
                chat_template=self.chat_template,
                chat_template_kwargs=chat_template_kwargs,
            )
            return await self.engine.apply_chat_template(chat)
        except Exception as exc:  # jinja errors are not ValueErrors; all are the client's input
            raise InvalidRequestError(f"messages: {exc}", param="messages") from exc

    async def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """A text prompt's token ids as the engine makes them (the model's BOS rule), on the
        engine's prompt thread (never behind an engine step)."""
        return await self.engine.encode(text, add_special_tokens)

    async def measure(
        self, caller: Principal, prompts: list, params: SamplingParams, field_names: dict
    ) -> tuple[list, RequestCost]:
        """The prompts as the engine will get them, and what the request costs the caller's
        quotas (see request_cost).

        Each text prompt is tokenized here, as the engine would, and handed to the engine as
        token ids (tokenized once): a tokens/minute quota needs the lengths, and so does the
        check that `max_tokens` fits the context (vLLM's 400, rather than a long answer cut
        at the context's end).
        """
        prompts = [await self._tokenized(p) for p in prompts]
        lengths = [_prompt_length(p) for p in prompts]
        _check_max_tokens(lengths, params.max_tokens, self.max_model_len, field_names)
        widest = "best_of" if (params.best_of or 1) > params.n else "n"
        if max(params.n, params.best_of or 1) == 1:
            widest = "prompt"
        cost = request_cost(
            lengths,
            params,
            self.max_model_len,
            max_tokens_param=field_names.get("max_tokens", "max_tokens"),
            sequences_param=field_names.get(widest, widest),
        )
        return prompts, cost

    async def _tokenized(self, prompt):
        """A text prompt (a string or {"prompt", "add_special_tokens"}) as token ids."""
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        if not isinstance(prompt, dict) or "prompt_token_ids" in prompt or not prompt["prompt"]:
            return prompt  # token ids already, or empty: the engine refuses that itself
        text, special = prompt["prompt"], prompt.get("add_special_tokens")
        ids = await self.encode(text, special)
        return {"prompt": text, "prompt_token_ids": ids}


def _check_max_tokens(lengths: list[int], max_tokens, max_model_len: int, names: dict) -> None:
    if max_tokens is None:
        return
    for length in lengths:
        if length < max_model_len and length + max_tokens > max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {length + max_tokens} tokens ({length} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion.",
                param=names.get("max_tokens", "max_tokens"),
            )


def _prompt_length(prompt) -> int:
    """Tokens of an engine prompt; 0 for text not tokenized here (no tokens quota asks)."""
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt_token_ids"), list):
        return len(prompt["prompt_token_ids"])
    return 0
