"""The offline API, as vLLM's `LLM`: construct once, then `generate` or `chat`."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import fields, replace
from itertools import count

from tqdm.auto import tqdm

from loragate.adapters import LoRARequest
from loragate.adapters.identity import SYSTEM_CLOCK, StampClock
from loragate.adapters.store import AdapterFetcher
from loragate.engine.api.chat_prompt import ChatPrompt
from loragate.engine.api.config import EngineConfig
from loragate.engine.api.engine_request import EngineRequest
from loragate.engine.core.llm_engine import LLMEngine, PromptInput
from loragate.engine.outputs.request_output import RequestOutput
from loragate.engine.sampling.beam_search_params import (
    BeamSearchOutput,
    BeamSearchParams,
    beam_search_output,
)
from loragate.engine.sampling.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """`LLM()` serves the default model; keyword arguments are EngineConfig fields."""

    def __init__(
        self,
        model: str | None = None,
        *,
        plugins=(),
        adapter_fetcher: AdapterFetcher | None = None,
        stamp_clock: StampClock = SYSTEM_CLOCK,
        **kwargs,
    ):
        """`plugins`: plugin objects or "module:object" strings, besides entry points.
        `adapter_fetcher` (not vLLM's; adapters/store.py) serves adapters named by their
        adapter store object (`LoRARequest(name, id, store_path(oid))`): each is fetched into
        the fetcher's cache directory and checked against its id before it is read.
        `stamp_clock` (not vLLM's; adapters/identity.py): the time adapter files are stamped
        at, which tests move forward instead of sleeping."""
        _check_engine_keywords(kwargs)
        config = EngineConfig(model=model, plugins=tuple(plugins), **kwargs)
        self.engine = LLMEngine(config, adapter_fetcher=adapter_fetcher, stamp_clock=stamp_clock)
        self._ids = count()

    @property
    def llm_engine(self) -> LLMEngine:
        """vLLM's name for the engine behind this LLM (`llm.llm_engine.scheduler...`)."""
        return self.engine

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
        add_special_tokens: bool | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        `priority` (vLLM's): one int per prompt, lower first under the `priority` policy.
        Outputs name each `lora_request` as given (a store object's path included, whose
        local copy the engine runs).

        Text prompts get the model's special tokens (its BOS rule) unless
        `add_special_tokens=False`; token-id prompts are taken as they are."""
        if not isinstance(prompts, list | tuple):
            prompts = [prompts]
        prompts = list(prompts)
        if add_special_tokens is not None:
            prompts = [_with_special_tokens_flag(p, add_special_tokens) for p in prompts]
        params = _aligned(sampling_params or SamplingParams(), len(prompts), "sampling_params")
        params = [_final_only(p) for p in params]
        loras = _aligned(lora_request, len(prompts), "lora_request")
        if priority is not None and not isinstance(priority, list | tuple):
            raise ValueError(f"priority must be a list of ints (one per prompt), got {priority!r}")
        priorities = _aligned(priority or 0, len(prompts), "priority")
        ids = []
        try:
            for prompt, p, lora, rank in zip(prompts, params, loras, priorities, strict=True):
                request = EngineRequest(prompt, p, f"llm-{next(self._ids)}", lora, priority=rank)
                self.engine.add(request)
                ids.append(request.request_id)
        except Exception:
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        outs = self._run(ids, use_tqdm)
        return [_as_given(out, lora) for out, lora in zip(outs, loras, strict=True)]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template (or `chat_template`, as vLLM's) to one
        conversation or a list of them; `tools` for templates that lay them out, and
        `chat_template_kwargs` for the template's own variables (``enable_thinking``)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            {
                "prompt_token_ids": self.apply_chat_template(
                    c,
                    add_generation_prompt,
                    tools=tools,
                    chat_template=chat_template,
                    chat_template_kwargs=chat_template_kwargs,
                )
            }
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, lora_request=lora_request, use_tqdm=use_tqdm)

    def beam_search(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search API: per prompt, `beam_width` sequences, best first."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be BeamSearchParams, got {type(params).__name__}")
        outs = self.generate(
            prompts, params.sampling_params(), lora_request=lora_request, use_tqdm=use_tqdm
        )
        return [beam_search_output(out) for out in outs]

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt=True,
        *,
        tools: list[dict] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[int]:
        chat = ChatPrompt(
            messages,
            add_generation_prompt,
            tools=tools,
            chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs,
        )
        return self.engine.apply_chat_template(chat)

    def get_memory_stats(self) -> dict:
        return self.engine.get_memory_stats()

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        pending = set(ids)
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm or len(ids) < 2) as bar:
            while pending:
                for out in self.engine.step():
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        done[out.request_id] = out
                        bar.update(1)
        return [done[i] for i in ids]


_ENGINE_KEYWORDS = {f.name for f in fields(EngineConfig)}


def _check_engine_keywords(kwargs: dict) -> None:
    unknown = sorted(set(kwargs) - _ENGINE_KEYWORDS)
    if unknown:
        raise TypeError(
            f"LLM() got an unexpected keyword argument {unknown[0]!r}: engine arguments are "
            "the fields of loragate.engine.EngineConfig"
        )


def _as_given(out: RequestOutput, lora: LoRARequest | None) -> RequestOutput:
    """``out`` naming the LoRARequest its prompt was given with (not the local copy of a
    store object the engine ran)."""
    return out if out.lora_request == lora else replace(out, lora_request=lora)


def _with_special_tokens_flag(prompt: PromptInput, add_special_tokens: bool) -> PromptInput:
    if isinstance(prompt, str):
        return {"prompt": prompt, "add_special_tokens": add_special_tokens}
    if isinstance(prompt, dict) and "prompt_token_ids" not in prompt:
        return {"add_special_tokens": add_special_tokens, **prompt}
    return prompt


def _final_only(params):
    """As vLLM's LLM.generate: only each request's final, whole output is built (nothing per
    step); the caller's SamplingParams stay as given."""
    if not isinstance(params, SamplingParams):
        return params  # the engine refuses it, naming it
    params = copy.copy(params)
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params


def _aligned(value, n: int, name: str) -> list:
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
        return list(value)
    return [value] * n
