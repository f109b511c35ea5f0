"""A server's prompts become token ids on a thread of their own, never the engine's.

A request's prompt is tokenized before it reaches the engine: its length is what a
tokens-per-minute quota charges and what `max_tokens` is checked against. Done on the engine
thread, every request (one to be refused with 429 included) would wait for the step in
progress, which takes seconds in a long prefill; done on the event loop, a long prompt or
chat template would hold every other request up. So the frontend keeps its own copy of the
engine's InputProcessor (a tokenizer is not safe to share between threads) and runs it on
one worker thread, the copy's only user (vLLM tokenizes in its API server the same way).
"""

from __future__ import annotations

import asyncio
import copy
from concurrent.futures import ThreadPoolExecutor

from loragate.engine.api.chat_prompt import ChatPrompt
from loragate.engine.api.input_processor import InputProcessor


class PromptThread:
    """`inputs` (an InputProcessor no other thread uses) behind one worker thread."""

    def __init__(self, inputs: InputProcessor):
        self.inputs = inputs
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loragate-prompts")

    @classmethod
    def copy_of(cls, inputs: InputProcessor) -> PromptThread:
        """A PromptThread over a copy of `inputs` (whose tokenizer another thread uses)."""
        return cls(copy.deepcopy(inputs))

    async def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """A text's token ids, with the model's special tokens unless told not to."""
        return await self._run(self.inputs.encode, text, add_special_tokens)

    async def apply_chat_template(self, chat: ChatPrompt) -> list[int]:
        """A conversation's prompt token ids, by its chat template."""
        return await self._run(self.inputs.apply_chat_template, chat)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Stop the thread once what was handed to it has run."""
        self._pool.shutdown(wait=False, cancel_futures=True)
