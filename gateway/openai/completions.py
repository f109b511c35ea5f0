"""POST /v1/completions: OpenAI's (legacy) text completions, whole or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from litestar import Controller, Request, post
from litestar.params import JSONBody
from litestar.response import Stream

from loragate.gateway.errors import APIError, ErrorDetail, ErrorResponse
from loragate.gateway.openai.format import (
    DeltaTracker,
    completion_logprobs,
    echoed,
    prompt_text,
    usage_of,
)
from loragate.gateway.openai.prompts import completion_prompts
from loragate.gateway.openai.sampling import completion_fields, completion_params
from loragate.gateway.openai.schemas import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    final_usage,
    usage_on_every_chunk,
)
from loragate.gateway.serving.accounting import Accounting
from loragate.gateway.serving.generation import Generation, outputs_of
from loragate.gateway.serving.route_start import start_route
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.serving.sse import DONE, sse_event
from loragate.gateway.tenancy.principal import Caller


class CompletionsController(Controller):
    path = "/v1/completions"
    tags = ["OpenAI"]

    @post("/", status_code=200, summary="Create a completion")
    async def create(
        self,
        data: JSONBody[CompletionRequest],
        request: Request,
        caller: Caller,
        served_model: ServedModel,
        accounting: Accounting,
    ) -> CompletionResponse | Stream:
        started = await start_route(
            served_model,
            accounting,
            request,
            caller,
            model=data.model,
            prompts=lambda: completion_prompts(data.prompt, data.add_special_tokens),
            params=completion_params(data, served_model.max_num_seqs),
            field_names=completion_fields(data),
            id_prefix="cmpl",
            priority=data.priority,
            numbered_ids=True,
        )
        run, request_id = started.run, started.request_id
        created = int(time.time())
        if data.stream:
            return run.stream(_stream(served_model, data, run.generations, request_id, created))
        finals = await run.collect()
        choices = []
        for p, out in enumerate(finals):
            for c in out.outputs:
                logprobs = None
                if data.echo:
                    c = echoed(served_model.tokenizer, out, c)
                if data.logprobs is not None and c.logprobs is not None:
                    logprobs = completion_logprobs(served_model.tokenizer, c.token_ids, c.logprobs)
                choices.append(_choice(p * len(out.outputs) + c.index, c, logprobs))
        return CompletionResponse(
            id=request_id,
            created=created,
            model=data.model,
            choices=choices,
            usage=usage_of(finals),
        )


def _choice(index: int, part, logprobs) -> CompletionChoice:
    """A choice from a whole output or from a stream's delta (both carry text and finish)."""
    return CompletionChoice(
        index=index,
        text=part.text,
        logprobs=logprobs,
        finish_reason=part.finish_reason,
        stop_reason=part.stop_reason,
    )


async def _stream(
    served_model: ServedModel,
    data: JSONBody[CompletionRequest],
    gens: list[Generation],
    request_id: str,
    created: int,
) -> AsyncIterator[bytes]:
    want_logprobs = data.logprobs is not None
    every_chunk = usage_on_every_chunk(data.stream_options)
    try:
        for p, gen in enumerate(gens):
            trackers: dict[int, DeltaTracker] = {}
            async for out in outputs_of(gen):
                choices = []
                for c in out.outputs:
                    first = c.index not in trackers
                    delta = trackers.setdefault(c.index, DeltaTracker()).step(c, want_logprobs)
                    if delta is None:
                        continue
                    if data.echo and first:  # the prompt leads the choice's first chunk
                        delta.text = prompt_text(served_model.tokenizer, out) + delta.text
                    logprobs = None
                    if want_logprobs and delta.logprobs is not None:
                        logprobs = completion_logprobs(
                            served_model.tokenizer,
                            delta.token_ids,
                            delta.logprobs,
                            delta.text_offset,
                        )
                    choices.append(_choice(p * len(out.outputs) + c.index, delta, logprobs))
                for choice in choices:  # one choice per chunk, as OpenAI and vLLM stream n > 1
                    yield sse_event(
                        CompletionResponse(
                            id=request_id,
                            created=created,
                            model=data.model,
                            choices=[choice],
                            usage=usage_of([out]) if every_chunk else None,
                        )
                    )
        if final_usage(data.stream_options):
            finals = [g.latest for g in gens]
            yield sse_event(
                CompletionResponse(
                    id=request_id,
                    created=created,
                    model=data.model,
                    choices=[],
                    usage=usage_of(finals),
                )
            )
    except APIError as exc:
        yield sse_event(
            ErrorResponse(
                error=ErrorDetail(message=exc.message, type=exc.error_type, code=exc.code)
            )
        )
    yield DONE
