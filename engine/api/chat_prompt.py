"""ChatPrompt: one conversation to put through the chat template, as every hop hands it on.

A chat's prompt takes six values (the messages, whether to open the assistant's turn,
whether to add the model's special tokens, the tools, vLLM's `chat_template` override and
the template's own variables); they travel as this one frozen object, checked once where it
is built: the offline `LLM.apply_chat_template` (and `LLM.chat` through it) and the
gateway's served model build one, and it goes whole through `EngineClient.apply_chat_template`
(the async engine, the replicated engine) and `LLMEngine.apply_chat_template` to the input
processor, which templates it.
"""

from __future__ import annotations

from dataclasses import dataclass

from loragate.plugins import InvalidParam

# apply_chat_template's own arguments: chat_template_kwargs (vLLM's) may not set them.
RESERVED_TEMPLATE_NAMES = frozenset(
    {
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "conversation",
        "documents",
        "messages",
        "return_dict",
        "return_tensors",
        "tokenize",
        "tools",
    }
)


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation (`messages`, each with a 'role' and 'content'), templated by the
    model's chat template or `chat_template` (vLLM's override), opening the assistant's turn
    if `add_generation_prompt`. The template writes its own special tokens, so the model's
    rule adds its own only if `add_special_tokens` (None: no); `tools` are laid out by
    templates that know them (OpenAI's function definitions); `chat_template_kwargs` are
    more variables for the template (vLLM's: Qwen3's `enable_thinking`, say).

    Built checked: InvalidParam naming the field for each value of the wrong shape, and for
    template variables that would set the template call's own arguments."""

    messages: list[dict]
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = False
    tools: list[dict] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict | None = None

    def __post_init__(self) -> None:
        messages = self.messages
        if not isinstance(messages, list) or not messages:
            raise InvalidParam("messages", "messages must be a non-empty list")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise InvalidParam(
                    "messages", f"messages[{i}] must be an object with 'role' and 'content'"
                )
        special = self.add_special_tokens
        if special is None:
            object.__setattr__(self, "add_special_tokens", False)
        elif not isinstance(special, bool):
            raise InvalidParam(
                "add_special_tokens", f"add_special_tokens must be true or false, got {special!r}"
            )
        tools = self.tools
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        ):
            raise InvalidParam("tools", "tools must be a list of objects")
        kwargs = self.chat_template_kwargs
        if kwargs is not None and not isinstance(kwargs, dict):
            raise InvalidParam("chat_template_kwargs", "chat_template_kwargs must be an object")
        reserved = sorted(set(kwargs or {}) & RESERVED_TEMPLATE_NAMES)
        if reserved:
            raise InvalidParam(
                "chat_template_kwargs", f"chat_template_kwargs may not set {', '.join(reserved)}"
            )
