"""POST /v1/chat/completions: chat through the model's chat template, whole or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from litestar import Controller, Request, post
from litestar.params import JSONBody
from litestar.response import Stream

from loragate.gateway.errors import APIError, ErrorDetail, ErrorResponse
from loragate.gateway.openai.format import DeltaTracker, chat_logprobs, usage_of
from loragate.gateway.openai.prompts import chat_messages
from loragate.gateway.openai.reasoning import ReasoningSplitter, started_in_prompt
from loragate.gateway.openai.sampling import chat_fields, chat_params
from loragate.gateway.openai.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
    final_usage,
    usage_on_every_chunk,
)
from loragate.gateway.openai.tool_stream import ToolCallStreamer
from loragate.gateway.openai.tools import ToolPlan, tool_calls, tool_plan
from loragate.gateway.serving.accounting import Accounting
from loragate.gateway.serving.generation import Generation, outputs_of
from loragate.gateway.serving.route_start import start_route
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.serving.sse import DONE, sse_event
from loragate.gateway.tenancy.principal import Caller


class ChatController(Controller):
    path = "/v1/chat/completions"
    tags = ["OpenAI"]

    @post("/", status_code=200, summary="Create a chat completion")
    async def create(
        self,
        data: JSONBody[ChatCompletionRequest],
        request: Request,
        caller: Caller,
        served_model: ServedModel,
        accounting: Accounting,
    ) -> ChatCompletionResponse | Stream:
        plan = tool_plan(
            data.tools,
            data.tool_choice,
            served_model.chat_template_text,
            served_model.auto_tool_parser,
        )
        started = await start_route(
            served_model,
            accounting,
            request,
            caller,
            model=data.model,
            prompts=lambda: _prompts(served_model, data, plan),
            params=chat_params(data, served_model.max_num_seqs, plan.schema if plan else None),
            field_names=chat_fields(data),
            id_prefix="chatcmpl",
            priority=data.priority,
        )
        run, request_id = started.run, started.request_id
        splitter = _reasoning_splitter(served_model, data, started.prompts[0]["prompt_token_ids"])
        created = int(time.time())
        if data.stream:
            return run.stream(
                _stream(served_model, data, plan, splitter, run.generations[0], request_id, created)
            )
        (final,) = await run.collect()
        top_n = data.top_logprobs or 0
        choices = []
        for c in final.outputs:
            reasoning, content = None, c.text
            if splitter is not None:
                split = splitter().split(c.text)
                reasoning, content = split.reasoning, split.content
            message = _message(plan, content, reasoning)
            choices.append(
                ChatChoice(
                    index=c.index,
                    message=message,
                    logprobs=chat_logprobs(served_model.tokenizer, c.token_ids, c.logprobs, top_n)
                    if data.logprobs and c.logprobs is not None
                    else None,
                    finish_reason=_finish(plan, c.finish_reason, bool(message.tool_calls)),
                    stop_reason=c.stop_reason,
                )
            )
        return ChatCompletionResponse(
            id=request_id,
            created=created,
            model=data.model,
            choices=choices,
            usage=usage_of([final]),
        )


async def _prompts(
    served_model: ServedModel, data: ChatCompletionRequest, plan: ToolPlan | None
) -> list[dict]:
    """The conversation as the route's one prompt: its token ids, by the chat template,
    with the tools laid out."""
    ids = await served_model.apply_chat_template(
        chat_messages(data.messages),
        data.add_generation_prompt,
        data.add_special_tokens,
        tools=plan.tools if plan is not None else None,
        chat_template_kwargs=data.chat_template_kwargs,
    )
    return [{"prompt_token_ids": ids}]


def _reasoning_splitter(
    served_model: ServedModel, data: ChatCompletionRequest, prompt_ids: list[int]
) -> Callable[[], ReasoningSplitter] | None:
    """A maker of one splitter per choice, under --reasoning-parser unless the request
    turned thinking off (``chat_template_kwargs.enable_thinking: false``, as vLLM reads it)."""
    parser = served_model.reasoning_parser
    if parser is None or (data.chat_template_kwargs or {}).get("enable_thinking") is False:
        return None
    opened = started_in_prompt(served_model.tokenizer.decode(prompt_ids[-16:]), parser)
    return lambda: ReasoningSplitter(parser, opened)


def _message(plan: ToolPlan | None, text: str | None, reasoning: str | None) -> AssistantMessage:
    found = tool_calls(plan, text or "") if plan is not None else None
    if found is None:
        return AssistantMessage(content=text, reasoning_content=reasoning)
    content, calls = found
    return AssistantMessage(content=content, reasoning_content=reasoning, tool_calls=calls)


def _finish(plan: ToolPlan | None, reason: str | None, called: bool) -> str | None:
    """OpenAI's: 'tool_calls' when the model chose to call ('required', 'auto'); the
    engine's own reason when a named function was forced or nothing was called."""
    if plan is not None and plan.named is None and called and reason is not None:
        return "tool_calls"
    return reason


