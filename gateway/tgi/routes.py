"""TGI / LoRAX routes: POST /generate, POST /generate_stream, and TGI's compatibility route
POST / (what the lorax and text-generation clients call, with `stream` in the body).

Errors here use TGI's shape ({"error", "error_type"}) so those clients raise their own
exception types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Controller, Request, get, post
from litestar.params import JSONBody
from litestar.response import Stream

from loragate.engine import CompletionOutput, RequestOutput
from loragate.gateway.errors import (
    APIError,
    InvalidRequestError,
    TGIErrorResponse,
    tgi_error_response,
)
from loragate.gateway.openai.format import token_text
from loragate.gateway.serving.accounting import Accounting
from loragate.gateway.serving.generation import Generation, outputs_of
from loragate.gateway.serving.route_start import start_route
from loragate.gateway.serving.run import Run
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.serving.sse import sse_event
from loragate.gateway.tenancy.principal import Caller, Principal
from loragate.gateway.tgi.sampling import tgi_fields, tgi_params
from loragate.gateway.tgi.schemas import (
    TGIBestOfSequence,
    TGIDetails,
    TGIInputToken,
    TGIParameters,
    TGIRequest,
    TGIResponse,
    TGIStreamDetails,
    TGIStreamResponse,
    TGIToken,
)


class TGIController(Controller):
    path = "/"
    tags = ["TGI / LoRAX"]
    exception_handlers = {Exception: tgi_error_response}

    @post("/", status_code=200, summary="TGI compatibility route: generate, or stream if asked")
    async def compat(
        self,
        data: JSONBody[TGIRequest],
        request: Request,
        caller: Caller,
        served_model: ServedModel,
        accounting: Accounting,
    ) -> list[TGIResponse] | Stream:
        if data.stream:
            return await _generate_stream(data, request, caller, served_model, accounting)
        return [await _generate(data, request, caller, served_model, accounting)]

    @post("/generate", status_code=200, summary="Generate (TGI / LoRAX)")
    async def generate(
        self,
        data: JSONBody[TGIRequest],
        request: Request,
        caller: Caller,
        served_model: ServedModel,
        accounting: Accounting,
    ) -> TGIResponse:
        return await _generate(data, request, caller, served_model, accounting)

    @post("/generate_stream", status_code=200, summary="Generate as server-sent events")
    async def generate_stream(
        self,
        data: JSONBody[TGIRequest],
        request: Request,
        caller: Caller,
        served_model: ServedModel,
        accounting: Accounting,
    ) -> Stream:
        return await _generate_stream(data, request, caller, served_model, accounting)

    @get("/info", summary="Model information (TGI)")
    async def info(self, served_model: ServedModel) -> dict:
        return {
            "model_id": served_model.model_name,
            "max_total_tokens": served_model.max_model_len,
            "max_input_length": served_model.max_model_len - 1,
            "router": "loragate",
        }


async def _run(
    data: TGIRequest,
    request: Request,
    caller: Principal,
    served_model: ServedModel,
    accounting: Accounting,
) -> tuple[Run, TGIParameters]:
    p = data.parameters or TGIParameters()
    started = await start_route(
        served_model,
        accounting,
        request,
        caller,
        model=p.adapter_id,
        model_param="parameters.adapter_id",
        prompts=lambda: _prompts(served_model, data.inputs, p.truncate),
        params=tgi_params(p, served_model.max_num_seqs),
        field_names=tgi_fields(p),
        id_prefix="tgi",
    )
    return started.run, p


async def _prompts(served_model: ServedModel, inputs: str, truncate: int | None) -> list:
    """The one prompt: the inputs, or their last `truncate` tokens."""
    if truncate is None:
        return [inputs]
    if truncate < 1:
        raise InvalidRequestError("truncate must be >= 1", param="parameters.truncate")
    ids = await served_model.encode(inputs)
    return [{"prompt_token_ids": ids[-truncate:]}]


async def _generate(
    data: TGIRequest,
    request: Request,
    caller: Principal,
    served_model: ServedModel,
    accounting: Accounting,
) -> TGIResponse:
    run, p = await _run(data, request, caller, served_model, accounting)
    (final,) = await run.collect()
    c = final.outputs[0]
    text = (data.inputs + c.text) if p.return_full_text else c.text
    details = None
    if p.details:
        prefill = _prefill(served_model, final) if p.decoder_input_details else []
        details = TGIDetails(
            finish_reason=tgi_finish_reason(c),
            prompt_tokens=len(final.prompt_token_ids),
            generated_tokens=len(c.token_ids),
            seed=p.seed,
            prefill=prefill,
            tokens=_tokens(served_model, c),
            top_tokens=_all_top_tokens(served_model, c, p),
            best_of_sequences=_best_of_sequences(served_model, data, p, final, prefill),
        )
    return TGIResponse(generated_text=text, details=details)


async def _generate_stream(
    data: TGIRequest,
    request: Request,
    caller: Principal,
    served_model: ServedModel,
    accounting: Accounting,
) -> Stream:
    best_of = (data.parameters or TGIParameters()).best_of
    if best_of is not None and best_of > 1:  # the best is known only at the end, as in TGI
        raise InvalidRequestError(
            "best_of > 1 is not supported when streaming", param="parameters.best_of"
        )
    run, p = await _run(data, request, caller, served_model, accounting)
    return run.stream(_events(served_model, data, p, run.generations[0]))


async def _events(
    served_model: ServedModel, data: JSONBody[TGIRequest], p: TGIParameters, gen: Generation
) -> AsyncIterator[bytes]:
    special = set(served_model.tokenizer.all_special_ids)
    sent_tokens = sent_chars = 0
    try:
        async for out in outputs_of(gen):
            c = out.outputs[0]
            new = list(range(sent_tokens, len(c.token_ids)))
            if not new and c.finish_reason is not None and c.token_ids:
                new = [len(c.token_ids) - 1]  # the finish carries no token: repeat the last one
            texts = token_texts(served_model.tokenizer, c.token_ids, new, c.text[sent_chars:])
            sent_chars = max(sent_chars, len(c.text))
            sent_tokens = len(c.token_ids)
            for k, i in enumerate(new):
                last = k == len(new) - 1
                token_id = c.token_ids[i]
                event = TGIStreamResponse(
                    token=TGIToken(
                        id=token_id,
                        text=texts[k],
                        logprob=_logprob(c, i),
                        special=token_id in special,
                    ),
                    top_tokens=_top_tokens(served_model, c, i, p) if p.top_n_tokens else None,
                )
                if last and c.finish_reason is not None:
                    event.generated_text = (data.inputs + c.text) if p.return_full_text else c.text
                    event.details = TGIStreamDetails(
                        finish_reason=tgi_finish_reason(c),
                        prompt_tokens=len(out.prompt_token_ids),
                        generated_tokens=len(c.token_ids),
                        seed=p.seed,
                    )
                yield sse_event(event)
    except APIError as exc:
        yield sse_event(TGIErrorResponse(error=exc.message, error_type="generation"))


# Tokens decoded before a step's first new one when its text is shared among its tokens:
# enough for a byte-level BPE's multi-byte characters and a word's leading space.
CONTEXT_TOKENS = 4


def token_texts(tokenizer, token_ids, new: list[int], text: str) -> list[str]:
    """`text`, the engine's text for the tokens at positions `new`, shared among them as TGI
    streams it, one event per token with that token's own text. A step brings several
    tokens when speculation verified them together; each gets what decoding it adds to the
    tokens before it, as a stream of one token per step would have sent it (nothing while a
    character is incomplete, then the whole of what completed). The events' texts always
    join to exactly the engine's text: where decoding a few tokens alone gives other text
    (a tokenizer's clean-up), the last token carries all of it, as before."""
    if len(new) <= 1:
        return [text]
    start = max(0, new[0] - CONTEXT_TOKENS)
    sent = ""  # the text of tokens start.. as streamed so far: the last complete decoding
    for j in range(start, new[0]):
        upto = tokenizer.decode(token_ids[start : j + 1])
        if not upto.endswith("\ufffd"):
            sent = upto
    texts = []
    for i in new:
        upto = tokenizer.decode(token_ids[start : i + 1])
        if upto.endswith("\ufffd") or not upto.startswith(sent):
            texts.append("")
        else:
            texts.append(upto[len(sent) :])
            sent = upto
    if "".join(texts) != text:  # decoding alone gave other text: the last token carries it
        return [""] * (len(new) - 1) + [text]
    return texts


def tgi_finish_reason(c: CompletionOutput) -> str:
    if c.finish_reason == "stop":
        return "stop_sequence" if isinstance(c.stop_reason, str) else "eos_token"
    return "length"


def _logprob(c: CompletionOutput, i: int) -> float:
    if c.logprobs is None or i >= len(c.logprobs):
        return 0.0
    return c.logprobs[i].get(c.token_ids[i], 0.0)


def _best_of_sequences(
    served_model: ServedModel,
    data: TGIRequest,
    p: TGIParameters,
    final: RequestOutput,
    prefill: list[TGIInputToken],
) -> list[TGIBestOfSequence] | None:
    """best_of's other candidates, likeliest first, as TGI details them."""
    if not final.best_of_sequences:
        return None
    return [
        TGIBestOfSequence(
            generated_text=(data.inputs + o.text) if p.return_full_text else o.text,
            finish_reason=tgi_finish_reason(o),
            generated_tokens=len(o.token_ids),
            seed=p.seed,
            prefill=prefill,
            tokens=_tokens(served_model, o),
            top_tokens=_all_top_tokens(served_model, o, p),
        )
        for o in final.best_of_sequences
    ]


def _tokens(served_model: ServedModel, c: CompletionOutput) -> list[TGIToken]:
    special = set(served_model.tokenizer.all_special_ids)
    return [
        TGIToken(
            id=t,
            text=token_text(served_model.tokenizer, t),
            logprob=_logprob(c, i),
            special=t in special,
        )
        for i, t in enumerate(c.token_ids)
    ]


def _all_top_tokens(
    served_model: ServedModel, c: CompletionOutput, p: TGIParameters
) -> list[list[TGIToken]] | None:
    if not p.top_n_tokens:
        return None
    return [_top_tokens(served_model, c, i, p) for i in range(len(c.token_ids))]


def _prefill(served_model: ServedModel, out: RequestOutput) -> list[TGIInputToken]:
    """Every prompt token with its logprob under the model (the first has none)."""
    steps = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
    return [
        TGIInputToken(
            id=t,
            text=token_text(served_model.tokenizer, t),
            logprob=step.get(t) if step is not None else None,
        )
        for t, step in zip(out.prompt_token_ids, steps, strict=False)
    ]


def _top_tokens(
    served_model: ServedModel, c: CompletionOutput, i: int, p: TGIParameters
) -> list[TGIToken]:
    """The top_n_tokens likeliest tokens of step i, best first (TGI's top_tokens)."""
    if c.logprobs is None or i >= len(c.logprobs):
        return []
    special = set(served_model.tokenizer.all_special_ids)
    ranked = sorted(c.logprobs[i].items(), key=lambda item: -item[1])[: p.top_n_tokens]
    return [
        TGIToken(id=t, text=token_text(served_model.tokenizer, t), logprob=lp, special=t in special)
        for t, lp in ranked
    ]