async def _stream(
    served_model: ServedModel,
    data: JSONBody[ChatCompletionRequest],
    plan: ToolPlan | None,
    splitter: Callable[[], ReasoningSplitter] | None,
    gen: Generation,
    request_id: str,
    created: int,
) -> AsyncIterator[bytes]:
    every_chunk = usage_on_every_chunk(data.stream_options)

    def chunk(choices, usage=None) -> bytes:
        if usage is None and every_chunk:
            usage = usage_of([gen.latest])
        return sse_event(
            ChatCompletionChunk(
                id=request_id, created=created, model=data.model, choices=choices, usage=usage
            )
        )

    top_n = data.top_logprobs or 0
    trackers: dict[int, DeltaTracker] = {}
    calls: dict[int, ToolCallStreamer] = {}
    splitters: dict[int, ReasoningSplitter] = {}
    try:
        for i in range(len(gen.latest.outputs)):
            yield chunk(
                [ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))]
            )
        async for out in outputs_of(gen):
            choices = []
            for c in out.outputs:
                delta = trackers.setdefault(c.index, DeltaTracker()).step(c, data.logprobs)
                if delta is None:
                    continue
                logprobs = None
                if data.logprobs and delta.logprobs is not None:
                    logprobs = chat_logprobs(
                        served_model.tokenizer, delta.token_ids, delta.logprobs, top_n
                    )
                text, content, reasoning = c.text, delta.text or None, None
                if splitter is not None:
                    final = delta.finish_reason is not None
                    parts = splitters.setdefault(c.index, splitter())
                    text = parts.split(c.text, final).content or ""
                    new = parts.step(c.text, final)
                    content, reasoning = new.content, new.reasoning
                if plan is None:
                    held = content is None and reasoning is None and logprobs is None
                    if splitter is not None and held and delta.finish_reason is None:
                        continue  # only text held back: a later step sends it
                    choices.append(
                        ChatChunkChoice(
                            index=c.index,
                            delta=DeltaMessage(content=content, reasoning_content=reasoning),
                            logprobs=logprobs,
                            finish_reason=delta.finish_reason,
                        )
                    )
                    continue
                if reasoning is not None:
                    only_reasoning = DeltaMessage(reasoning_content=reasoning)
                    choices.append(ChatChunkChoice(index=c.index, delta=only_reasoning))
                streamer = calls.setdefault(c.index, ToolCallStreamer(plan.format))
                choices += _tool_chunks(plan, streamer, c.index, text, delta, logprobs)
            for choice in choices:  # one choice per chunk, as OpenAI and vLLM stream n > 1
                yield chunk([choice])
        if final_usage(data.stream_options):
            yield chunk([], usage_of([gen.latest]))
    except APIError as exc:
        yield sse_event(
            ErrorResponse(
                error=ErrorDetail(message=exc.message, type=exc.error_type, code=exc.code)
            )
        )
    yield DONE


def _tool_chunks(
    plan: ToolPlan, streamer: ToolCallStreamer, index: int, text: str, delta, logprobs
) -> list[ChatChunkChoice]:
    """One step of a choice with tools: its content, each tool-call delta on its own, and
    the finish ('tool_calls' when the model chose to call)."""
    got = streamer.step(text, final=delta.finish_reason is not None)
    out = []
    if got.content or logprobs is not None:
        out.append(
            ChatChunkChoice(
                index=index, delta=DeltaMessage(content=got.content or None), logprobs=logprobs
            )
        )
    out += [
        ChatChunkChoice(index=index, delta=DeltaMessage(tool_calls=[call]))
        for call in got.tool_calls
    ]
    if delta.finish_reason is not None:
        reason = _finish(plan, delta.finish_reason, streamer.called)
        out.append(ChatChunkChoice(index=index, delta=DeltaMessage(), finish_reason=reason))
    return out
